"""Serving metrics of a scheduler run: the ones the guide says a healthy server watches.

KV-cache utilization, running and waiting sequences, preemptions, prompt and output lengths,
time to first token (TTFT: arrival -> first output token), inter-token latency (ITL: between
consecutive output tokens of one request), plus throughput and wasted KV. Times are the cost
model's simulated seconds. Percentiles are p50 / p90 / p99 (numpy's linear interpolation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lab.serving.request import RequestState

if TYPE_CHECKING:
    from lab.serving.scheduler import Scheduler


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float
    mean: float
    count: int

    @staticmethod
    def of(values) -> Percentiles:
        a = np.asarray(values, dtype=float)
        if a.size == 0:
            return Percentiles(float("nan"), float("nan"), float("nan"), float("nan"), 0)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return Percentiles(float(p50), float(p90), float(p99), float(a.mean()), int(a.size))


@dataclass(frozen=True)
class Summary:
    allocator: str
    engine: str  # "v1" (vLLM V1, 0.33) or "v0" (the paper's engine, 2023)
    iterations: int
    makespan_s: float  # first arrival to last token (simulated)
    finished: int
    rejected: int
    output_tokens: int
    throughput_tok_s: float  # output tokens / makespan
    ttft: Percentiles
    itl: Percentiles
    e2e: Percentiles  # arrival -> last token
    mean_batch_seqs: float  # sequences per iteration, time-weighted
    mean_batch_tokens: float
    mean_running: float  # resident sequences, time-weighted
    running_per_iteration: float  # resident sequences, mean over iterations
    prefill_tokens: int  # prompt tokens computed, recomputed ones included
    mean_kv_usage: float
    mean_waste_slots: float
    preemptions: int
    preempt_recompute: int
    preempt_swap: int
    recomputed_tokens: int
    readmit_hit_tokens: int  # of those, found in the prefix cache when re-admitted
    swapped_bytes: int  # out + in
    compute_bound_share: float  # fraction of time in compute-bound iterations
    max_error: float | None  # compute mode: worst kernel-vs-dense error over the run
    kernel_ok: bool | None  # compute mode: every iteration's check within tolerance


def series(sched: Scheduler) -> dict[str, np.ndarray]:
    """Per-iteration columns for the time-series figures."""
    r = sched.records
    cols = {
        "time_s": [x.start_s + x.seconds for x in r], "seconds": [x.seconds for x in r],
        "kv_usage": [x.kv_usage for x in r], "running": [x.num_running for x in r],
        "waiting": [x.num_waiting for x in r], "swapped": [x.num_swapped for x in r],
        "batch_seqs": [x.num_seqs for x in r], "batch_tokens": [x.batch_tokens for x in r],
        "prefill_tokens": [x.prefill_tokens for x in r],
        "waste_slots": [x.waste_slots for x in r], "finished": [x.finished for x in r],
        "compute_bound": [x.bound == "compute" for x in r],
    }
    out = {k: np.asarray(v) for k, v in cols.items()}
    out["preemptions"] = np.cumsum([x.preemptions for x in r]) if r else np.zeros(0)
    return out


def summarize(sched: Scheduler) -> Summary:
    reqs = list(sched.requests.values())
    done = [q for q in reqs if q.state is RequestState.FINISHED]
    cols = series(sched)
    weights = cols["seconds"]
    total_time = float(weights.sum())

    def weighted(name: str) -> float:
        return float(np.average(cols[name], weights=weights)) if total_time > 0 else 0.0

    start = min((q.spec.arrival_s for q in reqs), default=0.0)
    makespan = max(sched.clock - start, 0.0)
    out_tokens = sum(q.num_output for q in reqs)
    checks = [x.check for x in sched.records if x.check is not None]
    itl = np.concatenate(sched.itl) if sched.itl else np.zeros(0)
    return Summary(
        allocator=sched.backend.name, engine=sched.cfg.engine, iterations=sched.iteration,
        makespan_s=makespan,
        finished=len(done), rejected=sched.num_rejected, output_tokens=out_tokens,
        throughput_tok_s=out_tokens / makespan if makespan > 0 else 0.0,
        ttft=Percentiles.of([q.first_token_s - q.spec.arrival_s for q in done]),
        itl=Percentiles.of(itl),
        e2e=Percentiles.of([q.finish_s - q.spec.arrival_s for q in done]),
        mean_batch_seqs=weighted("batch_seqs"), mean_batch_tokens=weighted("batch_tokens"),
        mean_running=weighted("running"),
        running_per_iteration=float(cols["running"].mean()) if len(weights) else 0.0,
        prefill_tokens=int(cols["prefill_tokens"].sum()), mean_kv_usage=weighted("kv_usage"),
        mean_waste_slots=weighted("waste_slots"),
        preemptions=sum(sched.preemptions.values()),
        preempt_recompute=sched.preemptions["recompute"], preempt_swap=sched.preemptions["swap"],
        recomputed_tokens=sched.recomputed_tokens, readmit_hit_tokens=sched.readmit_hit_tokens,
        swapped_bytes=sched.swapped_out_bytes + sched.swapped_in_bytes,
        compute_bound_share=(float(weights[cols["compute_bound"]].sum()) / total_time
                             if total_time > 0 else 0.0),
        max_error=max(c.max_abs_error for c in checks) if checks else None,
        kernel_ok=all(c.ok for c in checks) if checks else None)
