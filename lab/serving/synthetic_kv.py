"""Seeded stand-in keys, values and queries for the walkthrough pages (no model attached).

A token's K/V is a function of (seed, token id, position): two sequences with the same prefix
get the same K/V for it, as a real model would give them, so prefix caching and forks behave
as in a real engine. Values are random normal, never zeros.

Keys also carry a recency ramp along one direction per KV head that every query shares: a later
key scores higher against any query (by up to RECENCY_GAIN in softmax units, reached after
RECENCY_SPAN positions), as a real model's attention often favours recent tokens. So when the
kernel reads a sequence block by block, its running max usually rises on a later block and the
online softmax visibly rescales what it summed before.
"""

from __future__ import annotations

import math

import torch

from kernels.reference import AttentionCheck
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kernel_check import check_kernel
from lab.memory.kv_pool import PoolConfig

VOCAB = 1024  # distinct token rows in the tables
MAX_POS = 4096  # distinct position rows
RECENCY_GAIN = 8.0  # scaled-score rise from position 0 to RECENCY_SPAN and beyond
RECENCY_SPAN = 256


class SyntheticKV:
    def __init__(self, config: PoolConfig, seed: int = 0, num_heads: int | None = None) -> None:
        g = torch.Generator().manual_seed(seed)
        L, H, D = config.num_layers, config.num_kv_heads, config.head_dim
        self.num_heads = num_heads or H  # query heads; a multiple of the KV heads
        if self.num_heads % H:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({H})")
        self.dtype = config.dtype
        self.token_k = torch.randn(VOCAB, L, H, D, generator=g)  # [vocab, L, kv_heads, D]
        self.token_v = torch.randn(VOCAB, L, H, D, generator=g)
        self.pos_k = 0.5 * torch.randn(MAX_POS, L, H, D, generator=g)  # [max_pos, L, kv_heads, D]
        self.token_q = torch.randn(VOCAB, self.num_heads, D, generator=g)  # [vocab, heads, D]
        recency = torch.randn(L, H, D, generator=g)  # drawn last: the tables above are unchanged
        self.recency = recency / recency.norm(dim=-1, keepdim=True)  # [L, kv_heads, D], unit
        self.head_dim = D

    def keys_values(self, tokens: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of tokens at positions start.., each [num_layers, n, num_kv_heads, head_dim]."""
        ids = torch.tensor(tokens, dtype=torch.int64) % VOCAB  # [n]
        pos = torch.arange(start, start + len(tokens)) % MAX_POS  # [n]
        ramp = RECENCY_GAIN / RECENCY_SPAN * torch.arange(start, start + len(tokens)).clamp(
            max=RECENCY_SPAN).float()  # [n]
        k = (self.token_k[ids] + self.pos_k[pos]).transpose(0, 1)  # [L, n, kv_heads, D]
        k = k + ramp[None, :, None, None] * self.recency[:, None]  # the recency ramp
        v = self.token_v[ids].transpose(0, 1)  # [L, n, kv_heads, D]
        return k.contiguous().to(self.dtype), v.contiguous().to(self.dtype)

    def queries(self, tokens: list[int]) -> torch.Tensor:
        """Queries for the given tokens: [n, num_heads, head_dim]."""
        ids = torch.tensor(tokens, dtype=torch.int64) % VOCAB
        group = self.num_heads // self.recency.shape[1]
        shared = self.recency[0].repeat_interleave(group, dim=0)  # [heads, D]: each KV head's
        # sqrt(D) scales the ramp's q.k to softmax units (attention divides by sqrt(D))
        return (self.token_q[ids] + math.sqrt(self.head_dim) * shared).to(self.dtype)

    def write_appended(self, manager: KVCacheManager,
                       appended: list[tuple[int, int, int]]) -> None:
        """Store the K/V of tokens just appended, (seq_id, position, token) each, in one pool
        write, then mark them written."""
        if appended:
            parts = [self.keys_values([tok], pos) for _, pos, tok in appended]
            keys = torch.cat([k for k, _ in parts], dim=1)  # [L, num_appended, kv_heads, D]
            values = torch.cat([v for _, v in parts], dim=1)
            slots = [manager.sequences[s].slot(pos) for s, pos, _ in appended]
            manager.pool.write(slots, keys, values)
        for seq_id, pos, _ in appended:
            manager.commit(seq_id, pos + 1)

    def check_newest(self, manager: KVCacheManager, seq_ids: list[int]) -> AttentionCheck:
        """The kernel vs dense attention, each sequence's newest token as the query."""
        newest = [manager.sequences[s].tokens[-1] for s in seq_ids]
        return check_kernel(manager, seq_ids, self.queries(newest))  # [num_seqs, heads, D]
