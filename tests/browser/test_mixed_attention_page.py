"""The Mixed attention page in a real browser: stepped from the empty pool to its end."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.scenarios.mixed_attention import MixedAttentionStory, MixedParams
from tests.browser.harness import (
    click_control,
    current_step,
    exceptions,
    open_page,
    screenshot,
    wait_settled,
)

pytestmark = pytest.mark.browser


def test_step_to_the_end(page, app_url: str, tmp_path: Path) -> None:
    last = len(MixedAttentionStory(MixedParams(), 0).frames()) - 1
    open_page(page, f"{app_url}/mixed_attention")
    assert current_step(page) == 0
    assert page.locator(".lab-figure").count() == 3  # tables, pool, blocks held
    for step in range(1, last + 1):
        click_control(page, "forward")
        wait_settled(page)
        assert current_step(page) == step
        assert exceptions(page) == [], f"step {step}"
    assert page.get_by_text("Every request has finished").count() >= 1
    assert page.get_by_text("Next: Admission control").count() == 1
    screenshot(page, tmp_path, "mixed_attention_end")
