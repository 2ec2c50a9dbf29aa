"""The Block tables page, driven from the entry point: counters and figures follow the engine."""

from __future__ import annotations

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.block_tables import BlockTablesStory, WalkParams
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/block_tables.py"


def engine_usage(step: int, params: WalkParams | None = None, seed: int = 0):
    return BlockTablesStory(params or WalkParams(), seed).frames()[step].snapshot.usage


def test_step_back_reset_scrub_follow_the_engine(open_page) -> None:
    at = open_page()
    assert not at.exception and metrics(at)["Blocks in use"] == "0 / 64"
    for step in range(1, 5):
        at.button(key="step_forward").click().run()
        usage = engine_usage(step)
        shown = metrics(at)
        assert shown["Blocks in use"] == f"{usage.blocks_used} / 64"
        assert shown["Filled slots"] == str(usage.slots_filled)
        assert shown["Unused tail slots"] == str(usage.tail_slots)
    at_four = figures(at)
    at.button(key="step_back").click().run()
    assert metrics(at)["Blocks in use"] == f"{engine_usage(3).blocks_used} / 64"
    assert figures(at) != at_four
    at.slider(key="step").set_value(4).run()
    assert figures(at) == at_four  # scrubbing back to a step shows it exactly as it was
    at.button(key="step_reset").click().run()
    assert metrics(at)["Blocks in use"] == "0 / 64"
    assert not at.exception


def test_each_step_runs_the_kernel_against_dense_attention(open_page) -> None:
    at = open_page(step="3")
    badge = [m.value for m in at.markdown if "badge" in m.value]
    assert badge and badge[0].startswith(":green-badge[") and "max abs error" in badge[0]


def test_link_restores_the_same_state(open_page) -> None:
    query = dict(block_size="8", prompt_len="20", output_len="9", requests="2", step="6",
                 seed="5")
    params = WalkParams(PoolConfig(num_blocks=64, block_size=8), prompt_len=20, output_len=9,
                        num_requests=2)
    first = open_page(**query)
    again = open_page(**query)
    assert figures(first) == figures(again)
    assert metrics(first)["Blocks in use"] == f"{engine_usage(6, params, 5).blocks_used} / 64"
    assert_link_keeps(first, query)


def test_pool_too_small_shows_a_message(open_page) -> None:
    at = open_page(prompt_len="200", output_len="200", requests="6", num_blocks="8")
    assert not at.exception
    assert "the pool has 8" in at.error[0].value
    assert not figures(at)


def test_last_step_matches_the_walk(open_page) -> None:
    at = open_page(output_len="7")
    assert at.slider(key="step").max == BlockTablesStory(WalkParams(output_len=7), 0).last_step


def test_predict_answers_come_from_the_engine(open_page) -> None:
    at = open_page(step="4")  # A has 33 tokens; its last token comes next: both asked
    at.button(key="bt_blocks_show").click().run()
    assert "engine says **3**" in at.info[0].value  # 33 tokens of 16: three blocks
    at.number_input(key="bt_tail_guess").set_value(14)  # a form: sent with Check
    at.button(key="bt_tail_check").click().run()
    assert at.success[0].value.startswith("Right: **14**")


def test_a_locked_class_link_locks_the_seed_and_hides_the_link_maker(open_page) -> None:
    at = open_page(lock="1", seed="7")
    assert not at.exception
    seed_box = next(n for n in at.sidebar.number_input if n.label == "Random seed")
    assert seed_box.disabled and seed_box.value == 7
    assert not [e for e in at.sidebar.expander if e.label == "Make a class link"]
    assert "locked" in " ".join(c.value for c in at.sidebar.caption)
    unlocked = open_page(seed="7")
    assert not next(n for n in unlocked.sidebar.number_input if n.label == "Random seed").disabled
    assert [e for e in unlocked.sidebar.expander if e.label == "Make a class link"]
