""""Predict, then reveal": a question the learner answers before the page shows the answer.

    q = Question("bt_blocks", "How many physical blocks will request A hold after token 33?",
                 answer=3, explanation="33 tokens / 16 per block, rounded up.", context=story)
    with held_back(q.answered, "the block counts"):
        ...  # what would give the answer away
    q.ask()

A question is answered by Check (the guess, right or wrong) or "Just show me". Until then what
would give the answer away sits under `held_back`: its place kept and hatched, its content
hidden (from screen readers too), with a note. The
answer comes from the engine, so it is the truth for the current settings; `context` names what
it depends on (the story), so any setting that changes it asks the question again. Check is a
form's submit button: one click (or Enter in the box) sends what was typed. A score per page
and over the lab is kept for the session.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import streamlit as st

from ui.state import current_page, first_time_this_run, is_classroom, is_hidden

Answer = int | str
_ANSWERS = "_ui_answers"  # session: {key: (signature, guess or SHOWN)}
_SCORE = "_ui_score"  # session: {page: {signature: right?}}, questions checked with a guess
_ASKED = "_ui_asked"  # session: {key: the signature last asked}
SHOWN = "shown"


@dataclass
class Question:
    key: str
    text: str
    answer: Answer | Callable[[], Answer]
    explanation: str
    choices: Sequence[str] | None = None
    context: Hashable = None  # what the answer depends on: a new one asks again
    _value: Answer | None = field(default=None, init=False, repr=False)

    @property
    def signature(self) -> tuple:
        return (self.text, repr(self.context))

    @property
    def answered(self) -> bool:
        """Checked with a guess, or shown: what gives the answer away may be seen now. Always
        true in classroom mode (the teacher asks, and the projector keeps showing the lesson)
        and when a teacher link hides the questions."""
        if is_hidden("questions") or is_classroom():
            return True
        stored = st.session_state.get(_ANSWERS, {}).get(self.key)
        return stored is not None and stored[0] == self.signature

    def value(self) -> Answer:
        if self._value is None:
            self._value = self.answer() if callable(self.answer) else self.answer
        return self._value

    def ask(self) -> None:
        """Draw the question, and once answered, the verdict and the explanation."""
        if is_hidden("questions"):
            return
        self._forget_an_old_guess()
        box = (st.expander(f"A question for the class: {self.text}", icon=":material/quiz:")
               if is_classroom() else st.container())
        with box, st.form(f"{self.key}_form", border=True):
            st.markdown(f"**Predict, then reveal.** {self.text}")
            if self.choices is None:
                st.number_input("Your prediction", min_value=0, value=None, step=1,
                                key=f"{self.key}_guess", placeholder="a number, then Enter")
            else:
                st.radio("Your prediction", list(self.choices), index=None,
                         key=f"{self.key}_guess", horizontal=True)
            check, show, _ = st.columns([1, 1.3, 3], vertical_alignment="center")
            with check:
                st.form_submit_button("Check", type="primary", on_click=self._checked,
                                      key=f"{self.key}_check")
            with show:
                st.form_submit_button("Just show me", type="tertiary", on_click=self._shown,
                                      key=f"{self.key}_show")
        stored = st.session_state.get(_ANSWERS, {}).get(self.key)
        if stored is None or stored[0] != self.signature:
            if st.session_state.pop(f"{self.key}_empty", False):
                st.warning("Type or pick a prediction first, then Check.",
                           icon=":material/edit:")
            return
        guess, answer = stored[1], self.value()
        if guess == SHOWN:
            st.info(f"The engine says **{_shown(answer)}**. {self.explanation}")
        elif _same(guess, answer):
            st.success(f"Right: **{_shown(answer)}**. {self.explanation}")
        else:
            st.error(f"Not quite: you said {_shown(guess)}, the engine says "
                     f"**{_shown(answer)}**. {self.explanation}")
        st.caption(score_line())

    def _forget_an_old_guess(self) -> None:
        """A new setting asks a new question: the box starts empty, not with the old guess."""
        asked = st.session_state.setdefault(_ASKED, {})
        if asked.get(self.key, self.signature) != self.signature:
            st.session_state.pop(f"{self.key}_guess", None)
        asked[self.key] = self.signature

    def _checked(self) -> None:
        guess = st.session_state.get(f"{self.key}_guess")
        if guess is None:
            st.session_state[f"{self.key}_empty"] = True
            return
        st.session_state.setdefault(_ANSWERS, {})[self.key] = (self.signature, guess)
        page = st.session_state.setdefault(_SCORE, {}).setdefault(current_page(), {})
        page[self.signature] = _same(guess, self.value())  # a new question adds, never replaces

    def _shown(self) -> None:
        st.session_state.setdefault(_ANSWERS, {})[self.key] = (self.signature, SHOWN)


@dataclass(frozen=True)
class Gate:
    """A step's questions: those due (asked right under the step controls: unanswered ones
    whose answer this step or the next shows, and answered ones around that step, so the
    verdict stays where the question was), the others (further down), and whether what this
    step shows must be held back."""

    due: tuple[Question, ...]
    later: tuple[Question, ...]
    hold: bool


def gate(questions: Sequence[tuple[Question, int]], step: int) -> Gate:
    """`questions`: each with the first step that shows its answer."""
    due = tuple(q for q, reveal in questions
                if (reveal - 1 <= step <= reveal if q.answered else step + 1 >= reveal))
    later = tuple(q for q, _ in questions if q not in due)
    hold = any(not q.answered and step >= reveal for q, reveal in questions)
    return Gate(due, later, hold)


def predict(key: str, question: str, *, answer: Answer | Callable[[], Answer],
            explanation: str, choices: Sequence[str] | None = None,
            context: Hashable = None) -> Question:
    """Ask a question now (nothing on the page depends on it being answered first)."""
    asked = Question(key, question, answer, explanation, choices, context)
    asked.ask()
    return asked


@contextmanager
def held_back(answered: bool, what: str, *, key: str) -> Iterator[None]:
    """Draw what would give an answer away hidden in its place (hatched; not readable, not
    hoverable, not read out) until the question is answered."""
    if answered:
        yield
        return
    if first_time_this_run("held back"):  # the hatching says it again below, without words
        st.caption(f":material/visibility_off: {what.capitalize()} held back (hatched): "
                   "predict first (the question is on this page), or choose “Just show me”.")
    with st.container(key=f"lab_held_{key}"):
        yield


def score_line() -> str:
    """Your questions answered right, on this page and in the whole lab (this session)."""
    pages = st.session_state.get(_SCORE, {})
    here = pages.get(current_page(), {})
    every = [right for page in pages.values() for right in page.values()]
    return (f"Your score: {sum(here.values())} of {len(here)} on this page, "
            f"{sum(every)} of {len(every)} in the lab.")


def _shown(value: object) -> str:
    return f"{value:,}" if isinstance(value, int | float) else str(value)


def _same(guess: object, answer: Answer) -> bool:
    if isinstance(answer, int):
        return guess is not None and int(guess) == answer
    return guess == answer
