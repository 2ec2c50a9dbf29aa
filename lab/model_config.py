"""What the KV formula needs to know about a model, and a careful reader of Hugging Face configs.

`ModelSpec` holds the attention geometry (layers, KV heads, head dimension, MLA latent, sliding
windows) plus the parameter count for the capacity sheet. `read_config` turns the text of a
`config.json` into a `ModelSpec` or raises `ConfigError` naming every field it could not read.
The reader treats its input as hostile: a size limit, a nesting limit, no NaN or infinity,
no huge integers, and no type it did not expect.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields as dataclass_fields
from functools import cache
from pathlib import Path
from typing import Any

PRESETS_PATH = Path(__file__).resolve().parents[1] / "assets" / "models.json"
MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: real config.json files are a few KiB
MAX_DEPTH = 64  # nesting levels accepted in a config
MAX_INT_DIGITS = 20  # longer integers are refused before Python converts them

# Inclusive bounds for every integer field: wide enough for any real model, small enough
# that the arithmetic and the charts stay meaningful.
LIMITS: dict[str, tuple[int, int]] = {
    "num_layers": (1, 1_000),
    "num_attention_heads": (1, 10_000),
    "num_kv_heads": (1, 10_000),
    "head_dim": (1, 16_384),
    "kv_lora_rank": (0, 65_536),
    "qk_rope_head_dim": (0, 65_536),
    "sliding_window": (0, 1 << 31),
    "num_sliding_layers": (0, 1_000),
    "max_position_embeddings": (0, 1 << 31),
    "num_params": (0, 100 * 10**12),
}
WEIGHT_DTYPES = ("fp32", "bf16", "fp8", "int4")
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16", "fp32": "fp32",
                 "bf16": "bf16", "fp16": "bf16", "float8_e4m3fn": "fp8"}


class ConfigError(ValueError):
    """A config or a hand-typed spec that cannot describe a model; `errors` maps field -> reason."""

    def __init__(self, errors: dict[str, str]):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{name}: {why}" for name, why in self.errors.items()))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int  # equal to num_attention_heads for MHA; ignored for MLA
    head_dim: int
    kv_lora_rank: int = 0  # > 0: multi-head latent attention (DeepSeek), one latent per token
    qk_rope_head_dim: int = 0  # MLA: the decoupled RoPE key stored beside the latent
    sliding_window: int = 0  # tokens a sliding-window layer keeps; 0 = no such layers
    num_sliding_layers: int = 0
    max_position_embeddings: int = 0  # 0 = unknown
    num_params: int = 0  # 0 = unknown
    weight_dtype: str = "bf16"
    source: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        errors = spec_errors(self)
        if errors:
            raise ConfigError(errors)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"


def spec_errors(spec: ModelSpec) -> dict[str, str]:
    """Every problem with a spec, field by field (empty when it is valid)."""
    errors: dict[str, str] = {}
    for name, (low, high) in LIMITS.items():
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int):
            errors[name] = f"must be a whole number, got {value!r}"
        elif not low <= value <= high:
            errors[name] = f"must be between {low:,} and {high:,}, got {value:,}"
    if spec.weight_dtype not in WEIGHT_DTYPES:
        errors["weight_dtype"] = f"must be one of {', '.join(WEIGHT_DTYPES)}"
    if errors:
        return errors
    if not spec.is_mla and spec.num_attention_heads % spec.num_kv_heads:
        errors["num_kv_heads"] = (f"{spec.num_kv_heads} KV heads do not divide "
                                  f"{spec.num_attention_heads} attention heads evenly")
    if spec.is_mla and spec.qk_rope_head_dim == 0:
        errors["qk_rope_head_dim"] = "MLA needs the RoPE key width (qk_rope_head_dim)"
    if spec.num_sliding_layers > spec.num_layers:
        errors["num_sliding_layers"] = f"cannot exceed the {spec.num_layers} layers"
    if spec.num_sliding_layers and not spec.sliding_window:
        errors["sliding_window"] = "sliding-window layers need a window above 0"
    return errors


@cache
def load_presets(path: Path = PRESETS_PATH) -> dict[str, ModelSpec]:
    """Model presets by name, from assets/models.json (the geometry fields of each entry)."""
    names = {f.name for f in dataclass_fields(ModelSpec)} - {"notes"}
    entries = json.loads(path.read_text())["models"]
    return {e["name"]: ModelSpec(**{k: v for k, v in e.items() if k in names},
                                 notes=(e["note"],) if e.get("note") else ())
            for e in entries}


def read_config(data: str | bytes, name: str = "config.json") -> ModelSpec:
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
