"""The kernel check of an animated page whose figures come from a fast allocator-only run.

The page's scenario is rebuilt on the real KV pool (`store_kv=True`) and kept per user in
`st.session_state` (a `lab.scenarios.live_run.LiveRun`): Step costs one more step on the pool,
Back or a jump rebuilds it from the seed. Then the Triton kernel and dense attention run on
that pool.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import streamlit as st

from kernels.reference import AttentionCheck
from lab.scenarios.live_run import LiveRun, Scenario
from ui.kernel_badge import attention_badge
from ui.step_controls import prefetch_next


def live_run(key: str, params: Hashable, make: Callable[[], Scenario]) -> LiveRun:
    """This user's scenario on the real pool, kept in session state (rebuilt for new params)."""
    live = st.session_state.get(key)
    if not isinstance(live, LiveRun) or live.key != params:
        live = st.session_state[key] = LiveRun(params, make)
    return live


def live_badge(key: str, params: Hashable, make: Callable[[], Scenario], step: int,
               last_step: int,
               idle: str = "No sequence is running at this step: no attention to check.") -> None:
    """Run the page's scenario on the real pool up to `step`, then show the shared
    kernel-vs-dense badge (or a caption when nothing runs); then the next step's check is
    computed in the background (the learner's next Step only reads it)."""
    live = live_run(key, params, make)
    with st.spinner("Running the paged-attention kernel on the real KV pool…"):
        check: AttentionCheck | None = live.check(step)
    if check is None:
        st.caption(idle)
    else:
        attention_badge(check)
    prefetch_next(live.check, step, last_step)
