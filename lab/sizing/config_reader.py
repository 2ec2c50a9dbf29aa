"""Read a Hugging Face config.json into a `ModelSpec`, treating the text as hostile.

`read_hf_config` turns the text of a `config.json` into a `ModelSpec` or raises `ConfigError`
naming every field it could not read: a size limit, a nesting limit, no NaN or infinity, no
huge integers, and no type it did not expect.
"""

from __future__ import annotations

import json
import math
from typing import Any

from lab.sizing.model_spec import LIMITS, ConfigError, ModelSpec

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: real config.json files are a few KiB
MAX_DEPTH = 64  # nesting levels accepted in a config
MAX_INT_DIGITS = 20  # longer integers are refused before Python converts them
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16", "fp32": "fp32",
                 "bf16": "bf16", "fp16": "bf16", "float8_e4m3fn": "fp8"}


def read_hf_config(data: str | bytes, name: str = "config.json") -> ModelSpec:
    """Parse the text of a Hugging Face config.json; ConfigError says what is wrong."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError({"file": f"{len(data):,} bytes; the limit is {MAX_CONFIG_BYTES:,}"})
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError({"file": f"not UTF-8 text ({err.reason} at byte {err.start})"}) \
                from None
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


def _refuse_constant(token: str) -> Any:
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


def is_whole(value: Any) -> bool:
    """A JSON number that is an integer (bools are not numbers here; 32.0 counts as 32)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return (isinstance(value, float) and math.isfinite(value) and value.is_integer()
            and abs(value) < 2**53)


# Spec field -> the config.json key it is read from (for error messages in the file's words).
_CONFIG_KEY = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
               "num_attention_heads": "num_attention_heads", "head_dim": "head_dim",
               "kv_lora_rank": "kv_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
               "sliding_window": "sliding_window", "num_sliding_layers": "layer_types",
               "max_position_embeddings": "max_position_embeddings"}
_READ_LIMITS = {"hidden_size": (1, 10**7), "layer_index": (1, 1_000)}
_SLIDING_TYPES = {"sliding_attention", "sliding_window", "local"}
_FULL_TYPES = {"full_attention", "global", "attention"}


class _Fields:
    """Reads typed fields from a config dict, collecting one error per bad field."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.errors: dict[str, str] = {}
        self.notes: list[str] = []

    def present(self, key: str) -> bool:
        return self.config.get(key) is not None

    def whole(self, key: str, limits: str, *, required: bool = False, default: int = 0) -> int:
        """The integer at `key`, checked against LIMITS[limits] (or _READ_LIMITS)."""
        if not self.present(key):
            if required:
                self.errors[key] = "missing"
            return default
        value = self.config[key]
        if not is_whole(value):
            self.errors[key] = f"must be a whole number, got {_show(value)}"
            return default
        low, high = LIMITS.get(limits) or _READ_LIMITS[limits]
        if not low <= int(value) <= high:
            self.errors[key] = f"must be between {low:,} and {high:,}, got {int(value):,}"
            return default
        return int(value)


def spec_from_config(config: dict[str, Any], name: str = "config.json") -> ModelSpec:
    """Build a ModelSpec from a parsed config dict (multimodal configs: from `text_config`)."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError({"text_config": f"must be an object, got {_show(text)}"})
    merged = {**config, **(text or {})}
    fields = _Fields(merged)
    if text is not None:
        fields.notes.append("read the language model's fields from text_config")
    layers = fields.whole("num_hidden_layers", "num_layers", required=True)
    heads = fields.whole("num_attention_heads", "num_attention_heads", required=True)
    kv_heads = fields.whole("num_key_value_heads", "num_kv_heads", default=heads)
    if not fields.present("num_key_value_heads") and not fields.present("kv_lora_rank"):
        fields.notes.append("num_key_value_heads absent: multi-head attention "
                            "(one KV head per attention head)")
    kv_lora_rank = fields.whole("kv_lora_rank", "kv_lora_rank")
    rope_dim = fields.whole("qk_rope_head_dim", "qk_rope_head_dim", required=kv_lora_rank > 0)
    if kv_lora_rank:
        # MLA caches one latent "head" of kv_lora_rank + rope values; heads and head_dim of
        # the queries do not enter the cache.
        kv_heads, head_dim = 1, kv_lora_rank + rope_dim
        fields.notes.append(f"MLA: one latent of {kv_lora_rank} + {rope_dim} values per token "
                            "and layer, cached once (no separate K and V)")
    else:
        head_dim = _head_dim(fields, heads)
    window, sliding = _sliding(fields, layers)
    max_pos = fields.whole("max_position_embeddings", "max_position_embeddings")
    params = 0 if kv_lora_rank else _estimate_params(merged, layers, heads, kv_heads, head_dim)
    if params:
        fields.notes.append(f"parameter count estimated from the shapes: {params / 1e9:.2f} B")
    else:
        fields.notes.append("parameter count not estimated: type it for the capacity sheet")
    weight_dtype = _weight_dtype(fields, config)
    if fields.errors:
        raise ConfigError(fields.errors)
    try:
        return ModelSpec(name=name, num_layers=layers, num_attention_heads=heads,
                         num_kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank,
                         qk_rope_head_dim=rope_dim, sliding_window=window,
                         num_sliding_layers=sliding, max_position_embeddings=max_pos,
                         num_params=params, weight_dtype=weight_dtype, source=name,
                         notes=tuple(fields.notes))
    except ConfigError as err:
        raise ConfigError({_CONFIG_KEY.get(k, k): v for k, v in err.errors.items()}) from None


