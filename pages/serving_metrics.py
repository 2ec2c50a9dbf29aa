"""Inspect a real engine: a vLLM server's /metrics and startup log, beside the lab's own numbers."""

import math

import streamlit as st

from lab.figures.scheduler import bucket_figure
from lab.sizing.capacity import GIB, load_gpus
from lab.sizing.kv_formula import KV_DTYPES, kv_layout
from lab.sizing.model_spec import load_presets
from lab.sizing.vllm_sheet import (
    default_max_num_batched_tokens,
    engine_block_size,
    log_lines,
    vllm_sheet_from_gpu,
)
from lab.vllm.fetch import (
    FETCH_TIMEOUT_S,
    MODE_ENV,
    REACHES,
    fetch_metrics,
    fetch_mode,
    turned_off_reason,
)
from lab.vllm.log_check import check_log, guess_preset
from lab.vllm.metrics_text import EngineView, MetricsError, engine_view, parse_prometheus
from lab.vllm.startup_log import LogError, parse_startup_log
from ui.chapters import chapter_strip
from ui.layout import explain, show_figure
from ui.memo import per_user
from ui.metrics_sample import sample_button, sample_note
from ui.sidebar import sidebar

sidebar()
chapter_strip()
st.title("Inspect a real engine")
explain(
    "The guide's list of what a healthy server watches — KV-cache utilization, running and "
    "waiting sequences, preemptions, time to first token, inter-token latency — is exactly what "
    "a vLLM server exports on its Prometheus `/metrics` endpoint. Paste that text (or give its "
    "URL) to read your engine the way the lab reads its own replays; paste the engine's startup "
    "log to check its KV-cache sizing, number by number, against the lab's vLLM sheet for the "
    "same model, GPU and settings."
)


def _num(x: float | None, fmt: str = ",.0f", unit: str = "") -> str:
    """A metric as shown: any float a /metrics text may hold (NaN, ±Inf, 1e308) has a text."""
    if x is None or math.isnan(x):
        return "—"
    if math.isinf(x):
        return ("∞" if x > 0 else "−∞") + unit
    return (format(x, fmt) if abs(x) < 1e15 else f"{x:.3g}") + unit


def _pct(x: float | None) -> str:
    return _num(None if x is None else 100 * x, ".0f", "%")


def _ms(x: float) -> str:
    return _num(x * 1e3, ",.1f", " ms")


st.subheader("Its /metrics")
sample_button()
sample_note("vllm_metrics_text")
paste, url_col = st.columns([3, 2])
text = paste.text_area("Paste the text of http://<server>/metrics", key="vllm_metrics_text",
                       height=180, placeholder="# HELP vllm:num_requests_running ...")
mode = fetch_mode()
off = turned_off_reason(mode)
url = url_col.text_input("…or fetch it from a URL", key="vllm_url", disabled=off is not None,
                         placeholder="http://localhost:8000/metrics")
url_col.caption(off or f"Fetched by the lab's server (not your browser): http(s) only, "
                f"{REACHES[mode]}, {FETCH_TIMEOUT_S:g} s in all, 4 MiB at most. A shared "
                f"deployment sets {MODE_ENV}=public (or off).")
if url_col.button("Fetch", key="vllm_fetch", disabled=off is not None or not url.strip(),
                  help=off):
    try:
        st.session_state["vllm_fetched"] = fetch_metrics(url, mode=mode)
    except MetricsError as err:  # the fetch's messages never quote what the remote sent
        st.session_state.pop("vllm_fetched", None)
        url_col.error(str(err), icon=":material/language:")
source = text.strip() or st.session_state.get("vllm_fetched", "")

def _read(text: str) -> tuple[EngineView | None, str | None]:
    try:
        return engine_view(parse_prometheus(text)), None
    except MetricsError as err:
        return None, str(err)


if source:
    # Read once per text, not on every rerun: 4 MiB of samples take seconds to parse.
    view, problem = per_user("_vllm_view", source, lambda: _read(source))
    if problem is not None:
        st.error(f"This text cannot be read as Prometheus metrics: {problem}",
                 icon=":material/monitoring:")
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
                rows.append({"histogram": name, "count": _num(h.count), "mean": _ms(h.mean),
                             "p50": _ms(h.quantile(0.5)), "p90": _ms(h.quantile(0.9)),
                             "p99": _ms(h.quantile(0.99))})
        lab = st.session_state.get("sched_replay")
        if lab is not None:
            s = lab[1]["paged"][0]
            rows.append({"histogram": "the lab's last replay: TTFT", "count": _num(s.ttft.count),
                         "mean": _ms(s.ttft.mean), "p50": _ms(s.ttft.p50),
                         "p90": _ms(s.ttft.p90), "p99": _ms(s.ttft.p99)})
            rows.append({"histogram": "the lab's last replay: ITL", "count": _num(s.itl.count),
                         "mean": _ms(s.itl.mean), "p50": _ms(s.itl.p50), "p90": _ms(s.itl.p90),
                         "p99": _ms(s.itl.p99)})
        if rows:
            st.dataframe(rows, hide_index=True, width="stretch")
            st.caption("Percentiles of a Prometheus histogram are interpolated inside its "
                       "buckets, as histogram_quantile does. The lab's rows (after a replay on "
                       "the Admission control page) are simulated times from its cost model.")
            show_figure(bucket_figure({"TTFT": view.ttft, "ITL": view.itl}), key="vllm_buckets")

