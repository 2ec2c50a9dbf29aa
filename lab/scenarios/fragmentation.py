"""Fragmentation: one seeded workload on the contiguous baseline and on the paged pool.

Both systems get the same bytes (the pool's num_blocks x block_size token slots) and the same
requests, served by the lab's scheduler on a step clock (one iteration per step, arrivals at
step numbers, no token budget or seat limit, first come first served). The contiguous server
must reserve prompt + max_output slots per request up front, in one piece (first fit); the
paged server takes blocks as tokens arrive. Each step records a memory map of both and their
internal / external fragmentation, so the page can show them side by side.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.contiguous import ContiguousPicture, Region
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.scenarios.story import MAX_STEPS, Story
from lab.serving.config import step_server
from lab.serving.cost_model import StepClock
from lab.serving.request import IterationRecord
from lab.serving.runs import BLOCK_SIZES
from lab.serving.scheduler import Scheduler
from lab.serving.synthetic_kv import VOCAB
from lab.serving.workloads import RequestSpec

BLOCK_TABLE_ENTRY_BYTES = 4  # one int32 physical id per logical block
SPREAD = 4  # standard deviations of the total output that likely_steps allows for
LENGTH_MARGIN = 1.1  # likely_steps x this must fit in MAX_STEPS
MAX_BLOCK_STEPS = 500_000  # pool blocks x steps the frames may hold (~90 MB, bench/RESULTS.md)
SYSTEMS = ("contiguous", "paged")


@dataclass(frozen=True)
class FragConfig:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_blocks=48, block_size=16))
    num_requests: int = 12
    prompt_min: int = 16
    prompt_max: int = 96
    mean_output: int = 48  # outputs are drawn around this, most short, a few long
    max_output: int = 160  # the cap a contiguous server must reserve for
    arrival_gap: int = 2  # mean steps between arrivals

    def __post_init__(self) -> None:
        for name in ("num_requests", "prompt_min", "prompt_max", "mean_output", "max_output",
                     "arrival_gap"):
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
                f"({self.pool.num_blocks} blocks x {self.pool.block_size}): add blocks or "
                "lower the lengths")
        # Bounded before it runs: a story past MAX_STEPS never drains on the page, and the
        # frames of a long story over a large pool take seconds and hundreds of MB to build.
        steps = self.likely_steps()
        if steps * LENGTH_MARGIN > MAX_STEPS:
            raise ValueError(
                f"this workload may take about {steps:,} steps to serve (the contiguous server "
                f"fits {self.side_by_side} reservation(s) side by side), and the page plays at "
                f"most {MAX_STEPS:,}: fewer requests, a shorter typical or maximum output, or a "
                "larger pool")
        if steps * self.pool.num_blocks > MAX_BLOCK_STEPS:
            raise ValueError(
                f"about {steps:,} steps of a {self.pool.num_blocks:,}-block pool is more than "
                f"the page draws ({MAX_BLOCK_STEPS:,} blocks x steps): a larger block size, a "
                "smaller pool or a shorter workload")

    @property
    def side_by_side(self) -> int:
        """Largest reservations the contiguous pool holds at once (at least the one)."""
        return max(1, self.capacity // (self.prompt_max + self.max_output))

    def likely_steps(self) -> int:
        """A high estimate of the story's length, from the settings alone (the seed draws the
        lengths): the last arrival, then the contiguous server's work (the paged server is
        never slower), i.e. the total output (its mean plus SPREAD standard deviations)
        shared by the reservations side by side, or the longest output when that is longer.
        Against 1,200 seeded runs of settings drawn over the page's ranges no story ran past it
        by more than 7 % (LENGTH_MARGIN covers that), and none it accepts ran past MAX_STEPS."""
        q = math.exp(-1 / self.mean_output)
        mean = (1 - q ** self.max_output) / (1 - q)  # E[min(max_output, 1 + floor(Exp))]
        n = self.num_requests
        total = n * mean + SPREAD * mean * math.sqrt(n)
        longest = min(self.max_output, self.mean_output * (math.log(n) + 5))
        return math.ceil(2 * self.arrival_gap * (n - 1) + max(total / self.side_by_side, longest))

    @property
    def capacity(self) -> int:
        return self.pool.num_blocks * self.pool.block_size


def make_workload(cfg: FragConfig, seed: int) -> tuple[RequestSpec, ...]:
    """Requests with uniform prompt lengths and geometric-like output lengths (many short,
    a few long), capped at max_output; arrivals spaced by a random gap around arrival_gap."""
    rng = random.Random(seed)
    requests, arrival = [], 0
    for req_id in range(cfg.num_requests):
        prompt_len = rng.randint(cfg.prompt_min, cfg.prompt_max)
        output_len = min(cfg.max_output, 1 + int(rng.expovariate(1 / cfg.mean_output)))
        tokens = tuple(rng.randrange(VOCAB) for _ in range(prompt_len + output_len))
        requests.append(RequestSpec(req_id, prompt_len, output_len, float(arrival),
                                    max_tokens=cfg.max_output, tokens=tokens))
        arrival += rng.randint(0, 2 * cfg.arrival_gap)
    return tuple(requests)


@dataclass(frozen=True)
class MemoryStats:
    """One system at one step, in token slots (x bytes_per_token for bytes)."""

    capacity: int
    used: int  # slots holding a token
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
    records: dict[str, IterationRecord | None]  # what each server did at this step (None: idle)


class FragStepper:
    """Both servers on one step clock: step s runs each one's iteration that starts at s."""

    def __init__(self, cfg: FragConfig, requests: tuple[RequestSpec, ...], seed: int,
                 store_kv: bool = False) -> None:
        for r in requests:
            if r.prompt_len + cfg.max_output > cfg.capacity or r.output_len > cfg.max_output:
                raise ValueError(f"request {r.req_id} does not fit the limits of {cfg}")
        self.cfg = cfg
        self.servers = {
            "contiguous": Scheduler(requests, step_server(cfg.pool, allocator="contiguous"),
                                    StepClock(), seed),
            "paged": Scheduler(requests, step_server(cfg.pool, compute=store_kv), StepClock(),
                               seed)}
        self.step = -1
        self.last: dict[str, IterationRecord | None] = dict.fromkeys(SYSTEMS)

    @property
    def done(self) -> bool:
        return all(s.done for s in self.servers.values())

    def advance(self) -> FragFrame:
        self.step += 1
        for name, sched in self.servers.items():
            start = sched.next_start()
            self.last[name] = sched.step() if start is not None and start <= self.step else None
        return self.frame()

    def frame(self) -> FragFrame:
        contiguous, paged = self.servers["contiguous"], self.servers["paged"]
        picture: ContiguousPicture = contiguous.picture()
        u = picture.usage
        c_stats = MemoryStats(u.capacity, u.used, u.internal, u.free, u.external,
                              len(contiguous.table), len(contiguous.waiting),
                              contiguous.num_finished)
        snap: Snapshot = paged.picture()
        p = snap.usage
        # Any free block serves any request, so the paged pool has no external fragmentation.
        p_stats = MemoryStats(self.cfg.capacity, p.slots_filled, p.tail_slots,
                              p.blocks_free * self.cfg.pool.block_size, 0, len(paged.table),
                              len(paged.waiting), paged.num_finished)
        return FragFrame(self.step, c_stats, p_stats, picture.regions, u.holes, snap,
                         {r.req_id: r.seq_id for r in paged.running()},
                         sum(paged.preemptions.values()), picture.next_request, dict(self.last))

    def check_attention(self) -> AttentionCheck | None:
        record = self.last["paged"]
        return record.check if record is not None else None

    def events(self) -> dict[str, list[dict]]:
        return {name: s.backend.events.as_dicts() for name, s in self.servers.items()}


