"""The Mixed attention page from the entry point: counters, tables and questions follow the
engine (lab/scenarios/mixed_attention.py)."""

from __future__ import annotations

from lab.memory.kv_cache_groups import NULL_BLOCK
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.mixed_attention import MixedAttentionStory, MixedParams
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/mixed_attention.py"


def expected(frame, num_blocks: int = 18) -> dict[str, str]:
    used = [b for b in frame.blocks if b.state == "used"]
    nulls = sum(b == NULL_BLOCK for r in frame.requests for t in r.tables for b in t)
    return {"Blocks in use": f"{num_blocks - frame.num_free} / {num_blocks}",
            "Full-attention blocks": str(sum(b.group == 0 for b in used)),
            "Sliding-window blocks": str(sum(b.group == 1 for b in used)),
            "Null entries": str(nulls)}


def test_steps_follow_the_engine(open_page) -> None:
    frames = MixedAttentionStory(MixedParams(), 0).frames()
    at = open_page(step="2")
    assert not at.exception and not at.error
    assert metrics(at) == expected(frames[2])
    assert metrics(at)["Null entries"] == "3"  # A's window left logical blocks 0-2
    tables = figures(at)["mixed_tables"]
    assert [t["text"][0] for t in tables["data"]] == [
        ["0", "1", "2", "3", "4", "10"], ["null", "null", "null", "8", "9", "11"]]
    at.button(key="step_forward").click().run()
    assert metrics(at) == expected(frames[3])
    assert any("16 tokens" in m.value and "both groups" in m.value for m in at.markdown)
    assert sum(m.value.startswith(":green-badge[") for m in at.markdown) >= 2  # all, full
    at.button(key="step_back").click().run()
    assert metrics(at) == expected(frames[2])
    assert not at.exception


def test_the_hit_question_holds_back_its_answer(open_page) -> None:
    at = open_page(step="12")  # C arrives: its hit is the question
    assert not at.exception
    asked = [m.value for m in at.markdown if "How many prompt tokens" in m.value]
    assert asked and "alone would find 16" in asked[0]
    assert any("held back" in c.value for c in at.caption)  # caption, counters, figures
    at.button(key="mx_hit_show").click().run()
    assert "mx_window_guess" not in {n.key for n in at.number_input}  # its step 6 went by
    assert not any("held back" in c.value for c in at.caption)
    shown = " ".join(m.value for m in at.markdown)
    assert "the sliding window only 0" in shown and "**0 tokens**" in shown
    assert any("The engine says **0**" in i.value for i in at.info)


def test_the_window_question_is_checked_against_the_engine(open_page) -> None:
    at = open_page(step="5")  # asked the step before A decodes position 24
    asked = [m.value for m in at.markdown if "sliding-window group?" in m.value]
    assert asked and "position 24" in asked[0]  # A's fifth decode
    at.number_input(key="mx_window_guess").set_value(3)  # positions 17-24: blocks 4, 5, 6
    at.button(key="mx_window_check").click().run()
    assert at.success[0].value.startswith("Right: **3**")


def test_link_restores_other_settings(open_page) -> None:
    query = dict(block_size="8", window="16", output_len="20", num_blocks="40", step="9")
    params = MixedParams(PoolConfig(40, 8, num_layers=2), window=16, output_len=20)
    frames = MixedAttentionStory(params, 0).frames()
    at = open_page(**query)
    assert not at.exception
    assert metrics(at) == expected(frames[9], 40)
    assert_link_keeps(at, query)


def test_pool_too_small_shows_a_message(open_page) -> None:
    at = open_page(num_blocks="8")
    assert not at.exception
    assert "pool's 8" in at.error[0].value
    assert not figures(at)


def test_the_window_explanation_waits_for_the_window_question(open_page) -> None:
    """The explanation and a counter's help give the steady window count (the window
    question's answer): held back until it is answered."""
    def why(at) -> bool:
        return any(m.value.startswith("**Why does the sliding window level off?**")
                   for m in at.markdown)

    at = open_page()  # not asked yet: the explanation is not there
    tip = next(m for m in at.metric if m.label == "Sliding-window blocks").help
    assert "at most" not in tip and not why(at)
    at = open_page(step="5")  # the window question is asked the step before its answer
    assert any("Why the window levels off held back" in c.value for c in at.caption)
    at.button(key="mx_window_show").click().run()
    assert not any("held back" in c.value for c in at.caption)
    tip = next(m for m in at.metric if m.label == "Sliding-window blocks").help
    assert "at most ⌈(window − 1) / block size⌉ + 1 = 3" in tip
    assert any(m.value.startswith("**Why does the sliding window level off?**")
               for m in at.markdown)


def test_an_answered_question_closes_after_the_step_that_answers_it(open_page) -> None:
    def asked(at) -> bool:
        return any("sliding-window group?" in m.value for m in at.markdown)

    at = open_page(step="5")  # due: A's fifth decode is step 6
    assert asked(at)
    at.button(key="mx_window_show").click().run()
    assert any("The engine says **3**" in i.value for i in at.info)
    at.button(key="step_forward").click().run()  # step 6 shows the answer, and the verdict
    assert asked(at) and not any("held back" in c.value for c in at.caption)
    at.button(key="step_forward").click().run()  # step 7: closed
    assert not asked(at) and not at.exception
    at.slider(key="step").set_value(12).run()  # the hit question is due; nothing else
    assert not asked(at)
    assert any("How many prompt tokens" in m.value for m in at.markdown)


def test_the_hit_question_names_what_the_window_group_needs(open_page) -> None:
    at = open_page(step="11")  # the window question closed after its step (6)
    asked = next(m.value for m in at.markdown if "How many prompt tokens" in m.value)
    assert "positions *h* − 7 to *h* − 1" in asked and "(0, 4, 8, 12, 16)" in asked


def test_the_lesson_downloads(open_page) -> None:
    at = open_page()
    at.button(key="mixed_attention_lesson_build").click().run(timeout=600)
    assert not at.exception and not at.warning
    assert [b for b in at.get("download_button")
            if b.proto.label.startswith("Save the lesson")]
