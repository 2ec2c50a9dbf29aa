"""The scheduler page's settings widgets and its long-running sections (replay, chain, sweeps).

Results of long runs are kept per user (`ui.memo.per_user`), keyed by their parameters, so a
rerun that changes nothing does not run them again; every long run draws a progress bar, and
changing a setting (or the app's Stop) ends it at its next update. Each view's work is bounded
before it starts (lab.serving.runs.check_work: ReplayTooLong says what to lower), and what is
kept per user is bounded too: a replay's time series is thinned to MAX_POINTS iterations.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any

import streamlit as st

from lab.figures.scheduler import chain_figure, length_histograms, serving_timeseries, sweep_figure
from lab.serving.chain import SEAT_OPTIONS, batch_chain, chain_verdict
from lab.serving.config import COMPUTE_POOL, ENGINE_LABELS, SchedulerConfig
from lab.serving.cost_model import CostModel, cost_model
from lab.serving.metrics import Summary, series, summarize
from lab.serving.runs import ReplayTooLong, block_size_sweep, pool_size_sweep, replay_both
from lab.serving.workloads import (
    PRESETS,
    RequestSpec,
    WorkloadError,
    from_preset,
    parse_csv,
    with_priorities,
    workload_stats,
)
from lab.sizing.capacity import load_gpus
from lab.sizing.model_spec import load_presets
from ui.layout import explain, show_figure
from ui.memo import per_user
from ui.predict import Question, held_back
from ui.state import bool_param, choice_param, float_param, int_param, set_param

CSV = "csv"
CHAIN_CHOICES = ("none: it held", "1. less waste", "2. more live sequences",
                 "3. bigger batches", "4. more throughput")
Requests = tuple[RequestSpec, ...]
MAX_POINTS = 4_000  # iterations of a replay's time series kept per user and drawn
ENGINES = {label: engine for engine, label in ENGINE_LABELS.items()}


# -- settings -----------------------------------------------------------------------------------
def workload_widgets(prefix: str, *, preset: str, n: int, max_n: int, max_tokens: int,
                     seed: int) -> Requests | None:
    """Workload widgets; None (with a message on the page) when no usable workload is given."""
    left, middle, right = st.columns(3)
    by_label = {p.label: name for name, p in PRESETS.items()} | {"Your CSV upload": CSV}
    label = choice_param("Workload", f"{prefix}_workload", list(by_label),
                         default=PRESETS[preset].label, container=left)
    chosen = by_label[label]
    rate = float_param("Arrival rate (requests/s; 0 = all at once)", f"{prefix}_rate",
                       default=0.0, min_value=0.0, max_value=200.0, step=0.5, container=left,
                       help="Poisson arrivals at this rate; 0 queues every request at time 0.")
    if chosen == CSV:
        upload = middle.file_uploader("CSV rows: prompt_len,output_len[,arrival_s]", type="csv",
                                      key=f"{prefix}_csv", max_upload_size=2,
                                      help=f"At most {max_n:,} rows and 2 MiB.")
        if upload is None:
            st.info("Upload a CSV to replay your own length distribution.",
                    icon=":material/description:")
            return None
        try:  # this view's own request limit: its frames hold every request's state
            return parse_csv(upload.getvalue(), max_requests=max_n)
        except WorkloadError as err:
            st.error(f"The CSV cannot be used here: {err}. This view replays at most "
                     f"{max_n:,} requests" + (" (Replay & metrics takes up to 20,000)."
                                              if max_n < 20_000 else "."),
                     icon=":material/description:")
            return None
    count = int_param("Requests", f"{prefix}_requests", default=n, min_value=2, max_value=max_n,
                      widget="number", container=middle)
    ceiling = int_param("max_tokens: output ceiling (contiguous reserves it)",
                        f"{prefix}_max_tokens", default=max_tokens,
                        min_value=8, max_value=4096, widget="number", container=middle)
    urgent = int_param("Interactive requests (%): priority 0, the rest 1", f"{prefix}_urgent",
                       default=0, min_value=0, max_value=100, widget="number", container=right,
                       help="A seeded share of the requests is interactive (priority 0, more "
                            "important); the rest is batch work (priority 1). With two classes, "
                            "the scheduler can preempt by priority instead of by arrival.")
    right.caption(PRESETS[chosen].note + ". Outputs are clipped at max_tokens.")
    requests = from_preset(chosen, count, seed=seed, rate=rate or None, max_tokens=ceiling)
    return with_priorities(requests, urgent / 100, seed=seed) if urgent else requests


def engine_widgets(prefix: str, *, blocks: int, block_size: int, seats: int, budget: int,
                   max_blocks: int, priorities: bool = False,
                   prefix_caching: bool = False) -> dict[str, Any]:
    """Scheduler settings shared by every section (SchedulerConfig keyword arguments).
    `priorities`: the workload has more than one priority, so the priority policy means
    something (otherwise it is not offered)."""
    left, middle, right = st.columns(3)
    engine = ENGINES[choice_param(
        "Engine", f"{prefix}_engine", list(ENGINES), default=ENGINE_LABELS["v1"],
        container=left,
        help="vLLM V1 (0.33), today's scheduler: running requests first, then waiting ones; "
             "a whole-sequence fit check, then blocks for the scheduled chunk only; preemption "
             "by recompute. vLLM V0, the paper's engine (2023): a prompt's blocks all taken at "
             "admission, a 1% watermark, preemption by swap or recompute.")]
    size = choice_param("Block size (tokens)", f"{prefix}_block_size",
                        [1, 2, 4, 8, 16, 32, 64, 128, 256], default=block_size, container=left,
                        help="Tokens per KV block: the unit the pool hands out.")
    count = int_param("Pool size (blocks)", f"{prefix}_blocks", default=blocks, min_value=4,
                      max_value=max_blocks, widget="number", container=left,
                      help="The contiguous baseline gets the same number of slots.")
    v0 = engine == "v0"
    watermark = float_param(  # each engine keeps its own default: V1 0, V0 1 %
        "Watermark (% of blocks kept free)", f"{prefix}_watermark" + ("_v0" if v0 else ""),
        default=1.0 if v0 else 0.0, min_value=0.0, max_value=50.0, step=0.5, container=left,
        help="Blocks admission leaves free, so requests already running find blocks for their "
             "next tokens before anyone must be preempted. vLLM V1 (0.33): 0 by default, held "
             "back only from waiting requests while something runs. vLLM V0 kept 1% at every "
             "admission.")
    policies = ["fcfs", "priority"] if priorities else ["fcfs"]
    settings = dict(
        engine=engine,
        pool=replace(COMPUTE_POOL, num_blocks=count, block_size=size),
        watermark=watermark / 100,
        max_num_seqs=int_param(
            "max_num_seqs", f"{prefix}_seats", default=seats, min_value=1, max_value=512,
            widget="number", container=middle,
            help="At most this many requests run at once (vLLM's max_num_seqs); the rest wait "
                 "even when memory is free."),
        max_num_batched_tokens=int_param(
            "Token budget (max_num_batched_tokens)", f"{prefix}_budget", default=budget,
            min_value=1, max_value=32768, widget="number", container=middle,
            help="Tokens computed in one step at most: one per decoding request, plus prompt "
                 "tokens of requests being prefilled."),
        long_prefill_token_threshold=int_param(
            "long_prefill_token_threshold (0: off)", f"{prefix}_long", default=0, min_value=0,
            max_value=32768, widget="number", container=middle,
            help="vLLM caps a prefill chunk at this many tokens when more than one request "
                 "runs or waits, so one long prompt does not take the whole budget."),
        policy=choice_param(
            "policy", f"{prefix}_policy", policies, default="fcfs", widget="segmented",
            container=right,
            help="fcfs: waiting requests in arrival order, the last running request preempted "
                 "first. priority (with two classes in the workload): the waiting queue by "
                 "(priority, arrival), and V1 preempts the running request with the largest "
                 "(priority, arrival). Set 'Interactive requests' above 0 to offer it."),
        enable_prefix_caching=bool_param(
            "Prefix caching", f"{prefix}_prefix", default=prefix_caching, container=right,
            help="Full blocks are hashed when allocated; a request whose leading blocks match "
                 "takes them instead of computing them (vLLM V1's default is on)."),
        enable_chunked_prefill=bool_param(
            "Chunked prefill", f"{prefix}_chunk", default=True, container=right,
            help="On: a long prompt is computed over several steps, a budget-sized chunk at a "
                 "time, beside the decodes. Off: a prompt must fit the token budget whole, and "
                 "waits until it does."),
    )
    if v0:
        settings["preemption_mode"] = choice_param(
            "Preemption (vLLM V0)", f"{prefix}_preempt", ["recompute", "swap"],
            default="recompute", widget="segmented", container=right,
            help="vLLM V0 could swap a victim's blocks to CPU memory and back, or free them and "
                 "recompute its tokens later. vLLM V1 always recomputes: a re-admitted request "
                 "often finds its own blocks still in the prefix cache.")
    return settings


def cost_widgets(prefix: str) -> CostModel:
    left, right = st.columns(2)
    model = choice_param("Model (times from the cost model)", f"{prefix}_model",
                         list(load_presets()), default="Llama-3.1-8B", container=left)
    gpu = choice_param("GPU", f"{prefix}_gpu", list(load_gpus()), default="H100 80 GB",
                       container=right)
    return cost_model(load_presets()[model], gpu)


# -- long runs, kept per user --------------------------------------------------------------------
def kept(key: str, params: Hashable, compute: Callable[[Callable[[float], None]], Any],
         label: str) -> Any | None:
    """compute(progress) once per parameter set, with a progress bar; kept for this user.
    None, with the reason on the page, when the view's work is refused (ReplayTooLong)."""
    def make() -> Any:
        bar = st.progress(0.0, text=label)
        try:
            return compute(lambda f: bar.progress(min(1.0, f), text=label))
        finally:
            bar.empty()

    try:
        return per_user(key, params, make)
    except ReplayTooLong as err:
        st.error(f"Not run: {err}.", icon=":material/hourglass_top:")
        return None


