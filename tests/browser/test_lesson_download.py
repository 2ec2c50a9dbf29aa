"""A downloaded lesson plays on its own: saved from a page, opened from `file://` with every
request that is not a file aborted, it steps (its figure and caption change), goes back, plays,
holds what answers a question until it is answered, and saves every step as PNG."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from lab.figures.lesson import lesson_html
from tests.browser.harness import SETTLE_TIMEOUT_MS, exceptions, open_page, wait_settled
from tests.test_lesson import HOSTILE, walk_lesson

pytestmark = pytest.mark.browser
# A security-policy refusal counts as an attempt too (the lesson tells the browser to load
# nothing), so a load the policy stops before the network still fails the test.
WATCH_POLICY = """document.addEventListener('securitypolicyviolation',
    (e) => (window.__refused = window.__refused || []).push(e.blockedURI));"""
MAIN = "#figures .figure"


def download_lesson(page, app_url: str, name: str, tmp_path: Path, query: str = "") -> Path:
    open_page(page, f"{app_url}/{name}{query}")
    page.locator(f".st-key-{name}_lesson_build button:visible").first.click()
    wait_settled(page)
    assert exceptions(page) == []
    with page.expect_download(timeout=SETTLE_TIMEOUT_MS) as download:
        page.locator(f".st-key-{name}_lesson_save button:visible").first.click()
    path = tmp_path / download.value.suggested_filename
    download.value.save_as(path)
    return path


def offline(browser, tmp_path: Path, lesson: Path):
    """The lesson opened from disk in a fresh browser context with the network cut off."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    attempted: list[str] = []

    def only_files(route) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            attempted.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    tab = context.new_page()
    tab.add_init_script(WATCH_POLICY)
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(lesson.as_uri())
    tab.wait_for_selector("body[data-ready]", timeout=30_000)
    return context, tab, attempted, errors


def shown(tab) -> dict:
    """The step, its caption, its main figure's traces, and what is held back."""
    return tab.evaluate(f"""() => ({{
        label: document.getElementById('step-label').textContent,
        caption: document.getElementById('caption').textContent,
        figure: JSON.stringify(document.querySelector('{MAIN}').data),
        drawn: document.querySelector('{MAIN} .main-svg') !== null,
        held: [...document.querySelectorAll('.held')].length,
        questions: [...document.querySelectorAll('.question')].map(q => q.innerText)}})""")


def test_a_downloaded_lesson_plays_offline(browser, page, app_url: str, tmp_path: Path) -> None:
    lesson = download_lesson(page, app_url, "block_tables", tmp_path)
    assert lesson.name == "block_tables_lesson.html" and lesson.stat().st_size <= 5_000_000
    context, tab, attempted, errors = offline(browser, tmp_path, lesson)
    try:
        first = shown(tab)
        assert first["label"] == "Step 0 of 10" and first["drawn"] and "pool is empty" in \
            first["caption"]
        assert "Kernel" not in tab.inner_text("#check")  # the empty pool: nothing to check
        tab.keyboard.press("ArrowRight")
        second = shown(tab)
        assert second["label"] == "Step 1 of 10"
        assert second["caption"] != first["caption"] and "A" in second["caption"]
        assert second["figure"] != first["figure"]
        assert tab.inner_text("#check").startswith("Kernel = dense attention · max abs error")
        tab.keyboard.press("ArrowLeft")
        assert shown(tab) == first
        tab.click("#step")
        assert shown(tab) == second
        tab.click("#back")
        assert shown(tab)["label"] == "Step 0 of 10"

        # Play runs on by itself and stops where a question is asked (A's blocks at 33
        # tokens, answered by step 4: asked at step 3), the answer not on screen yet.
        tab.click("#play")
        tab.wait_for_function("() => document.getElementById('play').textContent === 'Play'",
                              timeout=15_000)
        asked = shown(tab)
        assert asked["label"] == "Step 3 of 10" and len(asked["questions"]) == 1
        assert "33 tokens" in asked["questions"][0] and asked["held"] == 0
        tab.keyboard.press("ArrowRight")  # the step that answers it: held back, hatched
        held = shown(tab)
        assert held["label"] == "Step 4 of 10" and held["held"] >= 4
        assert not tab.is_visible(f"{MAIN} .main-svg") or tab.evaluate(
            f"() => getComputedStyle(document.querySelector('{MAIN} .main-svg'))"
            ".visibility") == "hidden"
        tab.click(".question .check")  # nothing typed: asked to predict first
        assert "prediction first" in tab.inner_text(".question .verdict")
        assert shown(tab)["held"] >= 4
        tab.fill(".question input[type=number]", "2")
        tab.click(".question .check")
        answered = shown(tab)
        assert answered["held"] == 0 and answered["caption"] == held["caption"]
        verdict = tab.inner_text(".question .verdict")
        assert verdict.startswith("Not quite: you said 2, the engine says 3.")
        assert "Your score: 0 of 1" in verdict

        # Slides: every step's figures as PNG, in one zip made in the page.
        with tab.expect_download(timeout=120_000) as download:
            tab.click("#png")
        archive = zipfile.ZipFile(io.BytesIO(Path(download.value.path()).read_bytes()))
        names = archive.namelist()
        assert len(names) == 11 * 3 and "step_00_pool.png" in names and archive.testzip() is None
        assert all(archive.read(n).startswith(b"\x89PNG\r\n\x1a\n") for n in names)

        assert attempted == [] and tab.evaluate("window.__refused || []") == []
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize("name", ["attention", "fragmentation", "prefix_cache"])
def test_every_walkthrough_page_downloads_a_lesson_that_opens_offline(
        browser, page, app_url: str, tmp_path: Path, name: str) -> None:
    lesson = download_lesson(page, app_url, name, tmp_path)
    assert lesson.stat().st_size <= 5_000_000
    context, tab, attempted, errors = offline(browser, tmp_path, lesson)
    try:
        while tab.locator(".question:not(:has(.score)) .show").count():  # what is asked at 0
            tab.locator(".question:not(:has(.score)) .show").first.click()
        first = shown(tab)
        assert first["drawn"] and first["caption"].strip() and first["held"] == 0
        tab.click("#step")
        second = shown(tab)
        assert second["label"].startswith("Step 1 of ") and second["figure"] != first["figure"]
        assert attempted == [] and tab.evaluate("window.__refused || []") == []
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize("name, query", [("copy_on_write", ""),
                                         ("copy_on_write", "?mode=Beam+search"),
                                         ("scheduler", ""), ("unknown_ending", "?requests=2")])
