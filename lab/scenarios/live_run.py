"""A scenario on the real KV pool, kept alive at its latest step, for the kernel check.

The figures of an animated page come from a fast allocator-only run of its scenario. The
kernel check needs the real pool at the shown step, so a `LiveRun` holds one scenario built with
`store_kv=True`: moving forward runs only the new steps; moving back rebuilds it from the seed
(scenarios are deterministic, so the rebuilt pool is the same). Checks are kept per step.
A lock makes `check` safe to call from a background thread (a page computing the next step's
check while the learner reads this one): a second caller waits, then reads the kept check.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Protocol

from kernels.reference import AttentionCheck


class Scenario(Protocol):
    step: int  # the last step run, -1 before the first

    def advance(self) -> object: ...

    def check_attention(self) -> AttentionCheck | None: ...


class LiveRun:
    def __init__(self, key: Hashable, make: Callable[[], Scenario]) -> None:
        self.key = key  # what the scenario was built from (parameters and seed)
        self._make = make
        self.scenario = make()
        self.rebuilds = 0
        self._checks: dict[int, AttentionCheck | None] = {}
        self._lock = threading.Lock()

    def at(self, step: int) -> Scenario:
        """The scenario after `step` (steps start at 0)."""
        if step < 0:
            raise ValueError(f"step must be 0 or more, got {step}")
        if self.scenario.step > step:
            self.scenario = self._make()
            self.rebuilds += 1
        while self.scenario.step < step:
            self.scenario.advance()
        return self.scenario

    def check(self, step: int) -> AttentionCheck | None:
        """The paged-attention kernel vs dense attention at `step` (None: nothing running)."""
        with self._lock:
            if step not in self._checks:
                self._checks[step] = self.at(step).check_attention()
            return self._checks[step]
