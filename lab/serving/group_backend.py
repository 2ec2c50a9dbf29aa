"""The paged backend over several KV cache groups (vLLM V1's hybrid KV cache manager).

A model that mixes attention types (full attention with sliding-window or chunked-local layers)
keeps a block table per group for every request, all drawn from one pool
(`HybridKVCacheManager`). The scheduler sees the same backend as with one group: the prefix hit
is the one every group can serve, admission counts the whole sequence over every group (a
windowed group at most its cap), and a step's slots come group by group.

One rule changes what the scheduler must call: a windowed group drops the positions that left
its window each time a request gets slots, as vLLM does in every `allocate_slots`, even a decode
that needs no new block. So this backend reports as a request's capacity only the tokens it was
given slots for: the scheduler then calls `grow` for every scheduled request, every step.

Allocator only: the K/V tensors, the kernel and the block picture run on one group
(`PagedBackend` in kv_backends.py); vLLM V1 has no swap.
"""

from __future__ import annotations

import numpy as np

from kernels.reference import AttentionCheck
from lab.memory.hybrid_cache_manager import HybridKVCacheManager
from lab.memory.kv_cache_groups import NULL_BLOCK
from lab.serving.config import SchedulerConfig
from lab.serving.paged_admission import Batch, GroupBlocks, NotSupported, PagedAdmission
from lab.serving.request import Request

NO_SWAP = "vLLM V1 preempts by recompute: it has no swap space"


class GroupedBackend(PagedAdmission):
    name = "paged"

    def __init__(self, cfg: SchedulerConfig, seed: int) -> None:
        kv_cache = HybridKVCacheManager(
            cfg.kv_cache_groups, cfg.num_blocks, cfg.block_size, cfg.max_num_batched_tokens,
            cfg.max_model_len or cfg.capacity_slots, cfg.enable_prefix_caching,
            record_events=cfg.explain)
        super().__init__(cfg, kv_cache, kv_cache.events, kv_cache.blocks)
        self.computes = False
        self._queried = self._found = 0  # prefix-cache tokens looked up at admissions, found

    def _admitted(self, req: Request, new: GroupBlocks, hit_tokens: int) -> GroupBlocks:
        if self.cfg.enable_prefix_caching:
            self._queried += len(req.tokens)
            self._found += hit_tokens
        return self.kv_cache.block_tables(req.req_id)  # hit, nulls and new blocks

    def capacity(self, req: Request, num_tokens: int) -> int:
        return num_tokens  # the tokens given slots: the next step's tokens call grow again

    def compute(self, batch: Batch) -> AttentionCheck | None:
        return None

    def release(self, req: Request) -> None:
        self.kv_cache.free(req.req_id)

    def can_swap_out(self, req: Request) -> bool:
        return False

    def swap_out(self, req: Request) -> int:
        raise NotSupported(NO_SWAP)

    def swap_in_shortfall(self, req: Request, reserve: int) -> str | None:
        raise NotSupported(NO_SWAP)

    def swap_in(self, req: Request) -> tuple[int, int]:
        raise NotSupported(NO_SWAP)

    def usage(self, length: np.ndarray, cap: np.ndarray,
              next_in_line: Request | None) -> tuple[float, int]:
        """(fraction of blocks in use, slots of held blocks holding no token): every group holds
        each request's tokens with slots, less the positions it has nulled."""
        used = self.blocks.num_used
        held = int(np.minimum(length, cap).sum()) * self.kv_cache.num_groups
        nulled = sum(t.count(NULL_BLOCK) for r in self.kv_cache.requests()
                     for t in self.kv_cache.block_tables(r))
        return (used / self.cfg.num_blocks,
                max(0, used * self.block_size - held + nulled * self.block_size))

    def picture(self, running: list[Request], next_in_line: Request | None):
        raise NotSupported("the block picture draws one KV cache group; these requests hold "
                           f"{self.kv_cache.num_groups} tables each (block_tables gives them)")

    def prefix_tokens(self) -> tuple[int, int]:
        return self._queried, self._found

    def check_invariants(self, running: list[Request]) -> None:
        self.kv_cache.check_invariants()
        assert set(self.kv_cache.requests()) == {r.req_id for r in running}, \
            "block tables without a running request"
