"""Which layers of a model cache what, for the families whose layers are not all alike.

`layer_plan` reads a resolved config the way vLLM's model file for its family builds the
layers, and says how many attention layers there are, which of them keep a sliding window or
one chunk, which read another layer's KV, and what recurrent layers keep instead of KV:
- Llama 4 (Llama4Attention): layers with RoPE use chunked local attention of
  attention_chunk_size tokens; the NoPE layers (no_rope_layers 0, or every 4th layer by
  Llama4TextConfig's default) attend to every token.
- Gemma-3n (Gemma3nAttention): the last num_kv_shared_layers layers read the KV of the last
  earlier layer of their kind and allocate none (kv_sharing_target_layer_name).
- Qwen3-Next: every full_attention_interval-th layer is gated attention, the others Gated
  DeltaNet; Granite-4.0-H: layer_types "mamba" / "attention"; Nemotron-H: the
  hybrid_override_pattern's "M" (Mamba2) and "*" (attention), "-" and "E" being MLP and MoE
  layers with no cache; Jamba: attention where layer % attn_layer_period == attn_layer_offset,
  Mamba1 elsewhere; Falcon-H1: attention and a Mamba2 mixer side by side in every layer.
Other families return None: every layer is an attention layer (`config_reader._sliding` then
reads their windows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lab.sizing.config_fields import Fields, show
from lab.sizing.state_spec import RecurrentState

MODEL_DTYPE_BYTES = 2  # "auto" state dtypes follow the model's 16-bit dtype
_SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SLIDING, _FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class LayerPlan:
    attention: int  # attention layers (holding KV, or reading another layer's)
    window: int = 0
    sliding: int = 0  # sliding-window layers that hold KV
    chunk: int = 0
    chunked: int = 0  # chunked local layers
    shared: int = 0  # layers reading another layer's KV
    state: RecurrentState | None = None


def _llama4(f: Fields, layers: int) -> LayerPlan:
    chunk = f.whole("attention_chunk_size", "attention_chunk_size")
    flags = f.config.get("no_rope_layers")
    if isinstance(flags, list) and flags:
        if len(flags) != layers or any(v not in (0, 1) or isinstance(v, bool) for v in flags):
            f.errors["no_rope_layers"] = f"must list 0 or 1 for each of the {layers} layers"
            return LayerPlan(layers)
        rope = sum(flags)
    else:
        interval = f.whole("no_rope_layer_interval", "layer_index", default=4)
        rope = layers - layers // interval
        f.notes.append(f"no_rope_layers absent: Llama4TextConfig's default, every "
                       f"{interval}th layer has no RoPE")
    if not chunk:
        return LayerPlan(layers)
    f.notes.append(f"attention_chunk_size {chunk:,}: the {rope} RoPE layers attend within "
                   f"{chunk:,}-token chunks (chunked local attention), the {layers - rope} "
                   "NoPE layers to every token")
    return LayerPlan(layers, chunk=chunk, chunked=rope)


def _gemma3n(f: Fields, layers: int) -> LayerPlan:
    window = f.whole("sliding_window", "sliding_window")
    types = f.strings("layer_types", layers)
    if types is None and "layer_types" not in f.errors:
        types = [_FULL if (i + 1) % 5 == 0 else _SLIDING for i in range(layers)]
        f.notes.append("layer_types absent: Gemma3nTextConfig's default, every 5th layer full")
    if types is None or _unknown(f, types, {_SLIDING, _FULL}):
        return LayerPlan(layers)
    shared = f.whole("num_kv_shared_layers", "num_kv_shared_layers")
    if shared >= layers:
        f.errors["num_kv_shared_layers"] = (f"{shared} of {layers} layers: at least one layer "
                                            "must hold the KV the others read")
        return LayerPlan(layers)
    owners = types[:layers - shared]
    sliding = owners.count(_SLIDING)
    if sliding and not window:
        f.errors["sliding_window"] = "layer_types has sliding layers but no window"
    if shared:
        f.notes.append(f"num_kv_shared_layers {shared}: the last {shared} layers read the KV "
                       "of an earlier layer of their kind and allocate none; of the "
                       f"{len(owners)} that hold KV, {sliding} slide and "
                       f"{len(owners) - sliding} attend to every token")
    return LayerPlan(layers, window=window if sliding else 0, sliding=sliding, shared=shared)


def _qwen3_next(f: Fields, layers: int) -> LayerPlan:
    types = f.strings("layer_types", layers)
    if types is not None:
        if _unknown(f, types, {"linear_attention", _FULL}):
            return LayerPlan(layers)
        full = types.count(_FULL)
    else:
        interval = f.whole("full_attention_interval", "layer_index", default=4)
        full = layers // interval
        f.notes.append(f"full_attention_interval {interval}: layer i is gated attention when "
                       f"i + 1 is a multiple of {interval}, so {full} attention and "
                       f"{layers - full} Gated DeltaNet layers")
    state = RecurrentState(
        "gdn", num_layers=layers - full,
        conv_kernel=f.whole("linear_conv_kernel_dim", "state_dim", default=4),
        groups=f.whole("linear_num_key_heads", "state_dim", default=16),
        heads=f.whole("linear_num_value_heads", "state_dim", default=32),
        head_dim=f.whole("linear_value_head_dim", "state_dim", default=128),
        state_size=f.whole("linear_key_head_dim", "state_dim", default=128),
        conv_bytes=MODEL_DTYPE_BYTES, ssm_bytes=MODEL_DTYPE_BYTES)
    return _with_state(f, full, state)


def _mamba2(f: Fields, layers: int, d_inner: int, **names: str) -> RecurrentState:
    """A Mamba2 state from the config's own names for its dimensions."""
    return RecurrentState(
        "mamba2", num_layers=layers, d_inner=d_inner,
        conv_kernel=f.whole(names["conv"], "state_dim", default=4),
        groups=f.whole(names["groups"], "state_dim", default=1),
        heads=f.whole(names["heads"], "state_dim", required=True),
        head_dim=f.whole(names["head_dim"], "state_dim", required=True),
        state_size=f.whole(names["state"], "state_dim", required=True),
        chunk_size=f.whole(names["chunk"], "state_dim"),
        conv_bytes=MODEL_DTYPE_BYTES, ssm_bytes=MODEL_DTYPE_BYTES, prefix_caching_all=True)