def test_the_stepped_pages_download_a_lesson_that_asks_and_plays_offline(
        browser, page, app_url: str, tmp_path: Path, name: str, query: str) -> None:
    """Copy-on-write, Admission control's step-through view and the unknown ending: their
    lesson opens offline, asks its question before its step and holds that step back, and a
    Step changes the figure and the caption."""
    lesson = download_lesson(page, app_url, name, tmp_path, query)
    assert lesson.stat().st_size <= 5_000_000
    context, tab, attempted, errors = offline(browser, tmp_path, lesson)
    try:
        first, seen = shown(tab), []
        assert first["drawn"] and first["caption"].strip()
        for _ in range(300):
            now = shown(tab)
            if now["questions"] and now["held"]:  # at the step that answers it: held back
                seen.append(now["label"])
                tab.locator(".question .show").first.click()
                assert shown(tab)["held"] == 0
            if tab.locator("#step").is_disabled():
                break
            tab.click("#step")
        assert seen, "the lesson never asked its question"
        last = shown(tab)
        assert last["label"] != first["label"] and last["figure"] != first["figure"]
        assert last["caption"] != first["caption"]
        assert attempted == [] and tab.evaluate("window.__refused || []") == []
        assert errors == []
    finally:
        context.close()


def test_a_lesson_asks_as_its_page_does_once_per_story(browser, page, app_url: str,
                                                       tmp_path: Path) -> None:
    """Prefix cache asks about one admission, the step before it and at it: a question left
    unanswered is gone once its admission has passed, and holds nothing after it."""
    lesson = download_lesson(page, app_url, "prefix_cache", tmp_path)
    context, tab, attempted, errors = offline(browser, tmp_path, lesson)
    try:
        seen, asked_at = set(), []
        for step in range(17):
            now = shown(tab)
            assert len(now["questions"]) <= 1, now["questions"]
            assert now["held"] == 0 or now["questions"]  # held only under its open question
            if now["questions"]:
                asked_at.append(step)
            seen.update(now["questions"])
            tab.keyboard.press("ArrowRight")
        assert len(seen) == 1 and asked_at == [9, 10]  # R5's admission at step 10
        assert attempted == [] and errors == []
    finally:
        context.close()


def test_a_caption_with_markup_is_shown_as_text(browser, tmp_path: Path) -> None:
    lesson = tmp_path / "hostile.html"
    lesson.write_text(lesson_html(walk_lesson(f"**{HOSTILE}** <b>x</b>")[0]))
    context, tab, attempted, errors = offline(browser, tmp_path, lesson)
    try:
        line = tab.locator("#caption li").last  # step 0: nothing held yet
        assert line.inner_text() == f"{HOSTILE} <b>x</b>"  # the markdown bold, nothing else
        assert line.locator("strong").count() == 1 and line.locator("b, script").count() == 0
        assert tab.evaluate("window.broken") is None and errors == [] and attempted == []
    finally:
        context.close()
