"""The scheduler page's long-running sections: Replay & metrics (and vLLM V1 beside V0),
the batch chain, the sweeps.

Each replay is kept per user (`ui.memo.per_user`), keyed by its parameters, so a rerun that
changes nothing runs nothing; a view shows its first replay's result while the others run;
every long run draws a progress bar, and changing a setting (or the app's Stop) ends it at its
next update. Each view's work is bounded before it starts (lab.serving.runs.check_work:
ReplayTooLong says what to lower), and what is kept per user is bounded too: a replay's time
series is thinned to MAX_POINTS steps.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any

import streamlit as st

from lab.figures.latency import latency_figure
from lab.figures.scheduler import (
    COLORS,
    chain_figure,
    length_histograms,
    serving_timeseries,
    sweep_figure,
)
from lab.serving.chain import chain_plan, chain_rows, chain_verdict, peak_seats, same_replay
from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import CostModel
from lab.serving.metrics import Summary, series, summarize
from lab.serving.runs import (
    BLOCK_SIZES,
    POOL_FRACTIONS,
    IterationAllowance,
    Latencies,
    ReplayTooLong,
    SweepPoint,
    block_size_configs,
    check_work,
    part_progress,
    pool_size_plan,
    replay,
    sweep_point,
)
from lab.serving.workloads import PRESETS, RequestSpec, workload_stats
from ui.layout import explain, show_figure
from ui.memo import per_user
from ui.predict import Question, hatched
from ui.scheduler_views import card_pool
from ui.state import choice_param, int_param, set_param

CHAIN_CHOICES = ("none: it held", "1. less waste", "2. more live sequences",
                 "3. bigger batches", "4. more throughput")
Requests = tuple[RequestSpec, ...]
MAX_POINTS = 4_000  # steps of a replay's time series kept per user and drawn


def runs_kept(key: str, requests: Requests, configs: dict[Hashable, SchedulerConfig],
              cost: CostModel, seed: int, keep: Callable[[Any], Any], label: str,
              show: Callable[[dict], None] | None = None,
              same: Callable[[Hashable, dict], Hashable | None] | None = None) -> dict | None:
    """keep(each config's replay), kept for this user run by run (a rerun that changes nothing
    runs nothing), the view's work checked and budgeted as one before the first starts;
    `show(the results so far)` after each run, so a first result is on the page long before
    the last run ends. `same(name, the results so far)`: the name of a result already there
    that this config's replay would repeat step for step (it is not run again), or None.
    None, with the reason, when the view's work is refused."""
    try:
        check_work(requests, list(configs.values()))
    except ReplayTooLong as err:
        st.error(f"Not run: {err}.", icon=":material/hourglass_top:")
        return None
    bar, allowance, done = st.progress(0.0, text=label), IterationAllowance(), {}
    try:
        for i, (name, c) in enumerate(configs.items()):
            def make(c: SchedulerConfig = c, i: int = i) -> Any:
                fraction = part_progress(lambda f: bar.progress(min(1.0, f), text=label), i,
                                         len(configs))
                return keep(replay(requests, c, cost, seed, fraction, allowance))

            twin = None if same is None else same(name, done)
            if twin is None:
                done[name] = per_user(f"{key}_{i}", (requests, c, cost, seed), make)
            else:
                done[name] = done[twin]
                bar.progress((i + 1) / len(configs), text=label)
            if show is not None and i < len(configs) - 1:
                show(done)
    except ReplayTooLong as err:
        st.error(f"Stopped: {err}.", icon=":material/hourglass_top:")
        return None
    finally:
        bar.empty()
    return done


