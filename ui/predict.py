""""Predict, then reveal": a question the learner answers before the page shows the answer.

    q = Question("bt_blocks", "How many physical blocks will request A hold after token 33?",
                 answer=3, explanation="33 tokens / 16 per block, rounded up.", context=story)
    with hatched(q.answered, "the block counts"):
        ...  # what would give the answer away
    q.ask()

A question is answered by Check (the guess, right or wrong) or "Just show me"; then it is
closed: its verdict and explanation, no box. Until then what would give the answer away sits
under `hatched(...)`: its place kept and hatched, its content hidden (from screen readers too),
with a note. The answer comes from the engine, so it is the truth for the current settings;
`context` names what it depends on (the story), so any setting that changes it asks the
question again, with an empty box and no old verdict. Check is a form's submit button: one
click (or Enter in the box) sends what was typed. A score per page and over the lab is kept
for the session: each question (key, text, context) counts once, and asking it again never
lowers it.

On an animated page, `gate(questions, step)` applies the lab's rule for every question: asked
the step before the step that shows its answer, holding that step back while open, and closed
(answered, or the engine's answer shown) once that step has gone by: never open under its
answer.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import streamlit as st

from ui.state import current_page, first_time_this_run, is_classroom, is_hidden

Answer = int | str
_ANSWERS = "_ui_answers"  # session: {key: (signature, guess or SHOWN)}
_SCORE = "_ui_score"  # session: {page: {(key, *signature): right?}}, checked with a guess
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
    reveal: int | None = field(default=None, init=False)  # set by `gate`: its answer's step
    closed: bool = field(default=False, init=False)  # set by `gate`: its step has gone by
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
        """Draw the question: open (a box and Check) until answered, then closed (the verdict
        and the explanation). `gate` closes it, answered or not, once its step has passed (and
        in classroom mode at its step): never left open under its answer."""
        if is_hidden("questions"):
            return
        self._forget_an_old_guess()
        stored = st.session_state.get(_ANSWERS, {}).get(self.key)
        mine = stored is not None and stored[0] == self.signature
        if mine or self.closed:
            self._closed(stored[1] if mine else None)
            return
        box = (st.expander(f"A question for the class: {self.text}", icon=":material/quiz:")
               if is_classroom() else st.container())
        marker = f"lab_open_{self.key}" + ("" if self.reveal is None else f"_at_{self.reveal}")
        with box, st.container(key=marker), st.form(f"{self.key}_form", border=True):
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
        if st.session_state.pop(f"{self.key}_empty", False):
            st.warning("Type or pick a prediction first, then Check.", icon=":material/edit:")

    def _closed(self, guess: Answer | None) -> None:
        """The question with its answer: the learner's verdict, or the engine's answer when it
        was shown or its step went by unanswered."""
        answer = self.value()
        with st.container(border=True, key=f"lab_closed_{self.key}"):
            st.markdown(f"**Predict, then reveal.** {self.text}")
            if guess is None or guess == SHOWN:
                st.info(f"The engine says **{_shown(answer)}**. {self.explanation}")
            elif _same(guess, answer):
                st.success(f"Right: **{_shown(answer)}**. {self.explanation}")
            else:
                st.error(f"Not quite: you said {_shown(guess)}, the engine says "
                         f"**{_shown(answer)}**. {self.explanation}")
            if guess is not None and guess != SHOWN:
                st.caption(score_line())

    def _forget_an_old_guess(self) -> None:
        """A new setting asks a new question: the box starts empty, not with the old guess,
        and the old setting's answer is not this one's."""
        asked = st.session_state.setdefault(_ASKED, {})
        if asked.get(self.key, self.signature) != self.signature:
            # None, not a removed key: the browser would keep drawing the number typed before
            st.session_state[f"{self.key}_guess"] = None
            answers = st.session_state.get(_ANSWERS, {})
            if answers.get(self.key, (self.signature,))[0] != self.signature:
                answers.pop(self.key, None)
        asked[self.key] = self.signature

    def _checked(self) -> None:
        guess = st.session_state.get(f"{self.key}_guess")
        if guess is None:
            st.session_state[f"{self.key}_empty"] = True
            return
        st.session_state.setdefault(_ANSWERS, {})[self.key] = (self.signature, guess)
        page = st.session_state.setdefault(_SCORE, {}).setdefault(current_page(), {})
        # A new question adds its own entry; one asked again never lowers what it scored.
        scored = (self.key, *self.signature)
        page[scored] = page.get(scored, False) or _same(guess, self.value())

    def _shown(self) -> None:
        st.session_state.setdefault(_ANSWERS, {})[self.key] = (self.signature, SHOWN)


@dataclass(frozen=True)
class Gate:
    """A step's questions. `due`: asked right under the step controls, from the step before
    their reveal step to it (open until answered; closed at the reveal step in classroom
    mode). `later`: closed, their step gone by (the verdict, or the engine's answer), further
    down. A question before the step ahead of its reveal is not asked yet. `hatch`: an open
    question's answer is what this step shows, so it is held back (hatched). `asking`: a
    question is open at this step (what on screen would answer it must be held back too)."""

    due: tuple[Question, ...]
    later: tuple[Question, ...]
    hatch: bool
    asking: bool


def gate(questions: Sequence[tuple[Question, int]], step: int) -> Gate:
    """`questions`: each with the first step that shows its answer."""
    due, later = [], []
    for q, reveal in questions:
        q.reveal = reveal
        q.closed = step > reveal or (step == reveal and is_classroom())
        if reveal - 1 <= step <= reveal:
            due.append(q)
        elif step > reveal:
            later.append(q)
    open_now = [q for q in due if not q.closed and not q.answered]
    hatch = any(q.reveal == step for q in open_now)
    return Gate(tuple(due), tuple(later), hatch, bool(open_now))


def predict(key: str, question: str, *, answer: Answer | Callable[[], Answer],
            explanation: str, choices: Sequence[str] | None = None,
            context: Hashable = None) -> Question:
    """Ask a question now (nothing on the page depends on it being answered first)."""
    asked = Question(key, question, answer, explanation, choices, context)
    asked.ask()
    return asked


@contextmanager
def hatched(answered: bool, what: str, *, key: str) -> Iterator[None]:
    """Draw what would give an answer away hidden in its place (hatched; not readable, not
    hoverable, not read out) until the question is answered."""
    if answered:
        yield
        return
    if first_time_this_run("held back"):  # the hatching says it again below, without words
        st.caption(f":material/visibility_off: {what.capitalize()} held back (hatched): "
                   "predict first (the question is on this page), or choose “Just show me”.")
    with st.container(key=f"lab_hatched_{key}"):
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
