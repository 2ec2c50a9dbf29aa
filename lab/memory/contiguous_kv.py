"""Contiguous reservations over a real K/V tensor: the server must guess each output's length.

The guide's first section: the server knows a request's prompt, not where its output ends. A
contiguous allocator reserves one region of prompt + `guess` slots per request in a linear slot
address space, here one real K/V tensor per layer, [num_slots, 1, num_kv_heads, head_dim] (a
`KVPool` with one slot per block: slot s of a region is row s, so attention reads a region as a
block table of consecutive slots). The region bookkeeping (holes, first fit) is the baseline's
`ContiguousAllocator`; this class adds the guess, growth and the bytes.

Guess low, and a request fills its reservation while it is still generating. Growth policy:
- the output reservation doubles (prompt + 2 x the previous output reservation, at most the
  whole tensor): like a growing array, a request that runs long is copied O(log n) times, not
  once per token, and every byte it holds is copied fewer than 2 times on average;
- in place when the slots right after its region are free (nothing moves);
- otherwise it moves: a new region of the doubled size, first fit, while the old one is still
  held (the copy needs its source), then its K/V are copied there (a device memcpy per layer,
  timed with `time.perf_counter` around it, synchronised on a GPU) and the old region is freed;
- if no hole holds the doubled size, the request cannot grow: the caller preempts (the lab's
  scheduler, through `lab/serving/guess_backend.py`: the newest running request, by recompute,
  as vLLM does).
Guess high, and the reserved-but-unused slots sit empty while the requests behind wait for a
hole big enough for their own reservation.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from lab.memory.block_pool import KVCacheError
from lab.memory.contiguous import ContiguousAllocator, ContiguousPicture, Region
from lab.memory.events import EventLog
from lab.memory.kv_pool import KVPool, PoolConfig


@dataclass(frozen=True)
class Growth:
    """A region that grew in place: nothing was copied."""

    req_id: int
    start: int
    old_size: int
    new_size: int


@dataclass(frozen=True)
class Move:
    """A region that moved: its tokens' K/V were copied from src to dst, every layer."""

    req_id: int
    src: int  # the old region's first slot
    dst: int  # the new region's first slot
    old_size: int
    new_size: int
    tokens: int  # tokens whose K/V were copied
    nbytes: int  # K and V, every layer
    seconds: float | None  # the measured copy (None: allocator only, nothing to copy)


