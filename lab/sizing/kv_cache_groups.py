"""How vLLM splits a model's layers into KV cache groups over one pool, and the block size it
picks for a Mamba hybrid (vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py).

Each layer gets a KVCacheSpec; layers of one spec type share a block table (a group):
- FullAttentionSpec / MLAAttentionSpec: cdiv(max_model_len, block_size) pages per request;
- SlidingWindowSpec: cdiv(min(window - 1 + max_num_batched_tokens, max_model_len),
  block_size) + 1 (the window rarely starts on a block boundary);
- ChunkedLocalAttentionSpec: cdiv(min(chunk + max_num_batched_tokens, max_model_len),
  block_size);
- MambaSpec: one state page per request with prefix caching off (mamba_cache_mode "none"), two
  in "align" mode, one per block of max_model_len in "all" mode.
One type: one group of every layer. Several: the page sizes are unified, and the layers are cut
into groups of an equal size (_get_kv_cache_groups_uniform_page_size): the smaller layer count,
or the larger when it is under 1.5x the smaller; the last group of a type is padded. Layers of
one type with different page sizes (DeepSeek-V3.2's MLA and indexer layers) form one group
instead (UniformTypeKVCacheSpecs), each layer with its own tensor.

A Mamba hybrid needs an attention page that holds a state page: vLLM raises the attention
block size to kernel_alignment x cdiv(state page, kernel_alignment x attention bytes per
token) (16 for the FlashAttention and FlashInfer kernels, 64 for MLA's), or, in "all" mode, to
a multiple of lcm(the model's mamba chunk size, that alignment); then it pads the state page up
to the attention page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lab.sizing.kv_formula import KVLayout
from lab.sizing.state_spec import STATE_KINDS

FULL, MLA, SLIDING, CHUNKED = "full attention", "MLA", "sliding window", "chunked local"
STATE_LABELS = frozenset(STATE_KINDS.values())
HYBRID_GROUP_RATIO = 1.5  # _get_kv_cache_groups_uniform_page_size's "not much larger" test
KERNEL_ALIGNMENT = 16  # the attention kernels' block-size multiple (FlashAttention, FlashInfer)
MLA_KERNEL_ALIGNMENT = 64  # the MLA kernels' (FlashMLA)
MAMBA_DEFAULT_CHUNK = 2048  # ModelConfig.get_mamba_chunk_size when the config names none


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers sharing one block table (KVCacheGroupSpec)."""

    kind: str  # FULL, MLA, SLIDING, CHUNKED or a recurrent state's label
    num_layers: int  # real layers; the group's other slots are padding
    pages_per_request: int  # max_memory_usage_bytes / page_size at max_model_len
    limit: int = 0  # the window or the chunk, in tokens


def mamba_cache_mode(layout: KVLayout, prefix_caching: bool) -> str:
    """CacheConfig.mamba_cache_mode as MambaModelConfig sets it: "none" without prefix caching,
    with it "all" for models that cache a state per block, "align" for the others."""
    state = layout.spec.state
    if state is None or not prefix_caching:
        return "none"
    return "all" if state.prefix_caching_all else "align"


def pages_per_request(kind: str, limit: int, max_model_len: int, block_size: int,
                      max_num_batched_tokens: int, mode: str = "none") -> int:
    """Pages of one layer for one request (the spec's max_memory_usage_bytes / page size)."""
    if kind == SLIDING:
        tokens = min(limit - 1 + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, block_size) + 1
    if kind == CHUNKED:
        return cdiv(min(limit + max_num_batched_tokens, max_model_len), block_size)
    if kind in STATE_LABELS and mode != "all":
        return 2 if mode == "align" else 1
    return cdiv(max_model_len, block_size)


def layer_types(layout: KVLayout) -> list[tuple[str, int, int]]:
    """(kind, layers, window or chunk) of each KV cache spec type the model has."""
    spec = layout.spec
    kinds = [(MLA if spec.is_mla else FULL, layout.num_full_layers, 0),
             (SLIDING, spec.num_sliding_layers, spec.sliding_window),
             (CHUNKED, spec.num_chunked_layers, spec.attention_chunk_size)]
    if spec.state:
        kinds.append((spec.state.label, spec.state.num_layers, 0))
    return [k for k in kinds if k[1]]


def kv_cache_groups(layout: KVLayout, block_size: int, max_model_len: int,
                    max_num_batched_tokens: int, mode: str = "none",
                    ) -> tuple[tuple[KVCacheGroup, ...], int]:
    """(groups, group_size) as get_kv_cache_groups forms them for this model."""
    kinds = layer_types(layout)
    counts = [n for _, n, _ in kinds]
    if len(kinds) == 1:  # one spec type (or one type of differing pages): every layer together
        group_size = counts[0]
    else:
        group_size = min(counts)
        if max(counts) < min(counts) * HYBRID_GROUP_RATIO:
            group_size = max(counts)
    groups = []
    for kind, n, limit in kinds:
        pages = pages_per_request(kind, limit, max_model_len, block_size,
                                  max_num_batched_tokens, mode)
        num_groups = cdiv(n, group_size)  # layers[i::num_groups] go to the i-th group
        groups += [KVCacheGroup(kind, len(range(i, n, num_groups)), pages, limit)
                   for i in range(num_groups)]
    return tuple(groups), group_size


@dataclass(frozen=True)
class HybridBlock:
    """The attention block size vLLM picks for a Mamba hybrid, and the state page's padding."""

    block_size: int
    asked: int  # the block size asked for (CacheConfig.block_size)
    state_page: int  # one layer's state for one request, unpadded
    attention_page: int  # one attention layer's block: the page every layer gets
    mode: str  # mamba_cache_mode

    @property
    def raised(self) -> bool:
        return self.block_size != self.asked

    @property
    def padding_pct(self) -> float:
        return 100 * (self.attention_page - self.state_page) / self.state_page

    def log_lines(self) -> list[str]:
        """What vLLM logs when it sets these (Platform._align_hybrid_block_size)."""
        lines = []
        if self.raised:
            lines.append(f"Setting attention block size to {self.block_size} tokens to ensure "
                         "that attention page size is >= mamba page size.")
        if self.attention_page != self.state_page:
            lines.append(f"Padding mamba page size by {self.padding_pct:.2f}% to ensure that "
                         "mamba page size and attention page size are exactly equal.")
        return lines


def hybrid_block(layout: KVLayout, asked: int, prefix_caching: bool = False
                 ) -> HybridBlock | None:
    """The block size for a model with recurrent layers (None for an attention-only model)."""
    state = layout.spec.state
    if state is None:
        return None
    per_token = layout.bytes_per_token_layer  # FullAttentionSpec(block_size=1).page_size_bytes
    state_page = state.page_bytes(layout.tp)
    if not state_page:  # vLLM too returns here: no state to hold
        return None
    mode = mamba_cache_mode(layout, prefix_caching)
    align = MLA_KERNEL_ALIGNMENT if layout.spec.is_mla else KERNEL_ALIGNMENT
    if mode == "all":  # a multiple of the Mamba2 kernel's chunk, so cached states line up
        chunk = math.lcm(state.chunk_size or MAMBA_DEFAULT_CHUNK, align)
        needed = chunk * cdiv(cdiv(state_page, per_token), chunk)
    else:  # the smallest aligned block whose page holds one state
        needed = align * cdiv(state_page, align * per_token)
    block = needed if asked < needed else asked
    return HybridBlock(block, asked, state_page, block * per_token, mode)
