"""What a model's family changes in the guide's formula, term by term, with its numbers.

The guide gives one formula, 2 x layers x KV heads x head dim x bytes per token. Each family
served by vLLM 0.33 changes one term of it, or adds one: a learner reads which, and why. Each
`Term` names the term it touches, what vLLM does for this family, and the bytes it makes.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.sizing.kv_cache_groups import hybrid_block
from lab.sizing.kv_formula import INDEXER_QUANT_BLOCK, KVLayout
from lab.sizing.state_spec import DTYPE_NAMES


@dataclass(frozen=True)
class Term:
    term: str  # the term of the guide's formula it changes, or what it adds
    change: str  # what vLLM does, with this model's numbers
    effect: str  # the bytes it makes (or saves)


def family_terms(layout: KVLayout, context: int, block_size: int = 16,
                 prefix_caching: bool = False) -> list[Term]:
    """The terms this model's family changes, in the order the formula reads."""
    spec, out = layout.spec, []
    per_layer = layout.bytes_per_token_layer
    state = spec.state
    if state and spec.decoder_layers and spec.num_layers == spec.decoder_layers:
        out.append(Term("layers", f"each of the {spec.num_layers} layers runs attention and a "
                        f"{state.label} mixer side by side: every one keeps KV and a state",
                        "the KV terms as the guide gives them"))
    elif state:
        out.append(Term("layers", f"{spec.num_layers} of the {spec.decoder_layers} decoder "
                        f"layers attend; the other {state.num_layers} are {state.label} "
                        "layers, which keep no KV", f"{state.num_layers} × {per_layer:,} B "
                        "per token not spent"))
    elif spec.decoder_layers and spec.decoder_layers != spec.num_layers:
        out.append(Term("layers", f"{spec.num_layers} of the {spec.decoder_layers} decoder "
                        "layers attend; the others hold no cache", ""))
    if spec.num_kv_shared_layers:
        out.append(Term("layers", f"the last {spec.num_kv_shared_layers} of {spec.num_layers} "
                        "layers read the KV of an earlier layer of their kind and allocate "
                        f"none: layers = {layout.kv_layers}",
                        f"{spec.num_kv_shared_layers} × {per_layer:,} B per token not spent"))
    out += _head_terms(layout)
    if spec.attention_sinks:
        heads = spec.num_attention_heads * spec.num_layers
        out.append(Term("(none)", "attention sinks: one learned logit per head and layer "
                        f"({spec.num_attention_heads} × {spec.num_layers} = {heads:,}), kept "
                        "in the weights and added to each softmax", "0 B of KV"))
    out += _token_terms(layout, context)
    if state:
        out += _state_terms(layout, block_size, prefix_caching)
    return out


def _head_terms(layout: KVLayout) -> list[Term]:
    spec, out = layout.spec, []
    if spec.model_type == "minicpm3":
        out.append(Term("KV heads × head dim", "the config has MLA's kv_lora_rank, but vLLM's "
                        f"MiniCPM3 attention caches K and V for all {spec.num_kv_heads} heads, "
                        f"each {spec.head_dim} wide (the query's width; V padded to it)",
                        f"{layout.bytes_per_token_layer:,} B per token and layer"))
    if spec.is_mla:
        out.append(Term("2 × KV heads × head dim", "MLA: one latent of "
                        f"{spec.kv_lora_rank} + {spec.qk_rope_head_dim} values per token, "
                        "shared by every head: no factor 2, one 'head'",
                        f"{layout.bytes_per_token_layer:,} B per token and layer"))
    if layout.sparse_mla_fp8:
        rank = spec.kv_lora_rank
        out.append(Term("bytes per value", "fp8 on DeepSeek-V3.2 is fp8_ds_mla: the latent in "
                        f"fp8 with one fp32 scale per {INDEXER_QUANT_BLOCK} values, the RoPE "
                        "key in bf16", f"{rank} + {rank // INDEXER_QUANT_BLOCK} × 4 + "
                        f"{spec.qk_rope_head_dim} × 2 = {layout.vector_bytes} B"))
    if idx := layout.indexer_bytes_per_token_layer:
        out.append(Term("+ per token", f"the sparse-attention indexer keeps a "
                        f"{spec.index_head_dim}-value fp8 key and its fp32 scale per token in "
                        "every layer, whatever the KV dtype",
                        f"+ {layout.kv_layers} × {idx} B = "
                        f"{layout.kv_layers * idx:,} B per token"))
    return out


def _token_terms(layout: KVLayout, context: int) -> list[Term]:
    """The windowed layers' term: the tokens they keep."""
    spec, out, per_layer = layout.spec, [], layout.bytes_per_token_layer
    kinds = [(spec.num_sliding_layers, spec.sliding_window, layout.window_tokens(context),
              layout.sliding_bytes(context), "sliding-window layers keep the last {:,} tokens"),
             (spec.num_chunked_layers, spec.attention_chunk_size, layout.chunk_tokens(context),
              layout.chunked_bytes(context), "chunked local layers attend within {:,}-token "
              "chunks and keep at most one")]
    for layers, limit, kept, size, what in kinds:
        if layers:
            out.append(Term("tokens", f"{layers} {what.format(limit)}: min({context:,}, "
                            f"{limit:,}) = {kept:,}",
                            f"{layers} × {per_layer:,} B × {kept:,} = {size:,} B"))
    return out


