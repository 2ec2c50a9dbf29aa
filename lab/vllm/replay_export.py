"""The lab's own scheduler replay, written out the way a vLLM v1 server reports itself: its
`/metrics` text and the KV-cache lines of its startup log. The "Inspect a real engine" page
offers it as a sample, so that someone without a server has something to read; the same
parsers read it as they read a real server's output.

Every text says what it is: a leading comment naming PagedAttention Lab and its replay, and a
model_name that says simulation. Nothing here is measured on a GPU: times are the replay's clock
(the cost model's simulated seconds, starting at 0), and the pool is the replay's pool.

The metrics follow vLLM v1's PrometheusStatLogger (vllm/v1/metrics/loggers.py, 2025): the same
names, types, HELP texts, `engine` and `model_name` labels and bucket bounds, in the text format
prometheus_client writes (counters as `_total` with a `_created` gauge after each family,
labels sorted, Go-style floats). What each one observes follows vllm/v1/metrics/stats.py:
- gauges: the state after the iteration the replay stopped at;
- counters: since the replay began; prompt tokens count once per request, at its first token;
- TTFT and ITL: as tokens are emitted (so running requests count too);
- the request-level histograms (e2e, queue, prefill, decode, inference, token counts): when a
  request finishes. Queue time is arrival to first scheduled (vLLM's queued_ts to scheduled_ts).
Only families the replay can observe are written (no process, HTTP, LoRA or speculative-decoding
metrics). Requests the lab rejects never reach vLLM's engine (its API refuses them), so they
count nowhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from lab.memory.kv_pool import PoolConfig
from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import cost_model
from lab.serving.request import RequestState
from lab.serving.runs import replay, run
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import from_preset
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import ModelSpec, load_presets
from lab.sizing.vllm_sheet import VllmSheet, log_lines, vllm_sheet

NOTICE = ("Exported by PagedAttention Lab from its own scheduler replay (a simulation), not by "
          "a vLLM server")
SIMULATED_ORG = "PagedAttention-Lab-simulation"  # model_name = this/preset name
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # str(FinishReason)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# (name, HELP, buckets: a tuple, or None for 1-2-5 token buckets up to max_model_len)
HISTOGRAMS: tuple[tuple[str, str, tuple[float, ...] | None], ...] = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", None),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", None),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", None),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
     TTFT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
     ITL_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     REQUEST_LATENCY_BUCKETS),
)


@dataclass(frozen=True)
class ReplayStats:
    """What a vLLM v1 server would have counted, up to the iteration a replay stopped at."""

    iteration: int
    running: int
    waiting: int
    kv_cache_usage: float
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    prefix_queries: int
    prefix_hits: int
    finished: dict[str, int]  # finished_reason -> requests
    observations: dict[str, tuple[float, ...]]  # histogram name -> observed values


def replay_stats(sched: Scheduler) -> ReplayStats:
    """Read a scheduler after its last step (run it to the iteration the gauges should show).
    A paged replay of the V1 engine: vLLM v1 has no contiguous allocator and no swap."""
    cfg = sched.cfg
    if cfg.allocator != "paged" or cfg.engine != "v1":
        raise ValueError("vLLM v1 is a paged server that preempts by recompute: export a paged "
                         "replay of the V1 engine (engine='v1')")
    if not sched.records:
        raise ValueError("the replay has not run an iteration yet")
    sched.running()  # copy the running requests' progress out of the table
    last = sched.records[-1]
    first_scheduled: dict[int, float] = {}
    for record in sched.records:
        for req_id in record.admitted_ids:
            first_scheduled.setdefault(req_id, record.start_s)
    reqs = sorted(sched.requests.values(), key=lambda q: q.req_id)
    started = [q for q in reqs if q.first_token_s is not None]
    done = [q for q in reqs if q.state is RequestState.FINISHED]
    finished = dict.fromkeys(FINISH_REASONS, 0)
    for q in done:
        finished["length" if q.num_output >= q.max_tokens else "stop"] += 1
    queries, hits = sched.backend.prefix_tokens()

    def per_done(value) -> tuple[float, ...]:
        return tuple(float(value(q)) for q in done)

    itl = np.concatenate(sched.itl) if sched.itl else np.zeros(0)
    observations = {
        "vllm:request_prompt_tokens": per_done(lambda q: q.spec.prompt_len),
        "vllm:request_generation_tokens": per_done(lambda q: q.num_output),
        "vllm:request_params_max_tokens": per_done(lambda q: q.max_tokens),
        "vllm:time_to_first_token_seconds": tuple(q.first_token_s - q.spec.arrival_s
                                                  for q in started),
        "vllm:inter_token_latency_seconds": tuple(float(x) for x in itl),
        "vllm:e2e_request_latency_seconds": per_done(lambda q: q.finish_s - q.spec.arrival_s),
        "vllm:request_queue_time_seconds": per_done(
            lambda q: first_scheduled[q.req_id] - q.spec.arrival_s),
        "vllm:request_inference_time_seconds": per_done(
            lambda q: q.finish_s - first_scheduled[q.req_id]),
        "vllm:request_prefill_time_seconds": per_done(
            lambda q: q.first_token_s - first_scheduled[q.req_id]),
        "vllm:request_decode_time_seconds": per_done(lambda q: q.finish_s - q.first_token_s),
    }
    return ReplayStats(
        last.index, last.num_running, last.num_waiting, last.kv_usage,
        sum(sched.preemptions.values()), sum(q.spec.prompt_len for q in started),
        sum(q.num_output for q in reqs), queries, hits, finished, observations)


# -- the /metrics text ---------------------------------------------------------------------------
def go_float(x: float) -> str:
    """A number as prometheus_client writes it (Go's %g style: 1.5e+06, +Inf, NaN)."""
    x = float(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    text = repr(x)
    point = text.find(".")
    if x > 0 and point > 6:  # Go turns to an exponent past six integer digits
        digits = (text[:point] + text[point + 1:]).rstrip("0") or "0"
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e+{point - 1:02d}"
    return text


def _labels(labels: dict[str, str]) -> str:
    def escape(v: str) -> str:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items())) + "}"


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    bounds, scale = [], 1
    while scale <= max_model_len:
        bounds += [m * scale for m in (1, 2, 5) if m * scale <= max_model_len]
        scale *= 10
    return tuple(bounds)