def sweep_runs(key: str, requests: Requests, configs: dict[int, SchedulerConfig],
               cost: CostModel, seed: int, point: Callable[[int, Summary], SweepPoint],
               label: str, x_label: str, counted: str) -> list[SweepPoint] | None:
    """A sweep's replays (`runs_kept`), each made a point by `point(name, summary)`; the points
    replayed so far stand in a table while the others run ("3 of 9 `counted`…"). The points in
    order of their names; None when the sweep's work is refused."""
    table = st.empty()

    def points(done: dict) -> list[SweepPoint]:
        return [point(name, s) for name, s in sorted(done.items())]

    def show(done: dict) -> None:
        so_far = points(done)
        lines = len({p.series for p in so_far}) > 1
        with table.container():
            st.caption(f"{len(done)} of {len(configs)} {counted}…")
            st.dataframe([{x_label: p.x, **({"line": p.series} if lines else {}),
                           "throughput tok/s": round(p.throughput),
                           "wasted KV": f"{p.waste_share:.1%}", "preemptions": p.preemptions}
                          for p in so_far], hide_index=True)

    done = runs_kept(key, requests, configs, cost, seed, summarize, label, show)
    table.empty()
    return None if done is None else points(done)


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


def _keep_replay(sched: Any) -> tuple[Summary, dict[str, Any], Latencies]:
    return summarize(sched), _thin(series(sched)), Latencies.of(sched)


def _keep_engine(sched: Any) -> tuple[Summary, Latencies]:
    return summarize(sched), Latencies.of(sched)


def replay_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    explain("Both allocators replay the whole workload (allocator only, no kernel) on the same "
            "pool, measured as a healthy server is watched: KV-cache usage, running and waiting"
            " requests, preemptions, and the latencies a user feels, TTFT (arrival to first "
            "token) and ITL (between two tokens of a request). Times are the cost model's "
            "simulated seconds for the chosen model and GPU.", title="What the replay measures")
    cfg = card_pool(cfg, "sched")
    d = workload_stats(requests)
    st.caption(f"{d['requests']:,} requests · prompt mean {d['prompt_mean']:.0f} (max "
               f"{d['prompt_max']}) · output mean {d['output_mean']:.0f} (max {d['output_max']})"
               f" · {cost.label} · {cfg.label} · {cfg.num_blocks:,} blocks")
    first = st.empty()

    def show_first(done: dict) -> None:  # the paged replay, while the contiguous one runs
        s, _, lat = done["paged"]
        with first.container():
            st.info(f"paged: {s.throughput_tok_s:,.0f} tok/s, {s.preemptions:,} preemptions, "
                    f"TTFT p50 {s.ttft.p50:.2f} s, ITL p90 {s.itl.p90 * 1e3:.1f} ms; the "
                    "contiguous baseline is still replaying…", icon=":material/hourglass_top:")
            show_figure(latency_figure({"paged": lat}, COLORS), key="sched_latency_first")

    results = runs_kept("sched_replay", requests,
                        {a: replace(cfg, allocator=a, explain=False) for a in ("paged",
                                                                              "contiguous")},
                        cost, seed, _keep_replay,
                        "Replaying the workload on both allocators (allocator only)…",
                        show_first)
    first.empty()
    if results is None:
        return
    summaries = {k: results[k][0] for k in ("contiguous", "paged")}
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
    if p.preemptions == 0:
        st.caption(f"Nothing was preempted: {cfg.num_blocks:,} blocks held what max_num_seqs "
                   f"({cfg.max_num_seqs}) and the token budget let run. More requests or "
                   "max_num_seqs, or a smaller pool (the calculator's off), make the pool the "
                   "limit.")
    show_figure(latency_figure({k: results[k][2] for k in summaries}, COLORS),
                key="sched_latency")
    st.dataframe(_percentile_rows(summaries), hide_index=True, width="stretch",
                 column_config={k: st.column_config.NumberColumn(format="%.3f")
                                for k in ("p50", "p90", "p99", "mean")})
    show_figure(serving_timeseries({k: results[k][1] for k in summaries}), key="sched_series")
    show_figure(length_histograms(requests), key="sched_lengths")
    engines_section(requests, cfg, cost, seed)


