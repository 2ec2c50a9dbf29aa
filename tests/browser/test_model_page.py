"""The real-model page in a browser: a short two-sample generation streams and finishes cleanly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser.harness import exceptions, open_page, screenshot, wait_settled

pytestmark = pytest.mark.browser


def test_short_generation_fills_the_pool(page, app_url: str, tmp_path: Path) -> None:
    open_page(page, f"{app_url}/model?model_max_new=4&model_n=2&model_decoding=sampling")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text("Same as dense cache").wait_for(timeout=180_000)
    wait_settled(page)
    screenshot(page, tmp_path, "model_generated")
    assert exceptions(page) == []
    assert page.get_by_text(re.compile(r"sample 2 \(\d tokens, done\)")).count() == 1
    assert page.get_by_text("Copy-on-write at step 0").count() == 1


def test_stop_ends_the_generation_and_keeps_the_partial_answer(page, app_url: str) -> None:
    open_page(page, f"{app_url}/model?model_max_new=96&model_n=3&model_decoding=sampling")
    stop = page.locator('[data-testid="stMainBlockContainer"]').get_by_role("button", name="Stop")
    assert stop.is_disabled()  # nothing to stop yet
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(re.compile(r"sample 1 \(\d+ tokens, writing…\)")).first.wait_for(
        timeout=180_000)
    stop.click()
    page.get_by_text(re.compile(r"Stopped after \d+ of at most 96 new tokens")).wait_for(
        timeout=60_000)
    wait_settled(page)
    assert exceptions(page) == []
    assert page.get_by_text("not checked").count() == 1  # a stopped answer is not compared
    assert page.get_by_text(re.compile(r"sample 3 \(\d+ tokens, stopped\)")).count() == 1
