"""How many parameters a config describes, part by part, as vLLM loads them.

The weights term of the capacity sheet needs the parameter count, and a quantized checkpoint
needs to know which parameters its format covers: fp8, AWQ and GPTQ quantize the decoder's
linear layers but keep embeddings, the LM head, norms and MoE routers in 16 bits; GPT-OSS's
mxfp4 quantizes the experts only. So the count is kept by part.

Counted from the shapes (biases are left out: under 0.01 % of any model here):
- embeddings vocab x hidden, and an LM head of the same size unless tie_word_embeddings;
- attention: Q and O of heads x head_dim, K and V of kv_heads x head_dim, each x hidden; MLA
  (DeepSeek) instead: q_a/q_b (or one q_proj), kv_a_proj_with_mqa, kv_b_proj and o_proj, and
  DeepSeek-V3.2's indexer (wq_b, wk, k_norm, weights_proj);
- MLP: gate, up, down (3 x hidden x intermediate), or up and down only for ungated families;
- MoE layers: every expert's MLP, shared experts, and the router (hidden x experts);
- two norms per layer and a final one; a ViT-style vision tower from vision_config.
DeepSeek's multi-token-prediction layer (num_nextn_predict_layers) is not counted: vLLM skips
it unless speculative decoding asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.sizing.hf_defaults import UNGATED_MLP_TYPES

MAX_SHAPE = 10**7  # any larger "dimension" is not a real model's


@dataclass(frozen=True)
class ParamCount:
    embedding: int = 0  # input embeddings and the LM head
    attention: int = 0
    mlp: int = 0  # dense MLPs and shared experts
    experts: int = 0  # routed experts of MoE layers
    router: int = 0
    norms: int = 0
    vision: int = 0

    @property
    def total(self) -> int:
        return (self.embedding + self.attention + self.mlp + self.experts + self.router
                + self.norms + self.vision)

    @property
    def unquantized(self) -> int:
        """What every quantization scheme here keeps in 16 bits."""
        return self.embedding + self.router + self.norms + self.vision


def _dim(values: dict[str, Any], key: str, default: int = 0) -> int:
    value = values.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value) if 0 < value < MAX_SHAPE and float(value).is_integer() else default


def count_params(values: dict[str, Any], model_type: str, layers: int, heads: int,
                 kv_heads: int, head_dim: int) -> ParamCount | None:
    """The parameter count of a resolved config; None when its shapes are missing."""
    hidden, vocab = _dim(values, "hidden_size"), _dim(values, "vocab_size")
    if not (hidden and vocab and layers):
        return None
    ungated = model_type in UNGATED_MLP_TYPES
    inter = _dim(values, "intermediate_size", 4 * hidden if ungated else 0)
    if not inter:
        return None
    tied = values.get("tie_word_embeddings", True) is not False
    attention = _mla_attention(values, hidden, heads) or (
        2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim)
    mlp_mats = 2 if ungated else 3
    dense_mlp = mlp_mats * hidden * inter
    experts, moe_layers = _experts(values, layers)
    expert_inter = _dim(values, "moe_intermediate_size", inter)
    shared = (_dim(values, "n_shared_experts") * mlp_mats * hidden * expert_inter
              + mlp_mats * hidden * _dim(values, "shared_expert_intermediate_size"))
    return ParamCount(
        embedding=vocab * hidden * (1 if tied else 2),
        attention=layers * attention,
        mlp=(layers - moe_layers) * dense_mlp + moe_layers * shared,
        experts=moe_layers * experts * mlp_mats * hidden * expert_inter,
        router=moe_layers * experts * hidden,
        norms=(2 * layers + 1) * hidden,
        vision=_vision(values.get("vision_config"), hidden))


def _mla_attention(values: dict[str, Any], hidden: int, heads: int) -> int:
    """One MLA layer's projections (DeepseekV2/V3 attention), 0 for other attention."""
    rank = _dim(values, "kv_lora_rank")
    if not rank:
        return 0
    rope, nope = _dim(values, "qk_rope_head_dim"), _dim(values, "qk_nope_head_dim")
    v_dim, q_rank = _dim(values, "v_head_dim", nope), _dim(values, "q_lora_rank")
    q_out = heads * (nope + rope)
    query = hidden * q_rank + q_rank + q_rank * q_out if q_rank else hidden * q_out
    return (query + hidden * (rank + rope) + rank  # kv_a_proj_with_mqa, kv_a_layernorm
            + rank * heads * (nope + v_dim) + heads * v_dim * hidden
            + _indexer(values, hidden, q_rank))


def _indexer(values: dict[str, Any], hidden: int, q_rank: int) -> int:
    """DeepSeek-V3.2's sparse-attention indexer: its query from the q latent, one key, its
    LayerNorm and the per-head weights (0 without index_topk)."""
    if values.get("index_topk") is None:
        return 0
    dim, heads = _dim(values, "index_head_dim", 128), _dim(values, "index_n_heads", 64)
    return (q_rank or hidden) * heads * dim + hidden * dim + 2 * dim + hidden * heads


def _experts(values: dict[str, Any], layers: int) -> tuple[int, int]:
    """(routed experts per MoE layer, number of MoE layers) for the three MoE conventions."""
    if routed := _dim(values, "n_routed_experts"):  # DeepSeek: dense first, then every freq-th
        first, freq = _dim(values, "first_k_dense_replace"), _dim(values, "moe_layer_freq", 1)
        return routed, sum(1 for i in range(layers) if i >= first and i % freq == 0)
    if (experts := _dim(values, "num_experts")) > 1:  # Qwen-MoE: decoder_sparse_step
        step = _dim(values, "decoder_sparse_step", 1)
        listed = values.get("mlp_only_layers")
        dense = {i for i in listed if isinstance(i, int)} if isinstance(listed, list) else set()
        return experts, sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if (experts := _dim(values, "num_local_experts")) > 1:  # Mixtral, GPT-OSS: every layer
        return experts, layers
    return 0, 0


def _vision(vision: Any, text_hidden: int) -> int:
    """A ViT-style tower (SigLIP, CLIP): attention and MLP per layer, patch and position
    embeddings, and the projector into the language model."""
    if not isinstance(vision, dict):
        return 0
    hidden, inter = _dim(vision, "hidden_size"), _dim(vision, "intermediate_size")
    layers, patch = _dim(vision, "num_hidden_layers"), _dim(vision, "patch_size", 14)
    if not (hidden and inter and layers):
        return 0
    positions = (_dim(vision, "image_size") // patch) ** 2
    return (layers * (4 * hidden * hidden + 2 * hidden * inter)
            + 3 * patch * patch * hidden + positions * hidden + hidden * text_hidden)
