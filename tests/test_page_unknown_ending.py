"""The unknown-ending page from the entry point: counters follow the engine, the quick guesses
and links set the guess, the question holds back what answers it."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.unknown_ending import EndingConfig, UnknownEndingStory, event_steps
from tests.page_helpers import assert_link_keeps, figures, metrics
from ui.chapters import CHAPTERS

PAGE = "pages/unknown_ending.py"
SECTION = "The problem is a cache with an unknown ending"


def expected(frame) -> dict[str, str]:
    c = frame.contiguous
    return {"Moves: contiguous": str(c.moves),
            "K/V copied": f"{c.copied_bytes / 1024:,.1f} KiB",
            "Reserved, unused": f"{c.unused_pct:.0f}%", "Waiting": str(c.waiting)}


def shown(at: AppTest) -> dict[str, str]:
    return {k: v for k, v in metrics(at).items() if k != "Copy time"}


def test_it_is_the_first_lesson_and_holds_the_guide_s_first_section() -> None:
    assert [c.url_path for c in CHAPTERS[:3]] == ["home", "unknown_ending", "block_tables"]
    assert CHAPTERS[1].sections == (SECTION,)
    assert all(SECTION not in c.sections for c in CHAPTERS if c.url_path != "unknown_ending")


def test_step_back_and_scrub_follow_the_engine(open_page) -> None:
    frames = UnknownEndingStory(EndingConfig(), 0).frames()
    at = open_page()
    assert not at.exception and not at.error
    assert shown(at) == expected(frames[0])
    assert at.slider(key="step").max == len(frames) - 1
    at.button(key="step_forward").click().run()
    assert shown(at) == expected(frames[1])
    at.button(key="step_back").click().run()
    assert shown(at) == expected(frames[0])
    moved = next(f.step for f in frames if f.logs["contiguous"].moves)
    at.slider(key="step").set_value(moved).run()
    assert shown(at) == expected(frames[moved])
    assert metrics(at)["Copy time"].endswith("s")  # the live run timed the copy
    assert "ue_map" in figures(at) and "ue_time" in figures(at)
    assert any(m.value.startswith(":green-badge[") for m in at.markdown)
    assert not at.exception


def test_the_quick_guesses_set_the_guess(open_page) -> None:
    at = open_page(step="40")
    at.button(key="ue_guess_high").click().run()
    assert at.slider(key="guess").value == EndingConfig().guess_high
    high = UnknownEndingStory(EndingConfig(guess=EndingConfig().guess_high), 0).frames()
    assert at.slider(key="step").max == len(high) - 1  # a new run, shown from its start
    assert shown(at) == expected(high[at.slider(key="step").value])
    at.slider(key="step").set_value(40).run()
    assert shown(at) == expected(high[40])
    assert int(shown(at)["Waiting"]) > 0
    at.button(key="ue_guess_low").click().run()
    assert at.slider(key="guess").value == 16
    assert not at.exception


def test_link_restores_the_same_state(open_page) -> None:
    query = dict(guess="48", requests="6", pool_slots="768", step="30", seed="2")
    cfg = EndingConfig(PoolConfig(num_blocks=48, block_size=16, num_kv_heads=2, head_dim=32),
                       guess=48, num_requests=6)
    frames = UnknownEndingStory(cfg, 2).frames()
    at = open_page(**query)
    assert not at.exception
    assert shown(at) == expected(frames[30])
    assert at.slider(key="step").value == 30
    assert_link_keeps(at, query)


def test_the_question_holds_back_the_step_that_answers_it(open_page) -> None:
    story = UnknownEndingStory(EndingConfig(), 0)
    frames = story.frames()
    longest = story.longest()
    reveal = story.first_growth(frames, longest.req_id)
    grown = len(story.moves_of(frames, longest.req_id)) + len(
        story.growths_of(frames, longest.req_id))
    assert grown >= 2  # the default guess makes the longest request grow more than once
    at = open_page(step=str(reveal - 1))  # asked the step before, nothing held yet
    assert any(f"How many times will R{longest.req_id}'s reservation **grow** in all?"
               in m.value for m in at.markdown)
    assert not any("held back" in c.value for c in at.caption)
    at.slider(key="step").set_value(reveal).run()
    assert any("held back" in c.value for c in at.caption)  # drawn hatched, with a note
    at.button(key="ue_growths_show").click().run()
    assert any(f"The engine says **{grown}**" in i.value for i in at.info)
    assert not any("held back" in c.value for c in at.caption)
    assert not at.exception


def test_a_question_past_its_step_is_closed_and_a_new_guess_asks_afresh(open_page) -> None:
    story = UnknownEndingStory(EndingConfig(), 0)
    frames = story.frames()
    reveal = story.first_growth(frames, story.longest().req_id)
    at = open_page(step=str(reveal + 1))
    assert "ue_growths_guess" not in {w.key for w in at.number_input}  # closed, answer shown
    assert any("The engine says" in i.value for i in at.info)
    at = open_page(step=str(reveal - 1))
    at.number_input(key="ue_growths_guess").set_value(1)
    at.button(key="ue_growths_check").click().run()
    assert any("you said 1" in e.value for e in at.error)
    at.button(key="ue_guess_high").click().run()  # a new setting: its question, an empty box
    assert not any("you said 1" in e.value for e in at.error)
    assert not at.exception


def test_next_event_jumps_to_the_first_move(open_page) -> None:
    story = UnknownEndingStory(EndingConfig(), 0)
    first = event_steps(story.frames())[0]
    at = open_page()
    jump = at.button(key="step_next_event")
    assert jump.label == f"Next: {first[1]}" and jump.help.startswith(f"Jump to step {first[0]}:")
    at.button(key="step_next_event").click().run()
    assert at.slider(key="step").value == first[0] and not at.exception
