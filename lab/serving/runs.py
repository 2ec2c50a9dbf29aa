"""Whole scheduler runs: replays, and sweeps over block size and pool size (the guide's batch
chain is in chain.py). No Streamlit here; `progress(fraction)` callbacks let a page draw a
progress bar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import Cost
from lab.serving.metrics import summarize
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec

Progress = Callable[[float], None] | None
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def run(sched: Scheduler, max_iterations: int | None = None, progress: Progress = None) -> None:
    """Step until done (or max_iterations); progress(fraction of requests done) now and then."""
    total = len(sched.pending) + len(sched.requests)
    while not sched.done and (max_iterations is None or sched.iteration < max_iterations):
        sched.step()
        if progress is not None and sched.iteration % 256 == 0:
            progress((sched.num_finished + sched.num_rejected) / max(1, total))


def replay(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: Cost, seed: int,
           progress: Progress = None) -> Scheduler:
    """A full allocator-only run (no tensors, no decision text)."""
    sched = Scheduler(requests, replace(cfg, compute=False, explain=False), cost, seed)
    run(sched, progress=progress)
    return sched


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


def _sweep(requests, configs: list[SchedulerConfig], xs: list[int], cost: Cost, seed: int,
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


def block_size_sweep(requests, cfg: SchedulerConfig, cost: Cost, seed: int,
                     sizes: tuple[int, ...] = BLOCK_SIZES,
                     progress: Progress = None) -> list[SweepPoint]:
    """Paged pool of the same bytes (cfg's slots) cut into blocks of each size."""
    slots = cfg.capacity_slots
    configs = [replace(cfg.with_pool(block_size=b, num_blocks=max(1, slots // b)),
                       allocator="paged") for b in sizes]
    return _sweep(requests, configs, list(sizes), cost, seed, progress)


def pool_size_sweep(requests, cfg: SchedulerConfig, cost: Cost, seed: int,
                    fractions: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0),
                    progress: Progress = None) -> list[SweepPoint]:
    """Both allocators on pools of `fractions` x cfg's blocks."""
    configs, xs = [], []
    for allocator in ("contiguous", "paged"):
        for f in fractions:
            blocks = max(1, round(cfg.num_blocks * f))
            configs.append(replace(cfg.with_pool(num_blocks=blocks), allocator=allocator))
            xs.append(blocks)
    return _sweep(requests, configs, xs, cost, seed, progress)
