"""The capacity sheet as vLLM v1 will log it, step by step, in its own names.

1. Worker.determine_available_memory (vllm/v1/worker/gpu_worker.py): requested_memory =
   ceil(total_memory x gpu_memory_utilization) (request_memory, vllm/v1/worker/utils.py), where
   total_memory is what CUDA reports (torch.cuda.mem_get_info), then
   available = requested_memory - non_kv_cache_memory (the weights, plus the activation peak,
   non-torch memory and CUDA graphs its profile run measures) -> "Available KV cache memory".
2. Each layer gets a KVCacheSpec (vllm/v1/kv_cache_interface.py) with page_size_bytes = coef
   x block_size x kv_heads x head_size x dtype bytes (coef 2 for K and V, 1 for MLA's latent);
   a recurrent layer's page is its state (MambaSpec), padded to the attention page. Pages per
   request by spec type, and the block size of Mamba hybrids: `lab.sizing.kv_cache_groups`.
3. get_kv_cache_groups (vllm/v1/core/kv_cache_utils.py): identical layers form one group; a
   hybrid model is cut into groups of equal size (_get_kv_cache_groups_uniform_page_size): the
   size is the smaller layer count (the larger if it is under 1.5x the smaller), and the last
   group of a type is padded. DeepSeek-V3.2's MLA and indexer layers, one type with two page
   sizes, stay one group (UniformTypeKVCacheSpecs).
4. get_kv_cache_config_from_groups: group_size tensors each shared by one layer of every group;
   num_gpu_blocks = available // page_size // group_size (get_num_blocks); for the uniform-type
   group, available // the sum of every layer's page.
5. _report_kv_cache_config: "GPU KV cache size: num_blocks // groups x block_size tokens" and
   "Maximum concurrency for max_model_len tokens per request: num_blocks / blocks per request"
   (get_max_concurrency_for_kv_cache_config: one request takes every group's pages at once).
These follow vLLM's main branch of 2025 (the code read for this module; earlier versions
differ in the grouping threshold and the log's wording).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lab.sizing.kv_cache_groups import (
    KVCacheGroup,
    cdiv,
    hybrid_block,
    kv_cache_groups,
    mamba_cache_mode,
    pages_per_request,
)
from lab.sizing.kv_formula import KVLayout

__all__ = ["GIB", "KVCacheGroup", "SheetLine", "VllmSheet", "cdiv",
           "default_max_num_batched_tokens", "default_max_num_seqs", "engine_block_size", "gib",
           "kv_cache_groups", "log_lines", "sheet_lines", "vllm_sheet", "vllm_sheet_from_gpu"]

GIB = 1 << 30
DEFAULT_BLOCK_SIZE = 16  # CacheConfig.block_size on CUDA
FLASHMLA_BLOCK = 64  # CudaPlatform.check_and_update_config forces it for MLA (FlashMLA)
HYBRID_GROUP_RATIO = 1.5  # _get_kv_cache_groups_uniform_page_size's "not much larger" test
# EngineArgs.get_batch_defaults for `vllm serve`: on >= 70 GiB cards other than the A100,
# 8192 tokens and 1024 sequences a step; else 2048 and 256.
SERVE_BATCHED_TOKENS, SMALL_GPU_BATCHED_TOKENS = 8192, 2048
SERVE_MAX_SEQS, SMALL_GPU_MAX_SEQS = 1024, 256


def _big_gpu(gpu_name: str, cuda_bytes: int) -> bool:
    return cuda_bytes >= 70 * GIB and "a100" not in gpu_name.lower()


def default_max_num_batched_tokens(gpu_name: str, cuda_bytes: int) -> int:
    """What `vllm serve` picks when --max-num-batched-tokens is not given."""
    return SERVE_BATCHED_TOKENS if _big_gpu(gpu_name, cuda_bytes) else SMALL_GPU_BATCHED_TOKENS


def default_max_num_seqs(gpu_name: str, cuda_bytes: int) -> int:
    """What `vllm serve` picks when --max-num-seqs is not given."""
    return SERVE_MAX_SEQS if _big_gpu(gpu_name, cuda_bytes) else SMALL_GPU_MAX_SEQS


def engine_block_size(layout: KVLayout, block_size: int,
                      prefix_caching: bool = False) -> tuple[int, str]:
    """The block size the engine really uses, and why it differs from the one asked for."""
    hybrid = hybrid_block(layout, block_size, prefix_caching)
    if layout.spec.is_mla and block_size % FLASHMLA_BLOCK and not hybrid:
        return FLASHMLA_BLOCK, (f"MLA on a Hopper GPU runs FlashMLA, which needs block size "
                                f"{FLASHMLA_BLOCK}: vLLM logs 'Forcing kv cache block size to "
                                f"{FLASHMLA_BLOCK} for FlashMLA backend'")
    if hybrid and hybrid.raised:
        return hybrid.block_size, (
            f"a {layout.spec.state.label} state is {hybrid.state_page:,} B per layer and "
            f"request; an attention page must hold one, so vLLM raises the block size to "
            f"{hybrid.block_size} tokens ({hybrid.block_size} x "
            f"{layout.bytes_per_token_layer:,} B = {hybrid.attention_page:,} B) and pads each "
            f"state page by {hybrid.padding_pct:.2f}%")
    return block_size, ""


@dataclass(frozen=True)
class VllmSheet:
    available_kv_memory: int  # "Available KV cache memory"
    block_size: int
    page_size_bytes: int  # one block of one layer (with its indexer, DeepSeek-V3.2)
    groups: tuple[KVCacheGroup, ...]
    group_size: int  # layers per group = KV-cache tensors
    max_model_len: int
    max_num_batched_tokens: int
    total_memory: int = 0  # 0: the sheet started from a known available KV memory
    requested_memory: int = 0
    weights_memory: int = 0
    other_memory: int = 0  # activation peak + non-torch + CUDA graphs (an estimate here)
    mode: str = "none"  # mamba_cache_mode
    state_page_bytes: int = 0  # one recurrent layer's state, before padding; 0 = none
    indexer_page_bytes: int = 0  # the indexer's share of page_size_bytes; 0 = none
    config_logs: tuple[str, ...] = ()  # what vLLM logs while it sets the cache up

    @property
    def num_layers(self) -> int:
        return sum(g.num_layers for g in self.groups)

    @property
    def padding_layers(self) -> int:
        return len(self.groups) * self.group_size - self.num_layers

    @property
    def num_blocks(self) -> int:
        """num_gpu_blocks (get_num_blocks)."""
        return max(0, self.available_kv_memory // self.page_size_bytes // self.group_size)

    @property
    def token_block_size(self) -> int:
        """The smallest block size of any group (a state group's block is max_model_len
        without prefix caching)."""
        if self.state_page_bytes and self.mode == "none":
            return min(self.block_size, self.max_model_len)
        return self.block_size

    @property
    def num_tokens(self) -> int:
        """"GPU KV cache size: N tokens" (_report_kv_cache_config)."""
        return self.num_blocks // len(self.groups) * self.token_block_size

    @property
    def blocks_per_request(self) -> int:
        """Blocks one max_model_len request holds, every group together."""
        return sum(g.pages_per_request for g in self.groups)

    @property
    def max_concurrency(self) -> float:
        """"Maximum concurrency for max_model_len tokens per request: X"."""
        return self.num_blocks / self.blocks_per_request

    @property
    def needed_memory(self) -> int:
        """KV memory one max_model_len request needs, padding included
        (_max_memory_usage_bytes_from_groups); vLLM refuses to start below it."""
        return self.group_size * self.page_size_bytes * self.blocks_per_request

    def padding_warnings(self) -> list[str]:
        """The warning _get_kv_cache_groups_uniform_page_size logs for each spec type whose
        layers leave its last group short, in group order."""
        lines = []
        for kind in dict.fromkeys(g.kind for g in self.groups):
            layers = sum(g.num_layers for g in self.groups if g.kind == kind)
            padding = -layers % self.group_size
            if padding:
                lines.append(f"Add {padding} padding layers, may waste at most "
                             f"{padding / layers * 100:.2f}% KV cache memory")
        return lines

    @property
    def fits_one_request(self) -> bool:
        return 0 < self.available_kv_memory and self.needed_memory <= self.available_kv_memory

    def failure(self) -> str | None:
        """The error vLLM stops with for these numbers, in its words; None when it starts."""
        if self.total_memory and self.weights_memory > self.requested_memory:
            return (f"torch.OutOfMemoryError while loading the weights: "
                    f"{gib(self.weights_memory)} of them do not fit in the "
                    f"{gib(self.requested_memory)} the engine may use")
        if self.available_kv_memory <= 0:
            return ("ValueError: No available memory for the cache blocks. Try increasing "
                    "`gpu_memory_utilization` when initializing the engine.")
        if not self.fits_one_request:
            return (f"ValueError: To serve at least one request with the models's max seq len "
                    f"({self.max_model_len}), ({self.needed_memory / GIB:.2f} GiB KV cache is "
                    f"needed, which is larger than the available KV cache memory "
                    f"({self.available_kv_memory / GIB:.2f} GiB). Based on the available "
                    f"memory, the estimated maximum model length is "
                    f"{self.estimated_max_model_len()}.")
        return None

    def estimated_max_model_len(self) -> int:
        """The longest max_model_len whose one request fits (estimate_max_model_len's binary
        search); 0 when not even one token fits."""
        low, high, best = 1, self.max_model_len, 0
        while low <= high:
            mid = (low + high) // 2
            pages = sum(pages_per_request(g.kind, g.limit, mid, self.block_size,
                                          self.max_num_batched_tokens, self.mode)
                        for g in self.groups)
            if self.group_size * self.page_size_bytes * pages <= self.available_kv_memory:
                best, low = mid, mid + 1
            else:
                high = mid - 1
        return best


def vllm_sheet(layout: KVLayout, *, available_kv_memory: int, block_size: int,
               max_model_len: int, max_num_batched_tokens: int, prefix_caching: bool = False,
               **memory: int) -> VllmSheet:
    """vLLM's KV-cache configuration from the available KV memory (the memory steps that led
    to it, when known, ride along in `memory`). `block_size` is the engine's
    (`engine_block_size`); `prefix_caching` decides how many states a hybrid's request keeps."""
    if block_size < 1 or max_model_len < 1 or max_num_batched_tokens < 1:
        raise ValueError("block size, max_model_len and max_num_batched_tokens must be >= 1")
    mode = mamba_cache_mode(layout, prefix_caching)
    groups, group_size = kv_cache_groups(layout, block_size, max_model_len,
                                         max_num_batched_tokens, mode)
    indexer = layout.indexer_bytes_per_token_layer * block_size
    logs = ["Using custom fp8 kv-cache format for DeepSeekV3.2"] if layout.sparse_mla_fp8 else []
    state = 0
    if needed := hybrid_block(layout, 1, prefix_caching):
        if block_size < needed.block_size:
            raise ValueError(f"a {needed.block_size}-token attention page at least holds one "
                             f"state: block size {block_size} is too small (engine_block_size "
                             "gives the block vLLM picks)")
        hybrid = replace(hybrid_block(layout, block_size, prefix_caching),
                         asked=1 if block_size == needed.block_size else block_size)
        logs += hybrid.log_lines()
        state = hybrid.state_page
    return VllmSheet(available_kv_memory, block_size,
                     layout.bytes_per_token_layer * block_size + indexer, groups, group_size,
                     max_model_len, max_num_batched_tokens, mode=mode, state_page_bytes=state,
                     indexer_page_bytes=indexer, config_logs=tuple(logs), **memory)