@dataclass(frozen=True)
class FragmentationStory(Story[FragFrame]):
    page = "fragmentation"
    config: FragConfig
    seed: int

    def requests(self) -> tuple[RequestSpec, ...]:
        return make_workload(self.config, self.seed)

    def stepper(self, store_kv: bool = False) -> FragStepper:
        return FragStepper(self.config, self.requests(), self.seed, store_kv)

    def caption(self, frame: FragFrame) -> list[str]:
        """What each server did at this step: admissions, preemptions, finished requests."""
        lines = []
        for name in SYSTEMS:
            record = frame.records[name]
            if record is None:
                continue
            label = name.capitalize()
            if record.admitted_ids:
                lines.append(f"{label}: admits {_requests(record.admitted_ids)}.")
            if record.preempted_ids:
                lines.append(f"{label}: no free block for a decode, so "
                             f"{_requests(record.preempted_ids)} is preempted (recompute).")
            if record.finished_ids:
                one = len(record.finished_ids) == 1
                lines.append(f"{label}: {_requests(record.finished_ids)} "
                             f"{'finishes and frees its' if one else 'finish and free their'} "
                             "memory.")
        total = self.config.num_requests
        if frame.contiguous.finished == frame.paged.finished == total:
            lines.append(f"Both servers are done with all {total} requests: every reservation "
                         "and every block is back in the free pool.")
        return lines


def finish_steps(frames: list[FragFrame], total: int) -> dict[str, int | None]:
    """The step at which each system finished its last request (None: not in these frames)."""
    return {name: next((f.step for f in frames if getattr(f, name).finished == total), None)
            for name in SYSTEMS}


