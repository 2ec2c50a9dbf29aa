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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import streamlit as st

from kernels.reference import AttentionCheck
from lab.scenarios.live_runs import CheckTimeout, LiveChecks
from lab.scenarios.live_workers import live_checks
from lab.scenarios.story import Story
from ui.kernel_badge import kernel_badge
from ui.memo import shared_within
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
    """What the story's play measured on the real tensors up to `step` (after live_badge: the
    play has run that far), or None when the server is too busy to say now."""
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