def engines_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    """vLLM V1 (0.33) beside the paper's V0 (2023) on the same workload, paged, on request."""
    st.markdown("**vLLM V1 (0.33) and vLLM V0 (the paper, 2023) on this workload**")
    left, right = st.columns([1, 2], vertical_alignment="bottom")
    mode = choice_param("vLLM V0 preempts by", "sched_v0_preempt", ["swap", "recompute"],
                        default="swap", widget="segmented", container=left)
    params = (requests, cfg, cost, seed, mode)
    if right.button("Replay under both engines", key="sched_engines_run"):
        st.session_state["sched_engines_params"] = params
    if st.session_state.get("sched_engines_params") != params:
        st.caption(f"Both paged, same pool ({cfg.num_blocks:,} blocks), budget and seats, each at"
                   " its own default watermark (V1: 0, V0: 1%).")
        return
    paged = replace(cfg, allocator="paged", explain=False)
    configs = {e: paged.as_engine(e, mode) for e in ("v1", "v0")}
    results = runs_kept("sched_engines", requests, configs, cost, seed, _keep_engine,
                        "Replaying under vLLM V1 and vLLM V0…")
    if results is None:
        return
    rows = []
    for engine, (s, _) in results.items():
        rows.append({"engine": configs[engine].label, "preemptions": s.preemptions,
                     "by recompute": s.preempt_recompute, "by swap": s.preempt_swap,
                     "recomputed tokens": s.recomputed_tokens,
                     "of those, prefix hits on re-admission": s.readmit_hit_tokens,
                     "swapped MiB": s.swapped_bytes / 2**20,
                     "TTFT p50 s": s.ttft.p50, "TTFT p90 s": s.ttft.p90,
                     "ITL p50 ms": s.itl.p50 * 1e3, "ITL p90 ms": s.itl.p90 * 1e3,
                     "ITL p99 ms": s.itl.p99 * 1e3, "throughput tok/s": s.throughput_tok_s})
    st.dataframe(rows, hide_index=True, width="stretch",
                 column_config={k: st.column_config.NumberColumn(format="%.2f")
                                for k in ("swapped MiB", "TTFT p50 s", "TTFT p90 s",
                                          "ITL p50 ms", "ITL p90 ms", "ITL p99 ms",
                                          "throughput tok/s")})
    show_figure(latency_figure({configs[e].label: lat for e, (_, lat) in results.items()},
                               title="Latency under each engine: TTFT over requests, ITL over "
                                     "token gaps"), key="sched_engines_latency")
    st.caption("Recomputed tokens are what recompute preemption threw away (V1's only kind); "
               "with prefix caching on, a re-admitted request finds part of them in its own "
               "cached blocks. Swapped bytes moved to CPU memory and back are V0's other way."
               + ("" if cfg.enable_prefix_caching else " Prefix caching is off in the settings"
                  " (vLLM V1's default is on), so a re-admission finds nothing cached."))


def chain_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    target_ms = int_param("Latency target: ITL p90 (ms)", "sched_itl_target", default=50,
                          min_value=1, max_value=1000, widget="number",
                          help="Inter-token latency: the time between two output tokens of one "
                               "request. p90: 9 in 10 of those gaps are shorter than this.")
    cfg = card_pool(cfg, "sched")
    plan = chain_plan(cfg)
    first = st.empty()

    def show_first(done: dict) -> None:
        with first.container():
            st.info("Replayed so far; the verdict comes when all "
                    f"{len(plan)} are done.", icon=":material/hourglass_top:")
            st.dataframe([{"allocator": plan[i].allocator, "max_num_seqs": plan[i].max_num_seqs,
                           "ITL p90 ms": round(s.itl.p90 * 1e3, 1),
                           f"meets {target_ms} ms": bool(s.itl.p90 * 1e3 <= target_ms),
                           "most running at once": peak} for i, (s, peak) in done.items()],
                         hide_index=True)

    def same(i: int, done: dict) -> int | None:
        return same_replay(plan, i, {j: peak for j, (_, peak) in done.items()})

    runs = runs_kept("sched_chain", requests, dict(enumerate(plan)), cost, seed,
                     lambda sched: (summarize(sched), peak_seats(sched)),
                     f"Running both allocators at {len(plan) // 2} values of max_num_seqs…",
                     show_first, same)
    first.empty()
    if runs is None:
        return
    rows = chain_rows([(c, s) for c, (s, _) in zip(plan, runs.values())], cfg, target_ms / 1e3)
    c, p = rows
    verdict = chain_verdict(c, p)
    question = Question(
        "sched_chain_link", "Which link of the chain breaks first on this workload, if any?",
        answer=CHAIN_CHOICES[verdict.link or 0], choices=CHAIN_CHOICES,
        explanation=verdict.text, context=(requests, cfg, cost, seed, target_ms))
    with hatched(question.answered, "the chain and its verdict", key="sched_chain"):
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
              help="Alpaca-like, 2,000 requests, max_tokens 512, a pool of 2,000 blocks (not "
                   "the calculator's), max_num_seqs 512, budget 4,096, Llama-3.1-8B on an H100, "
                   "ITL target 100 ms.")
    explain("Try the example (a small pool: the calculator's is off), then give both "
            "allocators a pool of 200,000 blocks: they keep the same sequences live and paging "
            "buys nothing. A max_num_seqs whose seats a replay never filled runs the same as "
            "more seats would, so that replay stands for them and is not run again.")