def metrics_text(stats: ReplayStats, *, model_name: str, max_model_len: int,
                 engine: int = 0, created_s: float = 0.0) -> str:
    """The stats as a vLLM v1 server's /metrics page. `_created` samples carry `created_s` (on
    the replay's clock, where a server writes the Unix time its metrics were made)."""
    base = {"engine": str(engine), "model_name": model_name}
    out = [f"# {NOTICE}: the replay stopped after iteration {stats.iteration}; times are its "
           "simulated seconds."]

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, dict, float]],
               created: list[dict]) -> None:
        shown = f"{name}_total" if kind == "counter" else name
        out.extend([f"# HELP {shown} {help_text}", f"# TYPE {shown} {kind}"])
        out.extend(f"{sample}{_labels(labels)} {go_float(value)}"
                   for sample, labels, value in samples)
        if created:  # prometheus_client puts the creation times in a gauge of their own
            out.extend([f"# HELP {name}_created {help_text}", f"# TYPE {name}_created gauge"])
            out.extend(f"{name}_created{_labels(labels)} {go_float(created_s)}"
                       for labels in created)

    for name, help_text, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             stats.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             stats.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             stats.kv_cache_usage)):
        family(name, "gauge", help_text, [(name, base, value)], [])
    for name, help_text, value in (
            ("vllm:prefix_cache_queries",
             "Prefix cache queries, in terms of number of queried tokens.", stats.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             stats.prefix_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
             stats.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.",
             stats.generation_tokens)):
        family(name, "counter", help_text, [(f"{name}_total", base, value)], [base])
    by_reason = [{**base, "finished_reason": r} for r in FINISH_REASONS]
    family("vllm:request_success", "counter", "Count of successfully processed requests.",
           [("vllm:request_success_total", labels, stats.finished[labels["finished_reason"]])
            for labels in by_reason], by_reason)
    for name, help_text, bounds in HISTOGRAMS:
        values = np.sort(np.asarray(stats.observations[name], dtype=float))
        bounds = (*(bounds or token_buckets(max_model_len)), math.inf)
        counts = np.searchsorted(values, bounds, side="right")  # observations <= bound
        samples = [(f"{name}_bucket", {**base, "le": go_float(b)}, float(c))
                   for b, c in zip(bounds, counts)]
        samples += [(f"{name}_count", base, float(values.size)),
                    (f"{name}_sum", base, float(values.sum()))]
        family(name, "histogram", help_text, samples, [base])
    return "\n".join(out) + "\n"


