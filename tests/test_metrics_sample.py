"""The sample for 'Inspect a real engine': a scheduler replay exported as vLLM's /metrics text and
startup log reads back, through the same parsers as a real server's, as the replay's numbers."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from lab.memory.kv_pool import PoolConfig
from lab.serving.config import SchedulerConfig
from lab.serving.request import RequestState
from lab.serving.runs import run
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import from_preset
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import load_presets
from lab.vllm.log_check import check_log
from lab.vllm.metrics_text import Family, engine_view, parse_prometheus
from lab.vllm.replay_export import (
    HISTOGRAMS,
    ITL_BUCKETS,
    NOTICE,
    TTFT_BUCKETS,
    engine_sample,
    go_float,
    metrics_text,
    pool_sheet,
    replay_stats,
    startup_log,
    token_buckets,
)
from lab.vllm.startup_log import parse_startup_log
from tests.scheduler_helpers import llama_h100

MODEL = "PagedAttention-Lab-simulation/Llama-3.1-8B"
MAX_MODEL_LEN = 2048
CFG = SchedulerConfig(pool=PoolConfig(num_blocks=128, block_size=16), max_num_seqs=16,
                      max_num_batched_tokens=1024, enable_prefix_caching=True, explain=False)


def small_replay(stop: int = 700) -> Scheduler:
    """24 ShareGPT-like requests at 10/s on 128 blocks, stopped while it is busy."""
    requests = from_preset("sharegpt", 24, seed=3, rate=10.0, max_tokens=512)
    sched = Scheduler(requests, CFG, llama_h100(), seed=3)
    run(sched, max_iterations=stop)
    return sched


@pytest.fixture(scope="module")
def replayed() -> tuple[Scheduler, dict[str, Family]]:
    sched = small_replay()
    text = metrics_text(replay_stats(sched), model_name=MODEL, max_model_len=MAX_MODEL_LEN)
    return sched, parse_prometheus(text)


def counter(families: dict[str, Family], name: str, **labels: str) -> float:
    samples = [s for s in families[name].samples if s.name == name
               and labels.items() <= s.labels.items()]
    assert samples, name
    return sum(s.value for s in samples)


def histogram(families: dict[str, Family], name: str) -> tuple[dict[float, float], float, float]:
    """({upper bound: cumulative count}, sum, count) as the text says them."""
    fam = families[name]
    assert fam.type == "histogram"
    buckets = {float(s.labels["le"]): s.value for s in fam.samples if s.name == f"{name}_bucket"}
    (total,) = [s.value for s in fam.samples if s.name == f"{name}_sum"]
    (count,) = [s.value for s in fam.samples if s.name == f"{name}_count"]
    return buckets, total, count


def test_the_replay_is_busy_where_it_stops(replayed) -> None:
    sched, _ = replayed
    last = sched.records[-1]
    assert not sched.done and last.num_running > 0 and last.num_waiting > 0
    assert sum(sched.preemptions.values()) > 0 and last.finished > 0


def test_gauges_and_counters_read_back(replayed) -> None:
    sched, families = replayed
    view, last = engine_view(families), sched.records[-1]
    assert (view.running, view.waiting) == (last.num_running, last.num_waiting)
    assert view.kv_cache_usage == last.kv_usage and view.kv_usage_metric == \
        "vllm:kv_cache_usage_perc"
    assert view.preemptions == sum(r.preemptions for r in sched.records)
    assert (view.prefix_queries, view.prefix_hits) == sched.backend.prefix_tokens()
    assert view.model_names == (MODEL,)
    reqs = list(sched.requests.values())
    emitted = [q for q in reqs if q.first_token_s is not None]
    assert counter(families, "vllm:prompt_tokens_total") == sum(q.spec.prompt_len
                                                               for q in emitted)
    generated = counter(families, "vllm:generation_tokens_total")
    assert generated == sum(q.num_output for q in reqs)
    # every token is a first token (TTFT) or follows one (ITL)
    assert generated == view.ttft.count + view.itl.count
    finished = [q for q in reqs if q.state is RequestState.FINISHED]
    assert counter(families, "vllm:request_success_total") == len(finished) == last.finished
    assert counter(families, "vllm:request_success_total", finished_reason="length") == sum(
        q.num_output == q.max_tokens for q in finished)
    assert counter(families, "vllm:request_success_total", finished_reason="abort") == 0


def test_latency_histograms_read_back(replayed) -> None:
    sched, families = replayed
    view, reqs = engine_view(families), list(sched.requests.values())
    ttft = np.array([q.first_token_s - q.spec.arrival_s for q in reqs
                     if q.first_token_s is not None])
    itl = np.concatenate(sched.itl)
    for hist, values, bounds in ((view.ttft, ttft, TTFT_BUCKETS), (view.itl, itl, ITL_BUCKETS)):
        assert hist.count == values.size and hist.total == pytest.approx(values.sum(), rel=1e-12)
        assert [b for b, _ in hist.buckets] == [*bounds, math.inf]
        assert [c for _, c in hist.buckets] == [int((values <= b).sum())
                                                for b in (*bounds, math.inf)]
    assert view.itl_metric == "vllm:inter_token_latency_seconds"


def test_request_histograms_read_back(replayed) -> None:
    sched, families = replayed
    finished = [q for q in sched.requests.values() if q.state is RequestState.FINISHED]
    e2e = np.array([q.finish_s - q.spec.arrival_s for q in finished])
    parts = {name: histogram(families, name) for name, _, _ in HISTOGRAMS}
    for name, (buckets, _, count) in parts.items():
        assert count == len(finished) or name in ("vllm:time_to_first_token_seconds",
                                                  "vllm:inter_token_latency_seconds")
        assert list(buckets.values()) == sorted(buckets.values()) and buckets[math.inf] == count
    assert parts["vllm:e2e_request_latency_seconds"][1] == pytest.approx(e2e.sum(), rel=1e-12)
    total = {name: parts[f"vllm:request_{name}_seconds"][1]
             for name in ("queue_time", "inference_time", "prefill_time", "decode_time")}
    # e2e = waiting + running, running = prefill + decode, on the replay's one clock
    assert total["queue_time"] + total["inference_time"] == pytest.approx(e2e.sum())
    assert total["prefill_time"] + total["decode_time"] == pytest.approx(total["inference_time"])
    assert min(total.values()) > 0  # requests queued, and were preempted into the queue again
    prompt = parts["vllm:request_prompt_tokens"]
    assert prompt[1] == sum(q.spec.prompt_len for q in finished)
    assert list(prompt[0]) == [*map(float, token_buckets(MAX_MODEL_LEN)), math.inf]
    assert token_buckets(MAX_MODEL_LEN) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def test_the_text_looks_like_prometheus_client_output(replayed) -> None:
    sched, _ = replayed
    text = metrics_text(replay_stats(sched), model_name=MODEL, max_model_len=MAX_MODEL_LEN)
    lines = text.splitlines()
    assert lines[0].startswith(f"# {NOTICE}")
    assert "# TYPE vllm:num_preemptions_total counter" in lines
    assert "# TYPE vllm:num_preemptions_created gauge" in lines
    assert "# TYPE vllm:time_to_first_token_seconds_created gauge" in lines
    assert f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} ' \
        f"{float(sched.records[-1].num_running)}" in lines
    assert any(line.startswith('vllm:request_success_total{engine="0",finished_reason="stop",'
                               f'model_name="{MODEL}"}} ') for line in lines)
    assert f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}}' \
        in text


def test_escaped_model_names_round_trip(replayed) -> None:
    sched, _ = replayed
    name = 'lab "sim"\\2\nx'
    text = metrics_text(replay_stats(sched), model_name=name, max_model_len=MAX_MODEL_LEN)
    assert engine_view(parse_prometheus(text)).model_names == (name,)


def test_go_floats() -> None:
    assert [go_float(x) for x in (0.0, 1.0, 0.90625, 123456.5, 1234567.0, 1e6, 1.7e9, 1e-5,
                                  math.inf, math.nan)] == [
        "0.0", "1.0", "0.90625", "123456.5", "1.234567e+06", "1e+06", "1.7e+09", "1e-05",
        "+Inf", "NaN"]
    rng = random.Random(0)
    for _ in range(2000):
        x = rng.uniform(0, 10) ** rng.uniform(0, 12)
        assert float(go_float(x)) == x


def test_startup_log_reads_back_as_the_pool() -> None:
    spec = load_presets()["Llama-3.1-8B"]
    sheet = pool_sheet(CFG, spec, MAX_MODEL_LEN)
    text = startup_log(CFG, sheet, model_name=MODEL)
    assert text.startswith(f"# {NOTICE}")
    log = parse_startup_log(text)
    assert (log.gpu_blocks, log.implied_block_size()) == (CFG.num_blocks, CFG.block_size)
    assert log.kv_cache_tokens == CFG.num_blocks * CFG.block_size
    assert (log.max_model_len, log.max_num_batched_tokens, log.model) == (
        MAX_MODEL_LEN, CFG.max_num_batched_tokens, MODEL)
    assert log.max_concurrency == CFG.num_blocks * CFG.block_size / MAX_MODEL_LEN
    # 128 blocks x 16 tokens x 128 KiB of Llama-3.1-8B K/V per token
    assert log.kv_memory_gib == 0.25
    rows = [c for c in check_log(log, sheet, kv_layout(spec)) if c.agrees is not None]
    assert len(rows) == 3 and all(c.agrees for c in rows)


def test_what_vllm_v1_cannot_do_is_refused() -> None:
    with pytest.raises(ValueError, match="recompute"):
        replay_stats(Scheduler((), replace(CFG, engine="v0", preemption_mode="swap"), llama_h100()))
    spec = load_presets()["Llama-3.1-8B"]
    with pytest.raises(ValueError, match="would not start"):
        pool_sheet(CFG, spec, 4096)  # one 4,096-token request needs 256 blocks, not 128


# A vLLM v1 server's text as prometheus_client writes it (our own numbers): process metrics,
# a config info gauge, `_created` gauges after each counter and histogram, two engines.
REAL_V1 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 10321.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.75201234567e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27915"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="org/m"} 3.0
vllm:num_requests_running{engine="1",model_name="org/m"} 4.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="org/m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="org/m"} 1.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="org/m"} 1.7520123501234e+09
vllm:num_preemptions_created{engine="1",model_name="org/m"} 1.7520123501234e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="org/m"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="org/m"} 4.0
# HELP vllm:request_success_created Count of successfully processed requests.
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="org/m"} 1.75201235e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="org/m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="org/m"} 14.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="org/m"} 14.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="org/m"} 3.5
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="org/m"} 1.75201235e+09
"""


