"""Read a Hugging Face config.json into a `ModelSpec`, treating the text as hostile.

`read_hf_config` turns the text of a `config.json` into a `ModelSpec` or raises `ConfigError`
naming every field it could not read: a size limit, a nesting limit, no NaN or infinity, no
huge integers, and no type it did not expect. The keys the file leaves out are what
transformers' config class for its model_type fills in (`lab.sizing.hf_defaults`), because
that object, not the file, is what vLLM reads; the notes say which ones were filled in.
"""

from __future__ import annotations

import json
from typing import Any

from lab.sizing.config_fields import Fields, is_whole, show
from lab.sizing.hf_defaults import MAX_LEN_KEYS, resolve
from lab.sizing.layer_plan import LayerPlan, layer_plan
from lab.sizing.model_spec import LIMITS, ConfigError, ModelSpec
from lab.sizing.params import count_params
from lab.sizing.weights import loaded_dtype

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: real config.json files are a few KiB
MAX_DEPTH = 64  # nesting levels accepted in a config
MAX_INT_DIGITS = 20  # longer integers are refused before Python converts them


def read_hf_config(data: str | bytes, name: str = "config.json") -> ModelSpec:
    """Parse the text of a Hugging Face config.json; ConfigError says what is wrong."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError({"file": f"{len(data):,} bytes; the limit is {MAX_CONFIG_BYTES:,}"})
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")  # a byte-order mark, as Windows editors save it
        except UnicodeDecodeError as err:
            raise ConfigError({"file": f"not UTF-8 text ({err.reason} at byte {err.start})"}) \
                from None
    else:
        data = data.removeprefix("\ufeff")
    try:
        config = json.loads(data, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except RecursionError:
        raise ConfigError({"file": f"nested deeper than {MAX_DEPTH} levels"}) from None
    except json.JSONDecodeError as err:
        raise ConfigError({"file": f"not JSON: {err.msg} (line {err.lineno}, "
                                   f"column {err.colno})"}) from None
    except ValueError as err:
        raise ConfigError({"file": str(err)}) from None
    if _depth(config) > MAX_DEPTH:
        raise ConfigError({"file": f"nested deeper than {MAX_DEPTH} levels"})
    if not isinstance(config, dict):
        raise ConfigError({"file": f"must be a JSON object, got {type(config).__name__}"})
    return spec_from_config(config, name)


class _Infinite(float):
    """JSON's Infinity, as Python's json and transformers read it (Nemotron-H's published
    time_step_limit holds one); shown as the file spells it. No sized key accepts it: the
    field reads want finite whole numbers."""

    def __new__(cls, token: str) -> _Infinite:
        value = super().__new__(cls, token.lower())
        value.token = token
        return value

    def __repr__(self) -> str:
        return self.token


def _refuse_constant(token: str) -> Any:
    if token in ("Infinity", "-Infinity"):
        return _Infinite(token)
    raise ValueError(f"{token} is not a number a config may hold")


def _bounded_int(token: str) -> int:
    if len(token.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer with {len(token)} digits is too large")
    return int(token)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level
        if isinstance(item, dict):
            item = list(item.values())
        children = item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children)
    return deepest


# Spec field -> the config key it is read from (error messages use the file's own name).
_CONFIG_KEY = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
               "num_attention_heads": "num_attention_heads", "head_dim": "head_dim",
               "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
               "sliding_window": "sliding_window", "num_sliding_layers": "layer_types",
               "max_position_embeddings": "max_position_embeddings"}
_SLIDING_TYPES = {"sliding_attention", "sliding_window", "local"}
_FULL_TYPES = {"full_attention", "global", "attention"}
# vLLM's _get_and_verify_max_len: these RoPE types already state the long context in
# max_position_embeddings; the others multiply it by their factor.
_ROPE_KEEPS_LENGTH = {"su", "longrope", "llama3"}
VLLM_DEFAULT_MAX_LEN = 2048  # vLLM's guess when a config has no length key at all
# Families whose config has MLA's keys but whose vLLM attention caches K and V per head.
MLA_SHAPED_MHA = frozenset({"minicpm3"})
# Families whose parameters the lab does not count (recurrent layers, per-layer embeddings).
NOT_COUNTED = frozenset({"llama4_text", "gemma3n_text", "qwen3_next", "granitemoehybrid",
                         "nemotron_h", "jamba", "falcon_h1"})


def spec_from_config(config: dict[str, Any], name: str = "config.json") -> ModelSpec:
    """Build a ModelSpec from a parsed config dict (multimodal configs: from `text_config`)."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError({"text_config": f"must be an object, got {show(text)}"})
    fields = Fields(resolve(config, text))
    layers = fields.whole("num_hidden_layers", "num_layers", required=True)
    heads = fields.whole("num_attention_heads", "num_attention_heads", required=True)
    kv_heads = fields.whole("num_key_value_heads", "num_kv_heads", default=heads)
    kv_lora_rank = fields.whole("kv_lora_rank", "kv_lora_rank")
    rope_dim = fields.whole("qk_rope_head_dim", "qk_rope_head_dim", required=kv_lora_rank > 0)
    model_type = fields.view.model_type
    if kv_lora_rank and model_type in MLA_SHAPED_MHA:
        kv_heads, head_dim = _cached_as_mha(fields, heads, rope_dim)
        kv_lora_rank = rope_dim = 0
    elif kv_lora_rank:
        # MLA caches one latent "head" of kv_lora_rank + rope values; heads and head_dim of
        # the queries do not enter the cache.
        fields.notes.append(f"MLA: one latent of {kv_lora_rank} + {rope_dim} values per token "
                            "and layer, cached once (no separate K and V)")
        head_dim = 0
    else:
        if not fields.present("num_key_value_heads"):
            fields.notes.append("num_key_value_heads absent: multi-head attention "
                                "(one KV head per attention head)")
        head_dim = _head_dim(fields, heads)
    plan = layer_plan(fields, layers)
    if plan is None:
        window, sliding = _sliding(fields, layers)
        plan = LayerPlan(layers, window=window, sliding=sliding)
    index_dim = _index_head_dim(fields, kv_lora_rank)
    if model_type == "gpt_oss":
        fields.notes.append("attention sinks: one learned logit per head and layer, kept in "
                            "the weights; the KV cache does not change")
    max_len = _max_model_len(fields)
    count = count_params(fields.config, model_type, layers, heads, kv_heads, head_dim) \
        if not fields.errors and model_type not in NOT_COUNTED else None
    if count is not None and count.total <= LIMITS["num_params"][1]:
        fields.notes.append(f"parameter count estimated from the shapes: "
                            f"{count.total / 1e9:.2f} B")
    else:
        count = None
        why = f" ({model_type}'s layers are not in the lab's count)" \
            if model_type in NOT_COUNTED else ""
        fields.notes.append(f"parameter count not estimated{why}: type it for the capacity "
                            "sheet")
    loaded = loaded_dtype(fields.config)
    if loaded.note:
        fields.notes.append(loaded.note)
    if fields.errors:
        raise ConfigError(fields.errors)
    try:
        return ModelSpec(
            name=name, num_layers=plan.attention, num_attention_heads=heads,
            num_kv_heads=1 if kv_lora_rank else kv_heads,
            head_dim=kv_lora_rank + rope_dim if kv_lora_rank else head_dim,
            kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope_dim, sliding_window=plan.window,
            num_sliding_layers=plan.sliding, attention_chunk_size=plan.chunk,
            num_chunked_layers=plan.chunked, num_kv_shared_layers=plan.shared,
            index_head_dim=index_dim, attention_sinks=model_type == "gpt_oss",
            state=plan.state, model_type=model_type, max_position_embeddings=max_len,
            decoder_layers=layers if plan.attention != layers or plan.state else 0,
            num_params=count.total if count else 0,
            unquantized_params=count.unquantized if count else 0,
            expert_params=count.experts if count else 0, weight_dtype=loaded.weight_dtype,
            weight_group_size=loaded.group_size, source=name, notes=tuple(fields.notes))
    except ConfigError as err:
        raise ConfigError({fields.view.key(_CONFIG_KEY.get(k, k)): v
                           for k, v in err.errors.items()}) from None


