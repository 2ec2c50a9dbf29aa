"""Every story being stepped on the real KV pool, one LiveRun per story, within a bound.

A story's kernel check at a step is a pure function of the story and the step (the stepper is
seeded), so everyone stepping the same story shares one `LiveRun` and its kept checks, as
everyone shares its frames. `LiveRuns` keeps the most recently used runs: at most `max_runs`,
and none left unused for `idle_s` (a run holds a KV pool and every check it computed), so
memory stays bounded whatever the number of sessions, and a story nobody steps any more is
dropped a while after its last user left. The same store serves in a worker process
(lab/scenarios/live_workers.py) or in the server process itself.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Protocol

from kernels.reference import AttentionCheck
from lab.scenarios.story import LiveRun, Story

# In this process a prefetch starts this long after the page asked for it: Python runs one
# thread at a time, and a replay (interpreted kernel launches) started at once would hold up the
# messages that draw the current step. A reader looks at a step for longer than this.
PREFETCH_DELAY_S = 0.3


class CheckTimeout(TimeoutError):
    """The check is not back within the time asked for; it goes on, and is kept."""


class LiveChecks(Protocol):
    """What a page asks for: a story's kernel check at a step, now or ahead of time."""

    def check(self, story: Story, step: int,
              timeout_s: float | None = None) -> AttentionCheck | None:
        """The check (None: nothing attends at that step), or CheckTimeout after timeout_s."""

    def measured(self, story: Story, step: int,
                 timeout_s: float | None = None) -> tuple | None:
        """What the story's stepper measured up to `step` (LiveRun.measured), or CheckTimeout."""

    def prefetch(self, story: Story, step: int) -> None:
        """Start computing a check the page will ask for soon; returns at once."""


class LiveRuns:
    def __init__(self, max_runs: int = 64, idle_s: float = 600.0) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        self.max_runs, self.idle_s = max_runs, idle_s
        self._runs: OrderedDict[Story, tuple[LiveRun, float]] = OrderedDict()  # LRU first
        self._lock = threading.Lock()  # the dict; each LiveRun locks its own stepper

    def __len__(self) -> int:
        return len(self._runs)

    def run(self, story: Story) -> LiveRun:
        """The story's run (made on first use), now the most recently used."""
        with self._lock:
            run = self._runs.pop(story, (None, 0.0))[0] or story.live()
            self._runs[story] = (run, time.monotonic())
            self._trim(keep=story)
            return run

    def check(self, story: Story, step: int,
              timeout_s: float | None = None) -> AttentionCheck | None:
        """Computed in the calling thread, so with a timeout a check not kept yet raises
        CheckTimeout at once (the caller can show a spinner, then ask without one)."""
        return self._ready(story, step, timeout_s).check(step)

    def measured(self, story: Story, step: int,
                 timeout_s: float | None = None) -> tuple | None:
        return self._ready(story, step, timeout_s).measured(step)

    def _ready(self, story: Story, step: int, timeout_s: float | None) -> LiveRun:
        """The story's run, or CheckTimeout when asked with a timeout before `step` is kept."""
        run = self.run(story)
        if timeout_s is not None and not run.kept(step):
            raise CheckTimeout(f"the check at step {step} is not computed yet")
        return run

    def prefetch(self, story: Story, step: int) -> None:
        timer = threading.Timer(PREFETCH_DELAY_S, self.check, args=(story, step))
        timer.name = f"prefetch-step-{step}"
        # Not a daemon (a thread inherits its creator's flag, and script threads are daemons):
        # at exit Python waits for it, instead of killing it inside a torch or Triton call.
        timer.daemon = False
        timer.start()

    def trim(self, keep: Story | None = None, *, fraction: float = 0.0) -> int:
        """Drop idle runs, runs beyond max_runs, and the least recently used `fraction` of
        the rest (never `keep`). Returns how many were dropped."""
        with self._lock:
            return self._trim(keep, fraction)

    def _trim(self, keep: Story | None, fraction: float = 0.0) -> int:
        now, before = time.monotonic(), len(self._runs)
        extra = max(len(self._runs) - self.max_runs, round(len(self._runs) * fraction))
        for story, (_, used) in list(self._runs.items()):
            if story == keep:
                continue
            if extra > 0 or now - used > self.idle_s:
                del self._runs[story]
                extra -= 1
        return before - len(self._runs)