def vllm_sheet_from_gpu(layout: KVLayout, *, total_memory: int, utilization: float,
                        weights_memory: int, other_memory: int, block_size: int,
                        max_model_len: int, max_num_batched_tokens: int,
                        prefix_caching: bool = False) -> VllmSheet:
    """The whole sheet, from the memory CUDA reports (Worker.determine_available_memory)."""
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    requested = math.ceil(total_memory * utilization)
    return vllm_sheet(layout, available_kv_memory=requested - weights_memory - other_memory,
                      block_size=block_size, max_model_len=max_model_len,
                      max_num_batched_tokens=max_num_batched_tokens,
                      prefix_caching=prefix_caching, total_memory=total_memory,
                      requested_memory=requested, weights_memory=weights_memory,
                      other_memory=other_memory)


@dataclass(frozen=True)
class SheetLine:
    step: str
    value: str
    source: str  # the vLLM function this line follows


def gib(n: float) -> str:
    """GiB with two decimals, as vLLM's logs print memory."""
    return f"{n / GIB:,.2f} GiB"


def sheet_lines(sheet: VllmSheet) -> list[SheetLine]:
    """The sheet's steps in vLLM's names, each with the function it follows."""
    lines = []
    if sheet.total_memory:
        lines += [
            SheetLine("total_memory (as CUDA reports it)", gib(sheet.total_memory),
                      "MemorySnapshot"),
            SheetLine("requested_memory = ceil(total_memory × gpu_memory_utilization)",
                      gib(sheet.requested_memory), "request_memory"),
            SheetLine("− model weights (\"Model loading took …\")", gib(sheet.weights_memory),
                      "GPUModelRunner.load_model"),
            SheetLine("− activation peak + non-torch + CUDA graphs (your estimate)",
                      gib(sheet.other_memory), "memory_profiling"),
        ]
    kinds = sorted({g.kind for g in sheet.groups})
    lines += [
        SheetLine("= Available KV cache memory", gib(sheet.available_kv_memory),
                  "determine_available_memory"),
        _page_line(sheet),
        SheetLine("KV-cache groups × layers per group", _groups_text(sheet, kinds),
                  "get_kv_cache_groups"),
        SheetLine("num_gpu_blocks = available // page_size // layers per group",
                  f"{sheet.num_blocks:,}", "get_num_blocks"),
        SheetLine("GPU KV cache size = blocks // groups × block_size",
                  f"{sheet.num_tokens:,} tokens", "_report_kv_cache_config"),
        SheetLine(f"blocks one {sheet.max_model_len:,}-token request holds",
                  _request_blocks(sheet),
                  "max_memory_usage_bytes"),
        SheetLine(f"Maximum concurrency for {sheet.max_model_len:,} tokens per request",
                  f"{sheet.max_concurrency:.2f}x", "get_max_concurrency_for_kv_cache_config"),
    ]
    return lines