def _cached_as_mha(fields: Fields, heads: int, rope_dim: int) -> tuple[int, int]:
    """(KV heads, head dim): MiniCPM3's attention in vLLM expands the latent into K and V for
    every head before caching them (MiniCPM3Attention), V padded to the key's width."""
    nope = fields.whole("qk_nope_head_dim", "head_dim", required=True)
    fields.notes.append(f"{fields.view.model_type}: the config has MLA's keys, but vLLM caches "
                        f"K and V for all {heads} heads, each {nope} + {rope_dim} = "
                        f"{nope + rope_dim} wide (V padded to it), not one latent")
    return heads, nope + rope_dim


def _index_head_dim(fields: Fields, kv_lora_rank: int) -> int:
    """DeepSeek-V3.2's indexer key width: vLLM builds the indexer when index_topk is set."""
    if not kv_lora_rank or not fields.present("index_topk"):
        return 0
    dim = fields.whole("index_head_dim", "index_head_dim", default=128)
    fields.notes.append(f"sparse attention indexer: each MLA layer also caches a {dim}-value "
                        f"fp8 key with one fp32 scale per 128 values ({dim + dim // 128 * 4} B "
                        "per token), whatever the KV dtype")
    return dim


def _head_dim(fields: Fields, heads: int) -> int:
    """The explicit head_dim (or the family's default), else hidden_size / heads, as vLLM's
    ModelConfig.get_head_size does."""
    if fields.present("head_dim"):
        return fields.whole("head_dim", "head_dim")
    hidden = fields.whole("hidden_size", "hidden_size")
    if not fields.present("hidden_size"):
        fields.errors.setdefault("head_dim", "missing, and no hidden_size to derive it from")
        return 0
    if heads and hidden % heads:
        fields.errors[fields.view.key("hidden_size")] = (f"{hidden:,} is not a multiple of "
                                                         f"{heads} heads")
        return 0
    if heads and hidden:
        fields.notes.append(f"head_dim derived: hidden_size / heads = {hidden} / {heads}")
        return hidden // heads
    return 0


