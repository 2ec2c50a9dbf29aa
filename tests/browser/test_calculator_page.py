"""The KV-size calculator in a browser, with the issue's three real configs pasted as published:
Falcon-7B (one KV head from multi_query), Gemma-3-27B (no layer_types: pattern 6) and
DeepSeek-V3 (MLA, fp8 weights) on eight H200s."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import exceptions, open_page, screenshot, wait_settled

pytestmark = pytest.mark.browser
CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def paste(page, file: str) -> None:
    box = page.get_by_label("Paste config.json")
    box.fill((CONFIGS / file).read_text())
    box.press("Control+Enter")
    wait_settled(page)
    page.get_by_role("button", name="Read pasted config").click()
    wait_settled(page)


@pytest.mark.parametrize(("file", "query", "shown"), [
    ("falcon-7b.json", "", ["multi_query: true",
                            "Maximum concurrency for 2,048 tokens per request"]),
    ("gemma-3-27b-it.json", "", ["10 full and 52 sliding layers", "8 padding slots",
                                 "1 × 8,192 (full attention) + 6 × 577 (sliding window)"]),
    ("deepseek-v3.json", "?gpu=H200+141+GB&tp=8", ["GPU KV cache size: 694,784 tokens",
                                                    "Forcing kv cache block size to 64"]),
])
def test_real_configs_pasted(page, app_url: str, tmp_path: Path, file: str, query: str,
                             shown: list[str]) -> None:
    open_page(page, f"{app_url}/calculator{query}")
    page.get_by_text("Read a Hugging Face config.json").first.click()
    paste(page, file)
    screenshot(page, tmp_path, file.removesuffix(".json"))
    assert exceptions(page) == []
    for text in shown:
        assert page.get_by_text(text, exact=False).count() >= 1, text


def pick_preset(page, name: str) -> None:
    page.locator(".st-key-model input").click()
    page.keyboard.type(name)
    page.keyboard.press("Enter")
    wait_settled(page)


def test_the_question_once_then_preset_changes_and_pastes_hold_nothing_back(
        page, app_url: str, tmp_path: Path) -> None:
    """The issue's engineer: answers once, then changes the preset and pastes three configs;
    the results stay readable, no question comes back, and the score stays."""
    open_page(page, f"{app_url}/calculator")
    held = page.locator("[class*='st-key-lab_hatched_calc_']")
    assert held.count() >= 3  # sizes, their table, both sheets (and the chart) held back
    guess = page.get_by_label("Your prediction")
    guess.fill("131072")
    guess.press("Enter")  # the form's submit: Check
    wait_settled(page)
    assert page.get_by_text("Right: 131,072").count() == 1
    assert held.count() == 0
    page.get_by_text("Read a Hugging Face config.json").first.click()
    for step, action in enumerate([lambda: pick_preset(page, "Qwen2.5-7B"),
                                   lambda: paste(page, "falcon-7b.json"),
                                   lambda: paste(page, "gemma-3-27b-it.json"),
                                   lambda: paste(page, "deepseek-v3.json")]):
        action()
        assert exceptions(page) == [], step
        assert held.count() == 0, step
        assert page.get_by_label("Your prediction").count() == 0, step  # not asked again
        assert page.get_by_text("Right: 131,072").count() == 0, step  # the old verdict gone
        assert page.get_by_text("per token, all layers").first.is_visible(), step
    screenshot(page, tmp_path, "calculator_after_three_pastes")
    pick_preset(page, "Llama-3.1-8B")  # the answered settings again: their verdict, same score
    assert page.get_by_text("Right: 131,072").count() == 1
    assert page.get_by_text("Your score: 1 of 1 on this page").count() == 1
