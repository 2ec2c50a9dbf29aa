"""Reading a vLLM server: Prometheus text, fetched from a local HTTP server, and startup logs."""

from __future__ import annotations

import http.server
import math
import socket
import threading
import time

import pytest

from lab.vllm.fetch import MODE_ENV, fetch_metrics
from lab.vllm.metrics_text import MetricsError, engine_view, parse_prometheus
from lab.vllm.startup_log import LogError, parse_startup_log

# Our own fixture, in the exposition format a vLLM server uses (values made up).
CURRENT = """\
# HELP vllm:num_requests_running Requests in the model execution batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo/tiny-model"} 12.0
# HELP vllm:num_requests_waiting Requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo/tiny-model"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage, 1 means 100 percent.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="demo/tiny-model"} 0.625
# HELP vllm:num_preemptions_total Cumulative preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="demo/tiny-model"} 7.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="demo/tiny-model"} 4000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="demo/tiny-model"} 1000.0
# HELP vllm:time_to_first_token_seconds Time to first token.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="demo/tiny-model"} 10.0
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="demo/tiny-model"} 60.0
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="demo/tiny-model"} 90.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="demo/tiny-model"} 100.0
vllm:time_to_first_token_seconds_count{model_name="demo/tiny-model"} 100.0
vllm:time_to_first_token_seconds_sum{model_name="demo/tiny-model"} 42.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{le="0.01",model_name="demo/tiny-model"} 500.0
vllm:inter_token_latency_seconds_bucket{le="0.05",model_name="demo/tiny-model"} 900.0
vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="demo/tiny-model"} 1000.0
vllm:inter_token_latency_seconds_count{model_name="demo/tiny-model"} 1000.0
vllm:inter_token_latency_seconds_sum{model_name="demo/tiny-model"} 20.0
"""

OLDER = """\
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
vllm:num_requests_running{model_name="m"} 3
vllm:time_per_output_token_seconds_bucket{le="0.02",model_name="m"} 8
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 10
vllm:time_per_output_token_seconds_count{model_name="m"} 10
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.3
"""


def test_current_names():
    view = engine_view(parse_prometheus(CURRENT))
    assert view.kv_cache_usage == 0.625 and view.kv_usage_metric == "vllm:kv_cache_usage_perc"
    assert (view.running, view.waiting, view.preemptions) == (12, 5, 7)
    assert view.prefix_hit_rate == 0.25
    assert view.model_names == ("demo/tiny-model",)
    assert view.ttft.count == 100 and view.ttft.mean == pytest.approx(0.42)
    assert view.ttft.quantile(0.5) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)
    assert view.ttft.quantile(0.99) == 1.0  # beyond the last finite bound: that bound
    assert view.itl_metric == "vllm:inter_token_latency_seconds"
    assert view.itl.quantile(0.5) == pytest.approx(0.01)


def test_older_names_without_type_lines():
    view = engine_view(parse_prometheus(OLDER))
    assert view.kv_cache_usage == 0.25 and view.kv_usage_metric == "vllm:gpu_cache_usage_perc"
    assert view.itl_metric == "vllm:time_per_output_token_seconds"
    assert view.itl.quantile(0.5) == pytest.approx(0.0125)
    assert view.preemptions is None and view.prefix_hit_rate is None


def test_labels_escapes_and_special_values():
    fams = parse_prometheus('m{a="x\\"y",b="1\\\\2"} NaN\nn +Inf 1700000000\n')
    (s,) = fams["m"].samples
    assert s.labels == {"a": 'x"y', "b": "1\\2"} and math.isnan(s.value)
    assert fams["n"].samples[0].value == math.inf


