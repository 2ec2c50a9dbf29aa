"""The shared UI components, each in a tiny app: step controls, link state, classroom mode,
predict-then-reveal."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

TIMEOUT = 60


def _step_app() -> None:
    import streamlit as st

    from ui.sidebar import sidebar
    from ui.step_controls import step_controls

    st.session_state["_ui_current_page"] = st.session_state.get("test_page", "a")  # as app.py
    sidebar()
    st.title("steps")
    shown = step_controls(st.session_state.get("test_last", 5),
                          events=st.session_state.get("test_events", ()))
    st.text(f"shown={shown}")


def _shown(at: AppTest) -> int:
    return int(at.text[0].value.removeprefix("shown="))


def _step_test(**query: str) -> AppTest:
    at = AppTest.from_function(_step_app, default_timeout=TIMEOUT)
    for name, value in query.items():
        at.query_params[name] = value
    return at.run()


def test_step_back_reset_and_scrub() -> None:
    at = _step_test()
    assert _shown(at) == 0 and at.button(key="step_back").disabled
    for _ in range(3):
        at.button(key="step_forward").click().run()
    assert _shown(at) == 3
    at.button(key="step_back").click().run()
    assert _shown(at) == 2
    at.slider(key="step").set_value(5).run()
    assert _shown(at) == 5 and at.button(key="step_forward").disabled
    at.button(key="step_reset").click().run()
    assert _shown(at) == 0
    assert not at.exception


def test_next_event_jumps_to_the_first_event_ahead_and_says_which() -> None:
    at = AppTest.from_function(_step_app, default_timeout=TIMEOUT)
    at.session_state["test_events"] = [(4, "preemption"), (2, "copy"), (2, "later label")]
    at.run()
    jump = at.button(key="step_next_event")
    assert jump.label == "Next: copy" and not jump.disabled
    assert jump.help.startswith("Jump to step 2: copy")
    jump.click().run()
    assert _shown(at) == 2 and at.button(key="step_next_event").label == "Next: preemption"
    assert at.button(key="step_next_event").help.startswith("Jump to step 4: preemption")
    at.button(key="step_next_event").click().run()
    assert _shown(at) == 4
    jump = at.button(key="step_next_event")
    assert jump.disabled and jump.label == "No event ahead"
    at.button(key="step_back").click().run()  # Back: the event is ahead again
    assert at.button(key="step_next_event").label == "Next: preemption"
    assert not at.exception


def test_no_events_no_next_event_button() -> None:
    at = _step_test()
    assert "step_next_event" not in {b.key for b in at.button}


def test_step_is_clamped_when_the_range_shrinks() -> None:
    at = _step_test()
    at.slider(key="step").set_value(5).run()
    at.session_state["test_last"] = 2
    at.run()
    assert _shown(at) == 2
    at.session_state["test_last"] = 0  # nothing to step through: no slider, buttons off
    at.run()
    assert _shown(at) == 0 and not at.slider and at.button(key="step_play").disabled


def test_another_page_starts_at_step_zero() -> None:
    at = _step_test()
    at.slider(key="step").set_value(4).run()
    at.run()
    assert _shown(at) == 4  # same page: the step stays
    at.session_state["test_page"] = "b"
    at.run()
    assert _shown(at) == 0


def test_play_advances_one_step_per_tick_and_stops_at_the_end() -> None:
    at = _step_test()
    at.button(key="step_play").click().run()
    assert at.button(key="step_play").label == "Pause"
    for expected in (1, 2):  # what the timer fragment asks for on each tick
        at.session_state["step_advance"] = True
        at.run()
        assert _shown(at) == expected
    at.slider(key="step").set_value(5).run()  # scrubbing to the end stops playing
    assert at.button(key="step_play").label == "Play"
    at.button(key="step_play").click().run()  # Play at the end starts over
    assert _shown(at) == 0 and at.button(key="step_play").label == "Pause"
    at.button(key="step_forward").click().run()  # a manual step pauses
    assert at.button(key="step_play").label == "Play"


def test_link_restores_step_and_rejects_bad_values() -> None:
    assert _shown(_step_test(step="4")) == 4
    at = _step_test(step="99")
    assert _shown(at) == 0
    assert "step=99" in at.warning[0].value and "0 to 5" in at.warning[0].value


def _params_app() -> None:
    import streamlit as st

    from ui.layout import explain, settings
    from ui.sidebar import sidebar
    from ui.state import choice_param, float_param, int_param, share_url

    sidebar()
    st.title("params")
    with settings():
        size = int_param("Block size", "block_size", default=16, min_value=1, max_value=64)
        ratio = float_param("Ratio", "ratio", default=0.5, min_value=0.0, max_value=1.0,
                            step=0.1)
        mode = choice_param("Mode", "mode", ["grid", "list"], default="grid")
    explain("Some teaching text.")
    st.text(f"size={size} ratio={ratio} mode={mode}")
    st.text(share_url())


def _params_test(**query: str) -> AppTest:
    at = AppTest.from_function(_params_app, default_timeout=TIMEOUT)
    for name, value in query.items():
        at.query_params[name] = value
    return at.run()


def test_params_come_from_the_link_and_go_into_the_copy_link() -> None:
    at = _params_test(block_size="32", mode="list", seed="7")
    assert at.text[0].value == "size=32 ratio=0.5 mode=list"
    link = at.text[1].value
    for part in ("seed=7", "block_size=32", "ratio=0.5", "mode=list"):
        assert part in link
    assert at.sidebar.get("code")[0].value == link  # the sidebar's copy-link box
    at.slider(key="block_size").set_value(8).run()
    assert "block_size=8" in at.text[1].value


def test_bad_link_values_show_a_message_not_a_traceback() -> None:
    at = _params_test(block_size="abc", mode="table")
    assert at.text[0].value == "size=16 ratio=0.5 mode=grid"
    messages = " ".join(w.value for w in at.warning)
    assert "block_size=abc" in messages and "mode=table" in messages
    assert not at.exception


def test_classroom_mode_collapses_text_and_loads_large_styles() -> None:
    normal = _params_test()
    assert "Explanation" not in {e.label for e in normal.expander}
    assert normal.markdown[0].value == "Some teaching text."
    at = _params_test(classroom="1")
    assert at.toggle(key="classroom").value is True
    assert {e.label for e in at.expander} >= {"Settings", "Explanation"}
    assert "Classroom mode" in at.get("html")[0].value  # classroom.css is loaded
    assert "classroom=1" in at.text[1].value
    at.toggle(key="classroom").set_value(False).run()
    assert "Explanation" not in {e.label for e in at.expander}
    assert "classroom" not in at.query_params


def _predict_app() -> None:
    import streamlit as st

    from ui.predict import Question, hatched
    from ui.state import begin_run

    begin_run()  # what every page's sidebar() does first

    def costly_answer() -> int:  # counts its calls: it must run only once asked
        st.session_state["answer_calls"] = st.session_state.get("answer_calls", 0) + 1
        return 3

    block_size = st.session_state.get("block_size", 16)
    question = Question("q", "How many blocks hold 33 tokens?", answer=costly_answer,
                        explanation="Round up.", context=block_size)
    with hatched(question.answered, "the pool", key="pool"):
        st.text("the answer, in a figure")
    question.ask()


def test_predict_then_reveal() -> None:
    at = AppTest.from_function(_predict_app, default_timeout=TIMEOUT).run()
    assert not at.success and not at.error and "answer_calls" not in at.session_state
    assert "held back" in at.caption[0].value
    at.button(key="q_check").click().run()  # Check with nothing typed: asked to type first
    assert "prediction first" in at.warning[0].value and not at.error
    at.number_input(key="q_guess").set_value(2)  # a form: the guess travels with Check
    at.button(key="q_check").click().run()
    assert "you said 2, the engine says **3**" in at.error[0].value
    assert "held back" not in " ".join(c.value for c in at.caption)
    assert "0 of 1 on this page" in at.caption[-1].value
    # Answered, the question is closed: its verdict, no box to answer it again.
    assert "q_guess" not in {w.key for w in at.number_input}
    assert "q_check" not in {b.key for b in at.button}


def test_a_new_setting_clears_the_old_guess_and_keeps_the_old_score() -> None:
    at = AppTest.from_function(_predict_app, default_timeout=TIMEOUT).run()
    at.number_input(key="q_guess").set_value(3)
    at.button(key="q_check").click().run()
    assert "1 of 1 on this page" in at.caption[-1].value
    at.session_state["block_size"] = 8  # a new question: the box is empty again
    at.run()
    assert at.number_input(key="q_guess").value is None and not at.success
    at.number_input(key="q_guess").set_value(1)
    at.button(key="q_check").click().run()
    assert "1 of 2 on this page" in at.caption[-1].value  # the right answer still counts
    at.session_state["block_size"] = 16  # back: the old setting's question, asked anew
    at.run()
    assert at.number_input(key="q_guess").value is None and not at.success and not at.error
    at.number_input(key="q_guess").set_value(5)
    at.button(key="q_check").click().run()  # wrong this time: the score it had stays
    assert "1 of 2 on this page" in at.caption[-1].value


def test_a_new_context_asks_again_and_just_show_me_reveals() -> None:
    at = AppTest.from_function(_predict_app, default_timeout=TIMEOUT).run()
    at.button(key="q_show").click().run()
    assert "engine says **3**" in at.info[0].value and not at.success
    at.session_state["block_size"] = 8  # a setting the answer depends on changes
    at.run()
    assert not at.info and "held back" in at.caption[0].value


def test_gate_asks_a_question_the_step_before_its_answer_and_closes_it_after(
        monkeypatch) -> None:
    from ui import predict

    monkeypatch.setattr(predict.Question, "answered", property(lambda q: q.key == "done"))
    early, late, done = (predict.Question(k, k, 1, "") for k in ("early", "late", "done"))
    steps = [(early, 2), (late, 6), (done, 1)]
    before = predict.gate(steps, 0)
    assert before.due == (done,) and before.later == () and not before.hatch
    assert not before.asking  # the only question due is answered
    asked = predict.gate(steps, 1)
    assert asked.due == (early, done) and not asked.hatch and asked.asking
    at_reveal = predict.gate(steps, 2)
    assert at_reveal.due == (early,) and at_reveal.hatch and at_reveal.later == (done,)
    assert not early.closed and done.closed and late.reveal == 6
    past = predict.gate(steps, 3)  # early's step went by unanswered: closed, nothing held
    assert past.due == () and past.later == (early, done) and not past.hatch
    assert early.closed and not past.asking
    assert predict.gate(steps, 5).due == (late,) and predict.gate(steps, 6).hatch


def test_a_question_past_its_step_is_closed_with_the_engine_s_answer() -> None:
    at = AppTest.from_function(_gated_app, default_timeout=TIMEOUT)
    at.session_state["step"] = 2  # the question's answer is at step 1: its step went by
    at.run()
    assert "q_guess" not in {w.key for w in at.number_input}
    assert "engine says **3**" in at.info[0].value and "held back" not in " ".join(
        c.value for c in at.caption)
    at.session_state["step"] = 1
    at.run()  # at its step, unanswered: open, and the step held back
    assert at.number_input(key="q_guess").value is None and "held back" in at.caption[0].value


def test_classroom_mode_closes_a_question_at_its_step(monkeypatch) -> None:
    from ui import predict

    monkeypatch.setattr(predict, "is_classroom", lambda: True)
    question = predict.Question("q", "q", 1, "")
    assert not predict.gate([(question, 3)], 2).hatch and not question.closed
    predict.gate([(question, 3)], 3)
    assert question.closed  # the answer is on the projector: the question shows it too


def _gated_app() -> None:
    import streamlit as st

    from ui.predict import Question, gate, hatched
    from ui.state import begin_run

    begin_run()
    question = Question("q", "How many blocks hold 33 tokens?", answer=3,
                        explanation="Round up.", context=16)
    questions = gate([(question, 1)], st.session_state.get("step", 0))
    for asked in questions.due:
        asked.ask()
    with hatched(not questions.hatch, "the pool", key="pool"):
        st.text("the answer, in a figure")
    for asked in questions.later:
        asked.ask()


def _figure_app() -> None:
    import plotly.graph_objects as go

    from ui.layout import show_figure

    show_figure(go.Figure(go.Bar(x=[1, 2], y=[3, 4])), key="bars", file_name="bars")


def test_figures_go_to_the_figure_view_with_plotly_js_served(tmp_path, monkeypatch) -> None:
    from tests.page_helpers import figures
    from ui import figure_view

    served = tmp_path / "static" / "plotly.min.js"
    monkeypatch.setattr(figure_view, "SERVED_JS", served)
    figure_view.plotly_js_served.cache_clear()
    try:
        at = AppTest.from_function(_figure_app, default_timeout=TIMEOUT).run()
        assert served.read_bytes() == figure_view.PLOTLY_JS.read_bytes()
    finally:
        figure_view.plotly_js_served.cache_clear()
    assert not at.exception and not at.get("plotly_chart")
    shown = figures(at)["bars"]
    assert shown["data"][0]["type"] == "bar" and list(shown["data"][0]["y"]) == [3, 4]


def test_figures_fall_back_to_plotly_chart_when_plotly_js_cannot_be_served(
        tmp_path, monkeypatch) -> None:
    from ui import figure_view

    blocker = tmp_path / "static"
    blocker.write_text("a file where the folder should be")  # the copy fails with an OSError
    monkeypatch.setattr(figure_view, "SERVED_JS", blocker / "plotly.min.js")
    figure_view.plotly_js_served.cache_clear()
    try:
        at = AppTest.from_function(_figure_app, default_timeout=TIMEOUT).run()
    finally:
        figure_view.plotly_js_served.cache_clear()
    assert not at.exception and not at.get("bidi_component")
    assert len(at.get("plotly_chart")) == 1  # the same figure, drawn by st.plotly_chart


def test_story_frames_are_shared_not_copied() -> None:
    """A page's rerun gets the very frames already computed (st.cache_data would unpickle a
    copy on every rerun: 37 ms for the Fragmentation page's frames)."""
    from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory
    from ui.scenario import frames

    first = frames(CopyOnWriteStory(BranchConfig(), 0))
    assert frames(CopyOnWriteStory(BranchConfig(), 0)) is first
    assert frames(CopyOnWriteStory(BranchConfig(), 1)) is not first  # another seed


