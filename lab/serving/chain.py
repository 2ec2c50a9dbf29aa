"""The guide's chain, measured: less waste -> more live sequences -> bigger batches -> throughput.

"Break any link in that chain and the realized gain may shrink." Each allocator is run at every
max_num_seqs of a few options, and the one with the best throughput whose ITL p90 meets the
latency target speaks for it; all four links come from that same run, so the verdict compares
like with like. `chain_verdict` names the first link that does not carry the previous one's
gain on, with the numbers that show it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import Cost
from lab.serving.metrics import Summary, summarize
from lab.serving.runs import (
    ALLOCATORS,
    IterationAllowance,
    Progress,
    check_work,
    part_progress,
    replay,
)
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec

SEAT_OPTIONS = (16, 32, 64, 128, 256)
CARRIES = 0.8  # a link holds when it passes on at least 80% of the gain it was given
LESS_WASTE = 0.05  # paged must waste 5 points of the pool less for link 1 to hold
MORE_LIVE = 1.2  # and keep 20% more sequences live for link 2


@dataclass(frozen=True)
class ChainRow:
    """One allocator's links of the chain, all from one run."""

    allocator: str
    waste_share: float  # wasted KV slots / pool, time-weighted
    live_seqs: float  # resident sequences per iteration
    batch_seqs: float  # output tokens per iteration: the sequences that decode in one
    throughput: float  # output tokens / s = batch_seqs / iteration_s
    prefill_share: float  # of the tokens computed, prompt tokens (recomputed ones included)
    best_max_num_seqs: int | None  # the run's max_num_seqs; None: no option met the target
    compute_bound_share: float  # share of time in compute-bound iterations
    iteration_s: float  # simulated seconds per iteration (makespan / iterations)
    summary: Summary

    @staticmethod
    def of(allocator: str, summary: Summary, capacity_slots: int,
           seats: int | None) -> ChainRow:
        iterations = max(1, summary.iterations)
        computed = summary.prefill_tokens + summary.output_tokens
        return ChainRow(allocator, summary.mean_waste_slots / capacity_slots,
                        summary.running_per_iteration, summary.output_tokens / iterations,
                        summary.throughput_tok_s, summary.prefill_tokens / max(1, computed),
                        seats, summary.compute_bound_share, summary.makespan_s / iterations,
                        summary)


def chain_plan(cfg: SchedulerConfig,
               seat_options: tuple[int, ...] = SEAT_OPTIONS) -> list[SchedulerConfig]:
    """The replays of a chain: each allocator at cfg's max_num_seqs (paged first: the first
    result a page shows) and at each seat option."""
    seats = [cfg.max_num_seqs] + sorted({*seat_options} - {cfg.max_num_seqs})
    return [replace(cfg, allocator=a, max_num_seqs=n) for n in seats
            for a in reversed(ALLOCATORS)]


def peak_seats(sched: Scheduler) -> int:
    """The most requests a replay ran at once: right after admission, those still running
    at the step's end plus those that finished in it."""
    return max((r.num_running + len(r.finished_ids) for r in sched.records), default=0)


def same_replay(plan: list[SchedulerConfig], i: int, peaks: dict[int, int]) -> int | None:
    """An earlier replay of `plan` (index: its peak_seats) that plan[i] repeats step for step,
    or None. max_num_seqs is read only where admission stops for a full set of seats, so a
    replay whose seats never filled would run the same with more of them."""
    c = plan[i]
    for j, peak in peaks.items():
        d = plan[j]
        if peak < d.max_num_seqs <= c.max_num_seqs and replace(d, max_num_seqs=c.max_num_seqs) == c:
            return j
    return None


def chain_rows(runs: list[tuple[SchedulerConfig, Summary]], cfg: SchedulerConfig,
               itl_target_s: float) -> list[ChainRow]:
    """[contiguous, paged] from the chain's replays: each at its best max_num_seqs whose ITL
    p90 meets the target (or, when none does, at cfg's own, throughput 0)."""
    chain = []
    for allocator in ALLOCATORS:
        mine = [(c.max_num_seqs, s) for c, s in runs if c.allocator == allocator]
        meeting = [(s.throughput_tok_s, seats, s) for seats, s in mine
                   if s.itl.count and s.itl.p90 <= itl_target_s]
        if meeting:
            _, seats, s = max(meeting, key=lambda m: (m[0], -m[1]))  # of equals: fewer seats
            chain.append(ChainRow.of(allocator, s, cfg.capacity_slots, seats))
        else:  # cfg's own run, throughput 0: no setting met the target
            s = dict(mine)[cfg.max_num_seqs]
            chain.append(replace(ChainRow.of(allocator, s, cfg.capacity_slots, None),
                                 throughput=0.0))
    return chain


