"""What a hostile user types: the strategies and settings the tests/test_hostile_*.py suites share.

Every suite asks the same thing of its inputs: no exception escapes, a message says what was
wrong, and the state is what it was. The strategies lean on the texts that broke the lab
before (issue 14): numbers as text, inf/nan, huge and empty values, unicode digits, control
characters, byte-order marks, binary and megabyte inputs.

`examples(n)` keeps the suites cheap in `make test` (derandomized, so a run is reproducible);
`HOSTILE_SCALE=20 pytest tests/test_hostile_*.py` explores twenty times as far, at random.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SCALE = int(os.environ.get("HOSTILE_SCALE", "1") or 1)


def examples(n: int) -> settings:
    """Hypothesis settings for a hostile suite: n examples (x HOSTILE_SCALE), no deadline
    (AppTest runs take seconds on a loaded machine). The page fixtures are factories that open
    a fresh AppTest each call, so sharing one between examples is what the suites want."""
    return settings(max_examples=n * SCALE, deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# Texts that look like numbers to someone, and are not all numbers to Python.
NUMBER_TEXTS = (
    "inf", "-inf", "+inf", "Infinity", "+Inf", "-Inf", "NaN", "nan", "-nan", "1e400", "-1e400",
    "1e-400", "1e308", "0x10", "0b1", "1_000", "1,000", "1.000,5", "١٢", "１２", "²", " 7 ", "7\n",
    "\t7", "", " ", "-0", "+0", "0", "-1", "00000000000000000001", "9" * 400, "1" + "0" * 30,
    "1.5", "1.", ".5", "1e3", "1E+3", "2147483648", "-2147483649", "3.4e38", "1/2", "five",
)
ODD_TEXTS = (
    "\x00", "\ufeff", "\ufeff1", "\u202e21", "\u200b", "😀", "<script>x</script>", "`x`",
    "%00", "%FF", "a" * 5000, "\r\n", "\\", '"', "'", "${x}", "../../etc/passwd", "\x1b[31m",
)

number_texts = (st.sampled_from(NUMBER_TEXTS)
                | st.integers(-(10**40), 10**40).map(str)
                | st.floats(allow_nan=True, allow_infinity=True).map(repr))
odd_texts = st.sampled_from(ODD_TEXTS) | st.text(max_size=40)
hostile_texts = number_texts | odd_texts


# -- pasted and uploaded texts -----------------------------------------------------------------
COUNTERS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total",
            "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:time_per_output_token_seconds")
# Sample values are mostly valid (so a text gets past the parser to what reads it), labels not.
sample_values = (st.sampled_from(["1", "0", "NaN", "+Inf", "-Inf", "1e308", "-2.5", "1e-300"])
                 | st.floats(allow_nan=True, allow_infinity=True).map(repr) | number_texts)
label_values = number_texts | st.sampled_from(["", "abc", "+Inf", "0.1", 'a\\"b', "\\n"])
metric_lines = st.one_of(
    st.builds("{} {}".format, st.sampled_from(COUNTERS), sample_values),
    st.builds('{}{}{{le="{}",model_name="m"}} {}'.format, st.sampled_from(HISTOGRAMS),
              st.sampled_from(["_bucket", "_sum", "_count", ""]), label_values, sample_values),
    st.sampled_from(["# TYPE x histogram", "# HELP", "#", "# TYPE", "{}", "m{", "m{a=} 1"]),
    odd_texts,
)
metrics_texts = (st.lists(metric_lines, max_size=10).map("\n".join)
                 | st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")))

LOG_LINES = ("# GPU blocks: {}, # CPU blocks: {}", "GPU KV cache size: {} tokens",
             "Maximum concurrency for {} tokens per request: {}x",
             "Available KV cache memory: {} GiB", "Model loading took {} GiB and {} seconds",
             "total_gpu_memory ({}GiB) x gpu_memory_utilization ({})", "max_seq_len={}, "
             "tensor_parallel_size={}", "Forcing kv cache block size to {}",
             "model weights take {}GiB; non_torch_memory takes {}GiB; PyTorch activation peak "
             "memory takes {}GiB", "kv_cache_dtype={}", "model='{}'", "num_gpu_blocks={}",
             "Estimated CUDA graph memory: {} GiB", "max_num_batched_tokens={}")
# Numbers an engine logs, often enough that a text gets past the parser to the page's sheet.
log_values = (st.sampled_from(["1", "16", "27,901", "53.52", "0.9", "8192", "0", "fp8"])
              | st.integers(0, 10**13).map(str) | st.floats(0, 1e7).map("{:,.2f}".format)
              | hostile_texts)
log_lines = st.builds(lambda template, values: template.format(*values),
                      st.sampled_from(LOG_LINES), st.lists(log_values, min_size=3,
                                                           max_size=3)) | odd_texts
log_texts = st.lists(log_lines, max_size=12).map("\n".join)

cells = number_texts | st.sampled_from(['"1"', '"', "1\x00", "\ufeff1", "1;2", "1\r"]) | odd_texts
csv_texts = st.lists(st.lists(cells, max_size=4).map(",".join), max_size=20).map("\n".join)
