"""The scheduler pages in a browser: step through decisions, run a replay, read pasted metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import exceptions, open_page, screenshot, wait_settled
from tests.test_vllm_metrics import CURRENT

pytestmark = pytest.mark.browser


def test_step_then_replay(page, app_url: str, tmp_path: Path) -> None:
    open_page(page, f"{app_url}/scheduler?step_blocks=16&step_block_size=16&step_requests=10")
    # Step 0 answers the chunk question asked first: its decisions show once it is answered.
    page.get_by_role("button", name="Just show me").first.click(timeout=60_000)
    wait_settled(page)
    page.get_by_text("request 0 admitted").filter(visible=True).first.wait_for(timeout=60_000)
    page.locator(".st-key-sched_step_forward button:visible").first.click()
    wait_settled(page)
    assert exceptions(page) == []
    thumb = '.st-key-sched_step [data-testid="stSliderThumbValue"]'
    assert page.locator(thumb).inner_text() == "1"
    replay = ("/scheduler?sched_view=Replay+%26+metrics&big_workload=Alpaca-like+%28synthetic%29"
              "&big_requests=200&big_max_tokens=128&big_blocks=128")
    open_page(page, app_url + replay)
    page.get_by_text("paged: throughput").wait_for(timeout=120_000)
    wait_settled(page)
    screenshot(page, tmp_path, "scheduler_replay")
    assert exceptions(page) == []
    assert page.get_by_text("What a healthy server watches").count() >= 1
    assert page.get_by_text("Latency: TTFT over requests").count() >= 1  # TTFT and ITL drawn
    assert page.get_by_text("Pool: 28,020 blocks of 16 tokens").count() == 1  # the card's


def test_pasted_metrics(page, app_url: str, tmp_path: Path) -> None:
    open_page(page, f"{app_url}/serving_metrics")
    box = page.locator("[data-testid=\"stMain\"] textarea").first  # the sidebar has one too
    box.fill(CURRENT)
    box.press("Control+Enter")
    page.get_by_text("Prefix-cache hit rate").wait_for(timeout=60_000)
    wait_settled(page)
    screenshot(page, tmp_path, "serving_metrics")
    assert exceptions(page) == []
    assert page.get_by_text("62%").count() >= 1