def _thin(columns: dict[str, Any], limit: int = MAX_POINTS) -> dict[str, Any]:
    """Every k-th iteration of a replay's time series (the last one kept), at most `limit`."""
    n = len(next(iter(columns.values()), ()))
    step = -(-n // limit) if n > limit else 1
    keep = list(range(0, n, step)) + ([n - 1] if n and (n - 1) % step else [])
    return {name: values[keep] for name, values in columns.items()}


def _percentile_rows(summaries: dict[str, Summary]) -> list[dict[str, Any]]:
    rows = []
    for name, s in summaries.items():
        for metric, p, unit in (("TTFT", s.ttft, 1.0), ("ITL", s.itl, 1e3),
                                ("end-to-end", s.e2e, 1.0)):
            rows.append({"allocator": name, "metric": f"{metric} ({'ms' if unit > 1 else 's'})",
                         "p50": p.p50 * unit, "p90": p.p90 * unit, "p99": p.p99 * unit,
                         "mean": p.mean * unit})
    return rows


def replay_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    d = workload_stats(requests)
    st.caption(f"{d['requests']:,} requests · prompt mean {d['prompt_mean']:.0f} (max "
               f"{d['prompt_max']}) · output mean {d['output_mean']:.0f} (max {d['output_max']})"
               f" · {cost.label}")

    def run(progress: Callable[[float], None]) -> dict[str, tuple[Summary, dict]]:
        return replay_both(requests, cfg, cost, seed,
                           lambda sched: (summarize(sched), _thin(series(sched))), progress)

    results = kept("sched_replay", (requests, cfg, cost, seed), run,
                   "Replaying the workload on both allocators (allocator only)…")
    if results is None:
        return
    summaries = {k: v[0] for k, v in results.items()}
    cols = st.columns(4)
    for col, name in zip(cols[:2], summaries):
        s = summaries[name]
        col.metric(f"{name}: throughput", f"{s.throughput_tok_s:,.0f} tok/s",
                   help="Output tokens per simulated second over the whole run.")
    p, c = summaries["paged"], summaries["contiguous"]
    cols[2].metric("paged: preemptions", f"{p.preemptions:,}",
                   help=f"{p.recomputed_tokens:,} tokens recomputed, "
                        f"{p.swapped_bytes / 2**20:,.1f} MiB swapped.")
    cols[3].metric("rejected (never fit)", f"{p.rejected} / {c.rejected}",
                   help="paged / contiguous: requests that could not fit even alone.")
    show_figure(serving_timeseries({k: v[1] for k, v in results.items()}), key="sched_series")
    st.dataframe(_percentile_rows(summaries), hide_index=True, width="stretch",
                 column_config={k: st.column_config.NumberColumn(format="%.3f")
                                for k in ("p50", "p90", "p99", "mean")})
    show_figure(length_histograms(requests), key="sched_lengths")


def chain_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    target_ms = int_param("Latency target: ITL p90 (ms)", "sched_itl_target", default=50,
                          min_value=1, max_value=1000, widget="number",
                          help="Inter-token latency: the time between two output tokens of one "
                               "request. p90: 9 in 10 of those gaps are shorter than this.")
    rows = kept("sched_chain", (requests, cfg, cost, seed, target_ms),
                lambda progress: batch_chain(requests, cfg, cost, seed, target_ms / 1e3,
                                             progress=progress),
                f"Running both allocators at {len({*SEAT_OPTIONS, cfg.max_num_seqs})} values of "
                "max_num_seqs…")
    if rows is None:
        return
    c, p = rows
    verdict = chain_verdict(c, p)
    question = Question(
        "sched_chain_link", "Which link of the chain breaks first on this workload, if any?",
        answer=CHAIN_CHOICES[verdict.link or 0], choices=CHAIN_CHOICES,
        explanation=verdict.text, context=(requests, cfg, cost, seed, target_ms))
    with held_back(question.answered, "the chain and its verdict", key="sched_chain"):
        show_figure(chain_figure(rows, target_ms), key="sched_chain_fig")
        best = {r.allocator: r.best_max_num_seqs or "none met it" for r in rows}
        st.markdown(f"Each allocator at its best max_num_seqs that meets the target (contiguous "
                    f"{best['contiguous']}, paged {best['paged']}); all four bars come from "
                    "that run.")
        icon = {"held": ":material/link:", "weak": ":material/link_off:",
                "no_target": ":material/timer:"}[verdict.kind]
        (st.success if verdict.kind == "held" else st.warning)(verdict.text, icon=icon)
    question.ask()
    st.button("Load an example where link 4 weakens", key="sched_chain_example",
              on_click=_example,
              help="Alpaca-like, 2,000 requests, max_tokens 512, 2,000 blocks, max_num_seqs "
                   "512, budget 4,096, Llama-3.1-8B on an H100, ITL target 100 ms.")
    explain("Try the example, then give both allocators a pool of 200,000 blocks: they keep "
            "the same sequences live and paging buys nothing.")


CHAIN_EXAMPLE = {  # tests/test_page_scheduler.py checks that its chain weakens at link 4
    "big_workload": PRESETS["alpaca"].label, "big_requests": 2000, "big_max_tokens": 512,
    "big_blocks": 2000, "big_block_size": 16, "big_seats": 512, "big_budget": 4096,
    "sched_model": "Llama-3.1-8B", "sched_gpu": "H100 80 GB", "sched_itl_target": 100,
    "big_rate": 0.0}


def _example() -> None:
    for param, value in CHAIN_EXAMPLE.items():
        set_param(param, value)


def sweeps_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    left, right = st.columns(2)
    if left.button("Sweep block size (1 to 256, same bytes)", key="sched_sweep_bs"):
        st.session_state["sched_bs_params"] = (requests, cfg, cost, seed)
    if right.button("Sweep pool size (¼× to 4×)", key="sched_sweep_pool"):
        st.session_state["sched_pool_params"] = (requests, cfg, cost, seed)
    if st.session_state.get("sched_bs_params") == (requests, cfg, cost, seed):
        points = kept("sched_bs", (requests, cfg, cost, seed),
                      lambda pr: block_size_sweep(requests, cfg, cost, seed, progress=pr),
                      "Replaying at 9 block sizes…")
        if points is not None:
            show_figure(sweep_figure(points, "block size (tokens)"), key="sched_bs_fig")
            explain("Both sides of the guide's tradeoff are priced. Small blocks: the kernel pays "
                    "for every block it visits (a table lookup and a loop turn, charged as 3.2 "
                    "tokens of extra K/V reads per block: 20% at block size 16, the overhead the "
                    "vLLM paper measured for its kernel) and the allocator's bookkeeping runs per "
                    "block taken. Large blocks: each sequence's last block wastes more of the "
                    "pool, so fewer sequences fit. The best size is where the two meet, for this "
                    "workload.", title="What the block-size sweep charges")
    if st.session_state.get("sched_pool_params") == (requests, cfg, cost, seed):
        points = kept("sched_pool", (requests, cfg, cost, seed),
                      lambda pr: pool_size_sweep(requests, cfg, cost, seed, progress=pr),
                      "Replaying at 5 pool sizes on both allocators…")
        if points is not None:
            show_figure(sweep_figure(points, "pool size (blocks)"), key="sched_pool_fig")
