"""Whole scheduler runs: replays on both allocators, and sweeps over block size and pool
size (the guide's batch chain is in chain.py). No Streamlit here; `progress(fraction)`
callbacks let a page draw a progress bar (called every 256 iterations, which is also where a
page run can be stopped).

A page's view is bounded before it starts: `check_work` refuses runs whose time on one core or
whose memory, by the cost model below (fitted on this machine, bench/hostile.py), pass what
one view may take; an `IterationAllowance` stops them (ReplayTooLong) should the estimate
be low (a preemption storm).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import Cost
from lab.serving.metrics import Summary, summarize
from lab.serving.request import RequestState
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec
from lab.sizing.capacity import CapacitySheet, capacity_sheet, load_gpus
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import ModelSpec

T = TypeVar("T")
Progress = Callable[[float], None] | None
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POOL_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)  # of cfg's pool: a card's is all it holds
ALLOCATORS = ("contiguous", "paged")
ENGINES = ("v1", "v0")
# What a replay costs on one core (bench/RESULTS.md, "Hostile input"): CPU seconds per
# iteration, per output token and per request; bytes held while it runs per token (each
# request's planned token ids, its blocks), per iteration (its record and latencies) and per
# request.
SECONDS_PER_ITERATION, SECONDS_PER_OUTPUT, SECONDS_PER_REQUEST = 36e-6, 0.6e-6, 40e-6
BYTES_PER_TOKEN, BYTES_PER_ITERATION, BYTES_PER_REQUEST = 72, 500, 1000
MAX_VIEW_SECONDS = 12.0  # CPU seconds a view's replays may take in all (the default chain: ~10)
MAX_REPLAY_BYTES = 256 << 20  # memory one replay may hold
MAX_ITERATIONS = int(2 * MAX_VIEW_SECONDS / SECONDS_PER_ITERATION)  # an allowance's hard stop
# The card's pool as the memory calculator sizes it by default: vLLM's gpu_memory_utilization
# default, and a non-KV reserve for activations, the runtime and CUDA graphs.
CARD_UTILIZATION, CARD_RESERVE_BYTES = 0.9, 2 << 30
PERCENTS = np.linspace(0.0, 100.0, 201)  # the percentiles a latency distribution is kept at


class ReplayTooLong(ValueError):
    """Replays that would run, or ran, past what a view may (the message says what to lower)."""


@dataclass
class IterationAllowance:
    """Iterations the replays of one view may still run."""

    left: int = MAX_ITERATIONS

    def spend(self, sched: Scheduler) -> None:
        self.left -= sched.iteration
        if not sched.done:
            raise ReplayTooLong(f"the replays passed {MAX_ITERATIONS:,} scheduler iterations "
                                "before they served every request: fewer requests, a larger "
                                "pool, token budget or max_num_seqs")


def _served(requests: Sequence[RequestSpec], cfg: SchedulerConfig) -> list[RequestSpec]:
    """The requests that fit the pool alone (the others are rejected when they arrive)."""
    return [r for r in requests if r.prompt_len + (r.max_tokens or r.output_len)
            <= cfg.capacity_slots]


def likely_iterations(requests: Sequence[RequestSpec], cfg: SchedulerConfig) -> int:
    """About how many iterations a replay takes (bench/hostile.py sets it beside real ones):
    every output token needs an iteration of its request, shared by as many requests as run at
    once (max_num_seqs, or the pool over an average request's footprint: prompt plus output,
    or plus max_tokens for the contiguous allocator, which reserves it), and the longest
    output needs one iteration per token whatever else runs; prompts go through the token
    budget."""
    served = _served(requests, cfg)
    if not served:
        return 0
    reserves = cfg.allocator == "contiguous"
    held = sum(r.prompt_len + (r.max_tokens or r.output_len if reserves else r.output_len)
               for r in served)
    concurrent = max(1.0, min(cfg.max_num_seqs, cfg.capacity_slots * len(served) / held))
    outputs = sum(r.output_len for r in served)
    prompts = sum(r.prompt_len for r in served)
    longest = max(r.output_len for r in served)
    return math.ceil(max(outputs / concurrent, longest) + prompts / cfg.max_num_batched_tokens)


def check_work(requests: Sequence[RequestSpec], configs: Sequence[SchedulerConfig]) -> float:
    """The CPU seconds replaying `requests` on each config would take, or ReplayTooLong when
    that, or the memory of the largest replay, is more than a view may take."""
    iterations = [likely_iterations(requests, c) for c in configs]
    seconds = sum(SECONDS_PER_ITERATION * i + SECONDS_PER_REQUEST * len(requests)
                  + SECONDS_PER_OUTPUT * sum(r.output_len for r in _served(requests, c))
                  for i, c in zip(iterations, configs))
    tokens = sum(r.total_len for r in requests)  # every arrival's token ids are drawn
    held = (BYTES_PER_TOKEN * tokens + BYTES_PER_ITERATION * max(iterations, default=0)
            + BYTES_PER_REQUEST * len(requests))
    what = f"{len(configs)} replay(s) of {len(requests):,} requests, {tokens:,} tokens"
    if held > MAX_REPLAY_BYTES:
        raise ReplayTooLong(f"{what}: a replay would hold about {held / 2**20:,.0f} MiB, and "
                            f"one may hold {MAX_REPLAY_BYTES >> 20} MiB: fewer or shorter "
                            "requests (a lower max_tokens)")
    if seconds > MAX_VIEW_SECONDS:
        raise ReplayTooLong(f"{what}, about {sum(iterations):,} scheduler iterations: about "
                            f"{seconds:,.0f} s of the server's time, and a view may take "
                            f"{MAX_VIEW_SECONDS:g} s: fewer requests, a lower max_tokens, a "
                            "larger token budget, more max_num_seqs or a larger pool")
    return seconds


def part_progress(progress: Progress, done: int, total: int) -> Progress:
    """The progress of one replay among `total`, as a fraction of all of them."""
    return None if progress is None else (lambda f: progress((done + f) / total))


def run(sched: Scheduler, max_iterations: int | None = None, progress: Progress = None) -> None:
    """Step until done (or max_iterations); progress(fraction of requests done) now and then."""
    total = len(sched.pending) + len(sched.requests)
    while not sched.done and (max_iterations is None or sched.iteration < max_iterations):
        sched.step()
        if progress is not None and sched.iteration % 256 == 0:
            progress((sched.num_finished + sched.num_rejected) / max(1, total))


def replay(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: Cost, seed: int,
           progress: Progress = None, allowance: IterationAllowance | None = None) -> Scheduler:
    """A full allocator-only run (no tensors, no decision text), within `allowance` if given."""
    sched = Scheduler(requests, replace(cfg, compute=False, explain=False), cost, seed)
    run(sched, None if allowance is None else max(0, allowance.left), progress)
    if allowance is not None:
        allowance.spend(sched)
    return sched


def replay_each(requests: tuple[RequestSpec, ...], configs: dict[str, SchedulerConfig],
                cost: Cost, seed: int, keep: Callable[[Scheduler], T],
                progress: Progress = None) -> dict[str, T]:
    """keep(the replay) on each named config, checked and given one allowance of iterations as
    one view; each replay is reduced to what `keep` returns before the next starts (one is in
    memory at a time)."""
    check_work(requests, list(configs.values()))
    allowance = IterationAllowance()
    return {name: keep(replay(requests, c, cost, seed,
                              part_progress(progress, i, len(configs)), allowance))
            for i, (name, c) in enumerate(configs.items())}


def replay_both(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: Cost, seed: int,
                keep: Callable[[Scheduler], T], progress: Progress = None) -> dict[str, T]:
    """keep(the replay) on each allocator (`replay_each`)."""
    return replay_each(requests, {a: replace(cfg, allocator=a) for a in ALLOCATORS}, cost,
                       seed, keep, progress)


def replay_engines(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: Cost,
                   seed: int, keep: Callable[[Scheduler], T], v0_preemption: str = "swap",
                   progress: Progress = None) -> dict[str, T]:
    """keep(the replay) under vLLM V1 (0.33) and under the paper's V0 (2023, preempting by
    `v0_preemption`), on the paged pool with the same workload and settings, each at its own
    default watermark (`SchedulerConfig.as_engine`)."""
    paged = replace(cfg, allocator="paged")
    configs = {e: paged.as_engine(e, v0_preemption) for e in ENGINES}
    return replay_each(requests, configs, cost, seed, keep, progress)


def card_sheet(spec: ModelSpec, gpu_name: str, block_size: int) -> CapacitySheet:
    """The memory calculator's sheet for `spec` on one `gpu_name`: the KV blocks that card
    holds for that model (its num_blocks: 0 when the weights and reserve alone do not fit)."""
    return capacity_sheet(kv_layout(spec), gpu_bytes=load_gpus()[gpu_name].memory_bytes,
                          utilization=CARD_UTILIZATION, weight_bytes=spec.weight_bytes(1),
                          reserve_bytes=CARD_RESERVE_BYTES, block_size=block_size,
                          context=block_size)


@dataclass(frozen=True)
class Latencies:
    """One replay's latency distributions, each as its percentiles at PERCENTS (simulated s)."""

    ttft_s: np.ndarray  # (201,) over finished requests: arrival -> first output token
    itl_s: np.ndarray  # (201,) over every gap between two consecutive tokens of one request
    requests: int  # finished requests behind ttft_s
    gaps: int  # token gaps behind itl_s

    @staticmethod
    def of(sched: Scheduler) -> Latencies:
        done = [q for q in sched.requests.values() if q.state is RequestState.FINISHED]
        ttft = np.asarray([q.first_token_s - q.spec.arrival_s for q in done], dtype=float)
        itl = np.concatenate(sched.itl) if sched.itl else np.zeros(0)

        def spread(a: np.ndarray) -> np.ndarray:
            return np.percentile(a, PERCENTS) if a.size else np.zeros(0)

        return Latencies(spread(ttft), spread(itl), int(ttft.size), int(itl.size))


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
    series: str  # its line in a figure: the allocator, and the engine where a sweep has two