def batch_chain(requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: Cost, seed: int,
                itl_target_s: float, seat_options: tuple[int, ...] = SEAT_OPTIONS,
                progress: Progress = None) -> list[ChainRow]:
    """The chain's replays (`chain_plan`, each one that `same_replay` finds already run taken
    from it), checked and given one allowance of iterations, and its rows (`chain_rows`)."""
    plan = chain_plan(cfg, seat_options)
    check_work(requests, plan)
    allowance, runs, peaks = IterationAllowance(), [], {}
    for i, run_cfg in enumerate(plan):
        same = same_replay(plan, i, peaks)
        if same is None:
            sched = replay(requests, run_cfg, cost, seed, part_progress(progress, i, len(plan)),
                           allowance)
            s, peaks[i] = summarize(sched), peak_seats(sched)
        else:
            s = runs[same][1]
            if progress is not None:
                progress((i + 1) / len(plan))
        runs.append((run_cfg, s))
    return chain_rows(runs, cfg, itl_target_s)


Kind = Literal["held", "weak", "no_target"]


@dataclass(frozen=True)
class ChainVerdict:
    kind: Kind
    link: int | None  # the first link that does not hold (None: none, or no run met it)
    text: str


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf") if a > 0 else 1.0


def chain_verdict(contiguous: ChainRow, paged: ChainRow) -> ChainVerdict:
    """The first link where paged's gain over contiguous does not carry on, with the numbers
    that show it; or that every link held."""
    c, p = contiguous, paged
    if c.best_max_num_seqs is None and p.best_max_num_seqs is None:
        return ChainVerdict("no_target", None, (
            "No run met the latency target: even one sequence per iteration reads every "
            "weight, so the target is below this GPU's floor. Raise it."))
    if c.best_max_num_seqs is None or p.best_max_num_seqs is None:
        met, missed = (p, c) if c.best_max_num_seqs is None else (c, p)
        return ChainVerdict("held" if met is p else "weak", None if met is p else 4, (
            f"Only {met.allocator} met the latency target (at max_num_seqs "
            f"{met.best_max_num_seqs}, {met.throughput:,.0f} tok/s); {missed.allocator} missed "
            f"it at every max_num_seqs tried, so its bars show its run at your settings."))
    saved = c.waste_share - p.waste_share
    live, batch, thr = (_ratio(p.live_seqs, c.live_seqs), _ratio(p.batch_seqs, c.batch_seqs),
                        _ratio(p.throughput, c.throughput))
    if saved < LESS_WASTE:
        return ChainVerdict("weak", 1, (
            f"Link 1 does not hold: paged wasted {p.waste_share:.0%} of the pool and contiguous "
            f"{c.waste_share:.0%}, so there was little capacity to win back (outputs close to "
            "max_tokens, or a pool too large to fill)."))
    if live < MORE_LIVE:
        return ChainVerdict("weak", 2, (
            f"Link 2 does not hold: paged freed {saved:.0%} of the pool but kept only "
            f"{live:.2f}× the live sequences: something else capped them (max_num_seqs, or too "
            "few requests waiting). Freeing blocks cannot help here."))
    if batch < CARRIES * live:
        preempted = p.summary.preemptions if p.summary is not None else 0
        return ChainVerdict("weak", 3, (
            f"Link 3 does not hold: {live:.1f}× the live sequences gave only {batch:.1f}× the "
            f"output tokens per iteration: prompt tokens took {p.prefill_share:.0%} of paged's "
            f"work (contiguous's {c.prefill_share:.0%}; {preempted:,} preemptions recomputed), "
            "so the token budget (max_num_batched_tokens), not memory, set the batch."))
    if thr < CARRIES * batch:
        slower = _ratio(p.iteration_s, c.iteration_s)
        share = f"{p.compute_bound_share:.0%} compute-bound, contiguous's " \
                f"{c.compute_bound_share:.0%}"
        cause = (f"paged's iterations were mostly compute-bound ({share}): past the roofline's "
                 "crossover a bigger batch takes longer by about as much as it adds tokens"
                 if p.compute_bound_share >= 0.5 else
                 f"paged's iterations were mostly memory-bound ({share}), and a memory-bound "
                 "iteration reads every live sequence's K/V: more sequences, more bytes")
        return ChainVerdict("weak", 4, (
            f"Link 4 weakens: {batch:.1f}× the output tokens per iteration gave {thr:.1f}× the "
            f"throughput, because each iteration took {slower:.1f}× as long: {cause}."))
    return ChainVerdict("held", None, (
        f"The chain held: paged wasted {saved:.0%} of the pool less, kept {live:.1f}× the "
        f"live sequences, emitted {batch:.1f}× the tokens per iteration and reached {thr:.1f}× "
        "the throughput within the latency target."))
