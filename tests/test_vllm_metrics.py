"""Reading a vLLM server: Prometheus text, fetched from a local HTTP server, and startup logs."""

from __future__ import annotations

import http.server
import math
import socket
import threading
import time

import pytest

from lab.vllm.metrics_text import (
    DISABLE_ENV,
    MetricsError,
    engine_view,
    fetch_metrics,
    parse_prometheus,
)
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
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    view = engine_view(parse_prometheus(fetch_metrics(f"{server}/metrics")))
    assert view.running == 12


def test_fetch_errors_are_clear(server, monkeypatch):
    monkeypatch.delenv(DISABLE_ENV, raising=False)
    with pytest.raises(MetricsError, match="HTTP 404"):
        fetch_metrics(f"{server}/nothing")
    with pytest.raises(MetricsError, match="larger than 1,000 bytes"):
        fetch_metrics(f"{server}/big", max_bytes=1000)
    with pytest.raises(MetricsError, match="did not answer within 0.3 s"):
        fetch_metrics(f"{server}/slow", timeout=0.3)
    with pytest.raises(MetricsError, match="http"):
        fetch_metrics("file:///etc/passwd")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(MetricsError, match="could not reach 127.0.0.1"):
        fetch_metrics(f"http://127.0.0.1:{closed}/metrics")


def test_fetch_can_be_turned_off(server, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
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
