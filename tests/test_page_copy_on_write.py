"""The Copy-on-write page from the entry point: both engines' counters, copies and narration
follow the engine; each story asks its own question, once per setting."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from lab.figures.style import HIGHLIGHT_COLOR
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/copy_on_write.py"
DEFAULT_SETTING = "parallel_n4_p30_t12_b16_k32_s0"
BEAM_SETTING = "beam_n4_p30_t12_b16_k32_s0"


def expected(frame) -> dict[str, str]:
    return {"Blocks held (V0)": str(frame.v0.blocks_used),
            "Computed (V0)": str(frame.v0.total_computed),
            "Copies": str(frame.v0.total_copies),
            "Blocks held (V1)": str(frame.v1.blocks_used),
            "Computed (V1)": str(frame.v1.total_computed),
            "Recomputed": str(frame.v1.total_recomputed)}


def text(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def guesses(at: AppTest) -> list[str]:
    """The keys of the question boxes on the page."""
    return [n.key for n in at.number_input if n.key.endswith("_guess")]


def answer(at: AppTest, key: str, value: int) -> AppTest:
    at.number_input(key=f"{key}_guess").set_value(value)
    return at.button(key=f"{key}_check").click().run()


def test_step_back_reset_follow_both_engines(open_page) -> None:
    frames = CopyOnWriteStory(BranchConfig(), 0).frames()
    at = open_page()
    assert not at.exception and not at.error
    # Step 0: V0 prefilled once and forked (2 blocks); V1's four child requests hold 5 and
    # computed the prompt's 14-token tail three more times.
    assert metrics(at) == expected(frames[0])
    assert metrics(at)["Blocks held (V0)"] == "2" and metrics(at)["Blocks held (V1)"] == "5"
    assert metrics(at)["Recomputed"] == "42"
    assert "vLLM V0 (the paper, 2023)" in text(at) and "vLLM V1 (0.33)" in text(at)
    at = answer(at, f"cow_copies_{DEFAULT_SETTING}", 3)
    assert at.success and at.success[0].value.startswith("Right: **3**")
    at.button(key="step_forward").click().run()
    assert metrics(at) == expected(frames[1])
    # The copy is on V0's pool: the shared source block and its three copies are outlined.
    tiles = next(t for t in figures(at)["cow_pool_v0"]["data"] if t.get("name") == "tiles")
    assert sum(c == HIGHLIGHT_COLOR for c in tiles["marker"]["line"]["color"]) == 4
    tiles = next(t for t in figures(at)["cow_pool_v1"]["data"] if t.get("name") == "tiles")
    assert HIGHLIGHT_COLOR not in tiles["marker"]["line"]["color"]  # V1 copies nothing
    assert "copy-on-write copies it to block(s) **2, 3, 4**" in text(at)
    assert any(m.value.startswith(":green-badge[") for m in at.markdown)
    at.button(key="step_forward").click().run()
    at.button(key="step_back").click().run()
    assert metrics(at) == expected(frames[1])
    at.button(key="step_reset").click().run()
    assert metrics(at) == expected(frames[0])
    assert not at.exception


def test_each_story_and_setting_asks_its_own_question(open_page) -> None:
    at = open_page()
    key = f"cow_copies_{DEFAULT_SETTING}"
    at = answer(at, key, 3)
    assert any("1 of 1 on this page" in c.value for c in at.caption)
    # Beam search asks about V1's compute, not the sampling question again, with an empty box.
    at.query_params["mode"] = "Beam search"
    at = at.run()
    beam_key = f"cow_beam_compute_{BEAM_SETTING}"
    assert guesses(at) == [f"{beam_key}_guess"]
    assert at.number_input(key=f"{beam_key}_guess").value is None
    assert "How many tokens does V1 compute at step 1" in text(at)
    at = answer(at, beam_key, 1)  # wrong: the sampling answer is not overwritten
    assert any("1 of 2 on this page" in c.value for c in at.caption)
    # A new setting: a new, empty question; the old right answer still counts.
    at.query_params["prompt_len"] = "20"
    at = at.run()
    (key,) = guesses(at)
    assert key != f"{beam_key}_guess" and at.number_input(key=key).value is None
    # Back to sampling with the first settings: the question already answered stays answered,
    # not asked again.
    at.query_params["mode"], at.query_params["prompt_len"] = "Parallel sampling", "30"
    at = at.run()
    assert guesses(at) == [] and at.success[0].value.startswith("Right: **3**")
    assert not at.exception


def test_next_event_jumps_to_the_copy_and_the_lesson_offers_itself(open_page) -> None:
    at = open_page()
    assert at.button(key="step_next_event").label == "Next: copy-on-write"
    assert at.button(key="step_next_event").help.startswith("Jump to step 1: copy-on-write")
    assert at.button(key="copy_on_write_lesson_build") is not None
    at.button(key="step_next_event").click().run()
    assert at.button(key="step_next_event").label == "Next: a branch ends"
    assert not at.exception


def test_beam_search_narrates_in_the_order_things_happen(open_page) -> None:
    """Step 6 of the default beam search: two beams are dropped (blocks 1 and 3 freed) and then
    copy-on-write takes those same blocks again. The drop is told first, the copy says the
    blocks were just freed, and the pool shows them in use."""
    cfg = BranchConfig(mode="beam")
    frame = CopyOnWriteStory(cfg, 0).frames()[6]
    at = open_page(mode="Beam search", step="6", classroom="1")
    assert not at.exception
    lines = [line for m in at.markdown if m.value.startswith("- ")
             for line in m.value.split("\n")]
    drop = next(i for i, line in enumerate(lines) if "dropped (not among the best beams)" in line)
    copy = next(i for i, line in enumerate(lines) if "copy-on-write copies it" in line)
    assert drop < copy
    assert "freed just before, taken again" in lines[copy]
    used = {b.block_id for b in frame.v0.snapshot.blocks if b.ref_count}
    assert {1, 3} <= used
    assert metrics(at) == expected(frame)


def test_link_restores_beam_search(open_page) -> None:
    query = dict(mode="Beam search", branches="3", prompt_len="20", block_size="8", step="4",
                 seed="2", classroom="1")
    cfg = BranchConfig(PoolConfig(num_blocks=32, block_size=8), mode="beam", num_branches=3,
                       prompt_len=20)
    frames = CopyOnWriteStory(cfg, 2).frames()
    at = open_page(**query)
    assert not at.exception
    assert metrics(at) == expected(frames[4])
    query.pop("classroom")
    assert_link_keeps(at, query)


def test_pool_too_small_shows_a_message(open_page) -> None:
    at = open_page(branches="8", prompt_len="128", new_tokens="48", num_blocks="8")
    assert not at.exception
    assert "cannot run" in at.error[0].value and "the pool has 8" in at.error[0].value
    assert not figures(at)
