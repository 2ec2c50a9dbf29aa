"""What the KV formula needs to know about a model: `ModelSpec`, and the presets.

`ModelSpec` holds the attention geometry (layers, KV heads, head dimension, MLA latent, sliding
windows, chunked local attention, layers that share another layer's KV, DeepSeek-V3.2's indexer),
the recurrent state of Mamba and Gated DeltaNet layers (`lab.sizing.state_spec`), the context
vLLM serves by default, and the weights for the capacity sheet: the parameter count, the format
vLLM loads them in, and the parts a quantized format leaves in 16 bits. Every field is checked
on construction (`spec_errors`); `ConfigError` names each bad field. The presets are
`assets/models.json`; `lab.sizing.config_reader` builds a spec from a Hugging Face config.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from functools import cache
from pathlib import Path

from lab.sizing.state_spec import RecurrentState, state_errors
from lab.sizing.weights import WEIGHT_DTYPES, weight_bytes_per_gpu

PRESETS_PATH = Path(__file__).resolve().parents[2] / "assets" / "models.json"

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
    "attention_chunk_size": (0, 1 << 31),
    "num_chunked_layers": (0, 1_000),
    "num_kv_shared_layers": (0, 1_000),
    "index_head_dim": (0, 65_536),
    "decoder_layers": (0, 1_000),
    "max_position_embeddings": (0, 1 << 31),
    "num_params": (0, 100 * 10**12),
    "unquantized_params": (0, 100 * 10**12),
    "expert_params": (0, 100 * 10**12),
    "weight_group_size": (0, 1 << 20),
}


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
    num_sliding_layers: int = 0  # sliding-window layers that hold KV
    attention_chunk_size: int = 0  # Llama 4's chunked local attention; 0 = no such layers
    num_chunked_layers: int = 0
    num_kv_shared_layers: int = 0  # attention layers reading another layer's KV, holding none
    index_head_dim: int = 0  # > 0: DeepSeek-V3.2's sparse-attention indexer keeps a key cache
    attention_sinks: bool = False  # gpt-oss: a learned logit per head, in the weights
    state: RecurrentState | None = None  # Mamba / Gated DeltaNet layers beside the attention
    decoder_layers: int = 0  # all decoder layers, when more than the attention layers
    model_type: str = ""
    max_position_embeddings: int = 0  # vLLM's default max_model_len; 0 = unknown
    num_params: int = 0  # 0 = unknown
    unquantized_params: int = 0  # embeddings, LM head, norms, routers: 16-bit in every format
    expert_params: int = 0  # routed MoE experts (all that an mxfp4 checkpoint quantizes)
    weight_dtype: str = "bf16"  # as vLLM loads the checkpoint (lab.sizing.weights)
    weight_group_size: int = 128  # weights per scale of an int4/int8 format; 0 = per channel
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

    def weight_bytes(self, tp: int = 1, weight_dtype: str | None = None) -> int:
        """This rank's weights as vLLM loads them (in `weight_dtype` when given)."""
        return weight_bytes_per_gpu(self.num_params, weight_dtype or self.weight_dtype, tp,
                                    unquantized_params=self.unquantized_params,
                                    expert_params=self.expert_params,
                                    group_size=self.weight_group_size)


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
    if not isinstance(spec.attention_sinks, bool):
        errors["attention_sinks"] = "must be true or false"
    if spec.state is not None:
        errors |= state_errors(spec.state)
    if errors:
        return errors
    if not spec.is_mla and spec.num_attention_heads % spec.num_kv_heads:
        errors["num_kv_heads"] = (f"{spec.num_kv_heads} KV heads do not divide "
                                  f"{spec.num_attention_heads} attention heads evenly")
    if spec.is_mla and spec.qk_rope_head_dim == 0:
        errors["qk_rope_head_dim"] = "MLA needs the RoPE key width (qk_rope_head_dim)"
    windowed = spec.num_sliding_layers + spec.num_chunked_layers + spec.num_kv_shared_layers
    if spec.num_sliding_layers > spec.num_layers:
        errors["num_sliding_layers"] = f"cannot exceed the {spec.num_layers} layers"
    elif windowed > spec.num_layers:
        errors["num_chunked_layers"] = (f"sliding, chunked and KV-sharing layers together "
                                        f"cannot exceed the {spec.num_layers} layers")
    elif spec.num_kv_shared_layers >= spec.num_layers:
        errors["num_kv_shared_layers"] = "the layers sharing KV need one that holds it"
    if spec.num_sliding_layers and not spec.sliding_window:
        errors["sliding_window"] = "sliding-window layers need a window above 0"
    if spec.num_chunked_layers and not spec.attention_chunk_size:
        errors["attention_chunk_size"] = "chunked local layers need a chunk above 0"
    if spec.index_head_dim and not spec.is_mla:
        errors["index_head_dim"] = "the sparse-attention indexer comes with MLA"
    if spec.unquantized_params + spec.expert_params > spec.num_params:
        errors["unquantized_params"] = "16-bit and expert parameters exceed the parameter count"
    return errors


@cache
def load_presets(path: Path = PRESETS_PATH) -> dict[str, ModelSpec]:
    """Model presets by name, from assets/models.json (the geometry fields of each entry)."""
    names = {f.name for f in dataclass_fields(ModelSpec)} - {"notes", "state"}
    entries = json.loads(path.read_text())["models"]
    return {e["name"]: ModelSpec(**{k: v for k, v in e.items() if k in names},
                                 state=RecurrentState(**e["state"]) if e.get("state") else None,
                                 notes=(e["note"],) if e.get("note") else ())
            for e in entries}
