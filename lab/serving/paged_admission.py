"""vLLM V1's admission and growth on the paged pool, over its KV cache manager's interface.

A request's admission looks up the prefix cache for its whole current sequence, checks that the
whole sequence fits (the blocks it needs past its hit, plus hit blocks sitting in the free
queue, summed over the KV cache groups), then takes blocks for the hit and its first chunk; each
later step asks for its new tokens' slots. `PagedAdmission` does this over anything with the
manager's methods (find_prefix_hit, blocks_to_admit, allocate_slots, free, block_tables: block
lists per group, -1 the null block), so the backend of one group and the backend of several
share it; each says what a request's tables and capacity are.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from lab.memory.block_pool import BlockPool, KVCacheError
from lab.memory.cache_manager import GroupBlocks
from lab.memory.events import EventLog
from lab.memory.kv_cache_groups import NULL_BLOCK
from lab.serving.config import SchedulerConfig
from lab.serving.request import Request

Batch = list[tuple[Request, int, int]]  # (request, first new position, new tokens)
NO_HIT: tuple[int, int, GroupBlocks] = (-1, 0, ([],))  # no lookup pending


class NotSupported(KVCacheError):
    """The backend cannot do this (e.g. swap out a contiguous reservation)."""


def shortfall(need: int, free: int, mark: int) -> str | None:
    if need + mark > free:
        held = f", {mark} held back as watermark" if mark else ""
        return f"needs {need} blocks, {free} free{held}"
    return None


class PagedAdmission(ABC):
    def __init__(self, cfg: SchedulerConfig, kv_cache, events: EventLog,
                 blocks: BlockPool) -> None:
        self.cfg = cfg
        self.kv_cache = kv_cache  # SingleGroupCache or HybridKVCacheManager
        self.events = events
        self.blocks = blocks
        self.hashes = cfg.enable_prefix_caching
        self.block_size = cfg.block_size
        self.taken = 0
        self._hit: tuple[int, int, GroupBlocks] = NO_HIT  # (request, tokens, blocks)
        # A step's blocks per group, and its lookups' hits per group, when traced.
        self.new_blocks: dict[int, GroupBlocks] | None = None
        self.group_hits: list[tuple[int, ...]] = []
        # The most one request may hold: V1 holds its watermark back only while something else
        # runs, so alone a request has every block.
        self._room_alone = cfg.num_blocks - (cfg.watermark_blocks if cfg.engine == "v0" else 0)

    @property
    def num_free(self) -> int:
        return self.blocks.num_free

    @property
    def no_hit(self) -> GroupBlocks:
        return tuple([] for _ in range(self.kv_cache.num_groups))

    # -- admission ---------------------------------------------------------------------------
    def never_fits(self, req: Request) -> str | None:
        # What admitting its longest sequence counts, summed over the groups (a windowed group
        # at most its cap).
        need = self.kv_cache.blocks_to_admit(req.longest, self.no_hit)
        room = self._room_alone
        if need > room:
            return (f"needs {need} blocks at its longest (prompt {req.spec.prompt_len} + "
                    f"max_tokens {req.max_tokens}), the pool admits at most {room}")
        return None

    def lookup(self, req: Request) -> int:
        hit_tokens, hit = self.kv_cache.find_prefix_hit(req.tokens)
        self._hit = (req.req_id, hit_tokens, hit)
        if self.new_blocks is not None:  # traced: the hit each group finds on its own
            self.group_hits.append(self.kv_cache.group_hits(req.tokens)
                                   if self.kv_cache.num_groups > 1 else (hit_tokens,))
        return hit_tokens

    def _hit_of(self, req: Request) -> tuple[int, GroupBlocks]:
        req_id, hit_tokens, hit = self._hit
        assert req_id == req.req_id, "admission without its lookup"
        return hit_tokens, hit

    def admit_shortfall(self, req: Request, reserve: int) -> str | None:
        """Its whole current sequence must fit, `reserve` blocks kept free besides."""
        _, hit = self._hit_of(req)
        return shortfall(self.kv_cache.blocks_to_admit(req.length, hit), self.blocks.num_free,
                          reserve)

    def admit(self, req: Request, num_tokens: int, reserve: int) -> int | None:
        hit_tokens, hit = self._hit_of(req)
        new = self.kv_cache.allocate_slots(req.req_id, req.tokens, hit_tokens,
                                           num_tokens - hit_tokens, hit, reserve)
        if new is None:
            return None
        self._hit = NO_HIT
        req.num_computed = req.num_cached = hit_tokens
        tables = self._admitted(req, new, hit_tokens)
        # A prefix hit is bookkeeping too (a lookup, a reference); a null entry holds nothing.
        self.taken += sum(len(t) - t.count(NULL_BLOCK) for t in tables)
        if self.new_blocks is not None:
            self.new_blocks[req.req_id] = tables
        return self.capacity(req, num_tokens)

    @abstractmethod
    def _admitted(self, req: Request, new: GroupBlocks, hit_tokens: int) -> GroupBlocks:
        """Its tables after admission (`new`: the blocks allocate_slots appended)."""

    @abstractmethod
    def capacity(self, req: Request, num_tokens: int) -> int:
        """The slots it holds, given slots for num_tokens tokens: the scheduler calls grow for
        tokens past them (or, hashing, filling a block)."""

    # -- growth ------------------------------------------------------------------------------
    def grow(self, req: Request, computed: int, num_new: int) -> int | None:
        # Its planned tokens stand for its current ones: only those before the end are read.
        new = self.kv_cache.allocate_slots(req.req_id, req.planned, computed, num_new)
        if new is None:
            return None
        self.taken += sum(map(len, new))
        if self.new_blocks is not None and any(new):
            if req.req_id in self.new_blocks:  # admitted and grown in one step (V0)
                for table, more in zip(self.new_blocks[req.req_id], new):
                    table.extend(more)
            else:
                self.new_blocks[req.req_id] = new
        return self.capacity(req, computed + num_new)
