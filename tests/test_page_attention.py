"""The Attention over blocks page: reading blocks in logical order, shuffling placement."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.attention import AttentionConfig, AttentionStory
from lab.scenarios.block_tables import WalkParams


def first_frame(block_size: int = 16, request: str = "A", placement: int = 0):
    walk = WalkParams(PoolConfig(num_blocks=64, block_size=block_size), output_len=20)
    return AttentionStory(AttentionConfig(walk, request, placement), 0).frames()[0]

PAGE = "pages/attention.py"


def table_line(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("**Block table of"))


def test_steps_read_blocks_in_logical_order(open_page) -> None:
    at = open_page()
    frame = first_frame()
    assert at.slider(key="step").max == len(frame.block_table)
    assert not at.table
    for step in (1, 2):
        at.button(key="step_forward").click().run()
        rows = at.table[0].value
        assert list(rows["physical block"]) == list(frame.block_table[:step])
    at.slider(key="step").set_value(len(frame.block_table)).run()
    assert at.table[0].value["max |output so far − final|"].iloc[-1] == "0.00e+00"
    assert not at.exception


def test_shuffle_moves_blocks_and_keeps_the_output(open_page) -> None:
    at = open_page()
    before = table_line(at)
    at.button(key="shuffle").click().run()
    assert at.number_input(key="placement").value == 1
    after = table_line(at)
    assert after != before and "as allocated" in after
    assert {m.label: m.value for m in at.metric}["Output change"] == "0.0e+00"
    badge = next(m.value for m in at.markdown if "badge" in m.value)
    assert badge.startswith(":green-badge[")


def test_link_restores_placement_sequence_and_step(open_page) -> None:
    query = dict(placement="2", seq="B", step="2", block_size="8")
    first, again = open_page(**query), open_page(**query)
    assert table_line(first) == table_line(again)
    assert table_line(first).startswith("**Block table of B**")
    frame = first_frame(8, "B", 2)
    assert list(first.table[0].value["physical block"]) == list(frame.block_table[:2])


def test_bad_combination_shows_a_message(open_page) -> None:
    at = open_page(prompt_len="250", output_len="250", requests="6", num_blocks="10")
    assert not at.exception and "the pool has 10" in at.error[0].value
