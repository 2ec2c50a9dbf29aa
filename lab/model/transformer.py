"""A Llama-architecture decoder (SmolLM2-135M) in plain torch, small enough to read in one go.

Each layer: RMSNorm -> Q/K/V projections -> rotary embedding -> attention -> output projection
(+ residual), then RMSNorm -> SwiGLU MLP (+ residual). The input embedding doubles as the output
projection (tied embeddings).

Attention is not done here: the model hands each layer's new Q/K/V to an `Attention` object,
which stores K/V in its cache (a contiguous one, or the paged KV pool) and attends over the
sequence's context. The model sees a flat batch of new tokens [num_tokens] with their positions;
which sequence each token belongs to is the attention object's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from lab.sizing.model_spec import ModelSpec


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 49152
    hidden_size: int = 576
    intermediate_size: int = 1536
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100_000.0
    rms_norm_eps: float = 1e-5
    max_positions: int = 8192

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_spec(self, name: str) -> ModelSpec:
        """The part of the model the KV formula and the capacity sheet read: its attention
        geometry (the transformer's other fields do not enter the cache)."""
        return ModelSpec(name=name, num_layers=self.num_layers,
                         num_attention_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                         head_dim=self.head_dim, max_position_embeddings=self.max_positions)


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [q_size + 2 * kv_size, hidden]: Q, K and V stacked, one matmul
    out: torch.Tensor  # [hidden, q_size]
    mlp_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]: gate and up stacked
    down: torch.Tensor  # [hidden, intermediate]


class Attention(Protocol):
    """Stores one layer's new K/V and returns the attention output of the new tokens."""

    def __call__(self, layer: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        """query [T, num_heads, head_dim]; key, value [T, num_kv_heads, head_dim].

        Returns [T, num_heads, head_dim].
        """
        ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotary_tables(config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency: each [max_positions, head_dim // 2]."""
    exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim
    inv_freq = config.rope_theta ** -exponents  # [head_dim // 2]
    angles = torch.arange(config.max_positions, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x0, x1), (x2, x3), ...: the layout the GGUF stores Q/K weights in.

    x [T, heads, head_dim]; cos, sin [T, head_dim // 2].
    """
    pairs = x.unflatten(-1, (-1, 2))  # [T, heads, head_dim // 2, 2]
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, head_dim // 2]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)  # [T, heads, head_dim]


class Transformer:
    """Weights plus the forward pass. Read-only after construction: safe to share across users."""

    def __init__(self, config: ModelConfig, embedding: torch.Tensor, layers: list[LayerWeights],
                 final_norm: torch.Tensor) -> None:
        self.config = config
        self.embedding = embedding  # [vocab, hidden], also the output projection
        self.layers = layers
        self.final_norm = final_norm  # [hidden]
        self.device = embedding.device
        self.dtype = embedding.dtype
        self.cos, self.sin = rotary_tables(config, self.device)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor,
                attention: Attention) -> torch.Tensor:
        """token_ids, positions [T] -> final hidden states [T, hidden]. Positions must be below
        max_positions (the caller checks, on the host: reading the tensor would make a GPU
        wait)."""
        c = self.config
        cos, sin = self.cos[positions], self.sin[positions]  # [T, head_dim // 2]
        x = self.embedding[token_ids]  # [T, hidden]
        for i, w in enumerate(self.layers):
            h = rms_norm(x, w.attn_norm, c.rms_norm_eps)
            q, k, v = (h @ w.qkv.T).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = apply_rotary(q.unflatten(-1, (c.num_heads, c.head_dim)), cos, sin)  # [T, H, D]
            k = apply_rotary(k.unflatten(-1, (c.num_kv_heads, c.head_dim)), cos, sin)  # [T, KV, D]
            v = v.unflatten(-1, (c.num_kv_heads, c.head_dim))  # [T, KV, D]
            attn = attention(i, q.contiguous(), k.contiguous(), v.contiguous())  # [T, H, D]
            x = x + attn.flatten(-2) @ w.out.T
            h = rms_norm(x, w.mlp_norm, c.rms_norm_eps)
            gate, up = (h @ w.gate_up.T).chunk(2, dim=-1)  # each [T, intermediate]
            x = x + (F.silu(gate) * up) @ w.down.T
        return rms_norm(x, self.final_norm, c.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> float32 logits [n, vocab] (tied embeddings)."""
        return (hidden @ self.embedding.T).float()
