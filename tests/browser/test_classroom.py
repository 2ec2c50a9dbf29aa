"""A lesson a teacher can run, in a real browser: classroom mode holds from page to page, fits a
projector, pages keep their own settings, copied links reopen what was shown, and a teacher
link hides what it names."""

from __future__ import annotations

import pytest

from tests.browser.harness import click_control, current_step, exceptions, open_page, wait_settled

pytestmark = pytest.mark.browser
# Every animated page, and the key of its step controls.
ANIMATED = {"unknown_ending": "step", "block_tables": "step", "attention": "step",
            "fragmentation": "step", "copy_on_write": "step", "prefix_cache": "step",
            "scheduler": "sched_step"}
VISIBLE_STATE_JS = """() => ({
  title: document.querySelector('h1')?.innerText,
  metrics: [...document.querySelectorAll('[data-testid="stMetricValue"]')].map(m => m.innerText),
  caption: [...document.querySelectorAll('[data-testid="stMarkdownContainer"] li')]
           .map(li => li.innerText).slice(0, 8),
  step: document.querySelector('.st-key-step [data-testid="stSliderThumbValue"], '
                               + '.st-key-sched_step [data-testid="stSliderThumbValue"]')
        ?.innerText,
})"""


def inside(page, selector: str) -> bool:
    """Whether the element's whole box lies inside the viewport."""
    box = page.locator(selector).first.bounding_box()
    size = page.viewport_size
    return (box is not None and box["x"] >= 0 and box["y"] >= 0
            and box["x"] + box["width"] <= size["width"] + 1
            and box["y"] + box["height"] <= size["height"] + 1)


def copied_link(page) -> str:
    return page.locator(".st-key-copy_link code").inner_text().replace("\n", "")


def open_fresh(browser, url: str, viewport: dict | None = None):
    tab = browser.new_context(viewport=viewport or {"width": 1280, "height": 800}).new_page()
    open_page(tab, url)
    return tab