st.subheader("Its startup log, beside the vLLM sheet")
log_text = st.text_area("Paste the engine's startup output (the memory and KV-cache lines are "
                        "enough)", key="vllm_log_text", height=140,
                        placeholder="... Model loading took 14.99 GiB ... Available KV cache "
                                    "memory: 54.62 GiB ... GPU KV cache size: 447,488 tokens ...")
sample_note("vllm_log_text")
if log_text.strip():
    try:
        log = parse_startup_log(log_text)
    except LogError as err:
        st.error(str(err), icon=":material/description:")
        st.stop()
    presets, gpus = load_presets(), load_gpus()

    def _within(value: float | None, low: float, high: float, default: float) -> float:
        """A logged number as a widget default, kept inside the widget's range."""
        return default if value is None else min(max(value, low), high)

    if st.session_state.get("_vllm_log_read") != log_text:  # a new log: its settings apply
        for key in [k for k in st.session_state if str(k).startswith("vllm_set_")]:
            del st.session_state[key]
        st.session_state["_vllm_log_read"] = log_text
    logged_gpu = "total_gpu_memory from the log"
    gpu_names = ([logged_gpu] if log.total_gpu_gib else []) + list(gpus)
    row = st.columns(4)
    model = row[0].selectbox("Model it serves", list(presets), key="vllm_set_model",
                             index=list(presets).index(guess_preset(log.model, presets)
                                                       or "Llama-3.1-8B"))
    gpu_name = row[1].selectbox("GPU", gpu_names, key="vllm_set_gpu",
                                index=gpu_names.index("H100 80 GB") if not log.total_gpu_gib
                                else 0)
    util = row[2].number_input("gpu_memory_utilization", 0.05, 1.0,
                               _within(log.utilization, 0.05, 1.0, 0.9), 0.01,
                               key="vllm_set_util")
    tp = row[3].number_input("Tensor-parallel size", 1, 64,
                             int(_within(log.tensor_parallel_size, 1, 64, 1)), key="vllm_set_tp")
    spec = presets[model]
    row = st.columns(4)
    kv_dtype = row[0].selectbox("KV cache dtype", ["fp16", "fp8"], key="vllm_set_kv",
                                index=int(str(log.kv_cache_dtype).startswith("fp8")),
                                format_func=lambda k: "auto (16-bit)" if k == "fp16" else k)
    block = row[1].number_input("Block size", 1, 256,
                                int(_within(log.implied_block_size(), 1, 256, 16)),
                                key="vllm_set_block")
    max_len = row[2].number_input("max_model_len", 1, 1 << 31, int(_within(
        log.concurrency_tokens or log.max_model_len, 1, 1 << 31,
        spec.max_position_embeddings or 8192)), key="vllm_set_len")
    reserve = row[3].number_input("Reserve beside the weights (GiB)", 0.0, 1024.0,
                                  round(_within(log.profiled_gib, 0.0, 1024.0, 2.0), 2), 0.1,
                                  key="vllm_set_reserve")
    total = (int(_within(log.total_gpu_gib, 1, 1 << 20, 80) * GIB) if gpu_name == logged_gpu
             else gpus[gpu_name].cuda_bytes)
    layout = kv_layout(spec, kv_dtype, int(tp))
    block, block_note = engine_block_size(layout, int(block))
    card = vllm_sheet_from_gpu(
        layout, total_memory=total, utilization=util, weights_memory=spec.weight_bytes(int(tp)),
        other_memory=int(reserve * GIB), block_size=block, max_model_len=int(max_len),
        max_num_batched_tokens=log.max_num_batched_tokens
        or default_max_num_batched_tokens(gpu_name, total))
    st.caption(f"{model}, {KV_DTYPES[kv_dtype].label} KV cache, tensor parallel {int(tp)}, "
               f"block size {block}, max_num_batched_tokens {card.max_num_batched_tokens:,}"
               + (f" ({block_note})" if block_note else "") + ". The settings start from what "
               "the log says (its engine config line, its block and token counts); change "
               "them to match the engine you ran.")
    checks = check_log(log, card, layout)
    st.table({"quantity": [c.quantity for c in checks],  # a table wraps the long reasons
              "engine log": [c.engine for c in checks],
              "sheet from the log's KV memory": [c.from_log_memory for c in checks],
              "sheet from the card": [c.from_card for c in checks],
              "agrees": [{True: "✓", False: "✗", None: ""}[c.agrees] for c in checks],
              "why": [c.why for c in checks]})
    st.markdown("The lab's vLLM sheet for these settings would log:")
    st.code("\n".join(log_lines(card)), language="text")
