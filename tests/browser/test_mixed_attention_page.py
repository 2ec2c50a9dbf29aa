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


def in_view(page, locator) -> bool:
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    return box is not None and box["y"] < height and box["y"] + min(box["height"], 80) > 0


@pytest.mark.parametrize("size, query", [((1400, 900), ""), ((1280, 720), "?classroom=1")])
def test_controls_question_and_figure_in_view_together(browser, app_url: str, size,
                                                       query: str) -> None:
    """After each Step up to the window question (due at step 5, answered by step 6) and past
    it: the step controls, the question due and the block tables are on screen together."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    open_page(page, f"{app_url}/mixed_attention{query}")
    question = page.get_by_text("how many physical blocks does it hold").first
    for step in range(1, 8):
        click_control(page, "forward")
        wait_settled(page)
        controls = page.locator(".st-key-step_forward").first
        figure = page.locator(".lab-figure").first
        assert in_view(page, controls) and in_view(page, figure), step
        if step in (5, 6):  # due (classroom: asked in an expander, for the class)
            assert in_view(page, question), step
        if step == 6 and not query:
            page.get_by_role("button", name="Just show me").first.click()
            wait_settled(page)
    assert exceptions(page) == []
    page.close()