def _page_line(sheet: VllmSheet) -> SheetLine:
    """One block of one layer: an attention layer's, which a padded state page equals, or an
    MLA layer's with its indexer's."""
    step = f"page_size_bytes (one {sheet.block_size}-token block of one layer)"
    value, source = f"{sheet.page_size_bytes:,} B", "AttentionSpec.page_size_bytes"
    if sheet.state_page_bytes:
        pad = sheet.page_size_bytes - sheet.state_page_bytes
        value += (f"; a state page is {sheet.state_page_bytes:,} B, padded by {pad:,} B "
                  f"({100 * pad / sheet.state_page_bytes:.2f}%)")
        source += ", MambaSpec.page_size_bytes"
    if sheet.indexer_page_bytes:
        latent = sheet.page_size_bytes - sheet.indexer_page_bytes
        value = (f"{latent:,} B (MLA) + {sheet.indexer_page_bytes:,} B (indexer) = "
                 f"{sheet.page_size_bytes:,} B")
        source = "MLAAttentionSpec.page_size_bytes, UniformTypeKVCacheSpecs"
    return SheetLine(step, value, source)


def _groups_text(sheet: VllmSheet, kinds: list[str]) -> str:
    """"7 × 10: 1 full attention, 6 sliding window (8 padding slots)"."""
    if len(sheet.groups) == 1:
        return f"1 group of all {sheet.group_size} layers ({kinds[0]})"
    counts = ", ".join(f"{sum(g.kind == k for g in sheet.groups)} {k}" for k in kinds)
    padding = f" ({sheet.padding_layers} padding slots)" if sheet.padding_layers else ""
    return f"{len(sheet.groups)} × {sheet.group_size}: {counts}{padding}"


