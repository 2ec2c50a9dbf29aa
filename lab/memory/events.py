"""Events: what each mutation of the cache did, so pages can animate it and traces can replay it."""

from __future__ import annotations

from typing import Literal, NamedTuple

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


class Event(NamedTuple):
    kind: EventKind
    seq_id: int | None
    block_id: int | None
    step: int
    detail: dict

    def to_dict(self) -> dict:
        return {**self._asdict(), "detail": dict(self.detail)}


class EventLog:
    """An append-only list of events, stamped with the current step."""

    def __init__(self, keep: bool = True) -> None:
        # Kept as tuples of plain values (the detail as a tuple of keys and one of values) and
        # read as Events: the garbage collector stops tracking such a tuple, while a tuple that
        # holds a dict stays tracked, and re-scanning a million of them made long traces 3x
        # slower.
        self._records: list[tuple] = []
        self.step = 0
        self.keep = keep  # False: large replays that only want counters, not a trace

    @property
    def events(self) -> list[Event]:
        return self._read(self._records)

    def emit(self, kind: EventKind, seq_id: int | None = None, block_id: int | None = None,
             **detail) -> None:
        if self.keep:
            self._records.append((kind, seq_id, block_id, self.step, tuple(detail),
                                  tuple(detail.values())))

    @staticmethod
    def _read(records: list[tuple]) -> list[Event]:
        return [Event(kind, seq_id, block_id, step, dict(zip(keys, values)))
                for kind, seq_id, block_id, step, keys, values in records]

    def next_step(self) -> int:
        self.step += 1
        return self.step

    def since(self, index: int) -> list[Event]:
        return self._read(self._records[index:])

    def __len__(self) -> int:
        return len(self._records)

    def as_dicts(self) -> list[dict]:
        """Every event as a plain dict (a trace's JSON)."""
        return [e.to_dict() for e in self.events]
