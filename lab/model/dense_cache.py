"""The reference KV cache: one contiguous tensor per sequence, reserved for max_len tokens.

This is what serving systems did before paging: every sequence reserves its maximum length up
front, a fork copies the whole reservation, and attention reads a plain contiguous slice.
It is the ground truth the paged cache must match token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.model.step_layout import StepLayout, context_attention
from lab.model.transformer import ModelConfig


@dataclass
class DenseSequence:
    tokens: list[int]
    keys: torch.Tensor  # [num_layers, max_len, num_kv_heads, head_dim]
    values: torch.Tensor  # [num_layers, max_len, num_kv_heads, head_dim]
    num_computed: int = 0  # leading positions whose K/V is stored


class DenseStep:
    """Writes new K/V into each sequence's contiguous rows, then attends over the rows."""

    def __init__(self, seqs: list[DenseSequence], device: torch.device) -> None:
        self.seqs = seqs
        self.layout = StepLayout(tuple(len(s.tokens) - s.num_computed for s in seqs),
                                 tuple(len(s.tokens) for s in seqs), device)
        new_tokens = [t for s in seqs for t in s.tokens[s.num_computed:]]
        self.token_ids = torch.tensor(new_tokens, device=device)  # [num_tokens]
        self.context = max(self.layout.seq_lens)

    def __call__(self, layer: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        starts = self.layout.query_start_loc.tolist()
        for seq, begin, end in zip(self.seqs, starts, starts[1:]):
            rows = slice(seq.num_computed, seq.num_computed + end - begin)
            seq.keys[layer, rows] = key[begin:end]
            seq.values[layer, rows] = value[begin:end]
        keys = torch.stack([s.keys[layer, :self.context] for s in self.seqs])  # [S, C, KV, D]
        values = torch.stack([s.values[layer, :self.context] for s in self.seqs])  # [S, C, KV, D]
        return context_attention(query, keys, values, self.layout)  # [T, H, D]


class DenseKVCache:
    def __init__(self, config: ModelConfig, max_len: int, device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        self.config = config
        self.max_len = max_len
        self.device = device
        self.dtype = dtype
        self.sequences: dict[int, DenseSequence] = {}

    def _reserve(self, tokens: list[int]) -> int:
        if len(tokens) > self.max_len:
            raise ValueError(f"{len(tokens)} tokens do not fit the "
                             f"{self.max_len}-token reservation")
        c = self.config
        shape = (c.num_layers, self.max_len, c.num_kv_heads, c.head_dim)
        seq_id = len(self.sequences)
        self.sequences[seq_id] = DenseSequence(
            list(tokens), torch.zeros(shape, dtype=self.dtype, device=self.device),
            torch.zeros(shape, dtype=self.dtype, device=self.device))
        return seq_id

    def add(self, prompt: list[int]) -> int:
        return self._reserve(prompt)

    def fork(self, seq_id: int) -> int:
        """A dense fork copies the parent's whole reservation."""
        parent = self.sequences[seq_id]
        child_id = self._reserve(parent.tokens)
        child = self.sequences[child_id]
        child.keys.copy_(parent.keys)
        child.values.copy_(parent.values)
        child.num_computed = parent.num_computed
        return child_id

    def append(self, seq_id: int, token: int) -> None:
        seq = self.sequences[seq_id]
        if len(seq.tokens) >= self.max_len:
            raise ValueError(f"sequence {seq_id} is past its {self.max_len}-token reservation")
        seq.tokens.append(token)

    def begin_step(self, seq_ids: list[int]) -> DenseStep:
        return DenseStep([self.sequences[i] for i in seq_ids], self.device)

    def end_step(self, step: DenseStep) -> None:
        for seq in step.seqs:
            seq.num_computed = len(seq.tokens)

    @property
    def nbytes(self) -> int:
        return sum(s.keys.nbytes + s.values.nbytes for s in self.sequences.values())