# -- the startup log -------------------------------------------------------------------------
def pool_sheet(cfg: SchedulerConfig, spec: ModelSpec, max_model_len: int) -> VllmSheet:
    """vLLM's KV-cache sheet for the replay's pool, as if its blocks held `spec`'s 16-bit K/V:
    the available memory is exactly the pool's blocks."""
    layout = kv_layout(spec, "fp16", 1)
    sheet = vllm_sheet(layout, available_kv_memory=0, block_size=cfg.block_size,
                       max_model_len=max_model_len,
                       max_num_batched_tokens=cfg.max_num_batched_tokens)
    if len(sheet.groups) > 1:
        raise ValueError(f"{spec.name} has {len(sheet.groups)} KV-cache groups: the lab's pool "
                         "stands for a model whose layers share one block table")
    sheet = replace(sheet, available_kv_memory=cfg.num_blocks * sheet.page_size_bytes
                    * sheet.group_size)
    if sheet.failure():
        raise ValueError(f"vLLM would not start on this pool: {sheet.failure()}")
    return sheet


def startup_log(cfg: SchedulerConfig, sheet: VllmSheet, *, model_name: str) -> str:
    """The startup lines vLLM v1 prints for the replay's pool (`pool_sheet`): its config line,
    the token budget, the KV-cache lines (lab.sizing.vllm_sheet.log_lines), the block count."""
    lines = [f"# {NOTICE}: the startup lines vLLM v1 would print for the replay's pool of "
             f"{sheet.num_blocks:,} blocks of {sheet.block_size} tokens.",
             f"Initializing a V1 LLM engine (PagedAttention Lab simulation) with config: "
             f"model='{model_name}', max_seq_len={sheet.max_model_len}, tensor_parallel_size=1, "
             f"kv_cache_dtype=auto, served_model_name={model_name}, "
             f"enable_prefix_caching={cfg.enable_prefix_caching}, "
             f"chunked_prefill_enabled={cfg.enable_chunked_prefill}",
             *([f"Chunked prefill is enabled with max_num_batched_tokens="
                f"{cfg.max_num_batched_tokens}."] if cfg.enable_chunked_prefill else []),
             *log_lines(sheet),
             f"Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: "
             f"{sheet.num_blocks}"]
    return "\n".join(lines) + "\n"


# -- the sample the page offers ------------------------------------------------------------------
@dataclass(frozen=True)
class SampleSetup:
    """A small seeded replay that keeps a server busy: ShareGPT-like requests arriving faster
    than a 256-block pool serves them, so requests wait and get preempted."""

    model: str = "Llama-3.1-8B"  # the cost model's model (and the log's KV bytes per block)
    gpu: str = "H100 80 GB"
    preset: str = "sharegpt"
    num_requests: int = 64
    rate: float = 8.0  # requests / s
    max_tokens: int = 1024
    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    seed: int = 0


@dataclass(frozen=True)
class EngineSample:
    metrics: str  # the /metrics text
    log: str  # the startup log
    stats: ReplayStats  # what the metrics say, as numbers
    sheet: VllmSheet  # what the log says
    model_name: str


def busiest_iteration(records) -> int:
    """The last iteration with the most requests in the engine (running + waiting)."""
    load = [r.num_running + r.num_waiting for r in records]
    return len(load) - 1 - int(np.argmax(load[::-1]))


def engine_sample(setup: SampleSetup = SampleSetup()) -> EngineSample:
    """The replay run once to find its busiest iteration, then again up to it."""
    spec = load_presets()[setup.model]
    cost = cost_model(spec, setup.gpu)
    requests = from_preset(setup.preset, setup.num_requests, seed=setup.seed, rate=setup.rate,
                           max_tokens=setup.max_tokens)
    cfg = SchedulerConfig(pool=PoolConfig(num_blocks=setup.num_blocks,
                                          block_size=setup.block_size),
                          max_num_seqs=setup.max_num_seqs,
                          max_num_batched_tokens=setup.max_num_batched_tokens,
                          enable_prefix_caching=True, explain=False)  # vLLM v1's default
    stop = busiest_iteration(replay(requests, cfg, cost, setup.seed).records)
    sched = Scheduler(requests, cfg, cost, setup.seed)
    run(sched, max_iterations=stop + 1)
    name = f"{SIMULATED_ORG}/{setup.model}"
    stats, sheet = replay_stats(sched), pool_sheet(cfg, spec, setup.max_model_len)
    return EngineSample(metrics_text(stats, model_name=name, max_model_len=setup.max_model_len),
                        startup_log(cfg, sheet, model_name=name), stats, sheet, name)