def _granite(f: Fields, layers: int) -> LayerPlan:
    types = f.strings("layer_types", layers)
    if types is None:
        f.errors.setdefault("layer_types", "missing: which layers are Mamba2 and which attend")
        return LayerPlan(layers)
    if _unknown(f, types, {"mamba", "attention"}):
        return LayerPlan(layers)
    hidden = f.whole("hidden_size", "hidden_size")
    d_inner = f.whole("mamba_expand", "state_dim", default=2) * hidden
    state = _mamba2(f, types.count("mamba"), d_inner, conv="mamba_d_conv",
                    groups="mamba_n_groups", heads="mamba_n_heads", head_dim="mamba_d_head",
                    state="mamba_d_state", chunk="mamba_chunk_size")
    return _with_state(f, types.count("attention"), state)


def _nemotron_h(f: Fields, layers: int) -> LayerPlan:
    pattern = f.text("hybrid_override_pattern")
    if pattern is None:
        f.errors.setdefault("hybrid_override_pattern", "missing: which layers attend")
        return LayerPlan(layers)
    if len(pattern) != layers or set(pattern) - set("M*-E"):
        f.errors["hybrid_override_pattern"] = (f"must give one of M * - E for each of the "
                                               f"{layers} layers, got {show(pattern)}")
        return LayerPlan(layers)
    heads, head_dim = (f.whole(k, "state_dim") for k in ("mamba_num_heads", "mamba_head_dim"))
    state = _mamba2(f, pattern.count("M"), heads * head_dim, conv="conv_kernel",
                    groups="n_groups", heads="mamba_num_heads", head_dim="mamba_head_dim",
                    state="ssm_state_size", chunk="chunk_size")
    ssm = f.config.get("mamba_ssm_cache_dtype", "float32")
    ssm_bytes = _SSM_DTYPE_BYTES.get(ssm, 4) if isinstance(ssm, str) else 4
    f.notes.append(f"Nemotron-H: vLLM keeps the SSM state in {ssm} "
                   "(NemotronHForCausalLMConfig), the conv state in the model's dtype")
    return _with_state(f, pattern.count("*"), replace(state, ssm_bytes=ssm_bytes))


def _jamba(f: Fields, layers: int) -> LayerPlan:
    period = f.whole("attn_layer_period", "layer_index", default=8)
    offset = f.whole("attn_layer_offset", "layer_index", default=4)
    attention = sum(1 for i in range(layers) if i % period == offset)
    hidden = f.whole("hidden_size", "hidden_size")
    f.notes.append(f"attn_layer_period {period}, attn_layer_offset {offset}: {attention} "
                   f"attention layers, {layers - attention} Mamba1 layers")
    state = RecurrentState(
        "mamba1", num_layers=layers - attention,
        conv_kernel=f.whole("mamba_d_conv", "state_dim", default=4),
        d_inner=f.whole("mamba_expand", "state_dim", default=2) * hidden,
        state_size=f.whole("mamba_d_state", "state_dim", default=16),
        conv_bytes=MODEL_DTYPE_BYTES, ssm_bytes=MODEL_DTYPE_BYTES, prefix_caching_all=True)
    return _with_state(f, attention, state)


def _falcon_h1(f: Fields, layers: int) -> LayerPlan:
    hidden = f.whole("hidden_size", "hidden_size")
    d_inner = f.whole("mamba_d_ssm", "state_dim") or \
        f.whole("mamba_expand", "state_dim", default=2) * hidden
    f.notes.append("Falcon-H1: every decoder layer runs attention and a Mamba2 mixer side by "
                   "side, so each keeps KV and a state")
    state = _mamba2(f, layers, d_inner, conv="mamba_d_conv", groups="mamba_n_groups",
                    heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state",
                    chunk="mamba_chunk_size")
    return _with_state(f, layers, state)


def _with_state(f: Fields, attention: int, state: RecurrentState) -> LayerPlan:
    if not attention:
        f.errors.setdefault("num_hidden_layers", "no attention layer: the lab sizes hybrids "
                            "that keep a KV cache beside their recurrent layers")
        return LayerPlan(max(1, attention))
    return LayerPlan(attention, state=state if state.num_layers else None)


def _unknown(f: Fields, types: list[str], known: set[str]) -> bool:
    unknown = sorted(set(types) - known)
    if unknown:
        f.errors["layer_types"] = f"cannot model layer type {show(unknown[0])}"
    return bool(unknown)


PLANNERS: dict[str, Callable[[Fields, int], LayerPlan]] = {
    "llama4_text": _llama4, "gemma3n_text": _gemma3n, "qwen3_next": _qwen3_next,
    "granitemoehybrid": _granite, "nemotron_h": _nemotron_h, "jamba": _jamba,
    "falcon_h1": _falcon_h1}


def layer_plan(f: Fields, layers: int) -> LayerPlan | None:
    """The family's layer plan, or None when every layer is an attention layer."""
    planner = PLANNERS.get(f.view.model_type)
    return planner(f, layers) if planner else None