def _state_terms(layout: KVLayout, block_size: int, prefix_caching: bool) -> list[Term]:
    state, tp = layout.spec.state, layout.tp
    conv, ssm = state.shapes(tp)
    conv_t, ssm_t = DTYPE_NAMES[state.conv_bytes], DTYPE_NAMES[state.ssm_bytes]
    out = [Term("+ per sequence", f"each {state.label} layer keeps a conv state "
                f"{' × '.join(map(str, conv))} ({conv_t}) and a recurrent state "
                f"{' × '.join(map(str, ssm))} ({ssm_t}), the same at any length",
                f"{state.num_layers} × {state.page_bytes(tp):,} B = "
                f"{layout.state_bytes:,} B per sequence")]
    hybrid = hybrid_block(layout, block_size, prefix_caching)
    if hybrid and hybrid.raised:
        out.append(Term("block size", f"an attention page must hold one state page: vLLM "
                        f"raises the block size from {block_size} to {hybrid.block_size} "
                        f"tokens and pads each state page by {hybrid.padding_pct:.2f}%",
                        f"pages of {hybrid.attention_page:,} B"))
    return out


def terms_markdown(terms: list[Term]) -> str:
    """The terms as a markdown table: the term, what vLLM does, the bytes."""
    rows = ["| term of the formula | what vLLM does for this model | bytes |",
            "| --- | --- | --- |"]
    rows += [f"| {t.term} | {t.change} | {t.effect} |".replace("*", r"\*") for t in terms]
    return "\n".join(rows)


def question_shape(layout: KVLayout) -> str:
    """Everything the bytes-per-token question needs, in words."""
    spec = layout.spec
    layers = f"{layout.kv_layers} layers holding KV"
    if layout.kv_layers != (spec.decoder_layers or spec.num_layers):
        layers += f" (of {spec.decoder_layers or spec.num_layers})"
    if spec.is_mla:
        shape = f"{layers}, one latent of {layout.vector_len} values per token"
    else:
        shape = (f"{layers}, {layout.heads_per_gpu} KV heads"
                 f"{f' per GPU of {layout.tp}' if layout.tp > 1 else ''}, "
                 f"head dim {spec.head_dim}")
    if layout.indexer_bytes_per_token_layer:
        shape += (f", and an indexer key of {layout.indexer_bytes_per_token_layer} B per "
                  "token and layer")
    return shape


def question_explanation(layout: KVLayout) -> str:
    """The worked answer: the guide's product with this model's terms."""
    spec, b = layout.spec, layout.dtype
    text = (f"{layout.vectors_per_head} ({'one latent' if spec.is_mla else 'K and V'}) × "
            f"{layout.kv_layers} layers × {layout.heads_per_gpu} "
            f"{'latent' if spec.is_mla else 'KV head(s)'} × {layout.vector_bytes:,} B per "
            f"vector ({layout.vector_len} values, {b.label})")
    if idx := layout.indexer_bytes_per_token_layer:
        text += f" + {layout.kv_layers} × {idx} B of indexer keys"
    return f"{text} = {layout.bytes_per_token:,} B."


def tensor_parallel_notes(layout: KVLayout) -> list[tuple[str, str]]:
    """("info" or "warning", text): how tensor parallelism splits this model's cache."""
    spec, tp, out = layout.spec, layout.tp, []
    if tp == 1:
        return out
    if spec.is_mla:
        out.append(("info", f"Tensor parallel {tp}: MLA's latent is replicated, so every GPU "
                            "holds all of it."))
    elif tp > spec.num_kv_heads:
        out.append(("info", f"Tensor parallel {tp} > {spec.num_kv_heads} KV heads: each GPU "
                            f"holds max(1, {spec.num_kv_heads} // {tp}) = 1 KV head; heads "
                            "are replicated."))
    else:
        out.append(("info", f"Tensor parallel {tp}: each GPU holds {spec.num_kv_heads} // {tp} "
                            f"= {layout.heads_per_gpu} KV heads. All sizes below are per GPU."))
    if not spec.is_mla and max(tp, spec.num_kv_heads) % min(tp, spec.num_kv_heads):
        out.append(("warning", f"{spec.num_kv_heads} KV heads do not split evenly over {tp} "
                               "GPUs; vLLM refuses such a split."))
    if spec.state and not spec.state.splits_evenly(tp):
        out.append(("warning", f"The {spec.state.label} layers' widths do not split evenly "
                               f"over {tp} GPUs; vLLM refuses such a split."))
    elif spec.state:
        out.append(("info", f"Each GPU keeps 1/{tp} of every {spec.state.label} state "
                            f"({spec.state.page_bytes(tp):,} B per layer and sequence)."))
    return out
