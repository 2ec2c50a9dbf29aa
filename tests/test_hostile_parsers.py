"""Hostile texts for every parser that reads what a user pastes or uploads: /metrics text, a vLLM
startup log, a config.json, a workload CSV.

Each parser gives a typed value or its own error (MetricsError, LogError, ConfigError,
WorkloadError) with a message; nothing else escapes, and the megabyte inputs it accepts are
read in linear time (bench/hostile.py measures the times; the bounds here are generous so a
loaded machine does not fail them, while the quadratic readings took tens of seconds).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.serving.workloads import MAX_CSV_BYTES, WorkloadError, parse_csv
from lab.sizing.config_reader import MAX_CONFIG_BYTES, read_hf_config
from lab.sizing.model_spec import ConfigError, ModelSpec
from lab.vllm.metrics_text import MAX_TEXT_BYTES, MetricsError, engine_view, parse_prometheus
from lab.vllm.startup_log import MAX_LOG_BYTES, LogError, StartupLog, parse_startup_log
from tests.hostile_inputs import csv_texts, examples, hostile_texts, log_texts, metrics_texts

CONFIGS = Path(__file__).parent / "data" / "configs"
LINEAR_S = 5.0  # a megabyte input is read well within this (the quadratic ones took 20-54 s)


def timed(fn, *args):
    """(result or error, CPU seconds of this thread): CPU time, since other test processes on
    a small machine stretch wall time (a linear read took 5.9 s of wall time beside three)."""
    start = time.thread_time()
    try:
        return fn(*args), time.thread_time() - start
    except ValueError as err:  # each parser's error is a ValueError
        return err, time.thread_time() - start


# -- /metrics text -------------------------------------------------------------------------------
def read_metrics(text: str):
    """What the page does with a text: parse it, then pick out what the guide watches."""
    try:
        return engine_view(parse_prometheus(text))
    except MetricsError as err:
        assert str(err)
        return None


@examples(300)
@given(metrics_texts)
def test_fuzzed_metrics_text_reads_or_names_its_error(text: str) -> None:
    view = read_metrics(text)
    if view is not None:
        for h in (view.ttft, view.itl):
            if h is not None:  # the numbers a page shows are defined for any histogram
                h.quantile(0.5), h.mean, h.count


@pytest.mark.parametrize("bound", ["abc", "", "1e400x", "NaN"])
def test_a_bucket_bound_that_is_not_a_number_is_named(bound: str) -> None:
    text = f'vllm:time_to_first_token_seconds_bucket{{le="{bound}"}} 1\n'
    with pytest.raises(MetricsError, match="le"):
        engine_view(parse_prometheus(text))


@pytest.mark.parametrize("text", [
    "m{" + "}" * (MAX_TEXT_BYTES - 8) + " 1",  # one line of braces: the sample pattern backtracks
    'm{a="' + "\\\\" * (MAX_TEXT_BYTES // 2 - 8) + '"} 1',
    "x 1\n" * (MAX_TEXT_BYTES // 8),  # 2 MiB of samples (bench/hostile.py times 4 MiB)
    "#" * MAX_TEXT_BYTES,
])
def test_megabyte_metrics_texts_read_in_linear_time(text: str) -> None:
    result, seconds = timed(lambda t: engine_view(parse_prometheus(t)), text)
    assert seconds < LINEAR_S
    assert result is not None


def test_metrics_text_past_the_limit_is_refused_first() -> None:
    result, seconds = timed(parse_prometheus, "x 1\n" * (MAX_TEXT_BYTES // 4 + 1))
    assert isinstance(result, MetricsError) and "larger than" in str(result)


# -- a vLLM startup log --------------------------------------------------------------------------
@examples(300)
@given(log_texts)
def test_fuzzed_startup_logs_read_or_name_their_error(text: str) -> None:
    try:
        log = parse_startup_log(text)
    except LogError as err:
        assert str(err)
        return
    assert isinstance(log, StartupLog)
    for name, value in vars(log).items():
        if isinstance(value, float):
            assert math.isfinite(value), name


def test_a_2_mib_log_is_read_in_linear_time() -> None:
    text = "Maximum concurrency for " * (MAX_LOG_BYTES // 24)
    result, seconds = timed(parse_startup_log, text)
    assert isinstance(result, LogError) and seconds < LINEAR_S


@pytest.mark.parametrize("prefix", ["# GPU blocks: 1", "GPU KV cache size: 1", "model weights "
                                    "take 1", "total_gpu_memory (1", "kv_cache_dtype=", "#"])
def test_every_log_pattern_reads_2_mib_of_its_own_prefix_in_linear_time(prefix: str) -> None:
    text = (prefix + " ") * (MAX_LOG_BYTES // (len(prefix) + 1))
    _, seconds = timed(parse_startup_log, text)
    assert seconds < LINEAR_S


@pytest.mark.parametrize("line", [
    "# GPU blocks: " + "9" * 400, "GPU KV cache size: 1" + "0" * 400 + " tokens",
    "Available KV cache memory: 1" + "0" * 30 + " GiB",
    "Maximum concurrency for 8 tokens per request: 1.2.3x", "# GPU blocks: 1,2,3",
    "gpu_memory_utilization=1.5 # GPU blocks: 9", "tensor_parallel_size=0 # GPU blocks: 9",
])
def test_a_number_no_engine_logs_is_refused_by_name(line: str) -> None:
    with pytest.raises(LogError, match="'(# GPU blocks|GPU KV cache size|Available KV cache "
                                       "memory|Maximum concurrency|gpu_memory_utilization|"
                                       "tensor_parallel_size)' reads"):
        parse_startup_log(line)


@pytest.mark.parametrize("text", ["Maximum concurrency for 8 tokens per request: 1.2.3x",
                                  "Available KV cache memory: ,,, GiB", "# GPU blocks: ,",
                                  "# GPU blocks: 1,,,,", "GPU KV cache size: 1.5 tokens"])
def test_the_issues_startup_log_numbers_read_or_name_their_error(text: str) -> None:
    try:
        parse_startup_log(text)
    except LogError as err:
        assert str(err)


def test_a_log_past_the_limit_is_refused_first() -> None:
    result, _ = timed(parse_startup_log, "x" * (MAX_LOG_BYTES + 1))
    assert isinstance(result, LogError) and "larger than" in str(result)


# -- config.json ---------------------------------------------------------------------------------
LLAMA = (CONFIGS / "llama-3.1-8b.json").read_bytes()


@pytest.mark.parametrize("data", [b"\xef\xbb\xbf" + LLAMA, "\ufeff" + LLAMA.decode()])
def test_a_config_with_a_byte_order_mark_is_read(data: str | bytes) -> None:
    assert read_hf_config(data).num_layers == 32


@pytest.mark.parametrize("data", [
    b"\xff\xfe" + LLAMA.decode().encode("utf-16-le"),  # UTF-16 with its BOM: not UTF-8
    b"\xef\xbb\xbf\xef\xbb\xbf" + LLAMA,  # two marks: the second is text JSON cannot start with
    b"\x00" * MAX_CONFIG_BYTES, b"[" * MAX_CONFIG_BYTES, b'{"a":' * (MAX_CONFIG_BYTES // 5),
    json.dumps({"num_hidden_layers": 10**19, "num_attention_heads": 1e308}).encode(),
    b'{"num_hidden_layers": ' + b"9" * 5000 + b"}", b"\xef\xbb\xbf",
])
def test_hostile_configs_name_their_error_quickly(data: bytes) -> None:
    result, seconds = timed(read_hf_config, data)
    assert isinstance(result, ConfigError) and result.errors and seconds < LINEAR_S


@examples(100)
@given(st.binary(max_size=64).map(lambda b: b"\xef\xbb\xbf" + b) | hostile_texts)
def test_fuzzed_configs_with_marks_and_numbers_read_or_name_their_error(data) -> None:
    try:
        assert isinstance(read_hf_config(data), ModelSpec)
    except ConfigError as err:
        assert err.errors


# -- a workload CSV ------------------------------------------------------------------------------
@examples(300)
@given(csv_texts | st.binary(max_size=200))
def test_fuzzed_csv_reads_or_names_its_error(data: str | bytes) -> None:
    try:
        requests = parse_csv(data)
    except WorkloadError as err:
        assert str(err)
        return
    assert requests and all(1 <= r.prompt_len and 1 <= r.output_len for r in requests)


@pytest.mark.parametrize("data", ["1," + "9" * 200_000 + "\n", '"' + "x" * 200_000])
def test_a_huge_csv_field_is_named(data: str) -> None:
    with pytest.raises(WorkloadError, match="row 1"):
        parse_csv(data)


@pytest.mark.parametrize("data", [
    "5,5\n" * 20_000,  # the issue's 80 KB upload: valid, read at once
    (" " * 95 + "7,9,0.5\n") * 20_000,  # 2 MiB of valid rows, the most a file may hold
    "\ufeffprompt_len,output_len\n" + "7,9\n" * 1000,
    b"\xef\xbb\xbf" + b"7,9\r\n" * 1000,
])
def test_large_or_marked_csv_reads_in_linear_time(data: str | bytes) -> None:
    result, seconds = timed(parse_csv, data)
    assert isinstance(result, tuple) and seconds < LINEAR_S


@pytest.mark.parametrize("data", [
    ",\n" * (MAX_CSV_BYTES // 2), "\n" * MAX_CSV_BYTES, "1,2\n" * (MAX_CSV_BYTES // 4 + 1),
    "x" * MAX_CSV_BYTES, b"\x00" * MAX_CSV_BYTES, "1," + "9" * 5000 + "\n", "1,١٢\n", "1,²\n",
])
def test_hostile_megabyte_csv_names_its_error_quickly(data: str | bytes) -> None:
    result, seconds = timed(parse_csv, data)
    assert isinstance(result, WorkloadError) and seconds < LINEAR_S
