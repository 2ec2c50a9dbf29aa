"""The KV-cache lines of a vLLM startup log, to set beside the lab's capacity sheet.

vLLM reports how much memory it kept for the KV cache and what that means in blocks, tokens and
concurrent requests, and before that what it is running: the engine config line (max_seq_len,
tensor_parallel_size, kv_cache_dtype), the token budget, the weights it loaded and, in v0 and
early v1 logs, the profile (total_gpu_memory, non-torch memory, activation peak). The wording
moved between versions, so each number has a pattern per wording; numbers may carry thousands
separators. Lines that are not about memory or the KV cache are ignored; a number on a KV line
that no engine would log (garbled, 400 digits, past any GPU) is named in a LogError. Reading is
linear in the text (bench/hostile.py: a 2 MiB paste).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LOG_BYTES = 2 << 20  # 2 MiB
# A number is matched as a run of digits, commas and dots (linear: every pattern starts with
# literal text, and the run stops at the first other character), then read by _number, which
# names what it cannot read: "1.2.3", 400 digits, a value past what any engine logs.
_N = r"(\d[\d,.]*)"
# field -> (what the log calls it, patterns); the last match of any wins: a restarted engine
# logs again. A bounded [^:\n]{0,80} where the wording varies: an unbounded [^:]* rescans to
# the end of the text from every match (a 2 MiB paste took 54 s).
_PATTERNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu_blocks": ("# GPU blocks", (r"#\s*GPU blocks:\s*" + _N, r"num_gpu_blocks=" + _N,
                                    r"num_gpu_blocks is:\s*" + _N)),  # v1: "... is: N"
    "cpu_blocks": ("# CPU blocks", (r"#\s*CPU blocks:\s*" + _N,)),
    "kv_cache_tokens": ("GPU KV cache size", (r"GPU KV cache size:\s*" + _N + r"\s*tokens",)),
    "concurrency_tokens": ("Maximum concurrency for", (
        r"Maximum concurrency for\s*" + _N + r"\s*tokens per request",)),
    "max_concurrency": ("Maximum concurrency", (
        r"Maximum concurrency for[^:\n]{0,80}:\s*" + _N + r"\s*x",)),
    "kv_memory_gib": ("Available KV cache memory", (
        r"Available KV cache memory:\s*" + _N + r"\s*GiB",
        r"available_kv_cache_memory\s*=?\s*" + _N + r"\s*GiB",
        r"reserved for KV Cache is\s*" + _N + r"\s*GiB", r"kv_cache_size=" + _N + r"\s*GiB")),
    "weights_gib": ("Model loading took", (
        r"(?:model weights took|Model loading took)\s*" + _N + r"\s*Gi?B",
        r"model weights take\s*" + _N + r"\s*GiB")),
    "total_gpu_gib": ("total_gpu_memory", (r"total_gpu_memory\s*[=(]?\s*" + _N + r"\s*GiB",)),
    "utilization": ("gpu_memory_utilization", (
        r"gpu_memory_utilization\s*[=(]?\s*" + _N, r"current --gpu-memory-utilization=" + _N)),
    "non_torch_gib": ("non_torch_memory", (
        r"non_torch_memory\s*(?:takes|=)?\s*" + _N + r"\s*GiB",)),
    "activation_gib": ("activation peak memory", (
        r"activation peak memory\s*(?:takes)?\s*" + _N + r"\s*GiB",)),
    "cuda_graph_gib": ("Estimated CUDA graph memory", (
        r"Estimated CUDA graph memory:\s*" + _N + r"\s*GiB",)),
    "max_model_len": ("max_seq_len", (r"max_seq_len=" + _N,)),
    "tensor_parallel_size": ("tensor_parallel_size", (r"tensor_parallel_size=" + _N,)),
    "max_num_batched_tokens": ("max_num_batched_tokens", (r"max_num_batched_tokens=" + _N,)),
    "forced_block_size": ("Forcing kv cache block size to", (
        r"Forcing kv cache block size to " + _N,)),
    "padding_layers": ("padding layers", (r"Add " + _N + r" padding layers",)),
}
_TEXT_PATTERNS = {"kv_cache_dtype": r"kv_cache_dtype=([\w.]{1,40})",
                  "model": r"\bmodel='([^'\n]{1,200})'"}
# The range each number may take (what an engine could log, with room): ints, then floats.
_INTS = {"gpu_blocks": (0, 10**10), "cpu_blocks": (0, 10**10), "kv_cache_tokens": (0, 10**13),
         "concurrency_tokens": (1, 10**9), "max_model_len": (1, 10**9),
         "tensor_parallel_size": (1, 4096), "max_num_batched_tokens": (1, 10**9),
         "forced_block_size": (1, 1 << 16), "padding_layers": (0, 10**4)}
_FLOATS = {"max_concurrency": (0.0, 1e9), "utilization": (0.0, 1.0)}  # the others are GiB
MAX_GIB = 1 << 20  # a PiB: no GPU, or set of them, holds more
_GROUPED = re.compile(r"\d{1,3}(?:,\d{3})*|\d{1,18}")
_DECIMALS = re.compile(r"\.\d{1,12}")


class LogError(ValueError):
    """A log with none of the KV-cache lines, or too large to read."""


@dataclass(frozen=True)
class StartupLog:
    gpu_blocks: int | None = None
    cpu_blocks: int | None = None
    kv_cache_tokens: int | None = None
    concurrency_tokens: int | None = None  # the per-request length the concurrency assumes
    max_concurrency: float | None = None
    kv_memory_gib: float | None = None
    weights_gib: float | None = None
    total_gpu_gib: float | None = None
    utilization: float | None = None
    non_torch_gib: float | None = None
    activation_gib: float | None = None
    cuda_graph_gib: float | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None
    max_num_batched_tokens: int | None = None
    forced_block_size: int | None = None
    padding_layers: int | None = None
    kv_cache_dtype: str | None = None
    model: str | None = None

    def implied_block_size(self) -> int | None:
        """Tokens per block: the size vLLM forced, or tokens / blocks when both are logged."""
        if self.forced_block_size:
            return self.forced_block_size
        if self.gpu_blocks and self.kv_cache_tokens and self.kv_cache_tokens % self.gpu_blocks == 0:
            return self.kv_cache_tokens // self.gpu_blocks
        return None

    @property
    def profiled_gib(self) -> float | None:
        """What the profile measured beside the weights (activation peak, non-torch memory
        and the CUDA graph estimate), when the log prints its parts."""
        parts = [self.non_torch_gib, self.activation_gib]
        if any(p is None for p in parts):
            return None
        return sum(p for p in (*parts, self.cuda_graph_gib) if p is not None)


def _number(name: str, token: str) -> int | float:
    """One logged number ("27,901", "53.52"), or LogError naming what the log calls it."""
    label = _PATTERNS[name][0]
    text = token.rstrip(",.")  # "27283, # CPU blocks", "53.29GiB."
    whole, dot, decimals = text.partition(".")
    readable = _GROUPED.fullmatch(whole) and (not dot or (
        name not in _INTS and _DECIMALS.fullmatch(dot + decimals)))
    shown = token if len(token) <= 30 else token[:30] + "…"
    if not readable:
        raise LogError(f"'{label}' reads {shown!r}, which is not a number an engine logs")
    value: int | float = int(whole.replace(",", "")) if name in _INTS else float(
        whole.replace(",", "") + dot + decimals)
    low, high = _INTS.get(name) or _FLOATS.get(name) or (0.0, MAX_GIB)
    if not low <= value <= high:
        raise LogError(f"'{label}' reads {shown}, outside what an engine logs ({low:,} to "
                       f"{high:,})")
    return value


def parse_startup_log(text: str) -> StartupLog:
    if len(text) > MAX_LOG_BYTES:
        raise LogError(f"the log is larger than {MAX_LOG_BYTES >> 20} MiB: paste the lines "
                       "around 'GPU blocks' / 'KV cache' only")
    found: dict[str, object] = {}
    for name, (_, patterns) in _PATTERNS.items():
        matches = [(m.start(), m.group(1)) for p in patterns for m in re.finditer(p, text)]
        if matches:
            found[name] = _number(name, max(matches)[1])
    if not {"gpu_blocks", "kv_cache_tokens", "max_concurrency", "kv_memory_gib"} & set(found):
        raise LogError("no KV-cache lines found: look for '# GPU blocks', 'GPU KV cache size', "
                       "'Available KV cache memory' or 'Maximum concurrency' in the engine's "
                       "startup output")
    for name, pattern in _TEXT_PATTERNS.items():
        matches = re.findall(pattern, text)
        if matches:
            found[name] = matches[-1]
    return StartupLog(**found)  # type: ignore[arg-type]
