"""Where the scheduler's requests keep their K/V: the paged pool or the contiguous baseline.

Both answer the same questions through `KVBackend` (can this request ever fit? what does the
prefix cache hold of it? can it be admitted now? memory for its next tokens? may it be swapped
out?), so one scheduler drives either and their runs can be compared; the scheduler never asks
which one it has.

Paged: vLLM V1's view of the KV cache manager (find the prefix hit, check the whole sequence
fits, allocate a step's slots, free; block lists per KV cache group): one full-attention group
is `SingleGroupCache` over the lab's `KVCacheManager`, the real block pool and, in compute mode,
the real K/V tensors; several groups are `GroupedBackend` (group_backend.py). Admission takes
blocks for the tokens the scheduler says (V1: the hit and the first chunk; V0: the whole
prompt); tokens that fit in the request's own last block need nothing from the pool, so the
scheduler calls `grow` only when they need a block or, hashing, fill one.

Contiguous: the lab's `ContiguousAllocator`, same number of slots; admission reserves
prompt + max_tokens in one region, so decode never needs memory and never preempts.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from kernels.reference import AttentionCheck
from lab.memory.cache_manager import GroupBlocks, KVCacheManager, SingleGroupCache
from lab.memory.contiguous import ContiguousAllocator, ContiguousPicture
from lab.memory.events import EventLog
from lab.memory.kernel_check import check_kernel
from lab.memory.snapshot import Snapshot
from lab.memory.swap import SwapSpace
from lab.serving.config import AllocatorKind, SchedulerConfig
from lab.serving.group_backend import GroupedBackend
from lab.serving.paged_admission import Batch, NotSupported, PagedAdmission, shortfall
from lab.serving.request import Request
from lab.serving.synthetic_kv import SyntheticKV


class KVBackend(Protocol):
    name: AllocatorKind
    events: EventLog  # what the memory did, stamped with the scheduler's step
    computes: bool  # compute() has work: K/V to write and check
    hashes: bool  # a step that fills a block must call grow (its hash is taken then)
    block_size: int | None  # the kernel walks blocks of this many tokens (None: one region)
    taken: int  # blocks (or regions) handed out so far: the allocator's bookkeeping work
    num_free: int  # free blocks (paged) or slots (contiguous)
    new_blocks: dict[int, list[int]] | None  # a step's new blocks by request, when traced

    def never_fits(self, req: Request) -> str | None:
        """Why the request could not run even alone in the pool (None: it could)."""

    def lookup(self, req: Request) -> int:
        """Tokens of its whole current sequence found in the prefix cache (whole blocks, never
        the last token; 0 without a prefix cache). The admission that follows uses it."""

    def admit_shortfall(self, req: Request, reserve: int) -> str | None:
        """Why its whole current sequence cannot be admitted now with `reserve` blocks kept
        free (None: it can)."""

    def admit(self, req: Request, num_tokens: int, reserve: int) -> int | None:
        """Take memory for its first `num_tokens` tokens (the hit included; contiguous: its
        whole reservation) with `reserve` blocks left free; return its slot capacity, or None
        when the pool cannot give it (nothing changed)."""

    def grow(self, req: Request, computed: int, num_new: int) -> int | None:
        """Memory for its tokens [computed, computed + num_new): the new capacity, or None
        when the pool cannot give it (nothing changed)."""

    def compute(self, batch: Batch) -> AttentionCheck | None:
        """After scheduling: store the batch's new K/V (compute mode: and check the kernel)."""

    def release(self, req: Request) -> None:
        """Give back its memory (finished, or preempted by recompute)."""

    def can_swap_out(self, req: Request) -> bool: ...

    def swap_out(self, req: Request) -> int:
        """Move it to CPU memory; return the bytes moved."""

    def swap_in_shortfall(self, req: Request, reserve: int) -> str | None: ...

    def swap_in(self, req: Request) -> tuple[int, int]:
        """Bring it back: (bytes moved, slot capacity)."""

    def usage(self, length: np.ndarray, cap: np.ndarray,
              next_in_line: Request | None) -> tuple[float, int]:
        """(fraction of the pool taken, slots taken but holding no token)."""

    def picture(self, running: list[Request],
                next_in_line: Request | None) -> Snapshot | ContiguousPicture:
        """Every block (paged) or region (contiguous) now, for a page to draw."""

    def prefix_tokens(self) -> tuple[int, int]:
        """(tokens looked up in the prefix cache at admissions, tokens found) so far."""

    def check_invariants(self, running: list[Request]) -> None: ...