def test_classroom_mode_stays_on_from_page_to_page(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?classroom=1")
    for title in ("The unknown ending", "Attention over blocks", "Fragmentation",
                  "Copy-on-write", "Prefix cache", "Admission control", "KV-size calculator",
                  "Start here"):
        if not page.locator('[data-testid="stSidebarNav"]').is_visible():
            page.locator('[data-testid="stExpandSidebarButton"]').first.click()
        page.locator('[data-testid="stSidebarNav"] a', has_text=title).first.click()
        wait_settled(page, start_grace_ms=1000)
        assert "classroom=1" in page.url, title
        assert page.locator('[data-testid="stSidebar"] .st-key-classroom input').is_checked()
        assert exceptions(page) == [], title


@pytest.mark.parametrize("viewport", [{"width": 1280, "height": 720},
                                      {"width": 1920, "height": 1080}],
                         ids=["1280x720", "1920x1080"])
def test_step_button_and_main_figure_fit_a_projector(browser, app_url: str,
                                                      viewport: dict) -> None:
    context = browser.new_context(viewport=viewport)
    tab = context.new_page()
    for path, key in ANIMATED.items():
        open_page(tab, f"{app_url}/{path}?classroom=1")
        click_control(tab, "forward", key=key)
        wait_settled(tab)
        assert inside(tab, f".st-key-{key}_forward button"), f"{path}: Step out of view"
        assert inside(tab, ".lab-figure[data-main]"), f"{path}: main figure out of view"
        assert exceptions(tab) == [], path
    context.close()


def test_pages_keep_their_own_settings(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?block_size=2&prompt_len=120")
    page.locator('[data-testid="stSidebarNav"] a', has_text="Copy-on-write").first.click()
    wait_settled(page, start_grace_ms=1000)
    assert "block_size" not in page.url and "prompt_len" not in page.url
    link = copied_link(page)
    assert "block_size=16" in link and "prompt_len=30" in link  # its own defaults
    page.locator('[data-testid="stSidebarNav"] a', has_text="Block tables").first.click()
    wait_settled(page, start_grace_ms=1000)
    assert "block_size=2" in copied_link(page)  # and Block tables kept its own
    assert exceptions(page) == []


@pytest.mark.parametrize("path, query", [
    ("unknown_ending", "guess=200&requests=6"),
    ("block_tables", "block_size=8&requests=2"),
    ("attention", "seq=B&head=1&placement=1"),
    ("fragmentation", "block_size=8&requests=10&seed=3"),
    ("copy_on_write", "mode=Beam+search&branches=3"),
    ("prefix_cache", "apps=3&requests=10"),
    ("scheduler", "sched_allocator=contiguous&step_preempt=swap"),
])
def test_a_copied_link_reopens_the_same_state(browser, page, app_url: str, path: str,
                                              query: str) -> None:
    open_page(page, f"{app_url}/{path}?{query}")
    key = ANIMATED[path]
    for _ in range(3):
        click_control(page, "forward", key=key)
        wait_settled(page)
    shown = page.evaluate(VISIBLE_STATE_JS)
    fresh = open_fresh(browser, copied_link(page))
    assert fresh.evaluate(VISIBLE_STATE_JS) == shown
    assert exceptions(fresh) == []
    fresh.context.close()


def test_a_teacher_link_hides_what_it_names(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?hide=settings,questions,sidebar&lock=1")
    main = page.locator('[data-testid="stMain"]')
    assert main.locator('[data-testid="stExpander"] summary', has_text="Settings").count() == 0
    assert main.locator('[data-testid="stForm"]').count() == 0
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    click_control(page, "forward")  # the class still steps
    wait_settled(page)
    assert current_step(page) == 1
    assert exceptions(page) == []


# Titles that run past their figure's sides or top, or (a figure's title) into its plot area.
CLIPPED_TITLES_JS = """() => [...document.querySelectorAll('.lab-figure')].flatMap(view => {
  const edge = view.getBoundingClientRect();
  const plot = view.querySelector('rect.nsewdrag')?.getBoundingClientRect();
  return [...view.querySelectorAll('text.gtitle, text.xtitle')].filter(t => {
    const box = t.getBoundingClientRect();
    const intoPlot = plot && t.classList.contains('gtitle') && box.bottom > plot.top + 1;
    return box.width > 0 && (box.left < edge.left - 1 || box.right > edge.right + 1 ||
                             box.top < edge.top - 1 || intoPlot);
  }).map(t => t.textContent);
})"""


@pytest.mark.parametrize("path", ["block_tables", "attention", "fragmentation"])
def test_on_a_phone_no_figure_title_runs_off_its_figure(browser, app_url: str, path: str) -> None:
    """At 390x844 the figure view wraps titles and axis titles to the plot's width (plotly
    never wraps them, and the pool's and the memory map's run past a phone's edge), and a
    wrapped title stays above its plot."""
    tab = open_fresh(browser, f"{app_url}/{path}", {"width": 390, "height": 844})
    try:
        tab.wait_for_function("() => document.querySelector('.lab-figure text.gtitle')")
        assert tab.evaluate(CLIPPED_TITLES_JS) == [] and not exceptions(tab)
    finally:
        tab.context.close()


def test_a_figure_follows_its_column_when_the_window_narrows(browser, app_url: str) -> None:
    """A window made narrow after the page drew (a laptop's window dragged small, a tablet
    turned): each plot takes its column's new width and is fitted again."""
    tab = open_fresh(browser, f"{app_url}/fragmentation", {"width": 1400, "height": 900})
    try:
        tab.set_viewport_size({"width": 390, "height": 844})
        tab.wait_for_function("""() => [...document.querySelectorAll('.lab-figure')].every(v =>
            Math.abs(v.querySelector('svg.main-svg').getBoundingClientRect().width
                     - v.clientWidth) <= 1)""")
        assert tab.evaluate(CLIPPED_TITLES_JS) == []
    finally:
        tab.context.close()
