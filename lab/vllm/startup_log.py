"""The KV-cache lines of a vLLM startup log, to set beside the lab's capacity sheet.

vLLM reports how much memory it kept for the KV cache and what that means in blocks, tokens and
concurrent requests. Older engines print the number of GPU (and CPU swap) blocks; newer ones the
KV cache size in tokens and the maximum concurrency at the model's context length. Numbers may
carry thousands separators. Lines that are not about the KV cache are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LOG_BYTES = 2 << 20  # 2 MiB

_PATTERNS = {
    "gpu_blocks": r"#\s*GPU blocks:\s*([\d,]+)",
    "cpu_blocks": r"#\s*CPU blocks:\s*([\d,]+)",
    "kv_cache_tokens": r"GPU KV cache size:\s*([\d,]+)\s*tokens",
    "concurrency_tokens": r"Maximum concurrency for\s*([\d,]+)\s*tokens per request",
    "max_concurrency": r"Maximum concurrency for[^:]*:\s*([\d,.]+)\s*x",
    "kv_memory_gib": r"Available KV cache memory:\s*([\d,.]+)\s*GiB",
    "weights_gib": r"(?:model weights took|Model loading took)\s*([\d,.]+)\s*Gi?B",
}


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

    def implied_block_size(self) -> int | None:
        """Tokens per block, when the log gives both blocks and tokens."""
        if self.gpu_blocks and self.kv_cache_tokens and self.kv_cache_tokens % self.gpu_blocks == 0:
            return self.kv_cache_tokens // self.gpu_blocks
        return None


def parse_startup_log(text: str) -> StartupLog:
    if len(text) > MAX_LOG_BYTES:
        raise LogError(f"the log is larger than {MAX_LOG_BYTES >> 20} MiB: paste the lines "
                       "around 'GPU blocks' / 'KV cache' only")
    found: dict[str, float] = {}
    for name, pattern in _PATTERNS.items():
        matches = re.findall(pattern, text)
        if matches:  # the last one: a restarted engine logs again
            found[name] = float(matches[-1].replace(",", "").rstrip("."))
    if not found:
        raise LogError("no KV-cache lines found: look for '# GPU blocks', 'GPU KV cache size' "
                       "or 'Maximum concurrency' in the engine's startup output")
    ints = {"gpu_blocks", "cpu_blocks", "kv_cache_tokens", "concurrency_tokens"}
    return StartupLog(**{k: int(v) if k in ints else v for k, v in found.items()})
