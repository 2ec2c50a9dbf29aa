"""The walkthrough pages in a real browser: Step, Play, the copied link, classroom mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import (
    STEP_THUMB,
    VIEWPORT,
    click_control,
    current_step,
    exceptions,
    open_page,
    screenshot,
    wait_settled,
)

pytestmark = pytest.mark.browser
PLAY_TIMEOUT_MS = 60_000


def metric_values(page) -> list[str]:
    return [m.inner_text() for m in page.query_selector_all('[data-testid="stMetricValue"]')]


def copied_link(page) -> str:
    return page.locator('.st-key-copy_link code').inner_text()


@pytest.mark.parametrize("path", ["block_tables", "attention"])
def test_step_play_and_link(browser, page, app_url: str, tmp_path: Path, path: str) -> None:
    open_page(page, f"{app_url}/{path}")
    click_control(page, "forward")
    wait_settled(page)
    assert current_step(page) == 1
    if path == "block_tables":  # Play is the same component on every page: test it once
        click_control(page, "play")
        page.wait_for_function(  # the timer advances the step on its own
            f"() => Number(document.querySelector('{STEP_THUMB}')?.innerText) >= 2",
            timeout=PLAY_TIMEOUT_MS)
        click_control(page, "play")  # pause
        wait_settled(page)
    step, shown = current_step(page), metric_values(page)
    assert exceptions(page) == []
    screenshot(page, tmp_path, f"{path}_step{step}", full=False)

    link = copied_link(page).replace("\n", "")
    assert f"step={step}" in link
    fresh = browser.new_context(viewport=VIEWPORT).new_page()  # a new session, as a new reader
    open_page(fresh, link)
    assert current_step(fresh) == step and metric_values(fresh) == shown
    screenshot(fresh, tmp_path, f"{path}_from_link", full=False)
    assert exceptions(fresh) == []
    fresh.context.close()


def test_classroom_mode_screenshots(page, app_url: str, tmp_path: Path) -> None:
    for path in ("block_tables?step=5", "attention?step=2"):
        open_page(page, f"{app_url}/{path}&classroom=1")
        assert page.get_by_role("switch", name="Classroom mode").is_checked()
        assert exceptions(page) == []
        screenshot(page, tmp_path, path.split("?")[0] + "_classroom", full=False)
        screenshot(page, tmp_path, path.split("?")[0] + "_classroom_full")


def test_figures_redraw_in_place(page, app_url: str) -> None:
    """A step redraws each changed figure in its plot (ui/figure_view.js), not a new one; every
    figure is drawn by plotly.js, with the toolbar's PNG download."""
    open_page(page, f"{app_url}/block_tables?step=2")
    figures = page.locator(".lab-figure")
    assert figures.count() == 3  # token strip, block table, pool grid
    page.evaluate("() => document.querySelectorAll('.lab-figure').forEach("
                  "(view, i) => { view.labMarker = i; })")
    drawn = [int(figures.nth(i).get_attribute("data-drawn")) for i in range(3)]
    click_control(page, "forward")
    wait_settled(page)
    assert current_step(page) == 3
    assert page.evaluate("() => [...document.querySelectorAll('.lab-figure')]"
                         ".map(view => view.labMarker)") == [0, 1, 2]  # the same plots
    now = [int(figures.nth(i).get_attribute("data-drawn")) for i in range(3)]
    assert now[0] > drawn[0] and now[2] > drawn[2]  # the strip and the pool changed
    for i in range(3):
        view = figures.nth(i)
        assert view.locator("svg.main-svg").count() > 0
        buttons = view.locator(".modebar-btn").evaluate_all(
            "buttons => buttons.map(b => b.getAttribute('data-title'))")
        assert "Download plot as a PNG" in buttons and "Share chart..." not in buttons
    assert "could not be drawn" not in page.inner_text("body")
    assert exceptions(page) == []


def test_a_figure_says_when_plotly_js_cannot_load(page, app_url: str) -> None:
    """With plotly.js unreachable the figures say so (no silent blank); once it loads again,
    the next step draws them."""
    blocked = {"now": True}
    page.route("**/app/static/plotly.min.js",
               lambda route: route.abort() if blocked["now"] else route.continue_())
    page.goto(f"{app_url}/block_tables?step=2", wait_until="domcontentloaded")
    page.wait_for_function("() => document.querySelectorAll('.lab-figure[data-failed]').length"
                           " === 3", timeout=60_000)
    assert "could not be drawn" in page.locator(".lab-figure").first.inner_text()
    blocked["now"] = False
    click_control(page, "forward")
    wait_settled(page)
    assert page.locator(".lab-figure[data-failed]").count() == 0
    assert page.locator(".lab-figure svg.main-svg").count() >= 3