CHAIN_EXAMPLE = {  # tests/test_page_scheduler.py checks that its chain weakens at link 4
    "big_workload": PRESETS["alpaca"].label, "big_requests": 2000, "big_max_tokens": 512,
    "big_blocks": 2000, "big_block_size": 16, "big_seats": 512, "big_budget": 4096,
    "sched_model": "Llama-3.1-8B", "sched_gpu": "H100 80 GB", "sched_itl_target": 100,
    "big_rate": 0.0, "sched_card_pool": False}


def _example() -> None:
    for param, value in CHAIN_EXAMPLE.items():
        set_param(param, value)


def sweeps_section(requests: Requests, cfg: SchedulerConfig, cost: CostModel, seed: int) -> None:
    cfg = card_pool(cfg, "sched")
    left, right = st.columns(2)
    if left.button("Sweep block size (1 to 256, same bytes)", key="sched_sweep_bs"):
        st.session_state["sched_bs_params"] = (requests, cfg, cost, seed)
    if right.button("Sweep pool size (1/16× to 1×), vLLM V0 beside V1", key="sched_sweep_pool"):
        st.session_state["sched_pool_params"] = (requests, cfg, cost, seed)
    if st.session_state.get("sched_bs_params") == (requests, cfg, cost, seed):
        sizes = sorted(BLOCK_SIZES, key=lambda b: abs(b.bit_length() - 5))  # 16 first
        configs = dict(zip(sizes, block_size_configs(cfg, tuple(sizes))))
        points = sweep_runs("sched_bs", requests, configs, cost, seed,
                            lambda b, s: sweep_point(configs[b], b, s),
                            f"Replaying at {len(sizes)} block sizes…", "block size",
                            "block sizes replayed")
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
        plan = pool_size_plan(cfg)
        # Largest pools first: they replay quickest (no preemption storm), so rows come early.
        configs = {i: plan[i][0] for i in sorted(range(len(plan)),
                                                 key=lambda i: -plan[i][0].num_blocks)}
        points = sweep_runs("sched_pool", requests, configs, cost, seed,
                            lambda i, s: sweep_point(plan[i][0], plan[i][0].num_blocks, s,
                                                     plan[i][1]),
                            f"Replaying at {len(POOL_FRACTIONS)} pool sizes: both allocators, "
                            "and the paged pool under the other engine…", "pool (blocks)",
                            "replays done")
        if points is not None:
            show_figure(sweep_figure(points, "pool size (blocks)"), key="sched_pool_fig")
            explain("The dotted line is the paged pool under the other engine: vLLM V0 "
                    "preempting by swap beside V1's recompute (or V1 beside V0, with Engine set "
                    "to V0). Where the pool is short, V0's swaps move a victim's blocks to CPU "
                    "memory and back instead of throwing its tokens away.",
                    title="V0 beside V1 in the pool-size sweep")
