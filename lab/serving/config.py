"""The scheduler's configuration: the pool it serves from and vLLM's scheduling settings, under
vLLM's own names (vllm/config/scheduler.py, cache.py), and which engine's policy runs.

"v1" is vLLM V1 (0.33): running requests first, a whole-sequence fit check at admission then
only the scheduled chunk's blocks, recompute preemption, a watermark of 0 by default applied
only to waiting requests while something runs. "v0" is the paper's engine (2023), kept as a
labelled comparison: a prompt's blocks all taken at admission, a 1 % watermark, preemption by
swap to CPU blocks or by recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lab.memory.kv_cache_groups import FullAttention, GroupSpec
from lab.memory.kv_pool import PoolConfig

Engine = Literal["v1", "v0"]
Policy = Literal["fcfs", "priority"]
PreemptionMode = Literal["recompute", "swap"]
AllocatorKind = Literal["paged", "contiguous"]
ENGINE_LABELS: dict[str, str] = {"v1": "vLLM V1 (0.33)", "v0": "vLLM V0 (the paper, 2023)"}
V0_WATERMARK = 0.01  # vLLM V0's block manager kept 1 % of the blocks free at admission
UNLIMITED = 1 << 30  # a token budget or seat count no workload reaches
# Compute mode's pool geometry: one layer of 2 KV heads of 32, small enough to interpret.
COMPUTE_POOL = PoolConfig(num_kv_heads=2, head_dim=32)


@dataclass(frozen=True)
class SchedulerConfig:
    # The pool (paged) or the same number of slots (contiguous); compute mode keeps real K/V
    # of this geometry (one layer).
    pool: PoolConfig = COMPUTE_POOL
    engine: Engine = "v1"
    max_num_batched_tokens: int = 512  # the token budget of one step
    max_num_seqs: int = 16  # running requests at most
    policy: Policy = "fcfs"
    long_prefill_token_threshold: int = 0  # > 0: a prefill chunk takes at most this many
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True  # admission checks that the whole sequence fits
    watermark: float | None = None  # fraction of blocks kept free; None: the engine's default
    max_model_len: int | None = None  # None: no limit but the pool
    preemption_mode: PreemptionMode = "recompute"  # "swap" only on vLLM V0
    allocator: AllocatorKind = "paged"
    # contiguous only: output tokens reserved per request, grown when outgrown
    # (lab/serving/guess_backend.py); None: prompt + max_tokens, never grown
    contiguous_guess: int | None = None
    compute: bool = False  # real K/V tensors and the paged-attention kernel every step
    # compute mode: check the kernel every step (False: the K/V are written, and a page
    # checks only the step it shows, as the Triton interpreter takes ~0.5 s a check)
    kernel_check: bool = True
    num_cpu_blocks: int = 0  # V0's swap space; 0 = as many as the device pool
    num_heads: int = 4  # query heads in compute mode (a multiple of the pool's KV heads)
    explain: bool = True  # keep the one-line decisions of every step
    # The model's KV cache groups over the one pool, in group order (vLLM's
    # kv_cache_config.kv_cache_groups): one full-attention group, or a mix with sliding-window
    # or chunked-local groups, each request then holding a block table per group.
    kv_cache_groups: tuple[GroupSpec, ...] = (FullAttention(),)

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
        if not 0 <= self.watermark_fraction < 1:
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark}")
        threshold = self.long_prefill_token_threshold
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be an integer >= 0 (0: off), "
                             f"got {threshold!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        for name, allowed in (("engine", ("v1", "v0")), ("policy", ("fcfs", "priority")),
                              ("preemption_mode", ("recompute", "swap")),
                              ("allocator", ("paged", "contiguous"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be {' or '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        groups = self.kv_cache_groups
        if not isinstance(groups, tuple) or not groups or not all(
                isinstance(g, GroupSpec) for g in groups):
            raise ValueError("kv_cache_groups must be a non-empty tuple of KV cache groups "
                             f"(FullAttention, SlidingWindow, ChunkedLocal), got {groups!r}")
        if not self.one_full_group and (self.engine, self.allocator, self.compute) != (
                "v1", "paged", False):
            raise ValueError("KV cache groups other than one full-attention group run on the "
                             "paged pool under vLLM V1, allocator only (compute=False)")
        if self.engine == "v1" and self.preemption_mode == "swap":
            raise ValueError("vLLM V1 preempts by recompute only: swap preemption is vLLM V0's "
                             "(engine='v0')")

    @property
    def label(self) -> str:
        return ENGINE_LABELS[self.engine]

    @property
    def one_full_group(self) -> bool:
        """Every layer full attention: one block table per request."""
        return self.kv_cache_groups == (FullAttention(),)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def watermark_fraction(self) -> float:
        if self.watermark is not None:
            return self.watermark
        return V0_WATERMARK if self.engine == "v0" else 0.0

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark_fraction * self.num_blocks)

    @property
    def capacity_slots(self) -> int:
        return self.num_blocks * self.block_size

    def with_pool(self, **changes) -> SchedulerConfig:
        """The same settings on a pool with these fields changed (num_blocks, block_size, ...)."""
        return replace(self, pool=replace(self.pool, **changes))

    def as_engine(self, engine: Engine, preemption_mode: PreemptionMode | None = None
                  ) -> SchedulerConfig:
        """The same settings under an engine's policy, at that engine's default watermark: V1
        has no swap, so it recomputes; V0 preempts by `preemption_mode` (default: this
        config's)."""
        mode = (preemption_mode or self.preemption_mode) if engine == "v0" else "recompute"
        return replace(self, engine=engine, preemption_mode=mode, watermark=None)


def step_server(pool: PoolConfig, **changes) -> SchedulerConfig:
    """The walkthrough pages' server: no token budget, seat limit or watermark, so every running
    request decodes each step and admission waits only for memory, first come first served
    (run it on a `StepClock`)."""
    return SchedulerConfig(pool=pool, max_num_batched_tokens=UNLIMITED, max_num_seqs=UNLIMITED,
                           watermark=0.0, **changes)
