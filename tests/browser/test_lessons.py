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
           ("prefix_cache?step=9", "prefix_hits"), ("calculator", "calc_bytes")]
HELD = '[class*="st-key-lab_hatched_"]'


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


def test_fragmentation_ends_saying_each_side_is_done_with_its_waste_over_the_run(
        page, app_url: str) -> None:
    open_page(page, f"{app_url}/fragmentation?step=141")
    click_control(page, "forward")  # the last step
    wait_settled(page)
    plot = page.locator('.lab-figure[data-figure-key="frag_map"]')
    words = plot.inner_text()
    assert "finished at step 72; every block is back in the free pool" in words
    assert "finished at step 142; every reservation is back in the free pool" in words
    values = page.locator('[data-testid="stMetricValue"]').all_inner_texts()
    assert values[2:] == ["56% avg", "4% avg"]  # not 0% / 0% of two empty pools
    assert exceptions(page) == []


def test_fragmentation_block_size_question_shows_its_lengths_and_no_winner(page,
                                                                           app_url: str) -> None:
    open_page(page, f"{app_url}/fragmentation")
    form = page.locator(".st-key-frag_doubling_form, [data-testid='stForm']").filter(
        has_text="doubles from 16 to 32")
    assert "prompt (16-96 tokens)" in form.inner_text()
    form.get_by_text("entries about halve, the empty tail about doubles").click()
    page.locator(".st-key-frag_doubling_check button").click()
    wait_settled(page)
    verdict = " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())
    assert "Right:" in verdict
    assert "no universal block size" in verdict and "Right: 16" not in verdict
    assert exceptions(page) == []


def test_prefix_cache_asks_once_closes_after_its_step_and_says_why(page, app_url: str) -> None:
    open_page(page, f"{app_url}/prefix_cache?step=8")
    asked = '.st-key-prefix_hits_guess input'
    assert page.locator(asked).count() == 0  # not yet: asked the step before its admission
    click_control(page, "forward")
    wait_settled(page)
    assert page.locator(asked).count() == 1  # step 9
    tiles = page.locator('.lab-figure[data-figure-key="prefix_pool"]').inner_text()
    assert "cached C·L0" in tiles and "B·L0" not in tiles  # app B's prompt is gone
    click_control(page, "forward")  # step 10, unanswered: its pool is held back
    wait_settled(page)
    assert not shown(page, f'{HELD} .lab-figure[data-figure-key="prefix_pool"]')
    answer(page, "prefix_hits", "0")
    verdict = " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())
    assert "Right: 0" in verdict and "B·L0 had been evicted at step 8" in verdict
    click_control(page, "forward")  # step 11: closed, nothing held
    wait_settled(page)
    assert page.locator(asked).count() == 0 and page.locator(HELD).count() == 0
    assert exceptions(page) == []


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
