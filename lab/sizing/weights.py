"""Weights as vLLM loads them: the dtype it picks, and the bytes of a quantized checkpoint.

- dtype=auto (vLLM's ModelConfig, _resolve_auto_dtype): a checkpoint saved in float32 is not
  loaded in float32; vLLM downcasts it to the platform's first supported 16-bit dtype
  (bfloat16 on CUDA GPUs since Ampere). So a float32 config counts 2 bytes per weight.
- A quantized checkpoint keeps its format: one byte per fp8 weight, 4.25 bits per mxfp4 weight
  (4-bit values, one 8-bit power-of-two scale per block of 32), and AWQ/GPTQ int4 half a byte
  plus, per group of `group_size` weights, one fp16 scale and one 4-bit zero point. What the
  format does not cover stays in 16 bits (`ParamCount.unquantized`, and for mxfp4 everything
  but the experts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WeightFormat:
    key: str
    label: str
    bits: float  # per quantized weight
    zero_bits: float = 0  # zero point stored per group (AWQ/GPTQ); 0 = none
    experts_only: bool = False  # mxfp4 checkpoints quantize the MoE experts alone
    grouped: bool = False  # fp16 scale (+ zero) per group_size weights
    note: str = ""

    def bytes_per_weight(self, group_size: int) -> float:
        """Bytes of one quantized weight, its share of the group's scale and zero included."""
        per_group = (16 + self.zero_bits) / group_size if self.grouped and group_size else 0
        return (self.bits + per_group) / 8


WEIGHT_FORMATS: dict[str, WeightFormat] = {f.key: f for f in (
    WeightFormat("fp32", "fp32", 32, note="only with an explicit --dtype float32"),
    WeightFormat("bf16", "bf16 / fp16", 16),
    WeightFormat("fp8", "fp8", 8, note="1 byte per weight; DeepSeek's one fp32 scale per "
                 "128 x 128 block adds 0.02 %, left out"),
    WeightFormat("int8", "int8 + group scales", 8, zero_bits=8, grouped=True),
    WeightFormat("int4", "int4 + group scales (AWQ/GPTQ)", 4, zero_bits=4, grouped=True),
    WeightFormat("mxfp4", "mxfp4 (experts)", 4.25, experts_only=True,
                 note="4-bit values and one 8-bit scale per 32; attention, embeddings and "
                 "routers stay bf16"),
)}
WEIGHT_DTYPES = tuple(WEIGHT_FORMATS)
SIXTEEN_BIT = 2  # bytes per weight the formats leave unquantized


def weight_bytes_per_gpu(num_params: int, weight_dtype: str, tp: int = 1, *,
                         unquantized_params: int = 0, expert_params: int = 0,
                         group_size: int = 128) -> int:
    """This rank's shard of the weights (everything split over `tp` ranks).

    Formats that quantize keep `unquantized_params` in 16 bits; mxfp4 quantizes only
    `expert_params` (all linear weights when a model has no experts)."""
    fmt = WEIGHT_FORMATS[weight_dtype]
    if fmt.bits >= 16:
        total = num_params * fmt.bits / 8
    else:
        covered = num_params - unquantized_params
        if fmt.experts_only and expert_params:
            covered = expert_params
        total = covered * fmt.bytes_per_weight(group_size) + (num_params - covered) * SIXTEEN_BIT
    return -(-int(total) // tp)


@dataclass(frozen=True)
class LoadedDtype:
    weight_dtype: str
    group_size: int = 128
    note: str = ""


_TORCH_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "bf16",
                 "half": "bf16", "float8_e4m3fn": "fp8"}


def loaded_dtype(config: dict[str, Any]) -> LoadedDtype:
    """The weight format vLLM loads this config's checkpoint in (dtype=auto)."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        return _quantized(quant)
    raw = config.get("torch_dtype", config.get("dtype"))
    name = raw.removeprefix("torch.") if isinstance(raw, str) else None
    if raw is None:
        return LoadedDtype("bf16", note="torch_dtype absent: vLLM reads the safetensors "
                           "dtype, else assumes float32 and loads bf16 (2 bytes per weight)")
    if name not in _TORCH_DTYPES:
        return LoadedDtype("bf16", note=f"torch_dtype {raw!r} not understood: weights "
                           "counted as bf16")
    if _TORCH_DTYPES[name] == "fp32":
        return LoadedDtype("bf16", note="torch_dtype float32: vLLM's dtype=auto loads float32 "
                           "checkpoints in bfloat16, 2 bytes per weight, not 4")
    return LoadedDtype(_TORCH_DTYPES[name])


def _quantized(quant: dict[str, Any]) -> LoadedDtype:
    method = str(quant.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return LoadedDtype("fp8", note=f"quantization_config: {method}, 1 byte per linear "
                           "weight; embeddings, LM head, norms and routers stay bf16")
    if method == "mxfp4":
        return LoadedDtype("mxfp4", note="quantization_config: mxfp4 experts (4.25 bits per "
                           "weight); attention, embeddings and routers stay bf16")
    if method.startswith(("awq", "gptq")):
        return _integer(quant.get("bits", 4), quant.get("group_size", 128), method)
    if method == "compressed-tensors":
        groups = quant.get("config_groups")
        groups = groups.values() if isinstance(groups, dict) else ()
        weights = next((g["weights"] for g in groups
                        if isinstance(g, dict) and isinstance(g.get("weights"), dict)), None)
        if weights and weights.get("type") == "float" and weights.get("num_bits") == 8:
            return LoadedDtype("fp8", note="compressed-tensors fp8 weights, 1 byte each")
        if weights and weights.get("type") == "int":
            return _integer(weights.get("num_bits"), weights.get("group_size"), method)
    return LoadedDtype("bf16", note=f"quantization_config {method or 'without quant_method'} "
                       "is not modelled: weights counted as bf16")


def _integer(bits: Any, group: Any, method: str) -> LoadedDtype:
    if bits not in (4, 8):
        return LoadedDtype("bf16", note=f"{method} with {bits!r}-bit weights is not modelled: "
                           "weights counted as bf16")
    per_channel = not isinstance(group, int) or isinstance(group, bool) or group <= 0
    size = 0 if per_channel else min(group, 1 << 20)
    where = "one scale per output channel" if per_channel else f"group size {size}"
    return LoadedDtype(f"int{bits}", size, note=f"quantization_config: {method} int{bits}, "
                       f"{where}; embeddings, LM head and norms stay 16-bit")
