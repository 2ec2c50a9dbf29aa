"""A request's life in the scheduler, and the record of one iteration."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from kernels.reference import AttentionCheck
from lab.serving.synthetic_kv import VOCAB
from lab.serving.workloads import RequestSpec

# One int object per token id, which a drawn request's tokens share (an object array's tolist
# returns its objects): a replay holds millions of tokens, and an int object each would spread
# them over memory that every copy of a token list then walks.
TOKEN_IDS = np.array(range(VOCAB), dtype=object)


class RequestState(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(eq=False, slots=True)
class Request:
    spec: RequestSpec
    planned: list[int]  # prompt tokens, then the tokens the model will emit (seeded)
    length: int  # tokens held: prompt + emitted so far (they are planned[:length])
    order: int = -1  # admission order (newest = largest)
    arrival: int = -1  # arrival order (vLLM's arrival_time: ties and the priority victim)
    state: RequestState = RequestState.WAITING
    num_computed: int = 0  # leading tokens whose K/V is in the pool
    num_cached: int = 0  # tokens found in the prefix cache at its last admission
    num_output: int = 0
    seq_id: int | None = None  # paged: the cache manager's sequence
    block_table: tuple[int, ...] = ()  # paged: its blocks after its last admission
    released_table: tuple[int, ...] = ()  # paged: the blocks it released last
    swapped: object | None = None  # paged: the SwappedSequence while swapped out
    first_token_s: float | None = None
    last_token_s: float = 0.0
    finish_s: float | None = None
    num_preemptions: int = 0
    num_recomputed: int = 0  # tokens computed again after recompute preemptions
    num_computed_total: int = 0  # K/V computations over its whole life, recomputation included
    reject_reason: str = ""

    @property
    def req_id(self) -> int:
        return self.spec.req_id

    @property
    def tokens(self) -> list[int]:
        return self.planned[:self.length]

    @property
    def max_tokens(self) -> int:
        return self.spec.max_tokens or self.spec.output_len

    @property
    def longest(self) -> int:
        """Tokens it may hold at most: prompt + max_tokens (the last one's K/V is never needed)."""
        return self.spec.prompt_len + self.max_tokens


@dataclass(frozen=True, slots=True)
class IterationRecord:
    index: int
    start_s: float
    seconds: float
    bound: str  # "memory" or "compute" (cost model)
    num_seqs: int  # sequences computed in this iteration (the batch)
    num_running: int  # resident after scheduling
    num_waiting: int
    num_swapped: int
    prefill_tokens: int
    decode_tokens: int
    kv_usage: float  # paged: blocks used / total; contiguous: slots reserved / total
    waste_slots: int  # allocated (reserved) but holding no token
    preemptions: int  # in this iteration
    finished: int  # requests done so far
    admitted_ids: tuple[int, ...] = ()  # requests admitted (or swapped in) this iteration
    finished_ids: tuple[int, ...] = ()
    preempted_ids: tuple[int, ...] = ()
    check: AttentionCheck | None = None  # compute mode: the kernel vs dense on this batch
    decisions: tuple[str, ...] = ()

    @property
    def batch_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


@dataclass(frozen=True, slots=True)
class ScheduledEntry:
    """One request's share of a step, as vLLM's SchedulerOutput holds it."""

    req_id: int
    kind: str  # "new", "resumed" (re-admitted after a preemption) or "running"
    computed: int  # num_computed_tokens before the step (new/resumed: the prefix hit)
    tokens: int  # num_scheduled_tokens
    # Per KV cache group: new/resumed, the whole table (-1 null); running, the blocks appended.
    new_blocks: tuple[list[int], ...]


@dataclass(frozen=True, slots=True)
class StepDetail:
    """What one step decided, entry by entry (a Scheduler built with detail=True keeps it)."""

    scheduled: tuple[ScheduledEntry, ...]  # in scheduling order
    preemptions: tuple[tuple[int, int, int, int], ...]  # (req, computed, tokens, free before)
    lookups: tuple[tuple[int, int, int], ...]  # (req, tokens looked up, hit tokens)
    free_after_schedule: int


def planned_tokens(specs: list[RequestSpec], rng: np.random.Generator) -> list[list[int]]:
    """Each arrival's tokens, prompt then outputs: its own, or drawn. One draw for all of
    them reads the generator's stream in the same order as a draw each, so it gives the
    same ids, without the cost of a call per request."""
    drawn = sum(spec.total_len for spec in specs if not spec.tokens)
    ids = TOKEN_IDS[rng.integers(0, VOCAB, drawn)].tolist() if drawn else []
    planned, start = [], 0
    for spec in specs:
        if spec.tokens:
            planned.append(list(spec.tokens))
        else:
            planned.append(ids[start:start + spec.total_len])
            start += spec.total_len
    return planned