class ContiguousKVCache:
    """One contiguous region per request over a real K/V tensor of the paged pool's bytes."""

    def __init__(self, config: PoolConfig, guess: int, device: torch.device | None = None,
                 store_kv: bool = True, events: EventLog | None = None) -> None:
        if guess < 1:
            raise ValueError(f"the output guess must be at least 1 token, got {guess}")
        self.capacity = config.num_blocks * config.block_size  # the paged pool's token slots
        self.config = replace(config, num_blocks=self.capacity, block_size=1)  # slot = row
        self.guess = guess
        self.allocator = ContiguousAllocator(self.capacity, events)
        self.events = self.allocator.events
        # store_kv=False: allocator only (a page's frames); the bytes move in the live run.
        self.pool = KVPool(self.config, device) if store_kv else None
        self.prompt_len: dict[int, int] = {}
        self.output_reserved: dict[int, int] = {}  # kept through a preemption
        self.moves: list[Move] = []
        self.growths: list[Growth] = []

    # -- admission -------------------------------------------------------------------------
    def reservation(self, req_id: int, prompt_len: int, held: int) -> int:
        """Slots a request reserves when admitted: its prompt + its output reservation (the
        guess, or what it grew to before a preemption), at least what it holds."""
        out = self.output_reserved.get(req_id, self.guess)
        return min(self.capacity, max(held, prompt_len + out))

    def can_admit(self, req_id: int, prompt_len: int, held: int) -> bool:
        return self.allocator.can_reserve(self.reservation(req_id, prompt_len, held))

    def admit(self, req_id: int, prompt_len: int, keys: torch.Tensor | None = None,
              values: torch.Tensor | None = None, held: int | None = None) -> Region:
        """Reserve the region and store the K/V of the tokens it holds (prefill, or recompute
        after a preemption): keys, values [num_layers, held, num_kv_heads, head_dim]."""
        held = keys.shape[1] if keys is not None else held
        if held is None or held < 1:
            raise ValueError("admit needs the K/V of the tokens held (or, allocator only, held)")
        size = self.reservation(req_id, prompt_len, held)
        region = self.allocator.reserve(req_id, size, held)
        self.prompt_len[req_id] = prompt_len
        self.output_reserved[req_id] = size - prompt_len
        self._write(region.start, keys, values)
        return region

    # -- growth ----------------------------------------------------------------------------
    def is_full(self, req_id: int) -> bool:
        region = self.allocator.regions[req_id]
        return region.used == region.reserved

    def target(self, req_id: int) -> int:
        """The region size growth asks for: prompt + 2 x the output reservation."""
        return min(self.capacity, self.prompt_len[req_id] + 2 * self.output_reserved[req_id])

    def grow(self, req_id: int) -> Growth | Move | None:
        """Make room for the next token of a full region: in place, or by a move; None when no
        hole holds the target (nothing changed: the caller must preempt someone)."""
        region = self.allocator.regions[req_id]
        size = self.target(req_id)
        if size <= region.reserved:
            raise KVCacheError(f"request {req_id} already holds the whole tensor")
        if size - region.reserved <= self.allocator.room_after(req_id):
            old = region.reserved
            self.allocator.extend(req_id, size)
            done: Growth | Move = Growth(req_id, region.start, old, size)
            self.growths.append(done)
        elif self.allocator.can_reserve(size):
            old, new = self.allocator.move(req_id, size)
            seconds = self._copy(old.start, new.start, old.used)
            done = Move(req_id, old.start, new.start, old.reserved, size, old.used,
                        old.used * self.config.bytes_per_token, seconds)
            self.events.emit("copy", req_id, None, src=old.start, dst=new.start,
                             tokens=old.used, nbytes=done.nbytes, reason="move")
            self.moves.append(done)
        else:
            return None
        self.output_reserved[req_id] = size - self.prompt_len[req_id]
        return done

    def append(self, req_id: int) -> int:
        """Take the region's next slot for a new token (it must be reserved: `grow` first when
        full); return it, for `write`."""
        region = self.allocator.regions[req_id]
        slot = region.start + region.used
        self.allocator.grow(req_id)
        return slot

    def write(self, slots: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store K/V ([num_layers, n, num_kv_heads, head_dim]) at these slots, in one launch
        of the Triton cache-write kernel (several requests' new tokens at once)."""
        if self.pool is not None:
            self.pool.write(slots, keys, values)

    # -- leaving ---------------------------------------------------------------------------
    def preempt(self, req_id: int) -> None:
        """Free the region (its K/V will be recomputed). The output reservation is kept, or,
        when the region was full, raised to what growth asked for: it comes back with that."""
        region = self.allocator.regions[req_id]
        if region.used == region.reserved:
            self.output_reserved[req_id] = self.target(req_id) - self.prompt_len[req_id]
        self.events.emit("preempt", req_id, None, start=region.start, tokens=region.used)
        self.allocator.release(req_id)

    def release(self, req_id: int) -> None:
        """A finished request gives its region back."""
        self.allocator.release(req_id)
        del self.prompt_len[req_id], self.output_reserved[req_id]

    # -- the bytes -------------------------------------------------------------------------
    def _write(self, start: int, keys: torch.Tensor | None, values: torch.Tensor | None) -> None:
        if keys is not None:
            self.write(list(range(start, start + keys.shape[1])), keys, values)

    def _sync(self) -> None:
        if self.pool is not None and self.pool.device.type == "cuda":
            torch.cuda.synchronize(self.pool.device)

    def _copy(self, src: int, dst: int, n: int) -> float | None:
        """Copy n slots' K/V from src to dst (disjoint), every layer; the seconds it took."""
        if self.pool is None:
            return None
        self._sync()  # time only the copy, not the work queued before it
        began = time.perf_counter()
        for cache in itertools.chain(self.pool.key_caches, self.pool.value_caches):
            cache[dst:dst + n].copy_(cache[src:src + n])  # [n, 1, kv_heads, head_dim]
        self._sync()
        return time.perf_counter() - began

    def read_kv(self, req_id: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V the request's region holds: each [used, num_kv_heads, head_dim]."""
        if self.pool is None:
            raise KVCacheError("this cache stores no K/V (store_kv=False)")
        r = self.allocator.regions[req_id]
        return (self.pool.key_caches[layer][r.start:r.start + r.used, 0],
                self.pool.value_caches[layer][r.start:r.start + r.used, 0])

    def slot_tables(self, req_ids: Sequence[int]) -> list[list[int]]:
        """Each region as a block table of block size 1: its used slots, in order."""
        regions = [self.allocator.regions[i] for i in req_ids]
        return [list(range(r.start, r.start + r.used)) for r in regions]

    # -- reading ---------------------------------------------------------------------------
    @property
    def bytes_copied(self) -> int:
        return sum(m.nbytes for m in self.moves)

    def picture(self, next_request: int = 0) -> ContiguousPicture:
        return self.allocator.picture(next_request=next_request)

    def check_invariants(self) -> None:
        regions = sorted(self.allocator.regions.values(), key=lambda r: r.start)
        for a, b in zip(regions, regions[1:]):
            assert a.start + a.reserved <= b.start, "overlapping regions"
        assert all(0 < r.used <= r.reserved for r in regions)
        assert set(self.prompt_len) >= set(self.allocator.regions)
