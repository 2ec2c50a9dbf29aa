"""Whole scheduler runs for the pages: step-through frames, replays on both allocators, the batch
chain, and sweeps over block size and pool size. No Streamlit here; `progress(fraction)` callbacks
let a page draw a progress bar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lab.memory.contiguous import ContiguousUsage
from lab.memory.snapshot import Snapshot
from lab.serving.cost_model import CostModel
from lab.serving.metrics import Summary, summarize
from lab.serving.request import IterationRecord, Request, SchedulerConfig
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec

Progress = Callable[[float], None] | None
MAX_FRAMES = 2000  # step-through runs stop here
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Frame:
    """The state after one iteration, for the step-through view."""

    record: IterationRecord
    clock_s: float
    snapshot: Snapshot | ContiguousUsage
    regions: tuple[tuple[int, int, int, int], ...]  # contiguous: (request, start, reserved, held)
    names: dict[int, str]  # paged: sequence id -> "R<request>"
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    swapped: tuple[str, ...]
    finished: int
    rejected: tuple[str, ...]
    preemptions: int


def run(sched: Scheduler, max_iterations: int | None = None, progress: Progress = None) -> None:
    """Step until done (or max_iterations); progress(fraction of requests done) now and then."""
    total = len(sched.pending) + len(sched.requests)
    while not sched.done and (max_iterations is None or sched.iteration < max_iterations):
        sched.step()
        if progress is not None and sched.iteration % 256 == 0:
            progress((sched.num_finished + sched.num_rejected) / max(1, total))


def snapshot(sched: Scheduler) -> Snapshot | ContiguousUsage:
    """The paged pool now (every block), or the contiguous allocator's usage."""
    if sched.backend.kind == "paged":
        return sched.backend.snapshot(sched.running())
    return sched.backend.allocator.usage(sched.next_reservation())


def check_invariants(sched: Scheduler) -> None:
    """The pool's invariants, and every running request's memory covering its tokens."""
    sched.backend.check_invariants()
    t = sched.table
    assert len(t) <= sched.cfg.max_num_seqs
    assert ((t.length - t.computed) >= 1).all(), "a running request with nothing to compute"
    assert (t.computed <= t.cap).all()
    if sched.backend.kind == "paged":
        live = {r.seq_id for r in t.reqs}
        assert live == set(sched.backend.manager.sequences), "sequences without a request"


def _progress_text(req: Request) -> str:
    if req.num_output == 0 or req.num_computed < req.length - 1:
        return f"R{req.req_id} prefill {req.num_computed}/{req.length}"
    return f"R{req.req_id} decode {req.num_output}/{req.spec.output_len}"


def frames(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: CostModel,
           seed: int) -> tuple[list[Frame], Scheduler]:
    """Run to the end (at most MAX_FRAMES iterations), keeping every iteration's picture."""
    sched = Scheduler(requests, cfg, cost, seed)
    out: list[Frame] = []
    while len(out) < MAX_FRAMES and (record := sched.step()) is not None:
        running = sched.running()
        snap = snapshot(sched)
        regions = ()
        if sched.backend.kind == "contiguous":
            held = {r.req_id: r.length for r in running}
            regions = tuple((r.req_id, r.start, r.reserved, held[r.req_id])
                            for r in sched.backend.allocator.regions.values())
        out.append(Frame(
            record, sched.clock, snap, regions, {r.seq_id: f"R{r.req_id}" for r in running},
            tuple(f"R{r.req_id}" for r in sched.waiting),
            tuple(_progress_text(r) for r in running),
            tuple(f"R{r.req_id}" for r in sched.swapped), sched.num_finished,
            tuple(f"R{r.req_id}: {r.reject_reason}" for r in sched.requests.values()
                  if r.reject_reason), sum(sched.preemptions.values())))
    return out, sched