class PagedBackend(PagedAdmission):
    name: AllocatorKind = "paged"

    def __init__(self, cfg: SchedulerConfig, seed: int) -> None:
        device = None if cfg.compute else torch.device("cpu")
        # Big replays (explain off) keep no per-block events.
        self.manager = KVCacheManager(cfg.pool, device, cfg.enable_prefix_caching,
                                      store_kv=cfg.compute, record_events=cfg.explain)
        super().__init__(cfg, SingleGroupCache(self.manager), self.manager.events,
                         self.manager.blocks)
        self.swap = SwapSpace(self.manager, cfg.num_cpu_blocks or cfg.num_blocks)
        self.kv = SyntheticKV(cfg.pool, seed, cfg.num_heads) if cfg.compute else None
        self.computes = cfg.compute

    def _admitted(self, req: Request, new: GroupBlocks, hit_tokens: int) -> GroupBlocks:
        # One group: allocate_slots returned the whole table; the request learns its sequence.
        req.seq_id = self.kv_cache.seq_of[req.req_id]
        req.block_table = tuple(new[0])
        return new

    def capacity(self, req: Request, num_tokens: int) -> int:
        return len(self.manager.sequences[req.seq_id].block_table) * self.block_size

    # -- growth ------------------------------------------------------------------------------
    def sync(self, req: Request, upto: int) -> None:
        """Append the request's tokens up to `upto` to its sequence; they fit in its blocks."""
        seq = self.manager.sequences[req.seq_id]
        if upto > len(seq):
            assert upto <= seq.num_blocks * self.cfg.block_size, "sync past the blocks"
            self.manager.extend(req.seq_id, req.planned[len(seq):upto])

    def compute(self, batch: Batch) -> AttentionCheck | None:
        if self.kv is None:
            return None
        queries = []
        for req, start, n in batch:
            self.sync(req, start + n)
            new = req.planned[start:start + n]
            k, v = self.kv.keys_values(new, start)  # [1, n, kv_heads, head_dim]
            self.manager.write(req.seq_id, start, k, v)
            queries.append(self.kv.queries(new))  # [n, num_heads, head_dim]
        if not self.cfg.kernel_check:
            return None
        # A prefill chunk attends over the positions computed so far, not the whole prompt.
        return check_kernel(self.manager, [r.seq_id for r, _, _ in batch], torch.cat(queries),
                            [n for _, _, n in batch], [start + n for _, start, n in batch])

    # -- leaving -----------------------------------------------------------------------------
    def release(self, req: Request) -> None:
        req.released_table = tuple(self.manager.sequences[req.seq_id].block_table)
        self.kv_cache.free(req.req_id)
        req.seq_id = None

    def can_swap_out(self, req: Request) -> bool:
        return self.swap.can_swap_out(req.seq_id)

    def swap_out(self, req: Request) -> int:
        seq = self.manager.sequences[req.seq_id]
        self.sync(req, req.num_computed)
        if seq.num_written < req.num_computed:  # allocator-only: K/V "written" up to here
            self.manager.commit(req.seq_id, req.num_computed)
        moved = seq.num_blocks * self.cfg.pool.bytes_per_block
        req.swapped = self.swap.swap_out(req.seq_id)
        del self.kv_cache.seq_of[req.req_id]
        req.seq_id = None
        return moved

    def swap_in_shortfall(self, req: Request, reserve: int) -> str | None:
        need = self.swap.blocks_to_swap_in(req.swapped) + 1  # + room for its next token
        return shortfall(need, self.blocks.num_free, reserve)

    def swap_in(self, req: Request) -> tuple[int, int]:
        swapped = req.swapped
        req.seq_id = self.swap.swap_in(swapped)
        self.kv_cache.seq_of[req.req_id] = req.seq_id
        req.swapped = None
        seq = self.manager.sequences[req.seq_id]
        self.taken += seq.num_blocks
        return (swapped.num_blocks * self.cfg.pool.bytes_per_block,
                seq.num_blocks * self.cfg.block_size)

    # -- state -------------------------------------------------------------------------------
    def usage(self, length: np.ndarray, cap: np.ndarray,
              next_in_line: Request | None) -> tuple[float, int]:
        """(fraction of blocks in use, allocated slots holding no token)."""
        used = self.blocks.num_used
        held = int(np.minimum(length, cap).sum())
        return used / self.cfg.num_blocks, max(0, used * self.cfg.block_size - held)

    def picture(self, running: list[Request], next_in_line: Request | None) -> Snapshot:
        for req in running:
            self.sync(req, min(req.length, self.manager.sequences[req.seq_id].num_blocks
                               * self.cfg.block_size))
        return self.manager.snapshot()

    def prefix_tokens(self) -> tuple[int, int]:
        return self.manager.prefix_query_tokens, self.manager.prefix_hit_tokens

    def check_invariants(self, running: list[Request]) -> None:
        self.manager.check_invariants()
        self.swap.blocks.check_invariants()
        live = {r.seq_id for r in running}
        assert live == set(self.manager.sequences), "sequences without a request"
        assert set(self.kv_cache.seq_of.values()) == live