def finish_verdict(step: int, finished_at: dict[str, int | None], total: int) -> str:
    """When each system finished its workload, said as of `step`: a system that is done has
    nothing left to compare, so the page says so instead of comparing it with a busy one."""
    done = {name: at for name, at in finished_at.items() if at is not None and at <= step}
    if not done:
        return ""
    if len(done) == 2:
        first, second = sorted(SYSTEMS, key=lambda name: (done[name], name))
        if done[first] == done[second]:
            return f"Both finished all {total} requests at step {done[first]}."
        return (f"{first.capitalize()} finished all {total} requests at step {done[first]}, "
                f"{second} at step {done[second]}: {first} needed "
                f"{done[first] / done[second]:.0%} of the steps.")
    (name, at), = done.items()
    other = next(n for n in SYSTEMS if n != name)
    later = finished_at[other]
    rest = f"it finishes at step {later}" if later is not None else "it has not finished"
    return (f"{name.capitalize()} finished all {total} requests at step {at}; {other} is still "
            f"serving ({rest}). From here on only {other}'s memory is in use.")


def run_waste(frames: list[FragFrame], system: str) -> float:
    """A system's waste over its run: internal + external fragmentation as a share of the pool,
    averaged over the steps it held requests (an idle pool wastes nothing and says nothing)."""
    busy = [getattr(f, system) for f in frames if getattr(f, system).running]
    return sum(s.wasted_pct for s in busy) / len(busy) if busy else 0.0


def blocked_by_holes(s: MemoryStats, next_reservation: int) -> bool:
    """The contiguous server has the free slots for the next reservation, only not in one piece:
    external fragmentation is what keeps the request waiting."""
    return 0 < next_reservation <= s.free and s.external == s.free


def event_steps(frames: list[FragFrame]) -> list[tuple[int, str]]:
    """The steps where something worth stopping at happens, each with what: a request finishes
    and frees its memory, a reservation fails on holes (from the step it starts failing), a
    paged decode finds no free block, a system finishes its workload."""
    out, was_blocked, preempted = [], False, 0
    total = frames[-1].paged.finished if frames else 0  # a whole story: it ends all done
    for f in frames:
        notes = []
        for name in SYSTEMS:
            record = f.records[name]
            if record and record.finished_ids:
                verb = "finishes" if len(record.finished_ids) == 1 else "finish"
                notes.append(f"{name}: {_names(record.finished_ids)} {verb} and free memory")
                if getattr(f, name).finished == total:
                    notes.append(f"{name} has finished all {total} requests")
        blocked = blocked_by_holes(f.contiguous, f.next_reservation)
        if blocked and not was_blocked:
            notes.append(f"contiguous: {f.contiguous.free} slots are free but no hole holds the "
                         f"next reservation of {f.next_reservation}")
        was_blocked = blocked
        if f.preemptions > preempted:
            notes.append("paged: no free block for a decode, a request is preempted")
        preempted = f.preemptions
        if notes:
            out.append((f.step, "; ".join(notes)))
    return out


def comparable(c: MemoryStats, p: MemoryStats) -> bool:
    """Like with like: both systems hold requests at this step (an empty pool wastes nothing,
    so comparing it with a busy one says nothing about fragmentation)."""
    return c.running > 0 and p.running > 0


def _names(ids: tuple[int, ...]) -> str:
    return ", ".join(f"R{i}" for i in ids)


def _requests(ids: tuple[int, ...]) -> str:
    return ", ".join(f"**R{i}**" for i in ids)


@dataclass(frozen=True)
class SweepRow:
    block_size: int
    tail_slots: float  # mean unused slots in a sequence's last block, over its whole life
    tail_pct: float  # tail slots as % of the slots the sequence's blocks hold
    table_entries: float  # mean block-table length (physical ids) per sequence
    table_bytes: float  # the same, in bytes of int32 entries


def block_size_sweep(requests: tuple[RequestSpec, ...],
                     sizes: tuple[int, ...] = BLOCK_SIZES) -> list[SweepRow]:
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


# What doubling the block size does, as (block-table entries factor, empty tail factor).
DOUBLING = {"entries about halve, the empty tail about doubles": (0.5, 2.0),
            "entries about halve, the empty tail stays about the same": (0.5, 1.0),
            "entries stay about the same, the empty tail about doubles": (1.0, 2.0),
            "entries and the empty tail both about halve": (0.5, 0.5)}


def doubling_effect(rows: list[SweepRow], size: int) -> tuple[str, SweepRow, SweepRow]:
    """Which of DOUBLING the sweep measures from `size` to twice it (the nearest, in factors of
    two), with the two rows it compares."""
    by_size = {r.block_size: r for r in rows}
    low, high = by_size[size], by_size[2 * size]

    def off(factors: tuple[float, float]) -> float:
        measured = (high.table_entries / low.table_entries,
                    (high.tail_slots + 1e-9) / (low.tail_slots + 1e-9))
        return sum(abs(math.log2(m / f)) for m, f in zip(measured, factors))

    return min(DOUBLING, key=lambda name: off(DOUBLING[name])), low, high