def test_real_v1_text_with_created_samples() -> None:
    families = parse_prometheus(REAL_V1)
    view = engine_view(families)
    assert (view.running, view.preemptions) == (7, 3)  # two engines, summed; no _created
    assert counter(families, "vllm:request_success_total") == 14
    assert (view.ttft.count, view.ttft.total) == (14, 3.5)
    assert view.ttft.buckets == ((0.1, 4.0), (math.inf, 14.0))


def test_v1_block_count_line() -> None:
    log = parse_startup_log("INFO 07-01 12:00:00 [kv_cache_utils.py:716] GPU KV cache size: "
                            "446,640 tokens\nINFO 07-01 12:00:05 [loggers.py:137] Engine 000: "
                            "vllm cache_config_info with initialization after num_gpu_blocks "
                            "is: 27915\n")
    assert (log.gpu_blocks, log.implied_block_size()) == (27915, 16)


def test_the_page_sample_is_busy_and_reads_back() -> None:
    sample = engine_sample()
    s = sample.stats
    assert s.running > 0 and s.waiting > 0 and s.preemptions > 0 and s.prefix_hits > 0
    view = engine_view(parse_prometheus(sample.metrics))
    assert (view.running, view.waiting, view.kv_cache_usage, view.preemptions) == (
        s.running, s.waiting, s.kv_cache_usage, s.preemptions)
    assert "simulation" in sample.model_name and view.model_names == (sample.model_name,)
    log = parse_startup_log(sample.log)
    assert (log.gpu_blocks, log.implied_block_size()) == (256, 16)


def test_the_page_loads_the_sample(open_app_page) -> None:
    at = open_app_page("pages/serving_metrics.py")
    assert not at.exception
    at.button(key="vllm_sample").click().run()
    assert not at.exception and not at.error
    stats = engine_sample().stats
    values = {m.label: m.value for m in at.metric}
    assert values["Running / waiting"] == f"{stats.running} / {stats.waiting}"
    assert values["Preemptions"] == f"{stats.preemptions:,}"
    assert values["KV-cache usage"] == f"{stats.kv_cache_usage:.0%}"
    notes = [str(e.value) for e in at.info]
    assert len(notes) == 2 and all("Sample from the lab's own simulation" in n for n in notes)
    table = at.table[-1].value
    agrees = dict(zip(table["quantity"], table["agrees"], strict=True))
    assert agrees["num_gpu_blocks"] == agrees["GPU KV cache size (tokens)"] == "✓"
    at.text_area(key="vllm_metrics_text").input("x 1\n").run()  # edited: no longer the sample
    assert len(at.info) == 1 and not at.exception
