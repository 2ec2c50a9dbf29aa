"""The contract every animated page keeps: a story told step by step.

A `Story` is a frozen, hashable description (its config, which holds a `PoolConfig`, and a
seed) from which everything a page shows is derived:

- `frames()`: one picture per step, from a run on the allocator alone (fast; pure function of
  the story, so pages share it between users);
- `trace(step)`: the event trace up to a step, as JSON with what replays it;
- `caption(frame)`: what happened at that step, in the guide's words;
- `live()`: the same story on the real KV pool (a `LiveRun`), whose `check(step)` runs the
  Triton kernel against dense attention at that step.

A story plays through a `Stepper`: an object advanced one step at a time, either on the allocator
alone or with real K/V tensors (`store_kv`). Both make exactly the same decisions.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import asdict, is_dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

from kernels.reference import AttentionCheck

F = TypeVar("F")
MAX_STEPS = 2000  # a story longer than this is a configuration no page allows


class StoryTooLong(RuntimeError):
    """The story did not end within MAX_STEPS (settings the page's checks should refuse)."""


class Stepper(Protocol[F]):
    step: int  # the last step played, -1 before the first

    @property
    def done(self) -> bool: ...

    def advance(self) -> F: ...

    def check_attention(self) -> AttentionCheck | None:
        """Kernel vs dense attention at this step (None: no sequence attends, or no K/V)."""

    def events(self) -> dict[str, list[dict]]:
        """The event log(s) so far, by system ("paged", "contiguous", ...), as plain dicts."""


class Story(ABC, Generic[F]):
    """Subclasses are frozen dataclasses with the fields `config` and `seed`."""

    page: ClassVar[str]  # the page's file name, e.g. "copy_on_write"
    config: object
    seed: int

    @abstractmethod
    def stepper(self, store_kv: bool = False) -> Stepper[F]:
        """A fresh stepper of the story, before its first step."""

    @abstractmethod
    def caption(self, frame: F) -> list[str]:
        """What happened at this frame's step, one sentence per line (markdown)."""

    def frames(self) -> tuple[F, ...]:
        stepper = self.stepper()
        out: list[F] = []
        while not stepper.done:
            if len(out) == MAX_STEPS:
                raise StoryTooLong(f"the {self.page} story did not end in {MAX_STEPS} steps")
            out.append(stepper.advance())
        return tuple(out)

    def trace(self, step: int) -> str:
        stepper = self.stepper()
        while stepper.step < step and not stepper.done:
            stepper.advance()
        params = asdict(self.config) if is_dataclass(self.config) else repr(self.config)
        meta = {"page": self.page, "seed": self.seed, "step": step, "params": params}
        return json.dumps({"meta": meta, **stepper.events()}, indent=1, default=str)

    def live(self) -> LiveRun:
        """This story on the real KV pool, for the kernel check (one per user: it is mutable)."""
        return LiveRun(self, lambda: self.stepper(store_kv=True))


class LiveRun:
    """A story on the real KV pool, kept alive at its latest step, for the kernel check.

    Moving forward plays only the new steps; moving back replays from the seed (stories are
    deterministic, so the rebuilt pool is the same). Checks are kept per step. A lock makes
    `check` safe from a background thread (a page computing the next step's check while the
    learner reads this one): a second caller waits, then reads the kept check.
    """

    def __init__(self, key: Hashable, make: Callable[[], Stepper]) -> None:
        self.key = key  # what the stepper was built from (the story)
        self._make = make
        self.stepper = make()
        self.rebuilds = 0
        self._checks: dict[int, AttentionCheck | None] = {}
        self._lock = threading.Lock()

    def at(self, step: int) -> Stepper:
        """The stepper after `step` (steps start at 0)."""
        if step < 0:
            raise ValueError(f"step must be 0 or more, got {step}")
        if self.stepper.step > step:
            self.stepper = self._make()
            self.rebuilds += 1
        while self.stepper.step < step and not self.stepper.done:
            self.stepper.advance()
        return self.stepper

    def kept(self, step: int) -> bool:
        """Whether the check at `step` is already computed (asking for it costs nothing)."""
        return step in self._checks

    def check(self, step: int) -> AttentionCheck | None:
        """The paged-attention kernel vs dense attention at `step` (None: nothing attends)."""
        with self._lock:
            if step not in self._checks:
                self._checks[step] = self.at(step).check_attention()
            return self._checks[step]

    def measured(self, step: int) -> tuple | None:
        """What the stepper measured on the real tensors up to `step`, for steppers that time
        something (`Stepper.measured(step)`, e.g. the unknown ending's K/V copies), else None.
        Checked first, so the stepper has run that far."""
        self.check(step)
        with self._lock:
            measure = getattr(self.stepper, "measured", None)
            return None if measure is None else measure(step)
