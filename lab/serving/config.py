"""The scheduler's configuration: the pool it serves from and vLLM's scheduling knobs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lab.memory.kv_pool import PoolConfig

PreemptionMode = Literal["recompute", "swap"]
VictimPolicy = Literal["newest", "priority"]
AllocatorKind = Literal["paged", "contiguous"]
UNLIMITED = 1 << 30  # a token budget or seat count no workload reaches
# Compute mode's pool geometry: one layer of 2 KV heads of 32, small enough to interpret.
COMPUTE_POOL = PoolConfig(num_kv_heads=2, head_dim=32)


@dataclass(frozen=True)
class SchedulerConfig:
    # The pool (paged) or the same number of slots (contiguous); compute mode keeps real K/V
    # of this geometry (one layer).
    pool: PoolConfig = COMPUTE_POOL
    max_num_batched_tokens: int = 512  # the token budget of one iteration
    max_num_seqs: int = 16  # sequences in one iteration at most
    watermark: float = 0.01  # fraction of the pool kept free at admission (vLLM v0: 1 %)
    enable_chunked_prefill: bool = True
    preemption_mode: PreemptionMode = "recompute"
    victim_policy: VictimPolicy = "newest"
    allocator: AllocatorKind = "paged"
    # contiguous only: output tokens reserved per request, grown when outgrown
    # (lab/serving/guess_backend.py); None: prompt + max_tokens, never grown
    contiguous_guess: int | None = None
    compute: bool = False  # real K/V tensors and the paged-attention kernel every iteration
    # compute mode: check the kernel every iteration (False: the K/V are written, and a page
    # checks only the step it shows, as the Triton interpreter takes ~0.5 s a check)
    kernel_check: bool = True
    enable_prefix_cache: bool = False
    num_cpu_blocks: int = 0  # swap space; 0 = as many as the device pool
    num_heads: int = 4  # query heads in compute mode (a multiple of the pool's KV heads)
    explain: bool = True  # keep the one-line decisions of every iteration

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.pool.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of the pool's "
                             f"{self.pool.num_kv_heads} KV heads")
        if self.contiguous_guess is not None and (
                self.allocator != "contiguous" or self.contiguous_guess < 1):
            raise ValueError("contiguous_guess must be a positive number of output tokens, "
                             f"for the contiguous allocator, got {self.contiguous_guess!r} "
                             f"for {self.allocator!r}")
        if not 0 <= self.watermark < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark}")
        for name, allowed in (("preemption_mode", ("recompute", "swap")),
                              ("victim_policy", ("newest", "priority")),
                              ("allocator", ("paged", "contiguous"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be {' or '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size

    def with_pool(self, **changes) -> SchedulerConfig:
        """The same settings on a pool with these fields changed (num_blocks, block_size, ...)."""
        return replace(self, pool=replace(self.pool, **changes))


def step_server(pool: PoolConfig, **changes) -> SchedulerConfig:
    """The walkthrough pages' server: no token budget, seat limit or watermark, so every running
    request decodes each step and admission waits only for memory, first come first served
    (run it on a `StepClock`)."""
    return SchedulerConfig(pool=pool, max_num_batched_tokens=UNLIMITED, max_num_seqs=UNLIMITED,
                           watermark=0.0, **changes)