def test_shared_results_stay_within_their_budget() -> None:
    """Frames are kept for every session within a total (ui.scenario.MAX_SHARED_FRAMES), so no
    sequence of settings, however long, makes the shared cache grow past it."""
    from ui.memo import _Within

    made: list[int] = []
    cache = _Within(lambda n: made.append(n) or tuple(range(n)), len, budget=10)
    first = cache.get((4,))
    assert cache.get((4,)) is first and made == [4]  # shared, not computed again
    cache.get((5,))
    assert (len(cache), cache.weight) == (2, 9)
    cache.get((3,))  # 12 frames: the least recently used (4) goes
    assert (len(cache), cache.weight) == (2, 8)
    cache.get((4,))
    assert made == [4, 5, 3, 4] and cache.weight == 7  # 5 went to make room
    cache.get((50,))  # past the budget alone: kept, and only it
    assert (len(cache), cache.weight) == (1, 50)


def _memo_app() -> None:
    import streamlit as st

    from ui.memo import per_user

    made = st.session_state.setdefault("made", [])
    value = per_user("thing", st.session_state.get("params", 1), lambda: made.append(1) or
                     len(made))
    st.text(f"value={value}")


def test_per_user_state_is_rebuilt_only_when_its_params_change() -> None:
    at = AppTest.from_function(_memo_app, default_timeout=TIMEOUT).run()
    at.run()
    assert at.text[0].value == "value=1" and at.session_state["made"] == [1]
    at.session_state["params"] = 2
    at.run()
    assert at.text[0].value == "value=2"
