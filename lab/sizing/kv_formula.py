"""How much KV cache a token creates: the guide's formula, and what each architecture changes.

    bytes = 2 x layers x KV heads x head dim x tokens x batch x bytes per element

- GQA/MQA: the KV-head term is `num_key_value_heads`, not the attention heads.
- head_dim is the config's explicit value when it has one (Gemma: 256, not hidden / heads).
- MLA (DeepSeek-V2/V3): each layer caches one latent of kv_lora_rank + qk_rope_head_dim values
  per token, shared by all heads; there is no separate K and V, so no factor 2. DeepSeek-V3.2
  adds its indexer's key cache per layer and token; in fp8 vLLM stores the latent as
  fp8_ds_mla (656 bytes).
- "layers" counts the attention layers that hold KV: not the recurrent layers of a Mamba
  hybrid, and not the layers that read another layer's KV (Gemma-3n).
- Sliding-window layers keep at most `window` tokens, chunked local layers (Llama 4) at most
  one chunk; full-attention layers keep all of them.
- Recurrent layers (Mamba, Gated DeltaNet) keep a state per sequence, not per token
  (`lab.sizing.state_spec`); it is counted per sequence, apart from the bytes per token.
- Tensor parallelism: each GPU holds max(1, kv_heads // tp) KV heads; the MLA latent is
  replicated on every rank.
- Quantized formats carry scales; the bytes below include them, with the assumption said.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.memory.block_table import blocks_for
from lab.sizing.model_spec import ModelSpec

INDEXER_QUANT_BLOCK = 128  # values per fp32 scale in DeepSeek-V3.2's fp8 caches


@dataclass(frozen=True)
class KVDtype:
    key: str
    label: str
    bits: int
    group_size: int = 0  # values sharing one set of scale bytes; 0 = no per-group scales
    scale_bytes: int = 0  # bytes of scale (and zero point) stored per group
    assumption: str = ""

    def vector_bytes(self, length: int) -> int:
        """Bytes to store one cached vector of `length` values, scales included."""
        data = (length * self.bits + 7) // 8
        groups = -(-length // self.group_size) if self.group_size else 0
        return data + groups * self.scale_bytes


KV_DTYPES: dict[str, KVDtype] = {
    d.key: d
    for d in (
        KVDtype("fp32", "fp32", 32, assumption="4 bytes per value, no scales."),
        KVDtype("fp16", "fp16 / bf16", 16, assumption="2 bytes per value, no scales."),
        KVDtype("fp8", "fp8 (e4m3)", 8, assumption="1 byte per value; one scale per tensor for "
                "K and one for V (vLLM's k_scale / v_scale), so no per-token overhead."),
        KVDtype("int8", "int8 + scales", 8, group_size=64, scale_bytes=2,
                assumption="1 byte per value plus one fp16 scale per group of 64 values of "
                "each head vector (+3.1 % at head_dim 128)."),
        KVDtype("int4", "int4 + scales", 4, group_size=64, scale_bytes=4,
                assumption="half a byte per value plus one fp16 scale and one fp16 zero point "
                "per group of 64 values of each head vector (+12.5 % at head_dim 128)."),
    )
}


@dataclass(frozen=True)
class KVLayout:
    """The cache geometry of one model on one GPU of a tensor-parallel group."""

    spec: ModelSpec
    dtype: KVDtype
    tp: int = 1

    @property
    def vectors_per_head(self) -> int:
        """2 for a K and a V vector; 1 for MLA's single latent."""
        return 1 if self.spec.is_mla else 2

    @property
    def heads_per_gpu(self) -> int:
        if self.spec.is_mla:
            return 1  # one latent "head", replicated on every rank
        return max(1, self.spec.num_kv_heads // self.tp)

    @property
    def vector_len(self) -> int:
        if self.spec.is_mla:
            return self.spec.kv_lora_rank + self.spec.qk_rope_head_dim
        return self.spec.head_dim

    @property
    def sparse_mla_fp8(self) -> bool:
        """DeepSeek-V3.2 in fp8: vLLM stores its latent as fp8_ds_mla (DeepseekV32ForCausalLM
        turns kv_cache_dtype fp8 into it)."""
        return bool(self.spec.index_head_dim) and self.dtype.key == "fp8"

    @property
    def vector_bytes(self) -> int:
        if self.sparse_mla_fp8:
            # the latent in fp8 with one fp32 scale per 128 values; the RoPE key stays 16-bit
            rank = self.spec.kv_lora_rank
            return rank + rank // INDEXER_QUANT_BLOCK * 4 + self.spec.qk_rope_head_dim * 2
        return self.dtype.vector_bytes(self.vector_len)

    @property
    def bytes_per_token_layer(self) -> int:
        return self.vectors_per_head * self.heads_per_gpu * self.vector_bytes

    @property
    def kv_layers(self) -> int:
        """Attention layers that hold KV (layers reading another layer's KV hold none)."""
        return self.spec.num_layers - self.spec.num_kv_shared_layers

    @property
    def indexer_bytes_per_token_layer(self) -> int:
        """DeepSeek-V3.2's indexer key: index_head_dim fp8 values and one fp32 scale per 128
        (DeepseekV32IndexerCache, uint8), whatever the KV dtype; 0 without an indexer."""
        dim = self.spec.index_head_dim
        return dim + dim // INDEXER_QUANT_BLOCK * 4 if dim else 0

    @property
    def bytes_per_token(self) -> int:
        """Every KV-holding layer stores K/V for every new token (windowed layers drop old ones
        later), and every MLA layer's indexer its key."""
        return self.kv_layers * (self.bytes_per_token_layer + self.indexer_bytes_per_token_layer)

    @property
    def num_full_layers(self) -> int:
        return self.kv_layers - self.spec.num_sliding_layers - self.spec.num_chunked_layers

    def block_bytes(self, block_size: int) -> int:
        """One block of `block_size` slots across all layers, K and V."""
        return self.bytes_per_token * block_size

    def window_tokens(self, context: int) -> int:
        """Tokens a sliding-window layer keeps at this context length."""
        return min(context, self.spec.sliding_window) if self.spec.num_sliding_layers else 0

    def chunk_tokens(self, context: int) -> int:
        """Tokens a chunked local layer keeps: at most one chunk."""
        return min(context, self.spec.attention_chunk_size) if self.spec.num_chunked_layers \
            else 0

    def full_bytes(self, context: int) -> int:
        """Full-attention layers' cache for one sequence of `context` tokens (with the indexer's
        keys, which every MLA layer keeps for every token)."""
        per_token = self.bytes_per_token_layer + self.indexer_bytes_per_token_layer
        return self.num_full_layers * per_token * context

    def sliding_bytes(self, context: int) -> int:
        """Sliding-window layers' cache for one sequence: at most `window` tokens each."""
        per_layer = self.bytes_per_token_layer * self.window_tokens(context)
        return self.spec.num_sliding_layers * per_layer

    def chunked_bytes(self, context: int) -> int:
        """Chunked local layers' cache for one sequence: at most one chunk each."""
        return self.spec.num_chunked_layers * self.bytes_per_token_layer * \
            self.chunk_tokens(context)

    @property
    def state_bytes(self) -> int:
        """The recurrent layers' state for one sequence, whatever its length."""
        return self.spec.state.sequence_bytes(self.tp) if self.spec.state else 0

    def kv_bytes(self, context: int) -> int:
        """The attention layers' cache for one sequence."""
        return self.full_bytes(context) + self.sliding_bytes(context) + \
            self.chunked_bytes(context)

    def sequence_bytes(self, context: int) -> int:
        """Everything one sequence keeps: its KV and its recurrent state."""
        return self.kv_bytes(context) + self.state_bytes

    def layer_blocks(self, context: int, block_size: int) -> int:
        """Per-layer blocks one sequence occupies. A window rarely starts on a block boundary,
        so a sliding layer past its window spans ceil(window / block_size) + 1 blocks; a
        chunked layer spans the blocks from its chunk's start (a multiple of the chunk)."""
        full = blocks_for(context, block_size)
        sliding = chunked = full
        if self.spec.num_sliding_layers and context > self.spec.sliding_window:
            sliding = min(full, blocks_for(self.spec.sliding_window, block_size) + 1)
        if self.spec.num_chunked_layers:
            start = (context - 1) // self.spec.attention_chunk_size * \
                self.spec.attention_chunk_size
            chunked = full - start // block_size
        return (self.num_full_layers * full + self.spec.num_sliding_layers * sliding
                + self.spec.num_chunked_layers * chunked)


def kv_layout(spec: ModelSpec, dtype: str | KVDtype = "fp16", tp: int = 1) -> KVLayout:
    if tp < 1:
        raise ValueError(f"tensor-parallel degree must be at least 1, got {tp}")
    return KVLayout(spec, KV_DTYPES[dtype] if isinstance(dtype, str) else dtype, tp)


def format_bytes(n: float) -> str:
    """Binary units first (what allocators and nvidia-smi count), decimal in brackets."""
    if n < 1024:
        return f"{n:,.0f} B"
    for power, (binary, decimal) in enumerate(
        (("KiB", "kB"), ("MiB", "MB"), ("GiB", "GB"), ("TiB", "TB"), ("PiB", "PB")), start=1
    ):
        if n < 1024 ** (power + 1) or binary == "PiB":
            return f"{n / 1024**power:,.2f} {binary} ({n / 1000**power:,.2f} {decimal})"
    raise AssertionError("unreachable")


def _tex(n: int) -> str:
    return f"{n:,}".replace(",", "{,}")


def per_token_latex(layout: KVLayout) -> str:
    """The per-token formula with this model's numbers substituted (the result on a line of its
    own, so a narrow screen shows it). "layers" are the layers holding KV; DeepSeek-V3.2's
    indexer adds its own term."""
    spec, b = layout.spec, layout.dtype
    size = _vector_tex(layout)
    layers = layout.kv_layers
    if spec.is_mla:
        label = "fp8_ds_mla" if layout.sparse_mla_fp8 else b.label
        product = (rf"\underbrace{{1}}_{{\text{{latent}}}} \times \underbrace{{{layers}}}"
                   rf"_{{\text{{layers}}}} \times \underbrace{{{size}}}_{{\text{{("
                   rf"{spec.kv_lora_rank} + {spec.qk_rope_head_dim}) {label}}}}}")
    else:
        product = (rf"\underbrace{{2}}_{{\text{{K, V}}}} \times \underbrace{{{layers}}}"
                   rf"_{{\text{{layers}}}} \times \underbrace{{{layout.heads_per_gpu}}}"
                   r"_{\text{KV heads}}"
                   rf" \times \underbrace{{{size}}}_{{\text{{head dim {spec.head_dim}, "
                   rf"{b.label}}}}}")
    if layout.indexer_bytes_per_token_layer:
        product += (rf" \\ &\quad + \underbrace{{{layers} \times "
                    rf"{layout.indexer_bytes_per_token_layer}\,\text{{B}}}}"
                    r"_{\text{indexer key, fp8 + scale}}")
    return (rf"\begin{{aligned}}&{product} \\ &= {_tex(layout.bytes_per_token)}"
            r"\ \text{B per token}\end{aligned}")


def batch_latex(layout: KVLayout, context: int, batch: int) -> str:
    """Per-token bytes x tokens x batch, one line per layer kind (aligned lines, so long
    numbers stay on screen); a recurrent state adds its bytes per sequence."""
    spec, t = layout.spec, _tex(context)
    per_layer = _tex(layout.bytes_per_token_layer)
    per_full = per_layer if not layout.indexer_bytes_per_token_layer else (
        rf"({per_layer} + {layout.indexer_bytes_per_token_layer})")
    terms = [(rf"{layout.num_full_layers} \times {per_full} \times {t}", "full layers")]
    if spec.num_sliding_layers:
        terms.append((rf"{spec.num_sliding_layers} \times {per_layer} \times "
                       rf"\min({t}, {_tex(spec.sliding_window)})", "sliding layers"))
    if spec.num_chunked_layers:
        terms.append((rf"{spec.num_chunked_layers} \times {per_layer} \times "
                       rf"\min({t}, {_tex(spec.attention_chunk_size)})", "chunked layers"))
    if not layout.num_full_layers and len(terms) > 1:
        terms.pop(0)
    state = spec.state
    if state:
        terms.append((rf"{state.num_layers} \times {_tex(state.page_bytes(layout.tp))}",
                      f"{state.label} state"))
    total = _tex(layout.sequence_bytes(context) * batch)
    what = r"\text{KV and state for the batch}" if state else r"\text{KV for the batch}"
    body = terms[0][0]
    if len(terms) > 1:  # one line per layer kind: long numbers stay on screen
        body = r" \\ &\quad + ".join(rf"\underbrace{{{tex}}}_{{\text{{{name}}}}}"
                                     for tex, name in terms)
        body = rf"\big({body}\big)"
    return (rf"\begin{{aligned}}{what} &= {body} \times {_tex(batch)} \\ "
            rf"&= {total}\ \text{{B}}\end{{aligned}}")


def _vector_tex(layout: KVLayout) -> str:
    """Bytes of one cached vector, written as a product (with scales when the format has them)."""
    b, n = layout.dtype, layout.vector_len
    if layout.sparse_mla_fp8:
        rank, rope = layout.spec.kv_lora_rank, layout.spec.qk_rope_head_dim
        return (rf"({rank} + {rank // INDEXER_QUANT_BLOCK} \times 4 + {rope} \times 2)"
                r"\,\text{B}")
    data = rf"{n} \times {b.bits / 8:g}\,\text{{B}}"
    if not b.group_size:
        return data
    groups = -(-n // b.group_size)
    return rf"({data} + {groups} \times {b.scale_bytes}\,\text{{B}})"
