"""The KV-cache lines of a vLLM startup log, to set beside the lab's capacity sheet.

vLLM reports how much memory it kept for the KV cache and what that means in blocks, tokens and
concurrent requests, and before that what it is running: the engine config line (max_seq_len,
tensor_parallel_size, kv_cache_dtype), the token budget, the weights it loaded and, in v0 and
early v1 logs, the profile (total_gpu_memory, non-torch memory, activation peak). The wording
moved between versions, so each number has a pattern per wording; numbers may carry thousands
separators. Lines that are not about memory or the KV cache are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LOG_BYTES = 2 << 20  # 2 MiB
_INT = r"(\d[\d,]{0,24})"  # bounded: a pasted log may hold anything
_NUM = r"(\d[\d,]{0,24}(?:\.\d{1,12})?)"
# field -> patterns (the last match of any wins: a restarted engine logs again).
_PATTERNS: dict[str, tuple[str, ...]] = {
    "gpu_blocks": (r"#\s*GPU blocks:\s*" + _INT, r"num_gpu_blocks=" + _INT,
                   r"num_gpu_blocks is:\s*" + _INT),  # v1: "... after num_gpu_blocks is: N"
    "cpu_blocks": (r"#\s*CPU blocks:\s*" + _INT,),
    "kv_cache_tokens": (r"GPU KV cache size:\s*" + _INT + r"\s*tokens",),
    "concurrency_tokens": (r"Maximum concurrency for\s*" + _INT + r"\s*tokens per request",),
    "max_concurrency": (r"Maximum concurrency for[^:]*:\s*" + _NUM + r"\s*x",),
    "kv_memory_gib": (r"Available KV cache memory:\s*" + _NUM + r"\s*GiB",
                      r"available_kv_cache_memory\s*=?\s*" + _NUM + r"\s*GiB",
                      r"reserved for KV Cache is\s*" + _NUM + r"\s*GiB",
                      r"kv_cache_size=" + _NUM + r"\s*GiB"),
    "weights_gib": (r"(?:model weights took|Model loading took)\s*" + _NUM + r"\s*Gi?B",
                    r"model weights take\s*" + _NUM + r"\s*GiB"),
    "total_gpu_gib": (r"total_gpu_memory\s*[=(]?\s*" + _NUM + r"\s*GiB",),
    "utilization": (r"gpu_memory_utilization\s*[=(]?\s*(0?\.\d+|1(?:\.0+)?)\b",
                    r"current --gpu-memory-utilization=(0?\.\d+|1(?:\.0+)?)"),
    "non_torch_gib": (r"non_torch_memory\s*(?:takes|=)?\s*" + _NUM + r"\s*GiB",),
    "activation_gib": (r"activation peak memory\s*(?:takes)?\s*" + _NUM + r"\s*GiB",),
    "cuda_graph_gib": (r"Estimated CUDA graph memory:\s*" + _NUM + r"\s*GiB",),
    "max_model_len": (r"max_seq_len=" + _INT,),
    "tensor_parallel_size": (r"tensor_parallel_size=(\d{1,6})",),
    "max_num_batched_tokens": (r"max_num_batched_tokens=" + _INT,),
    "forced_block_size": (r"Forcing kv cache block size to (\d{1,6})",),
    "padding_layers": (r"Add (\d{1,6}) padding layers",),
}
_TEXT_PATTERNS = {"kv_cache_dtype": r"kv_cache_dtype=([\w.]+)", "model": r"\bmodel='([^']{1,200})'"}
_INTS = {"gpu_blocks", "cpu_blocks", "kv_cache_tokens", "concurrency_tokens", "max_model_len",
         "tensor_parallel_size", "max_num_batched_tokens", "forced_block_size",
         "padding_layers"}


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


def parse_startup_log(text: str) -> StartupLog:
    if len(text) > MAX_LOG_BYTES:
        raise LogError(f"the log is larger than {MAX_LOG_BYTES >> 20} MiB: paste the lines "
                       "around 'GPU blocks' / 'KV cache' only")
    found: dict[str, object] = {}
    for name, patterns in _PATTERNS.items():
        matches = [(m.start(), m.group(1)) for p in patterns for m in re.finditer(p, text)]
        if matches:
            raw = max(matches)[1].replace(",", "").rstrip(".")
            found[name] = int(raw) if name in _INTS else float(raw)
    if not {"gpu_blocks", "kv_cache_tokens", "max_concurrency", "kv_memory_gib"} & set(found):
        raise LogError("no KV-cache lines found: look for '# GPU blocks', 'GPU KV cache size', "
                       "'Available KV cache memory' or 'Maximum concurrency' in the engine's "
                       "startup output")
    for name, pattern in _TEXT_PATTERNS.items():
        matches = re.findall(pattern, text)
        if matches:
            found[name] = matches[-1]
    return StartupLog(**found)  # type: ignore[arg-type]
