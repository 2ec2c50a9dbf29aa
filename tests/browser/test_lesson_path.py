"""A teacher's lesson path in a real browser: one link opens the first stop (its page, step,
hidden controls and presenter note), "Next stop" walks the class through the others, and a
link whose path cannot be read says so and shows the page as usual."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.browser.harness import current_step, exceptions, open_page, wait_settled
from ui.lesson_path import Stop, stop_query

pytestmark = pytest.mark.browser
STOPS = (
    Stop("block_tables", (("seed", "0"), ("step", "2")), ("settings",),
         "Two blocks for A's 30-token prompt: ask why not one."),
    Stop("block_tables", (("seed", "0"), ("step", "4"), ("block_size", "8")), (),
         "Now block size 8: count A's blocks again."),
    Stop("attention", (("seed", "0"), ("step", "1")), ("questions",),
         "The kernel reads the blocks through the table."),
)
TITLES = ("Block tables", "Block tables", "Attention over blocks")


def stop_box(page):
    return page.locator(".st-key-lab_lesson_stop")


def test_a_three_stop_lesson_walked_with_next(page, app_url: str) -> None:
    open_page(page, f"{app_url}/{STOPS[0].page}?{urlencode(stop_query(STOPS, 0, lock=False))}")
    for index, (stop, title) in enumerate(zip(STOPS, TITLES, strict=True)):
        box = stop_box(page)
        assert f"stop {index + 1} of 3" in box.inner_text(), index
        assert stop.note in box.locator('[data-testid="stAlert"]').inner_text()
        assert page.locator("h1").first.inner_text() == title
        assert current_step(page) == int(stop.step)
        assert "classroom=1" in page.url and "lesson=" in page.url  # a reload keeps the path
        settings = page.locator('[data-testid="stMain"] [data-testid="stExpander"] summary',
                                has_text="Settings")
        assert (settings.count() == 0) == ("settings" in stop.hide), index
        assert exceptions(page) == [], index
        if index == 1:  # this stop's own settings: block size 8
            assert "block_size=8" in page.url
        if index + 1 < len(STOPS):
            box.locator('[data-testid="stPageLink"] a', has_text="Next stop").click()
            wait_settled(page, start_grace_ms=1000)
    assert "last stop" in stop_box(page).inner_text()
    stop_box(page).locator('[data-testid="stPageLink"] a', has_text="Previous stop").click()
    wait_settled(page, start_grace_ms=1000)
    assert "stop 2 of 3" in stop_box(page).inner_text() and current_step(page) == 4


def test_a_lesson_link_that_cannot_be_read_falls_back_to_the_page(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?lesson=not-a-lesson&stop=7")
    warning = page.locator('[data-testid="stAlert"]', has_text="lesson=").first.inner_text()
    assert "was ignored" in warning and "lesson path" in warning
    assert stop_box(page).count() == 0
    assert page.locator("h1").first.inner_text() == "Block tables"
    assert exceptions(page) == []
