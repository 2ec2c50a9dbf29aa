"""Lessons in a real browser: every numeric question answers on one click of Check after typing,
what would give an answer away is hidden until then, a new setting asks again, and a screen
reader gets each figure in words and each step announced."""

from __future__ import annotations

import pytest

from tests.browser.harness import click_control, exceptions, open_page, wait_settled

pytestmark = pytest.mark.browser
# Every numeric question: the page (at a step where it is asked) and its key.
NUMERIC = [("block_tables?step=3", "bt_blocks"), ("block_tables?step=4", "bt_tail"),
           ("fragmentation", "frag_peak"),
           ("copy_on_write", "cow_copies_parallel_n4_p30_t12_b16_k32_s0"),
           ("prefix_cache?step=3", "prefix_hits"), ("calculator", "calc_bytes")]
HELD = '[class*="st-key-lab_held_"]'


def shown(page, selector: str) -> bool:
    """Whether any element matching `selector` is on screen, readable (not hidden in a held-back
    place)."""
    return page.evaluate("""(selector) => [...document.querySelectorAll(selector)].some(
        el => getComputedStyle(el).visibility === 'visible' && el.getClientRects().length > 0)""",
                         selector)


def answer(page, key: str, value: str) -> None:
    box = page.locator(f".st-key-{key}_guess input")
    box.fill(value)
    page.locator(f".st-key-{key}_check button").click()  # one click, no Enter, no blur first
    wait_settled(page)


@pytest.mark.parametrize("path, key", NUMERIC)
def test_one_click_on_check_after_typing_gives_feedback(page, app_url: str, path: str,
                                                        key: str) -> None:
    open_page(page, f"{app_url}/{path}")
    answer(page, key, "1")
    text = page.locator('[data-testid="stAlert"]').all_inner_texts()
    assert any(t.startswith(("Right:", "Not quite:")) for t in text), text
    assert exceptions(page) == []


def test_attention_hides_the_output_change_until_answered(page, app_url: str) -> None:
    open_page(page, f"{app_url}/attention?step=2")
    text = page.locator('[data-testid="stMain"]').inner_text()
    assert "the same to the last bit" not in text and "bit-for-bit identical." not in text
    assert not shown(page, f'{HELD} [data-testid="stMetricValue"]')
    assert page.locator(HELD).count() >= 1
    page.locator(".st-key-att_shift_show button").click()
    wait_settled(page)
    assert page.locator(HELD).count() == 0
    assert "Output change" in page.locator('[data-testid="stMetricLabel"]').all_inner_texts()[-1]


def test_fragmentation_hides_the_run_over_time_and_the_sweep(page, app_url: str) -> None:
    open_page(page, f"{app_url}/fragmentation")
    assert not shown(page, f"{HELD} .lab-figure")  # the timeline and the block-size sweep
    assert page.locator(f"{HELD} .lab-figure").count() == 2
    page.locator(".st-key-frag_peak_show button").click()
    wait_settled(page)
    assert page.locator(f"{HELD} .lab-figure").count() == 1  # the sweep waits for its own


def test_block_tables_hide_the_pool_at_the_step_that_answers(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?step=3")
    assert page.locator(HELD).count() == 0  # asked before: nothing shown gives it away yet
    click_control(page, "forward")
    wait_settled(page)
    assert not shown(page, f"{HELD} .lab-figure")  # the pool and the tables at step 4
    assert not shown(page, f'{HELD} [data-testid="stMetricValue"]')
    answer(page, "bt_blocks", "3")
    assert shown(page, '.lab-figure[data-figure-key="pool"]')  # answered: all of step 4


def test_a_new_setting_asks_again(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?step=4")
    page.locator(".st-key-bt_tail_show button").click()
    wait_settled(page)
    assert "The engine says" in " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())
    page.locator('[data-testid="stMain"] [data-testid="stExpander"] summary',
                 has_text="Settings").first.click()
    thumb = page.locator(".st-key-output_len input")  # the slider's range input
    thumb.focus()
    thumb.press("ArrowLeft")  # output 4 -> 3 tokens: a new ending (asked at step 3, answered
    wait_settled(page)  # at step 4, where the page is), so a new answer
    assert "output_len=3" in page.url
    alerts = " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())
    assert "The engine says" not in alerts  # the old answer is gone: asked again
    assert page.locator(".st-key-bt_tail_guess input").count() == 1


def test_figures_have_words_and_steps_are_announced(page, app_url: str) -> None:
    open_page(page, f"{app_url}/block_tables?step=1")
    pool = page.locator('.lab-figure[data-figure-key="pool"]')
    assert pool.get_attribute("role") == "img"
    assert "A holds blocks 0, 1 (30 tokens)" in pool.get_attribute("aria-label")
    live = page.locator('[role="status"][aria-live="polite"]')
    assert "Step 1:" in live.inner_text() and "prefilled" in live.inner_text()
    click_control(page, "forward")
    wait_settled(page)
    assert "Step 2:" in live.inner_text()
    assert exceptions(page) == []
