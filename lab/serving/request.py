"""The scheduler's plain data: its configuration, a request's life, and one iteration's record."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from lab.serving.workloads import RequestSpec

PreemptionMode = Literal["recompute", "swap"]
VictimPolicy = Literal["newest", "priority"]
AllocatorKind = Literal["paged", "contiguous"]


@dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int = 64
    block_size: int = 16
    max_num_batched_tokens: int = 512  # the token budget of one iteration
    max_num_seqs: int = 16  # sequences in one iteration at most
    watermark: float = 0.01  # fraction of the pool kept free at admission (vLLM v0: 1 %)
    enable_chunked_prefill: bool = True
    preemption_mode: PreemptionMode = "recompute"
    victim_policy: VictimPolicy = "newest"
    allocator: AllocatorKind = "paged"
    compute: bool = False  # real K/V tensors and the paged-attention kernel every iteration
    enable_prefix_cache: bool = False
    num_cpu_blocks: int = 0  # swap space; 0 = as many as the device pool
    num_kv_heads: int = 2  # pool geometry for compute mode (one layer)
    num_heads: int = 4
    head_dim: int = 32
    explain: bool = True  # keep the one-line decisions of every iteration

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs",
                     "num_kv_heads", "num_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be recompute or swap, "
                             f"got {self.preemption_mode!r}")
        if self.victim_policy not in ("newest", "priority"):
            raise ValueError(f"victim_policy must be newest or priority, "
                             f"got {self.victim_policy!r}")
        if self.allocator not in ("paged", "contiguous"):
            raise ValueError(f"allocator must be paged or contiguous, got {self.allocator!r}")

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size


class RequestState(StrEnum):
    PENDING = "pending"  # not arrived yet
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
    state: RequestState = RequestState.WAITING
    num_computed: int = 0  # leading tokens whose K/V is in the pool
    num_output: int = 0
    seq_id: int | None = None  # paged: the cache manager's sequence
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
    max_error: float | None = None  # compute mode: kernel vs dense attention
    decisions: tuple[str, ...] = ()

    @property
    def batch_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens
