"""A page's story on screen: its settings, its frames, its kernel check and its trace.

* `or_stop(build)`: build the page's config or story; on a bad combination of settings show
  what is wrong and stop the page, instead of a traceback.
* `frames(story)`: the story's frames, shared by every user with the same settings.
* `live_badge(story, step, last_step)`: the story played on the real KV pool to `step`, then
  the kernel badge; the next step's check is computed in the background while the learner
  reads this one. The runs are kept per story, for everyone stepping it (Step plays one more
  step, Back to a step not checked yet replays from the seed), in worker processes when the
  server has them (lab/scenarios/live_workers.py: `live_checks`).
* `export_trace(story, step)`: download the event trace up to this step.
* `export_lesson(story, view, last_step, ...)`: "Download this lesson": the whole story as one
  HTML file that plays without the server (lab/figures/lesson.py), built when first asked for
  (with progress: every step's kernel check is part of it) and then kept per story for every
  user, so a Step never builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, TypeVar

import streamlit as st

from kernels.reference import AttentionCheck
from lab.figures.lesson import (
    Lesson,
    LessonQuestion,
    LessonStep,
    LessonTooLarge,
    StepView,
    check_line,
    lesson_html,
)
from lab.scenarios.live_runs import CheckTimeout, LiveChecks
from lab.scenarios.live_workers import live_checks
from lab.scenarios.story import Story
from ui.chapters import CHAPTERS
from ui.kernel_badge import kernel_badge
from ui.memo import shared_within
from ui.predict import Question
from ui.state import is_classroom, is_hidden

# A check prefetched while the learner read the last step is back well within this; only a
# slower one gets a spinner (st.spinner starts a timer thread, and threads take the GIL in turn).
QUICK_S = 0.25

T = TypeVar("T")


def or_stop(build: Callable[[], T], *, errors: type[Exception] = ValueError,
            message: str = "These settings cannot run: {error}.") -> T:
    """`build()`, or its error (`message` with ``{error}``) and the end of this page run."""
    try:
        return build()
    except errors as error:
        st.error(message.format(error=error), icon=":material/error:")
        st.stop()


# Frames kept for every session, in all: a frame is 1-30 KB (the largest, Admission control's
# step view at its maxima: 45 MiB for 1,439 frames, bench/RESULTS.md "Hostile input"), so at
# most ~0.6 GiB; a typical story has 10-150 frames, so a few hundred stories fit.
MAX_SHARED_FRAMES = 20_000


def _frames(story: Story) -> tuple:
    return story.frames()


def frames(story: Story, *, spinner: bool | str = False) -> tuple:
    """Every frame of the story (allocator only), cached for all users within
    MAX_SHARED_FRAMES frames in all."""
    return shared_within(_frames, len, MAX_SHARED_FRAMES, spinner=spinner)(story)


def live_badge(story: Story, step: int, last_step: int,
               idle: str = "No sequence is running at this step: no attention to check.") -> None:
    """Run the story on the real pool up to `step`, then show the kernel-vs-dense badge (or a
    caption when nothing attends); then prefetch the next step's check."""
    checks = live_checks()
    try:
        check = _check(checks, story, step)
    except CheckTimeout as error:  # the server is busy: the page goes on without the badge
        st.caption(f"{error}: the server is busy. Its result will show when you come back to "
                   "this step.")
        return
    if check is None:
        st.caption(idle)
    else:
        kernel_badge(check)
    if step < last_step:
        checks.prefetch(story, step + 1)


def live_measured(story: Story, step: int, timeout_s: float = 5.0) -> tuple | None:
    """What the story's stepper measured on the real tensors up to `step` (after live_badge: the
    stepper has run that far), or None when the server is too busy to say now."""
    try:
        return live_checks().measured(story, step, timeout_s=timeout_s)
    except CheckTimeout:
        return None


def _check(checks: LiveChecks, story: Story, step: int) -> AttentionCheck | None:
    try:
        return checks.check(story, step, timeout_s=QUICK_S)
    except CheckTimeout:
        with st.spinner("Running the paged-attention kernel on the real KV pool…"):
            return checks.check(story, step)


def export_trace(story: Story, step: int) -> None:
    """A download button for the event trace up to `step` (computed only when clicked)."""
    if is_hidden("downloads") or is_classroom():
        return
    st.download_button("Download event trace (JSON)", lambda: story.trace(step),
                       file_name=f"{story.page}_step{step}.json", mime="application/json",
                       key=f"{story.page}_trace", icon=":material/download:", on_click="ignore",
                       help="Every allocate / append / share / copy / free event of this run up "
                            "to the current step, with the parameters and seed that replay it. "
                            "Figures download as PNG from the camera icon above each chart.")


# Lessons kept for every session, in all (each at most MAX_LESSON_BYTES, ~5 MB).
MAX_SHARED_LESSON_BYTES = 60_000_000
NOT_CHECKED = "Kernel check not recorded: the server was too busy to run it."


