"""A contiguous backend that guesses each output's length, for the scheduler.

The contiguous baseline (`ContiguousBackend`) reserves prompt + max_tokens per request, so its
decodes never need memory. A server that does not know max_tokens, or will not pay for it,
must guess: this backend reserves prompt + `contiguous_guess` slots per request, in one region
of `lab/memory/contiguous_kv.py`'s real K/V tensor (the same bytes as the paged pool). When a
decode finds its region full, `grow` doubles the output reservation in place if the slots
after it are free, else moves the region to a hole that holds the doubled size, its K/V really
copied (counted and timed); when no hole does, it returns None and the scheduler preempts, as
it does when the paged pool has no free block. A preempted request comes back with the
reservation it had, or the doubled one if its region was full.

A region's `used` is the tokens whose K/V it stores (set from the scheduler's computed count
whenever it matters: a move copies exactly those); pictures count the tokens a request holds,
as the paged pool's do.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels.reference import AttentionCheck
from lab.memory.contiguous import ContiguousPicture, Region
from lab.memory.contiguous_kv import ContiguousKVCache
from lab.memory.events import EventLog
from lab.memory.kernel_check import check_expected
from lab.serving.config import SchedulerConfig
from lab.serving.kv_backends import Batch, ContiguousBackend, NotSupported
from lab.serving.request import Request
from lab.serving.synthetic_kv import SyntheticKV


class GuessBackend(ContiguousBackend):
    def __init__(self, cfg: SchedulerConfig, seed: int) -> None:
        if cfg.contiguous_guess is None:
            raise ValueError("a guessing contiguous backend needs contiguous_guess")
        self.cfg = cfg  # (not the baseline's __init__: the regions are the cache's)
        device = None if cfg.compute else torch.device("cpu")
        self.cache = ContiguousKVCache(cfg.pool, cfg.contiguous_guess, device,
                                       store_kv=cfg.compute, events=EventLog(cfg.explain))
        self.allocator = self.cache.allocator
        self.events = self.cache.events
        self.kv = SyntheticKV(cfg.pool, seed, cfg.num_heads) if cfg.compute else None
        self.computes = cfg.compute  # K/V to write and check; no prefix cache
        self.taken = 0
        self.no_room: list[tuple[int, int]] = []  # (request, slots it asked for): a preemption
        self.finished: list[Region] = []  # each finished request's region as it was freed

    def reservation(self, req: Request) -> int:
        """Prompt + the guess (or what it grew to before a preemption), at least its tokens."""
        return self.cache.reservation(req.req_id, req.spec.prompt_len, req.length)

    def admit(self, req: Request, num_tokens: int, reserve: int) -> int | None:
        """Its whole reservation, whatever the first chunk (`num_tokens`); None when no hole
        holds it."""
        if not self.allocator.can_reserve(self.reservation(req)):
            return None
        region = self.cache.admit(req.req_id, req.spec.prompt_len, held=req.length)
        self.taken += 1
        req.num_computed = req.num_cached = 0
        return region.reserved

    def grow(self, req: Request, computed: int, num_new: int) -> int | None:
        """Its region cannot hold tokens [computed, computed + num_new): grow in place, or
        move, doubling the output reservation until they fit; None when no hole holds the
        doubled region."""
        region = self.allocator.regions[req.req_id]
        region.used = computed
        while region.reserved < computed + num_new:
            made = self.cache.grow(req.req_id)
            if made is None:
                self.no_room.append((req.req_id, self.cache.target(req.req_id)))
                return None
            self.taken += 1
            region = self.allocator.regions[req.req_id]
        return region.reserved

    def compute(self, batch: Batch) -> AttentionCheck | None:
        """Store the batch's new K/V in one write (and, with `kernel_check`, check them)."""
        if self.kv is None or not batch:
            return None
        slots, keys, values = [], [], []
        for req, start, n in batch:
            first = self.allocator.regions[req.req_id].start
            k, v = self.kv.keys_values(req.planned[start:start + n], start)  # [L, n, kv, D]
            slots += range(first + start, first + start + n)
            keys.append(k)
            values.append(v)
        self.cache.write(slots, torch.cat(keys, 1), torch.cat(values, 1))
        if not self.cfg.kernel_check:
            return None
        return self.check([(req, start + n) for req, start, n in batch])

    def check(self, held: list[tuple[Request, int]]) -> AttentionCheck:
        """(request, n) each: its n-th token attends over its first n slots, read from its
        region with the Triton kernel, against dense attention over the K/V it should hold
        (a move that lost or shifted a token shows)."""
        if self.kv is None:
            raise NotSupported("no K/V to check: the backend runs without tensors (compute)")
        tables, expected, newest = [], [], []
        for req, n in held:
            first = self.allocator.regions[req.req_id].start
            tables.append(list(range(first, first + n)))
            k, v = self.kv.keys_values(req.planned[:n], 0)  # [L, n, kv_heads, D]
            expected.append((k[0], v[0]))
            newest.append(req.planned[n - 1])
        pool = self.cache.pool
        return check_expected(pool.key_caches[0], pool.value_caches[0], tables,
                              self.kv.queries(newest), expected)  # queries [n, heads, D]

    def release(self, req: Request) -> None:
        """Finished: give the region back. Preempted (tokens still to emit): free it for
        recompute, keeping its output reservation."""
        region = self.allocator.regions[req.req_id]
        region.used = req.num_computed
        if req.num_output < req.spec.output_len:
            self.cache.preempt(req.req_id)
        else:
            self.finished.append(Region(req.req_id, region.start, region.reserved, region.used))
            self.cache.release(req.req_id)

    def usage(self, length: np.ndarray, cap: np.ndarray,
              next_in_line: Request | None) -> tuple[float, int]:
        # a full region's newest token waits for growth: it holds no slot yet
        return super().usage(np.minimum(length, cap), cap, next_in_line)

    def picture(self, running: list[Request],
                next_in_line: Request | None) -> ContiguousPicture:
        regions = self.allocator.regions
        held = {r.req_id: min(r.length, regions[r.req_id].reserved) for r in running}
        return self.allocator.picture(held, self._next_need(next_in_line))

    def check_invariants(self, running: list[Request]) -> None:
        super().check_invariants(running)
        self.cache.check_invariants()
