"""The walkthrough pages in a real browser: Step, Play, the copied link, classroom mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import (STEP_THUMB, VIEWPORT, click_control, current_step,
                                   exceptions, open_page, screenshot, wait_settled)

pytestmark = pytest.mark.browser
PLAY_TIMEOUT_MS = 60_000


def metric_values(page) -> list[str]:
    return [m.inner_text() for m in page.query_selector_all('[data-testid="stMetricValue"]')]


def copied_link(page) -> str:
    return page.locator('[data-testid="stSidebar"] [data-testid="stCode"] code').inner_text()


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