class ContiguousBackend:
    name: AllocatorKind = "contiguous"
    computes = False  # the baseline is accounting only: no tensors, no prefix cache
    hashes = False
    new_blocks: dict[int, list[int]] | None = None  # regions, not blocks: always empty
    block_size = None  # each request's K/V is one region: the kernel walks no blocks

    def __init__(self, cfg: SchedulerConfig, seed: int) -> None:
        self.cfg = cfg
        self.allocator = ContiguousAllocator(cfg.capacity_slots)
        self.events = self.allocator.events
        self.taken = 0

    @staticmethod
    def reservation(req: Request) -> int:
        """Slots it reserves: what it holds plus every output token it may still emit."""
        return req.length + req.max_tokens - req.num_output

    def never_fits(self, req: Request) -> str | None:
        if req.longest > self.cfg.capacity_slots:
            return (f"reserves {req.longest} slots (prompt {req.spec.prompt_len} + max_tokens "
                    f"{req.max_tokens}), the region holds {self.cfg.capacity_slots}")
        return None

    @property
    def num_free(self) -> int:
        return self.allocator.usage(0).free

    def lookup(self, req: Request) -> int:
        return 0  # no prefix cache: every prompt is computed

    def admit_shortfall(self, req: Request, reserve: int) -> str | None:
        size = self.reservation(req)
        if not self.allocator.can_reserve(size):
            u = self.allocator.usage(size)
            return (f"no contiguous hole of {size} slots (largest {u.largest_hole}, "
                    f"{u.free} free in all)")
        return None

    def admit(self, req: Request, num_tokens: int, reserve: int) -> int | None:
        if not self.allocator.can_reserve(self.reservation(req)):
            return None
        region = self.allocator.reserve(req.req_id, self.reservation(req), req.length)
        self.taken += 1
        req.num_computed = req.num_cached = 0
        return region.reserved

    def grow(self, req: Request, computed: int, num_new: int) -> int | None:
        raise NotSupported(f"request {req.req_id}: a contiguous reservation holds every token "
                           "it may emit, so it never grows")

    def compute(self, batch: Batch) -> AttentionCheck | None:
        return None

    def release(self, req: Request) -> None:
        self.allocator.release(req.req_id)

    def can_swap_out(self, req: Request) -> bool:
        return False  # a contiguous server never preempts: its decodes never need memory

    def swap_out(self, req: Request) -> int:
        raise NotSupported("the contiguous baseline has no swap space")

    def swap_in_shortfall(self, req: Request, reserve: int) -> str | None:
        raise NotSupported("the contiguous baseline has no swap space")

    def swap_in(self, req: Request) -> tuple[int, int]:
        raise NotSupported("the contiguous baseline has no swap space")

    def _next_need(self, next_in_line: Request | None) -> int:
        return self.reservation(next_in_line) if next_in_line is not None else 0

    def usage(self, length: np.ndarray, cap: np.ndarray,
              next_in_line: Request | None) -> tuple[float, int]:
        """(fraction of slots reserved, reserved-but-empty slots + holes too small for the
        request next in line)."""
        reserved = int(cap.sum())
        need = self._next_need(next_in_line)
        external = self.allocator.usage(need).external if need else 0
        return reserved / self.cfg.capacity_slots, reserved - int(length.sum()) + external

    def picture(self, running: list[Request],
                next_in_line: Request | None) -> ContiguousPicture:
        return self.allocator.picture({r.req_id: r.length for r in running},
                                      self._next_need(next_in_line))

    def prefix_tokens(self) -> tuple[int, int]:
        return 0, 0  # no prefix cache: every prompt is computed

    def check_invariants(self, running: list[Request]) -> None:
        regions = sorted(self.allocator.regions.values(), key=lambda r: r.start)
        for a, b in zip(regions, regions[1:]):
            assert a.start + a.reserved <= b.start, "overlapping regions"
        assert all(r.start + r.reserved <= self.cfg.capacity_slots for r in regions)
        held = {r.req_id for r in running}
        assert held == set(self.allocator.regions), "regions without a request"


def make_backend(cfg: SchedulerConfig, seed: int) -> KVBackend:
    if cfg.allocator == "contiguous":
        return ContiguousBackend(cfg, seed)
    return PagedBackend(cfg, seed) if cfg.one_full_group else GroupedBackend(cfg, seed)
