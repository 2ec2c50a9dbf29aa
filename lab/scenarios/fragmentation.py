"""Fragmentation: one seeded workload on the contiguous baseline and on the paged pool.

Both systems get the same bytes (num_blocks x block_size token slots) and the same requests.
The contiguous server must reserve prompt + max_output slots per request up front, in one
piece (first fit); the paged server takes blocks as tokens arrive. Each step records a memory
map of both and their internal / external fragmentation, so a page can show them side by side.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.contiguous import ContiguousAllocator, Region
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.serving.paged_replay import PagedReplay, Request, RequestQueue
from lab.serving.synthetic_kv import VOCAB, SyntheticKV

BLOCK_TABLE_ENTRY_BYTES = 4  # one int32 physical id per logical block
SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class FragConfig:
    num_requests: int = 12
    block_size: int = 16
    num_blocks: int = 48  # the paged pool; the contiguous region has the same slots
    prompt_min: int = 16
    prompt_max: int = 96
    mean_output: int = 48  # outputs are drawn around this, most short, a few long
    max_output: int = 160  # the cap a contiguous server must reserve for
    arrival_gap: int = 2  # mean steps between arrivals

    def __post_init__(self) -> None:
        for name in ("num_requests", "block_size", "num_blocks", "prompt_min", "prompt_max",
                     "mean_output", "max_output", "arrival_gap"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.prompt_min > self.prompt_max:
            raise ValueError(f"prompt_min ({self.prompt_min}) is above prompt_max "
                             f"({self.prompt_max})")
        if self.mean_output > self.max_output:
            raise ValueError(f"the mean output ({self.mean_output}) is above the maximum output "
                             f"({self.max_output})")
        reservation = self.prompt_max + self.max_output
        if reservation > self.capacity:
            raise ValueError(
                f"one request may reserve {reservation} slots (prompt {self.prompt_max} + max "
                f"output {self.max_output}) but the pool holds only {self.capacity} "
                f"({self.num_blocks} blocks x {self.block_size}): add blocks or lower the lengths")

    @property
    def capacity(self) -> int:
        return self.num_blocks * self.block_size


def make_workload(cfg: FragConfig, seed: int) -> list[Request]:
    """Requests with uniform prompt lengths and geometric-like output lengths (many short,
    a few long), capped at max_output; arrivals spaced by a random gap around arrival_gap."""
    rng = random.Random(seed)
    requests, arrival = [], 0
    for req_id in range(cfg.num_requests):
        prompt_len = rng.randint(cfg.prompt_min, cfg.prompt_max)
        output_len = min(cfg.max_output, 1 + int(rng.expovariate(1 / cfg.mean_output)))
        tokens = [rng.randrange(VOCAB) for _ in range(prompt_len + output_len)]
        requests.append(Request(req_id, arrival, tuple(tokens[:prompt_len]),
                                tuple(tokens[prompt_len:])))
        arrival += rng.randint(0, 2 * cfg.arrival_gap)
    return requests


class ContiguousReplay(RequestQueue):
    """The same loop as PagedReplay, but each admission reserves prompt + max_output slots."""

    def __init__(self, capacity: int, requests: list[Request], max_output: int) -> None:
        super().__init__(requests)
        self.allocator = ContiguousAllocator(capacity)
        self.max_output = max_output

    def advance(self) -> None:
        self._arrive()
        self.allocator.events.step = self.step
        for req_id in list(self.running):
            self.allocator.grow(req_id)
            if self.allocator.regions[req_id].used == self.requests[req_id].total_len:
                self.allocator.release(req_id)
                del self.running[req_id]
                self.finished.append(req_id)
        while self.waiting:
            req = self.requests[self.waiting[0]]
            size = req.prompt_len + self.max_output
            if not self.allocator.can_reserve(size):
                break  # first come, first served: nobody overtakes the head of the queue
            self.allocator.reserve(req.req_id, size, used=req.prompt_len)
            self.running[self.waiting.popleft()] = req.req_id


@dataclass(frozen=True)
class MemoryStats:
    """One system at one step, in token slots (x bytes_per_token for bytes)."""

    capacity: int
    used: int  # slots holding a live token's K/V
    internal: int  # allocated or reserved, but holding nothing
    free: int
    external: int  # free, but in pieces too small for the request waiting to be placed
    running: int
    waiting: int
    finished: int

    @property
    def wasted_pct(self) -> float:
        """Internal + external fragmentation, as a percentage of the pool."""
        return 100 * (self.internal + self.external) / self.capacity


@dataclass(frozen=True)
class FragFrame:
    step: int
    contiguous: MemoryStats
    paged: MemoryStats
    regions: tuple[Region, ...]  # the contiguous layout: (req_id, start, reserved, used)
    holes: tuple[tuple[int, int], ...]  # the contiguous free runs: (start, size)
    snapshot: Snapshot  # the paged pool
    seq_of_request: dict[int, int]  # running req_id -> its paged sequence id
    preemptions: int  # paged recompute preemptions so far
    next_reservation: int  # slots the contiguous server must find next (0: nobody waits)


def paged_replay(cfg: FragConfig, requests: list[Request], seed: int,
                 store_kv: bool = True) -> PagedReplay:
    """The paged side of the comparison on its own (with store_kv: on a real KV pool)."""
    config = PoolConfig(num_blocks=cfg.num_blocks, block_size=cfg.block_size)
    manager = KVCacheManager(config, enable_prefix_cache=False, store_kv=store_kv)
    kv = SyntheticKV(config, seed) if store_kv else None
    return PagedReplay(manager, requests, kv)


def run(cfg: FragConfig, seed: int) -> tuple[list[Request], list[FragFrame]]:
    """The seeded workload on both systems."""
    requests = make_workload(cfg, seed)
    return requests, simulate(cfg, requests)


def simulate(cfg: FragConfig, requests: list[Request],
             max_steps: int = 2000) -> list[FragFrame]:
    """Both systems, step by step, until every request has finished in both."""
    frames = []
    for contiguous, paged in _steps(cfg, requests, max_steps):
        frames.append(_frame(contiguous, paged, cfg))
    return frames


def _steps(cfg: FragConfig, requests: list[Request], max_steps: int):
    """Advance both systems together; yield them after each step until both are drained."""
    for r in requests:
        if r.prompt_len + cfg.max_output > cfg.capacity or r.output_len > cfg.max_output:
            raise ValueError(f"request {r.req_id} does not fit the limits of {cfg}")
    contiguous = ContiguousReplay(cfg.capacity, requests, cfg.max_output)
    paged = paged_replay(cfg, requests, 0, store_kv=False)
    for _ in range(max_steps):
        contiguous.advance()
        paged.advance()
        yield contiguous, paged
        if contiguous.done and paged.done:
            return
    raise RuntimeError(f"the workload did not drain in {max_steps} steps")


def trace_json(cfg: FragConfig, seed: int, step: int) -> str:
    """The event traces of both systems up to `step`, with what replays them."""
    requests = make_workload(cfg, seed)
    for contiguous, paged in _steps(cfg, requests, step + 1):  # noqa: B007 (kept after the loop)
        if paged.step == step:
            break
    return json.dumps({
        "meta": {"page": "fragmentation", "seed": seed, "step": step, "params": asdict(cfg)},
        "contiguous": [e.to_dict() for e in contiguous.allocator.events.events],
        "paged": json.loads(paged.manager.events.to_json())["events"]}, indent=1)


def _frame(contiguous: ContiguousReplay, paged: PagedReplay, cfg: FragConfig) -> FragFrame:
    demand = contiguous.next_demand()
    need = demand.prompt_len + cfg.max_output if demand else 0
    u = contiguous.allocator.usage(next_request=need)
    c_stats = MemoryStats(u.capacity, u.used, u.internal, u.free, u.external,
                          len(contiguous.running), len(contiguous.waiting),
                          len(contiguous.finished))
    snap = paged.manager.snapshot()
    p = snap.usage
    # Any free block serves any request, so the paged pool has no external fragmentation.
    p_stats = MemoryStats(cfg.capacity, p.slots_filled, p.tail_slots,
                          p.blocks_free * cfg.block_size, 0, len(paged.running),
                          len(paged.waiting), len(paged.finished))
    regions = tuple(Region(r.req_id, r.start, r.reserved, r.used)
                    for r in sorted(contiguous.allocator.regions.values(), key=lambda r: r.start))
    return FragFrame(contiguous.step, c_stats, p_stats, regions, u.holes, snap,
                     dict(paged.running), paged.num_preemptions, need)


@dataclass(frozen=True)
class SweepRow:
    block_size: int
    tail_slots: float  # mean unused slots in a sequence's last block, over its whole life
    tail_pct: float  # tail slots as % of the slots the sequence's blocks hold
    table_entries: float  # mean block-table length (physical ids) per sequence
    table_bytes: float  # the same, in bytes of int32 entries


def block_size_sweep(requests: list[Request],
                     sizes: tuple[int, ...] = SWEEP_BLOCK_SIZES) -> list[SweepRow]:
    """The block-size tradeoff on this workload: every request at every length it passes
    through (prompt .. prompt + output), averaged."""
    lengths = [n for r in requests for n in range(r.prompt_len, r.total_len + 1)]
    rows = []
    for bs in sizes:
        entries = [blocks_for(n, bs) for n in lengths]
        tails = [e * bs - n for e, n in zip(entries, lengths)]
        allocated = sum(e * bs for e in entries)
        rows.append(SweepRow(bs, sum(tails) / len(lengths), 100 * sum(tails) / allocated,
                             sum(entries) / len(lengths),
                             BLOCK_TABLE_ENTRY_BYTES * sum(entries) / len(lengths)))
    return rows