def _head_dim(fields: _Fields, heads: int) -> int:
    if fields.present("head_dim"):
        return fields.whole("head_dim", "head_dim")
    hidden = fields.whole("hidden_size", "hidden_size")
    if not fields.present("hidden_size"):
        fields.errors.setdefault("head_dim", "missing, and no hidden_size to derive it from")
        return 0
    if heads and hidden % heads:
        fields.errors["hidden_size"] = f"{hidden:,} is not a multiple of {heads} heads"
        return 0
    if heads and hidden:
        fields.notes.append(f"head_dim derived: hidden_size / heads = {hidden} / {heads}")
        return hidden // heads
    return 0


def _sliding(fields: _Fields, layers: int) -> tuple[int, int]:
    """(window, number of sliding-window layers), from layer_types or the family's pattern."""
    window = fields.whole("sliding_window", "sliding_window")
    types = fields.config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            fields.errors["layer_types"] = "must be a list of strings"
            return 0, 0
        unknown = sorted(set(types) - _SLIDING_TYPES - _FULL_TYPES)
        if unknown:
            fields.errors["layer_types"] = f"cannot model layer type {_show(unknown[0])}"
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
    model_type = fields.config.get("model_type")
    if fields.present("sliding_window_pattern"):
        pattern = fields.whole("sliding_window_pattern", "layer_index", default=1)
        count = layers - layers // pattern
        fields.notes.append(f"every {pattern}th layer is full attention, the rest slide")
    elif isinstance(model_type, str) and model_type.startswith("gemma2"):
        count = (layers + 1) // 2
        fields.notes.append("Gemma 2 alternates: even layers slide, odd layers are full")
    elif fields.config.get("use_sliding_window") is True and fields.present("max_window_layers"):
        first = fields.whole("max_window_layers", "layer_index")
        count = max(0, layers - first)
        fields.notes.append(f"layers from max_window_layers = {first} on slide")
    else:
        count = layers
        fields.notes.append("every layer uses the sliding window")
    return (window, count) if count else (0, 0)


def _estimate_params(config: dict[str, Any], layers: int, heads: int, kv_heads: int,
                     head_dim: int) -> int:
    """Parameters of a dense or Mixtral-style MoE decoder (embeddings, attention, gated MLP,
    norms) from the config's shapes; 0 when the shapes are missing."""
    values = [config.get(k) for k in ("hidden_size", "vocab_size", "intermediate_size")]
    if not all(is_whole(v) and 0 < v < 10**7 for v in values):
        return 0
    hidden, vocab, inter = (int(v) for v in values)
    experts = next((int(config[k]) for k in ("num_local_experts", "num_experts")
                    if is_whole(config.get(k)) and 1 < config[k] < 10**4), 1)
    if experts > 1 and is_whole(config.get("moe_intermediate_size")):
        inter = int(config["moe_intermediate_size"])
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = experts * 3 * hidden * inter + (hidden * experts if experts > 1 else 0)
    tied = config.get("tie_word_embeddings", True) is not False
    total = layers * (attention + mlp + 2 * hidden) + vocab * hidden * (1 if tied else 2) + hidden
    return total if total <= LIMITS["num_params"][1] else 0


def _weight_dtype(fields: _Fields, config: dict[str, Any]) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8":
        return "fp8"
    raw = config.get("torch_dtype", config.get("dtype"))
    if raw is None:
        fields.notes.append("torch_dtype absent: weights assumed bf16")
        return "bf16"
    if isinstance(raw, str) and raw.removeprefix("torch.") in _TORCH_DTYPES:
        return _TORCH_DTYPES[raw.removeprefix("torch.")]
    fields.notes.append(f"torch_dtype {_show(raw)} not understood: weights assumed bf16")
    return "bf16"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