def _request_blocks(sheet: VllmSheet) -> str:
    """Every group's blocks for one request, summed by kind: "1 × 512 + 6 × 513 = 3,590"."""
    if len(sheet.groups) == 1:
        return f"{sheet.blocks_per_request:,}"
    kinds: dict[tuple[str, int], int] = {}
    for g in sheet.groups:
        kinds[g.kind, g.pages_per_request] = kinds.get((g.kind, g.pages_per_request), 0) + 1
    terms = [f"{n} × {pages:,} ({kind})" for (kind, pages), n in kinds.items()]
    return " + ".join(terms) + f" = {sheet.blocks_per_request:,}"


def log_lines(sheet: VllmSheet) -> list[str]:
    """What the engine prints at start-up for this sheet (the v1 wording), up to the error it
    stops with, if any (get_kv_cache_configs checks before _report_kv_cache_config logs)."""
    failure = sheet.failure()
    if failure and failure.startswith("torch."):
        return [*sheet.config_logs, failure]
    lines = [*sheet.config_logs,
             f"Available KV cache memory: {sheet.available_kv_memory / GIB:.2f} GiB",
             *sheet.padding_warnings()]
    if failure:
        return [*lines, failure]
    return [*lines, f"GPU KV cache size: {sheet.num_tokens:,} tokens",
            f"Maximum concurrency for {sheet.max_model_len:,} tokens per request: "
            f"{sheet.max_concurrency:.2f}x"]
