"""Events: what each mutation of the cache did, so pages can animate it and traces can replay it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

EventKind = Literal[
    "allocate",  # a free physical block was taken for a sequence
    "append",  # a token was written into a slot
    "share",  # a block gained a reference (fork)
    "copy",  # copy-on-write: a shared block was copied into a fresh one
    "free",  # a sequence dropped its reference to a block
    "evict",  # a cached free block lost its hash because it was reused
    "hit",  # a prefix-cache lookup found the block
    "cache",  # a full block was registered in the prefix cache under its hash
    "preempt",  # the scheduler took a sequence's blocks back
    "swap",  # blocks were copied between the device pool and the CPU pool
]


@dataclass(frozen=True)
class Event:
    kind: EventKind
    seq_id: int | None = None
    block_id: int | None = None
    step: int = 0
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class EventLog:
    """An append-only list of events, stamped with the current step."""

    def __init__(self, keep: bool = True) -> None:
        self.events: list[Event] = []
        self.step = 0
        self.keep = keep  # False: large replays that only want counters, not a trace

    def emit(self, kind: EventKind, seq_id: int | None = None, block_id: int | None = None,
             **detail) -> None:
        if self.keep:
            self.events.append(Event(kind, seq_id, block_id, self.step, detail))

    def next_step(self) -> int:
        self.step += 1
        return self.step

    def since(self, index: int) -> list[Event]:
        return self.events[index:]

    def __len__(self) -> int:
        return len(self.events)

    def as_dicts(self) -> list[dict]:
        """Every event as a plain dict (a trace's JSON)."""
        return [e.to_dict() for e in self.events]