def replay(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: CostModel, seed: int,
           progress: Progress = None) -> Scheduler:
    """A full allocator-only run (no tensors, no decision text)."""
    sched = Scheduler(requests, replace(cfg, compute=False, explain=False), cost, seed)
    run(sched, progress=progress)
    return sched


@dataclass(frozen=True)
class ChainRow:
    """One allocator's links of the guide's chain on one workload."""

    allocator: str
    waste_share: float  # wasted KV slots / pool, time-weighted
    live_seqs: float  # resident sequences, time-weighted
    batch_seqs: float  # sequences per iteration, time-weighted
    throughput: float  # output tokens/s at the best max_num_seqs meeting the latency target
    best_max_num_seqs: int | None  # None: no setting met the target
    compute_bound_share: float
    summary: Summary


def chain(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: CostModel, seed: int,
          itl_target_s: float, seat_options: tuple[int, ...] = (16, 32, 64, 128, 256),
          progress: Progress = None) -> list[ChainRow]:
    """Both allocators at cfg, then each allocator's best throughput over `seat_options` among
    the runs whose ITL p90 stays under the target."""
    rows, total, done = [], 2 * (1 + len(seat_options)), 0
    for allocator in ("contiguous", "paged"):
        base = replace(cfg, allocator=allocator)
        summary = summarize(replay(requests, base, cost, seed))
        done += 1
        best: tuple[float, int] | None = None
        for seats in seat_options:
            s = summarize(replay(requests, replace(base, max_num_seqs=seats), cost, seed))
            meets = s.itl.count and s.itl.p90 <= itl_target_s
            if meets and (best is None or s.throughput_tok_s > best[0]):
                best = (s.throughput_tok_s, seats)
            done += 1
            if progress is not None:
                progress(done / total)
        rows.append(ChainRow(allocator, summary.mean_waste_slots / cfg.capacity_slots,
                             summary.mean_running, summary.mean_batch_seqs,
                             best[0] if best else 0.0, best[1] if best else None,
                             summary.compute_bound_share, summary))
    return rows


@dataclass(frozen=True)
class SweepPoint:
    allocator: str
    x: int  # the swept value (block size, or pool blocks)
    num_blocks: int
    block_size: int
    throughput: float
    waste_share: float
    preemptions: int
    finished: int
    rejected: int
    ttft_p90: float


def _sweep(requests, configs: list[SchedulerConfig], xs: list[int], cost: CostModel, seed: int,
           progress: Progress) -> list[SweepPoint]:
    points = []
    for i, (x, c) in enumerate(zip(xs, configs)):
        s = summarize(replay(requests, c, cost, seed))
        points.append(SweepPoint(c.allocator, x, c.num_blocks, c.block_size, s.throughput_tok_s,
                                 s.mean_waste_slots / c.capacity_slots, s.preemptions,
                                 s.finished, s.rejected, s.ttft.p90))
        if progress is not None:
            progress((i + 1) / len(configs))
    return points


def block_size_sweep(requests, cfg: SchedulerConfig, cost: CostModel, seed: int,
                     sizes: tuple[int, ...] = BLOCK_SIZES,
                     progress: Progress = None) -> list[SweepPoint]:
    """Paged pool of the same bytes (cfg's slots) cut into blocks of each size."""
    slots = cfg.capacity_slots
    configs = [replace(cfg, allocator="paged", block_size=b, num_blocks=max(1, slots // b))
               for b in sizes]
    return _sweep(requests, configs, list(sizes), cost, seed, progress)


def pool_size_sweep(requests, cfg: SchedulerConfig, cost: CostModel, seed: int,
                    fractions: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0),
                    progress: Progress = None) -> list[SweepPoint]:
    """Both allocators on pools of `fractions` x cfg's blocks."""
    configs, xs = [], []
    for allocator in ("contiguous", "paged"):
        for f in fractions:
            blocks = max(1, round(cfg.num_blocks * f))
            configs.append(replace(cfg, allocator=allocator, num_blocks=blocks))
            xs.append(blocks)
    return _sweep(requests, configs, xs, cost, seed, progress)
