"""AppTest for the real-model page: a short generation, the second request's prefix-cache hit."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.test_model import one_torch_thread  # noqa: F401  (autouse fixture)

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "model.py")


def metric(at: AppTest, label: str) -> str:
    return next(str(m.value) for m in at.metric if m.label == label)


def metrics(at: AppTest, label: str) -> list[str]:
    return [str(m.value) for m in at.metric if m.label == label]


def test_generate_then_second_request_reuses_the_system_prompt() -> None:
    at = AppTest.from_file(PAGE, default_timeout=240)
    at.query_params.update({"model_max_new": "4", "model_n": "2", "model_decoding": "sampling"})
    at.run()
    assert not at.exception
    assert any("per block" in m.value and "equal" in m.value for m in at.markdown)
    at.button(key="model_generate").click().run()
    assert not at.exception
    assert metric(at, "Same as dense cache") == "yes"
    assert metric(at, "Reused from prefix cache") == "0"
    copy_note = next(i.value for i in at.info if "Copy-on-write" in i.value)  # one partial block
    assert "(vLLM V0's mechanism)" in copy_note and "as 2 child requests" in copy_note
    prompt = int(metric(at, "Prompt tokens"))
    full, tail = divmod(prompt, 16)
    # The same samples held both ways, shown at step 0: V0 prefilled once and shares every
    # prompt block; V1's second child found the full blocks and computed the partial one again.
    assert [m.value for m in at.markdown if m.value.startswith("**vLLM V")] == [
        "**vLLM V0 (the paper, 2023): fork + copy-on-write**",
        "**vLLM V1 (0.33): child requests through the prefix cache**"]
    assert metrics(at, "Blocks held") == [str(full + 1), str(full + 2)]
    assert metrics(at, "Computed") == [str(prompt), str(prompt + tail)]
    step0 = next(m.value for m in at.markdown if m.value.startswith("**Step 0.**"))
    assert (f"S1 found 0 tokens (0 full blocks) and computed {prompt}; S2 found {full * 16} "
            f"tokens ({full} full blocks) and computed {tail}, {tail} tokens computed again"
            in step0)
    over = next(m.value for m in at.markdown if m.value.startswith("**Over the run.**"))
    assert f"({tail} more than V0)" in over and "the same most likely token **every time**" in over
    texts = [m.value for m in at.markdown if m.value.startswith("**sample")]
    assert len(texts) == 2
    at.button(key="model_second").click().run()
    assert not at.exception
    assert int(metric(at, "Reused from prefix cache")) >= 16  # the system prompt's full blocks
    assert metric(at, "Same as dense cache") == "yes"


def test_an_answer_shows_its_end_of_turn_token_in_words() -> None:
    at = AppTest.from_file(PAGE, default_timeout=240)
    at.query_params.update({"model_max_new": "16"})
    at.run()
    at.button(key="model_generate").click().run()
    assert not at.exception
    (answer,) = [m.value for m in at.markdown if m.value.startswith("**sample")]
    assert "Paris" in answer and "⟨end of turn⟩" in answer
    assert "im_end" not in answer


def test_a_request_too_big_for_the_pool_gets_a_clear_message() -> None:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params.update({"model_pool": "16", "model_n": "4", "model_max_new": "96",
                            "model_block_size": "8"})
    at.run()
    at.button(key="model_generate").click().run()
    assert not at.exception
    assert any("more blocks than the pool has free" in e.value for e in at.error)