@pytest.mark.parametrize("text, message", [
    ("hello world\n", "line 1"),
    ("ok 1\nbad{a=1} 2\n", "line 2"),
    ("m abc\n", "not a number"),
    ("# only comments\n", "no samples"),
])
def test_bad_text_is_named(text, message):
    with pytest.raises(MetricsError, match=message):
        parse_prometheus(text)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/metrics":
            body = CURRENT.encode()
        elif self.path == "/big":
            body = b"x 1\n" * 5000
        elif self.path == "/slow":
            time.sleep(1.0)
            body = b"x 1\n"
        else:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (timeout or size cap): what the test wants

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_fetch_from_a_local_server(server, monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    view = engine_view(parse_prometheus(fetch_metrics(f"{server}/metrics")))
    assert view.running == 12


def test_fetch_errors_are_clear(server, monkeypatch):
    """One message for every remote failure (tests/test_hostile_fetch.py: it does not tell a
    closed port from an error reply), naming the host and the deadline."""
    monkeypatch.delenv(MODE_ENV, raising=False)
    with pytest.raises(MetricsError, match="no Prometheus /metrics text from 127.0.0.1"):
        fetch_metrics(f"{server}/nothing")
    with pytest.raises(MetricsError, match="no Prometheus /metrics text"):
        fetch_metrics(f"{server}/big", max_bytes=1000)
    start = time.monotonic()
    with pytest.raises(MetricsError, match="within 0.3 s"):
        fetch_metrics(f"{server}/slow", timeout=0.3)
    assert time.monotonic() - start < 0.9
    with pytest.raises(MetricsError, match="http"):
        fetch_metrics("file:///etc/passwd")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(MetricsError, match=f"from 127.0.0.1:{closed} within"):
        fetch_metrics(f"http://127.0.0.1:{closed}/metrics")


def test_fetch_can_be_turned_off(server, monkeypatch):
    monkeypatch.setenv(MODE_ENV, "off")
    with pytest.raises(MetricsError, match="turned off"):
        fetch_metrics(f"{server}/metrics")


LOG = """\
INFO 01-02 03:04:05 [loader.py:10] Loading model weights took 14.9889 GB
INFO 01-02 03:04:09 [executor.py:20] # GPU blocks: 27,901, # CPU blocks: 2048
INFO 01-02 03:04:09 [kv_cache_utils.py:30] GPU KV cache size: 446,416 tokens
INFO 01-02 03:04:09 [kv_cache_utils.py:31] Maximum concurrency for 8,192 tokens per request: 54.49x
INFO 01-02 03:04:08 [gpu_worker.py:40] Available KV cache memory: 53.52 GiB
"""


def test_startup_log():
    log = parse_startup_log(LOG)
    assert (log.gpu_blocks, log.cpu_blocks, log.kv_cache_tokens) == (27901, 2048, 446416)
    assert log.concurrency_tokens == 8192 and log.max_concurrency == 54.49
    assert log.kv_memory_gib == 53.52 and log.implied_block_size() == 16
    with pytest.raises(LogError, match="no KV-cache lines"):
        parse_startup_log("INFO starting server\nINFO ready\n")


# A vLLM v1 start-up in its wording (engine-core prefixes, the config line, the memory lines).
# The values are ours, consistent with vLLM's arithmetic for Llama-3.1-8B: 54.71 GiB in 2 MiB
# blocks is 28,008 to 28,014 blocks (the two decimals), and 28,013 x 16 = 448,208 tokens.
V1_LOG = """\
INFO 09-01 12:00:00 [core.py:70] Initializing a V1 LLM engine (v0.10.1) with config: \
model='meta-llama/Llama-3.1-8B-Instruct', speculative_config=None, dtype=torch.bfloat16, \
max_seq_len=131072, download_dir=None, load_format=auto, tensor_parallel_size=1, \
pipeline_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=auto
INFO 09-01 12:00:01 [scheduler.py:222] Chunked prefill is enabled with max_num_batched_tokens=8192.
(EngineCore_0 pid=123) INFO 09-01 12:00:20 [gpu_model_runner.py:1953] Model loading took \
14.9889 GiB and 4.3 seconds
(EngineCore_0 pid=123) INFO 09-01 12:00:40 [gpu_worker.py:276] Available KV cache memory: 54.71 GiB
(EngineCore_0 pid=123) INFO 09-01 12:00:40 [kv_cache_utils.py:849] GPU KV cache size: 448,208 tokens
(EngineCore_0 pid=123) INFO 09-01 12:00:40 [kv_cache_utils.py:853] Maximum concurrency for \
131,072 tokens per request: 3.42x
"""
# A v0 start-up: the profile lines carry the numbers vLLM PR #10511 shows for Llama-3-8B on an
# H100; the block lines are what v0 derives from them (53.288 GiB in 2 MiB blocks = 27,283).
V0_LOG = """\
INFO 12-13 19:54:18 worker.py:243] the current vLLM instance can use total_gpu_memory \
(79.22GiB) x gpu_memory_utilization (0.90) = 71.29GiB
INFO 12-13 19:54:18 worker.py:243] model weights take 14.96GiB; non_torch_memory takes 1.79GiB; \
PyTorch activation peak memory takes 1.26GiB; the rest of the memory reserved for KV Cache is \
53.29GiB.
INFO 12-13 19:54:19 gpu_executor.py:76] # GPU blocks: 27283, # CPU blocks: 2048
INFO 12-13 19:54:19 gpu_executor.py:80] Maximum concurrency for 8192 tokens per request: 53.29x
"""


def test_startup_log_reads_v1_and_v0_wordings():
    v1 = parse_startup_log(V1_LOG)
    assert (v1.model, v1.max_model_len, v1.tensor_parallel_size) == (
        "meta-llama/Llama-3.1-8B-Instruct", 131072, 1)
    assert (v1.kv_cache_dtype, v1.max_num_batched_tokens, v1.weights_gib) == (
        "auto", 8192, 14.9889)
    assert (v1.kv_memory_gib, v1.kv_cache_tokens, v1.max_concurrency) == (54.71, 448208, 3.42)
    v0 = parse_startup_log(V0_LOG)
    assert (v0.total_gpu_gib, v0.utilization, v0.weights_gib) == (79.22, 0.9, 14.96)
    assert (v0.non_torch_gib, v0.activation_gib, v0.kv_memory_gib) == (1.79, 1.26, 53.29)
    assert v0.profiled_gib == pytest.approx(3.05) and v0.gpu_blocks == 27283
    assert v0.concurrency_tokens == 8192


@pytest.mark.parametrize("text", [
    "GPU KV cache size: " + "9" * 5000 + " tokens",
    "Maximum concurrency for 1" + "0" * 400 + " tokens per request: 1e999x",
    "Available KV cache memory: 99999999999999999999999.5 GiB\n" + "x" * 1000,
])
def test_hostile_startup_logs_read_or_fail_cleanly(text):
    try:
        log = parse_startup_log(text)
    except LogError as err:  # the number is named (tests/test_hostile_parsers.py has more)
        assert "not a number an engine logs" in str(err) or "outside what" in str(err)
    else:
        assert isinstance(log.kv_memory_gib or log.kv_cache_tokens or 0, float | int)


def _card(log_settings: dict | None = None, **kwargs):
    from lab.sizing.capacity import load_gpus
    from lab.sizing.kv_formula import kv_layout
    from lab.sizing.model_spec import load_presets
    from lab.sizing.vllm_sheet import vllm_sheet_from_gpu

    spec = load_presets()["Llama-3.1-8B"]
    layout = kv_layout(spec, kwargs.pop("dtype", "fp16"))
    settings = {"total_memory": load_gpus()["H100 80 GB"].cuda_bytes, "utilization": 0.9,
                "weights_memory": spec.weight_bytes(), "other_memory": int(1.6 * 2**30),
                "block_size": 16, "max_model_len": 131072, "max_num_batched_tokens": 8192}
    return layout, vllm_sheet_from_gpu(layout, **{**settings, **kwargs})


def test_the_log_is_checked_number_by_number():
    from lab.vllm.log_check import check_log

    layout, card = _card()
    rows = {c.quantity: c for c in check_log(parse_startup_log(V1_LOG), card, layout)}
    assert rows["GPU KV cache size (tokens)"].agrees is True
    assert rows["GPU KV cache size (tokens)"].engine == "448,208"
    concurrency = rows["Maximum concurrency for 131,072 tokens per request"]
    assert concurrency.agrees is True and concurrency.from_log_memory == "3.42"
    weights = rows["model weights (GiB)"]
    assert "RoPE's cos/sin table" in weights.why and "0.031 GiB" in weights.why
    assert "+0.03 GiB in the log" in weights.why
    assert "Available KV cache memory (GiB)" in rows


def test_a_v0_log_splits_the_memory_gap_into_its_parts():
    from lab.vllm.log_check import check_log

    layout, card = _card(max_model_len=8192)
    rows = {c.quantity: c for c in check_log(parse_startup_log(V0_LOG), card, layout)}
    assert rows["total GPU memory (GiB)"].engine == "79.22"
    assert rows["activation peak + non-torch + CUDA graphs (GiB)"].engine == "3.05"
    why = rows["Available KV cache memory (GiB)"].why
    assert "from the total memory" in why and "from the weights" in why
    assert "from the profiled reserve" in why
    assert rows["num_gpu_blocks"].agrees is True
    assert rows["Maximum concurrency for 8,192 tokens per request"].agrees is True


def test_a_mismatch_names_the_setting_that_likely_differs():
    from lab.vllm.log_check import check_log

    layout, card = _card(dtype="fp8")  # the engine ran bf16, the sheet says fp8
    rows = {c.quantity: c for c in check_log(parse_startup_log(V1_LOG), card, layout)}
    tokens = rows["GPU KV cache size (tokens)"]
    assert tokens.agrees is False and "fp8 KV cache" in tokens.why
    layout, card = _card(max_model_len=8192)
    concurrency = next(c for c in check_log(parse_startup_log(V1_LOG), card, layout)
                       if c.quantity.startswith("Maximum concurrency"))
    assert concurrency.agrees is False and "set max_model_len to 131,072" in concurrency.why


def test_the_preset_is_guessed_from_the_model_id():
    from lab.vllm.log_check import guess_preset

    names = ["Llama-3.1-8B", "Llama-3.1-70B", "Gemma-3-27B", "DeepSeek-V3"]
    assert guess_preset("meta-llama/Llama-3.1-8B-Instruct", names) == "Llama-3.1-8B"
    assert guess_preset("meta-llama/Meta-Llama-3.1-70B-Instruct", names) == "Llama-3.1-70B"
    assert guess_preset("google/gemma-3-27b-it", names) == "Gemma-3-27B"
    assert guess_preset("/models/DeepSeek-V3-0324/", names) == "DeepSeek-V3"
    assert guess_preset("some/other-model", names) is None and guess_preset(None, names) is None
