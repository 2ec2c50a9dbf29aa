"""The two servers the unknown ending compares, under one serving loop (`EndingServer`): a
contiguous server whose reservations are a guess (`ContiguousServer`, over
`lab/memory/contiguous_kv.py`) and a paged one (`PagedServer`, over the cache manager), with the
seeded K/V both write (`SeededKV`). The loop's policy is in lab/scenarios/unknown_ending.py's
docstring; the story drives both servers on one step clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass

import torch

from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.contiguous_kv import ContiguousKVCache, Growth, Move
from lab.memory.events import EventLog
from lab.memory.kv_pool import PoolConfig
from lab.serving.synthetic_kv import SyntheticKV
from lab.serving.workloads import RequestSpec


def request_label(req_id: int) -> str:
    """A request as the captions name it."""
    return f"**R{req_id}**"


@dataclass(frozen=True)
class StepLog:
    """What one server did at one step."""

    admitted: tuple[int, ...] = ()
    finished: tuple[tuple[int, int], ...] = ()  # (request, the slots it frees)
    preempted: tuple[tuple[int, int, str], ...] = ()  # (victim, who needed room, what it lacked)
    growths: tuple[Growth, ...] = ()  # contiguous: grew in place
    moves: tuple[Move, ...] = ()  # contiguous: moved, its K/V copied
    new_blocks: tuple[tuple[int, int], ...] = ()  # paged: (request, the block its token took)
    waiting: tuple[int, ...] = ()  # after the step, in queue order
    wait_reason: str = ""  # why the head of the queue waits


class SeededKV:
    """Each request's K/V (a function of the seed, its tokens and their positions), made once
    per request: what its tokens write, and what the kernel check expects to read back."""

    def __init__(self, config: PoolConfig, seed: int, specs: dict[int, RequestSpec]) -> None:
        self.synthetic = SyntheticKV(config, seed)
        self.specs = specs
        self._full: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def of(self, req_id: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [start, end): each [num_layers, end - start, num_kv_heads, head_dim]."""
        if req_id not in self._full:
            self._full[req_id] = self.synthetic.keys_values(list(self.specs[req_id].tokens), 0)
        keys, values = self._full[req_id]
        return keys[:, start:end], values[:, start:end]

    def batch(self, writes: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(request, position) pairs, end to end: each [num_layers, n, num_kv_heads, head_dim]."""
        parts = [self.of(r, pos, pos + 1) for r, pos in writes]
        return torch.cat([k for k, _ in parts], 1), torch.cat([v for _, v in parts], 1)


class EndingServer(ABC):
    """The one serving loop both memories run under (see the module docstring)."""

    events: EventLog

    def __init__(self, requests: tuple[RequestSpec, ...], kv: SeededKV | None) -> None:
        self.specs = {r.req_id: r for r in requests}
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.req_id)))
        self.waiting: deque[int] = deque()
        self.running: dict[int, None] = {}  # in admission order: the newest last
        self.held: dict[int, int] = {}  # tokens a request holds (or will prefill again)
        self.num_finished = self.preemptions = self.recomputed = 0
        self.kv = kv

    # what a memory does
    @abstractmethod
    def room(self, req_id: int) -> Growth | Move | bool:
        """Room for the request's next token (growing, in place or by a move); False: none."""

    @abstractmethod
    def fits(self, req_id: int) -> bool: ...

    @abstractmethod
    def take(self, req_id: int) -> None:
        """Admit: memory for the tokens it holds, and (with K/V) their K/V, prefilled."""

    @abstractmethod
    def put(self, req_id: int, pos: int) -> int:
        """Take the slot for its token at pos (room was made); return it."""

    @abstractmethod
    def store(self, writes: list[tuple[int, int, int]]) -> None:
        """The K/V of this step's new tokens, (request, position, slot) each, in one write."""

    @abstractmethod
    def drop(self, req_id: int, preempted: bool) -> None: ...

    @abstractmethod
    def why_waiting(self, req_id: int) -> str: ...

    @abstractmethod
    def lacking(self, req_id: int) -> str:
        """What a running request found no room for (its next token cannot be stored)."""

    @abstractmethod
    def slots_of(self, req_id: int) -> int:
        """Slots the request's memory spans (reserved, or its blocks')."""

    @abstractmethod
    def tables(self, req_ids: list[int]) -> tuple[object, list[list[int]]]:
        """(the KV pool, each request's block table in it), for the kernel check."""

    # the loop
    def step(self, step: int) -> StepLog:
        """One iteration: arrivals, a decode token for every running request, admissions."""
        self.events.step = step
        while self.pending and self.pending[0].arrival_s <= step:
            spec = self.pending.popleft()
            self.waiting.append(spec.req_id)
            self.held[spec.req_id] = spec.prompt_len
        growths, moves, preempted, writes = [], [], [], []
        for req_id in list(self.running):
            if req_id not in self.running:
                continue  # preempted this step to make room for an older request
            while not (made := self.room(req_id)):
                victim = next(reversed(self.running))
                self._preempt(victim)
                preempted.append((victim, req_id, self.lacking(req_id)))
                if victim == req_id:
                    break
            if req_id not in self.running:
                continue
            if isinstance(made, Move):
                moves.append(made)
            elif isinstance(made, Growth):
                growths.append(made)
            pos = self.held[req_id]
            writes.append((req_id, pos, self.put(req_id, pos)))
            self.held[req_id] = pos + 1
        self.store(writes)
        admitted = []
        while not preempted and self.waiting and self.fits(self.waiting[0]):
            req_id = self.waiting.popleft()
            if self.held[req_id] > self.specs[req_id].prompt_len:
                self.recomputed += self.held[req_id]
            self.take(req_id)
            self.running[req_id] = None
            admitted.append(req_id)
        finished = tuple((r, self.slots_of(r)) for r in self.running
                         if self.held[r] == self.specs[r].total_len)
        reason = ""
        if self.waiting:
            reason = ("is not admitted at a step that preempted (the freed room goes to the "
                      "running requests first)" if preempted else self.why_waiting(self.waiting[0]))
        return StepLog(tuple(admitted), finished, tuple(preempted), tuple(growths),
                       tuple(moves), self.new_blocks(writes), tuple(self.waiting), reason)

    def new_blocks(self, writes: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
        """(request, block) for each token of `writes` that took a new block."""
        return ()

    def finish(self, finished: tuple[tuple[int, int], ...]) -> None:
        for req_id, _ in finished:
            self.drop(req_id, preempted=False)
            del self.running[req_id]
            self.num_finished += 1

    def _preempt(self, req_id: int) -> None:
        self.drop(req_id, preempted=True)
        del self.running[req_id]
        self.waiting.appendleft(req_id)
        self.preemptions += 1

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.running)


class ContiguousServer(EndingServer):
    def __init__(self, pool: PoolConfig, guess: int, requests: tuple[RequestSpec, ...],
                 kv: SeededKV | None) -> None:
        super().__init__(requests, kv)
        self.cache = ContiguousKVCache(pool, guess, store_kv=kv is not None)
        self.events = self.cache.events

    def room(self, req_id: int) -> Growth | Move | bool:
        if not self.cache.is_full(req_id):
            return True
        return self.cache.grow(req_id) or False

    def fits(self, req_id: int) -> bool:
        return self.cache.can_admit(req_id, self.specs[req_id].prompt_len, self.held[req_id])

    def take(self, req_id: int) -> None:
        held, prompt_len = self.held[req_id], self.specs[req_id].prompt_len
        if self.kv is None:
            self.cache.admit(req_id, prompt_len, held=held)
        else:
            self.cache.admit(req_id, prompt_len, *self.kv.of(req_id, 0, held))

    def put(self, req_id: int, pos: int) -> int:
        return self.cache.append(req_id)

    def store(self, writes: list[tuple[int, int, int]]) -> None:
        if self.kv is not None and writes:
            self.cache.write([slot for _, _, slot in writes],
                             *self.kv.batch([(r, pos) for r, pos, _ in writes]))

    def drop(self, req_id: int, preempted: bool) -> None:
        (self.cache.preempt if preempted else self.cache.release)(req_id)

    def slots_of(self, req_id: int) -> int:
        return self.cache.allocator.regions[req_id].reserved

    def need(self, req_id: int) -> int:
        return self.cache.reservation(req_id, self.specs[req_id].prompt_len, self.held[req_id])

    def lacking(self, req_id: int) -> str:
        return (f"{request_label(req_id)} must grow to {self.cache.target(req_id)} slots, and "
                "neither the slots after it nor any hole has room")

    def why_waiting(self, req_id: int) -> str:
        usage = self.cache.allocator.usage()
        return (f"needs a hole of {self.need(req_id)} slots, the largest is "
                f"{usage.largest_hole} ({usage.free} free in all)")

    def tables(self, req_ids: list[int]) -> tuple[object, list[list[int]]]:
        return self.cache.pool, self.cache.slot_tables(req_ids)


class PagedServer(EndingServer):
    def __init__(self, pool: PoolConfig, requests: tuple[RequestSpec, ...],
                 kv: SeededKV | None) -> None:
        super().__init__(requests, kv)
        self.manager = KVCacheManager(pool, enable_prefix_cache=False,
                                      store_kv=kv is not None)
        self.events = self.manager.events
        self.seq_of: dict[int, int] = {}

    def room(self, req_id: int) -> bool:
        return self.held[req_id] % self.manager.block_size != 0 or self.manager.blocks.num_free > 0

    def fits(self, req_id: int) -> bool:
        return self.manager.can_allocate(self.held[req_id])

    def take(self, req_id: int) -> None:
        held = self.held[req_id]
        seq = self.manager.add_sequence(list(self.specs[req_id].tokens[:held]))
        self.seq_of[req_id] = seq.seq_id
        if self.kv is None:
            self.manager.commit(seq.seq_id, held)
        else:
            self.manager.write(seq.seq_id, 0, *self.kv.of(req_id, 0, held))

    def put(self, req_id: int, pos: int) -> int:
        return self.manager.append_token(self.seq_of[req_id], self.specs[req_id].tokens[pos])

    def new_blocks(self, writes: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
        bs = self.manager.block_size  # a token at a block's first slot took that block
        return tuple((r, slot // bs) for r, _, slot in writes if slot % bs == 0)

    def store(self, writes: list[tuple[int, int, int]]) -> None:
        seq_ids = [self.seq_of[r] for r, _, _ in writes]
        if self.kv is None:
            for (_, pos, _), seq_id in zip(writes, seq_ids):
                self.manager.commit(seq_id, pos + 1)
        elif writes:
            self.manager.write_batch(seq_ids, *self.kv.batch([(r, pos) for r, pos, _ in writes]))

    def drop(self, req_id: int, preempted: bool) -> None:
        seq_id = self.seq_of.pop(req_id)
        if preempted:
            self.events.emit("preempt", seq_id, None, req_id=req_id,
                             tokens=len(self.manager.sequences[seq_id]))
        self.manager.free(seq_id)

    def slots_of(self, req_id: int) -> int:
        return self.manager.sequences[self.seq_of[req_id]].num_blocks * self.manager.block_size

    def lacking(self, req_id: int) -> str:
        return f"no free block for {request_label(req_id)}'s next token"

    def why_waiting(self, req_id: int) -> str:
        need = blocks_for(self.held[req_id], self.manager.block_size)
        return f"needs {need} blocks, {self.manager.blocks.num_free} free"

    def tables(self, req_ids: list[int]) -> tuple[object, list[list[int]]]:
        return self.manager.pool, [self.manager.sequences[self.seq_of[r]].block_table
                                   for r in req_ids]