def sweep_point(c: SchedulerConfig, x: int, s: Summary, series: str | None = None) -> SweepPoint:
    return SweepPoint(c.allocator, x, c.num_blocks, c.block_size, s.throughput_tok_s,
                      s.mean_waste_slots / c.capacity_slots, s.preemptions, s.finished,
                      s.rejected, s.ttft.p90, series or c.allocator)


def _sweep(requests, configs: list[SchedulerConfig], xs: list[int], cost: Cost, seed: int,
           progress: Progress, series: list[str] | None = None) -> list[SweepPoint]:
    check_work(requests, configs)
    points, allowance = [], IterationAllowance()
    for i, (x, c) in enumerate(zip(xs, configs)):
        s = summarize(replay(requests, c, cost, seed, part_progress(progress, i, len(configs)),
                             allowance))
        points.append(sweep_point(c, x, s, series[i] if series else None))
    return points


def block_size_configs(cfg: SchedulerConfig,
                       sizes: tuple[int, ...] = BLOCK_SIZES) -> list[SchedulerConfig]:
    """Paged pools of the same bytes (cfg's slots) cut into blocks of each size."""
    slots = cfg.capacity_slots
    return [replace(cfg.with_pool(block_size=b, num_blocks=max(1, slots // b)),
                    allocator="paged") for b in sizes]


def block_size_sweep(requests, cfg: SchedulerConfig, cost: Cost, seed: int,
                     sizes: tuple[int, ...] = BLOCK_SIZES,
                     progress: Progress = None) -> list[SweepPoint]:
    """Paged pool of the same bytes (cfg's slots) cut into blocks of each size."""
    return _sweep(requests, block_size_configs(cfg, sizes), list(sizes), cost, seed, progress)


def pool_size_plan(cfg: SchedulerConfig, fractions: tuple[float, ...] = POOL_FRACTIONS
                   ) -> list[tuple[SchedulerConfig, str]]:
    """(config, series) of each replay of the pool-size sweep: both allocators on pools of
    `fractions` x cfg's blocks under cfg's engine, and the paged pool under the other one
    (vLLM V0 preempting by swap beside V1, or V1 beside V0) at that engine's default
    watermark."""
    other = replace(cfg, allocator="paged").as_engine(
        "v0" if cfg.engine == "v1" else "v1", "swap" if cfg.engine == "v1" else None)
    lines = [(replace(cfg, allocator=a), a) for a in ALLOCATORS] + [(other, "paged")]
    return [(base.with_pool(num_blocks=max(1, round(cfg.num_blocks * f))),
             f"{allocator}, {engine_name(base)}") for base, allocator in lines for f in fractions]


def engine_name(cfg: SchedulerConfig) -> str:
    """The engine in a few words: V1, or V0 and how it preempts."""
    return "V1" if cfg.engine == "v1" else f"V0 {cfg.preemption_mode}"