@dataclass(frozen=True)
class LessonPlan:
    """How to build a story's lesson. Only the story is its identity (what the lesson is a
    pure function of); the page's functions say how to draw it."""

    story: Story
    last_step: int
    view: Callable[[int], StepView] = field(compare=False)
    questions: Callable[[], Sequence[LessonQuestion]] = field(compare=False)
    checks: Callable[[int], AttentionCheck | None] | None = field(compare=False)
    idle: str = field(compare=False)
    extras: Callable[[], dict[str, Any]] = field(compare=False)


def lesson_question(question: Question, reveal: int, holds: Sequence[str] = (),
                    until: int | None = None) -> LessonQuestion:
    """A page's question as the lesson asks it: before step `reveal`, holding back `holds`
    (names of figures or counters; nothing named: the whole step), gone after `until`."""
    return LessonQuestion(question.text, question.value(), question.explanation, reveal,
                          question.choices, tuple(holds), until)


def export_lesson(story: Story, view: Callable[[int], StepView], last_step: int, *,
                  questions: Callable[[], Sequence[LessonQuestion]] = tuple,
                  checks: Callable[[int], AttentionCheck | None] | None = None,
                  idle: str = "No sequence is running at this step: no attention to check.",
                  extras: Callable[[], dict[str, Any]] = dict) -> None:
    """ "Download this lesson": `view(step)` is what the page shows at a step; `checks(step)`
    the kernel check there (default: the story played on the real pool, as live_badge does);
    `idle` what a step without attention says. The first click builds it, with progress."""
    if is_hidden("downloads") or is_classroom():
        return
    key, slot = f"{story.page}_lesson", st.empty()  # the Save button replaces this one
    kept = st.session_state.get(key)
    if isinstance(kept, tuple) and kept[0] == story:  # built for this user: a Step only draws
        page = kept[1]
    else:
        if not slot.button(
                "Download this lesson", key=f"{key}_build", icon=":material/school:",
                help="One HTML file that plays this story with Step, Back and Play from your "
                     "disk, with no server and no network: every step's figures, caption and "
                     "kernel check, and the questions. Inside it, a button saves every step "
                     "as PNG for slides."):
            return
        plan = LessonPlan(story, last_step, view, questions, checks, idle, extras)
        try:  # a build cut short (a Step meanwhile) is not kept: the button comes back
            page = shared_within(_lesson, len, MAX_SHARED_LESSON_BYTES)(plan)
        except LessonTooLarge as error:
            slot.warning(f"This lesson cannot be downloaded: {error}.",
                         icon=":material/warning:")
            return
        st.session_state[key] = (story, page)  # the same bytes as the shared copy
    slot.download_button(f"Save the lesson ({len(page) / 1e6:.1f} MB, HTML)", lambda: page,
                         file_name=f"{story.page}_lesson.html", mime="text/html",
                         key=f"{key}_save", icon=":material/download:", on_click="ignore",
                         type="primary")


def _lesson(plan: LessonPlan) -> bytes:
    """The lesson's HTML (UTF-8); every step's kernel check, with a progress bar."""
    progress = st.progress(0.0, text="Recording every step's kernel check…")
    try:
        steps = [_lesson_step(plan, step, progress) for step in range(plan.last_step + 1)]
        title = next((c.title for c in CHAPTERS if c.url_path == plan.story.page),
                     plan.story.page)
        return lesson_html(Lesson(plan.story.page, f"PagedAttention Lab · {title}",
                                  _settings(plan.story), steps, tuple(plan.questions()),
                                  plan.extras())).encode()
    finally:
        progress.empty()


def _lesson_step(plan: LessonPlan, step: int, progress: Any) -> LessonStep:
    check = plan.checks(step) if plan.checks is not None else _recorded(plan.story, step)
    progress.progress((step + 1) / (plan.last_step + 1),
                      text=f"Recording step {step} of {plan.last_step}…")
    if isinstance(check, str):
        return LessonStep(plan.view(step), check)
    if check is None:
        return LessonStep(plan.view(step), plan.idle)
    return LessonStep(plan.view(step), check_line(check), check.ok)


def _recorded(story: Story, step: int) -> AttentionCheck | str | None:
    try:
        return live_checks().check(story, step)
    except CheckTimeout:
        return NOT_CHECKED


def _settings(story: Story) -> str:
    def flat(value: object, prefix: str = "") -> list[str]:
        if isinstance(value, dict):
            return [item for name, inner in value.items()
                    for item in flat(inner, f"{prefix}{name}.")]
        return [f"{prefix.removesuffix('.')}={value}"]

    params = asdict(story.config) if is_dataclass(story.config) else {"config": story.config}
    return (f"Recorded by PagedAttention Lab from its page {story.page!r}: seed {story.seed}, "
            + ", ".join(flat(params)) + ".")
