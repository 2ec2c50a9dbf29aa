""""Predict, then reveal": a question the learner answers before the page shows the answer.

    predict("bt_blocks", "How many physical blocks will request A hold after token 33?",
            answer=3, explanation="33 tokens / 16 per block, rounded up.")

Numeric answers use a number input; pass `choices` for a multiple-choice question. The answer
comes from the engine, so it is always the truth for the current parameters. When computing it
costs something (a kernel run), pass a function: it is called only once the learner asks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from ui.state import is_hidden

Answer = int | str


def predict(key: str, question: str, *, answer: Answer | Callable[[], Answer],
            explanation: str, choices: Sequence[str] | None = None) -> None:
    """Ask, check the learner's guess, then explain. State is per user, keyed by `key`; a
    revealed answer stays until the question text changes (new parameters, new question)."""
    if is_hidden("questions"):
        return
    revealed_key = f"{key}_revealed"
    with st.container(border=True, key=f"{key}_predict"):
        st.markdown(f"**Predict, then reveal.** {question}")
        guess_col, check_col = st.columns([2, 1], vertical_alignment="bottom")
        if choices is None:
            guess = guess_col.number_input("Your prediction", min_value=0, value=None, step=1,
                                           key=f"{key}_guess", placeholder="a number")
        else:
            guess = guess_col.radio("Your prediction", list(choices), index=None,
                                    key=f"{key}_guess", horizontal=True)
        check_col.button("Check", key=f"{key}_check", disabled=guess is None, on_click=_reveal,
                         args=(revealed_key, question, f"{key}_guess"))
        check_col.button("Just show me", key=f"{key}_show", type="tertiary", on_click=_reveal,
                         args=(revealed_key, question, None))
        asked, revealed = st.session_state.get(revealed_key, (None, None))
        if asked != question:  # the parameters changed the question: ask again
            return
        if callable(answer):
            answer = answer()
        if revealed != "shown" and _same(revealed, answer):
            st.success(f"Right: **{answer}**. {explanation}")
        elif revealed != "shown":
            st.error(f"Not quite: you said {revealed}, the engine says **{answer}**. "
                     f"{explanation}")
        else:
            st.info(f"The engine says **{answer}**. {explanation}")


def _reveal(revealed_key: str, question: str, guess_key: str | None) -> None:
    """Remember what was asked and the guess (or "shown" when the learner skipped guessing)."""
    guess = st.session_state.get(guess_key) if guess_key else "shown"
    st.session_state[revealed_key] = (question, guess)


def _same(guess: object, answer: Answer) -> bool:
    if isinstance(answer, int):
        return guess is not None and int(guess) == answer
    return guess == answer
