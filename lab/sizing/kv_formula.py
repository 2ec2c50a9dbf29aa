"""How much KV cache a token creates: the guide's formula, right for GQA, MLA and sliding windows.

    bytes = 2 x layers x KV heads x head dim x tokens x batch x bytes per element

- GQA/MQA: the KV-head term is `num_key_value_heads`, not the attention heads.
- head_dim is the config's explicit value when it has one (Gemma: 256, not hidden / heads).
- MLA (DeepSeek-V2/V3): each layer caches one latent of kv_lora_rank + qk_rope_head_dim values
  per token, shared by all heads; there is no separate K and V, so no factor 2.
- Sliding-window layers keep at most `window` tokens; full-attention layers keep all of them.
- Tensor parallelism: each GPU holds max(1, kv_heads // tp) KV heads; the MLA latent is
  replicated on every rank.
- Quantized formats carry scales; the bytes below include them, with the assumption said.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.memory.block_table import blocks_for
from lab.sizing.model_spec import ModelSpec


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
    def vector_bytes(self) -> int:
        return self.dtype.vector_bytes(self.vector_len)

    @property
    def bytes_per_token_layer(self) -> int:
        return self.vectors_per_head * self.heads_per_gpu * self.vector_bytes

    @property
    def bytes_per_token(self) -> int:
        """Every layer stores K/V for every new token (sliding layers drop old ones later)."""
        return self.spec.num_layers * self.bytes_per_token_layer

    @property
    def num_full_layers(self) -> int:
        return self.spec.num_layers - self.spec.num_sliding_layers

    def block_bytes(self, block_size: int) -> int:
        """One block of `block_size` slots across all layers, K and V."""
        return self.bytes_per_token * block_size

    def window_tokens(self, context: int) -> int:
        """Tokens a sliding-window layer keeps at this context length."""
        return min(context, self.spec.sliding_window) if self.spec.num_sliding_layers else 0

    def full_bytes(self, context: int) -> int:
        """Full-attention layers' cache for one sequence of `context` tokens."""
        return self.num_full_layers * self.bytes_per_token_layer * context

    def sliding_bytes(self, context: int) -> int:
        """Sliding-window layers' cache for one sequence: at most `window` tokens each."""
        per_layer = self.bytes_per_token_layer * self.window_tokens(context)
        return self.spec.num_sliding_layers * per_layer

    def sequence_bytes(self, context: int) -> int:
        return self.full_bytes(context) + self.sliding_bytes(context)

    def layer_blocks(self, context: int, block_size: int) -> int:
        """Per-layer blocks one sequence occupies. A window rarely starts on a block boundary,
        so a sliding layer past its window spans ceil(window / block_size) + 1 blocks."""
        full = blocks_for(context, block_size)
        sliding = full
        if self.spec.num_sliding_layers and context > self.spec.sliding_window:
            sliding = min(full, blocks_for(self.spec.sliding_window, block_size) + 1)
        return self.num_full_layers * full + self.spec.num_sliding_layers * sliding


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
    own, so a narrow screen shows it)."""
    spec, b = layout.spec, layout.dtype
    size = _vector_tex(layout)
    if spec.is_mla:
        product = (rf"\underbrace{{1}}_{{\text{{latent}}}} \times \underbrace{{{spec.num_layers}}}"
                   rf"_{{\text{{layers}}}} \times \underbrace{{{size}}}_{{\text{{("
                   rf"{spec.kv_lora_rank} + {spec.qk_rope_head_dim}) {b.label}}}}}")
    else:
        product = (rf"\underbrace{{2}}_{{\text{{K, V}}}} \times \underbrace{{{spec.num_layers}}}"
                   rf"_{{\text{{layers}}}} \times \underbrace{{{layout.heads_per_gpu}}}"
                   r"_{\text{KV heads}}"
                   rf" \times \underbrace{{{size}}}_{{\text{{head dim {spec.head_dim}, "
                   rf"{b.label}}}}}")
    return (rf"\begin{{aligned}}&{product} \\ &= {_tex(layout.bytes_per_token)}"
            r"\ \text{B per token}\end{aligned}")


def batch_latex(layout: KVLayout, context: int, batch: int) -> str:
    """Per-token bytes x tokens x batch, full-attention and sliding-window layers apart
    (aligned lines, so long numbers stay on screen)."""
    per_layer = _tex(layout.bytes_per_token_layer)
    total = _tex(layout.sequence_bytes(context) * batch)
    full = rf"{layout.num_full_layers} \times {per_layer} \times {_tex(context)}"
    if layout.spec.num_sliding_layers:  # one line per layer kind: long numbers stay on screen
        sliding = (rf"{layout.spec.num_sliding_layers} \times {per_layer} \times "
                   rf"\min({_tex(context)}, {_tex(layout.spec.sliding_window)})")
        full = (rf"\big(\underbrace{{{full}}}_{{\text{{full layers}}}} \\ &\quad + "
                rf"\underbrace{{{sliding}}}_{{\text{{sliding layers}}}}\big)")
    return (rf"\begin{{aligned}}\text{{KV for the batch}} &= {full} \times {_tex(batch)} \\ "
            rf"&= {total}\ \text{{B}}\end{{aligned}}")


def _vector_tex(layout: KVLayout) -> str:
    """Bytes of one cached vector, written as a product (with scales when the format has them)."""
    b, n = layout.dtype, layout.vector_len
    data = rf"{n} \times {b.bits / 8:g}\,\text{{B}}"
    if not b.group_size:
        return data
    groups = -(-n // b.group_size)
    return rf"({data} + {groups} \times {b.scale_bytes}\,\text{{B}})"