def _sliding(fields: Fields, layers: int) -> tuple[int, int]:
    """(window, number of sliding-window layers): from layer_types when the file has it, else
    from the sliding pattern (the file's or the family's default), else every layer slides."""
    window = fields.whole("sliding_window", "sliding_window")
    if fields.present("attention_chunk_size"):
        fields.notes.append(f"attention_chunk_size ignored: vLLM's chunked local attention is "
                            f"Llama 4's; {fields.view.model_type or 'this model'}'s layers "
                            "attend to every token")
    types = fields.config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            fields.errors["layer_types"] = "must be a list of strings"
            return 0, 0
        unknown = sorted(set(types) - _SLIDING_TYPES - _FULL_TYPES)
        if unknown:
            fields.errors["layer_types"] = f"cannot model layer type {show(unknown[0])}"
            return 0, 0
        if layers and len(types) != layers:
            fields.errors["layer_types"] = f"{len(types)} entries for {layers} layers"
            return 0, 0
        count = sum(t in _SLIDING_TYPES for t in types)
        if count and not window:
            fields.errors["sliding_window"] = "layer_types has sliding layers but no window"
        fields.notes.append(f"layer_types: {count} sliding-window layers, {layers - count} full")
        return (window, count) if count else (0, 0)
    if not window:
        return 0, 0
    if fields.config.get("use_sliding_window") is False:
        fields.notes.append("sliding_window ignored: use_sliding_window is false")
        return 0, 0
    if fields.present("sliding_window_pattern"):
        # transformers: layer i is full attention when (i + 1) is a multiple of the pattern.
        pattern = fields.whole("sliding_window_pattern", "layer_index", default=1)
        count = layers - layers // pattern
        fields.notes.append(f"sliding_window_pattern {pattern}: layer i is full attention when "
                            f"i + 1 is a multiple of {pattern}, so {layers - count} full and "
                            f"{count} sliding layers")
    elif fields.config.get("use_sliding_window") is True and fields.present("max_window_layers"):
        first = fields.whole("max_window_layers", "layer_index")
        count = max(0, layers - first)
        fields.notes.append(f"layers from max_window_layers = {first} on slide")
    else:
        count = layers
        fields.notes.append("every layer uses the sliding window")
    return (window, count) if count else (0, 0)


def _max_model_len(fields: Fields) -> int:
    """The context vLLM serves by default (_get_and_verify_max_len): the smallest length key
    the config has (2048 when none), times the rope_scaling factor for RoPE types that do not
    already count it (yarn from original_max_position_embeddings). Gemma 3's length is already
    scaled, so vLLM skips its factor."""
    lengths = [fields.whole(k, "max_position_embeddings") for k in MAX_LEN_KEYS
               if fields.present(k)]
    lengths = [n for n in lengths if n]
    if not lengths:
        fields.notes.append(f"no max_position_embeddings: vLLM assumes "
                            f"{VLLM_DEFAULT_MAX_LEN:,} tokens")
        return VLLM_DEFAULT_MAX_LEN
    length = min(lengths)
    rope = fields.config.get("rope_scaling")
    if not isinstance(rope, dict) or "gemma3" in fields.view.model_type:
        return length
    rope_type = rope.get("rope_type", rope.get("type"))
    factor = rope.get("factor", 1.0)
    if rope_type in _ROPE_KEEPS_LENGTH or not isinstance(factor, int | float) \
            or isinstance(factor, bool) or not 0 < factor <= 1024:
        return length
    base = rope.get("original_max_position_embeddings") if rope_type == "yarn" else length
    if not is_whole(base) or not 0 < base <= LIMITS["max_position_embeddings"][1]:
        return length
    scaled = min(int(base * factor), LIMITS["max_position_embeddings"][1])
    if scaled != length:
        fields.notes.append(f"rope_scaling {rope_type} x {factor:g}: vLLM's max_model_len is "
                            f"{scaled:,}, not max_position_embeddings {length:,}")
    return scaled
