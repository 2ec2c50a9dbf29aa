"""Inspect a real engine: a vLLM server's /metrics and startup log, beside the lab's own numbers."""

import math

import streamlit as st

from lab.figures.scheduler import bucket_figure
from lab.sizing.capacity import GIB, kv_budget_sheet
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import load_presets
from lab.vllm.metrics_text import (
    DISABLE_ENV,
    FETCH_TIMEOUT_S,
    MetricsError,
    engine_view,
    fetch_metrics,
    parse_prometheus,
)
from lab.vllm.startup_log import LogError, parse_startup_log
from ui.layout import explain, show_figure
from ui.sidebar import sidebar
from ui.state import choice_param, int_param

sidebar()
st.title("Inspect a real engine")
explain(
    "The guide's list of what a healthy server watches — KV-cache utilization, running and "
    "waiting sequences, preemptions, time to first token, inter-token latency — is exactly what "
    "a vLLM server exports on its Prometheus `/metrics` endpoint. Paste that text (or give its "
    "URL) to read your engine the way the lab reads its own replays; paste the engine's startup "
    "log to check its KV-cache sizing against the calculator's formula."
)


def _pct(x: float | None) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.0%}"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _ms(x: float) -> str:
    return "—" if math.isnan(x) else f"{x * 1e3:,.1f} ms"


st.subheader("Its /metrics")
paste, url_col = st.columns([3, 2])
text = paste.text_area("Paste the text of http://<server>/metrics", key="vllm_metrics_text",
                       height=180, placeholder="# HELP vllm:num_requests_running ...")
url = url_col.text_input("…or fetch it from a URL", key="vllm_url",
                         placeholder="http://localhost:8000/metrics")
url_col.caption(f"Fetched by the lab's server (not your browser): http(s) only, "
                f"{FETCH_TIMEOUT_S:g} s timeout, 4 MiB at most. A shared deployment can turn "
                f"this off with {DISABLE_ENV}=1.")
if url_col.button("Fetch", key="vllm_fetch", disabled=not url.strip()):
    try:
        st.session_state["vllm_fetched"] = fetch_metrics(url)
    except MetricsError as err:
        st.session_state.pop("vllm_fetched", None)
        url_col.error(str(err), icon="🌐")
source = text.strip() or st.session_state.get("vllm_fetched", "")

if source:
    try:
        view = engine_view(parse_prometheus(source))
    except MetricsError as err:
        st.error(f"This text cannot be read as Prometheus metrics: {err}", icon="📈")
        view = None
    if view is not None:
        if view.model_names:
            st.caption("Model: " + ", ".join(view.model_names))
        m = st.columns(4)
        m[0].metric("KV-cache usage", _pct(view.kv_cache_usage),
                    help=f"From {view.kv_usage_metric or 'no usage metric found'}.")
        m[1].metric("Running / waiting", f"{_num(view.running)} / {_num(view.waiting)}")
        m[2].metric("Preemptions", _num(view.preemptions),
                    help="Since the server started (a counter).")
        m[3].metric("Prefix-cache hit rate", _pct(view.prefix_hit_rate),
                    help="Hit tokens / queried tokens, since the server started.")
        rows = []
        for name, h in (("TTFT", view.ttft), (view.itl_metric or "ITL", view.itl)):
            if h is not None:
                rows.append({"histogram": name, "count": int(h.count), "mean": _ms(h.mean),
                             "p50": _ms(h.quantile(0.5)), "p90": _ms(h.quantile(0.9)),
                             "p99": _ms(h.quantile(0.99))})
        lab = st.session_state.get("sched_replay")
        if lab is not None:
            s = lab[1]["paged"][0]
            rows.append({"histogram": "the lab's last replay: TTFT", "count": s.ttft.count,
                         "mean": _ms(s.ttft.mean), "p50": _ms(s.ttft.p50),
                         "p90": _ms(s.ttft.p90), "p99": _ms(s.ttft.p99)})
            rows.append({"histogram": "the lab's last replay: ITL", "count": s.itl.count,
                         "mean": _ms(s.itl.mean), "p50": _ms(s.itl.p50), "p90": _ms(s.itl.p90),
                         "p99": _ms(s.itl.p99)})
        if rows:
            st.dataframe(rows, hide_index=True, width="stretch")
            st.caption("Percentiles of a Prometheus histogram are interpolated inside its "
                       "buckets, as histogram_quantile does. The lab's rows (after a replay on "
                       "the Admission control page) are simulated times from its cost model.")
            show_figure(bucket_figure({"TTFT": view.ttft, "ITL": view.itl}), key="vllm_buckets")

st.subheader("Its startup log, beside the calculator")
log_text = st.text_area("Paste the engine's startup output (the KV-cache lines are enough)",
                        key="vllm_log_text", height=140,
                        placeholder="... # GPU blocks: 27901 ... GPU KV cache size: 446,416 "
                                    "tokens ... Maximum concurrency for 8,192 tokens ...")
if log_text.strip():
    try:
        log = parse_startup_log(log_text)
    except LogError as err:
        st.error(str(err), icon="📜")
        st.stop()
    left, middle, right = st.columns(3)
    model = choice_param("Model it serves", "vllm_model", list(load_presets()),
                         default="Llama-3.1-8B", container=left)
    block_size = int_param("Block size", "vllm_block_size", default=log.implied_block_size() or 16,
                           min_value=1, max_value=256, widget="number", container=middle)
    context = int_param("Tokens per request (for concurrency)", "vllm_context",
                        default=log.concurrency_tokens or 8192, min_value=1, max_value=1 << 20,
                        widget="number", container=right)
    rows = [{"quantity": "GPU blocks", "engine": _num(log.gpu_blocks)},
            {"quantity": "KV cache size (tokens)", "engine": _num(log.kv_cache_tokens)},
            {"quantity": f"maximum concurrency at {context:,} tokens",
             "engine": "—" if log.max_concurrency is None else f"{log.max_concurrency:.2f}×"}]
    if log.kv_memory_gib is not None:
        sheet = kv_budget_sheet(kv_layout(load_presets()[model]), int(log.kv_memory_gib * GIB),
                                block_size, context)
        for row, value in zip(rows, (f"{sheet.num_blocks:,}", f"{sheet.num_tokens:,}",
                                     f"{sheet.max_concurrency:.2f}×")):
            row["calculator (from the logged KV memory)"] = value
        st.caption(f"The calculator cuts the {log.kv_memory_gib:g} GiB the engine logged as "
                   f"available KV memory into {block_size}-token blocks of {model}'s K/V.")
    else:
        st.caption("The log has no 'Available KV cache memory' line, so the calculator has no "
                   "budget to start from: compare with the KV-size calculator page instead.")
    st.dataframe(rows, hide_index=True, width="stretch")
