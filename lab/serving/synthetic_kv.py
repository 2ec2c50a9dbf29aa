"""Seeded stand-in keys, values and queries for the walkthrough pages (no model attached).

A token's K/V is a function of (seed, token id, position): two sequences with the same prefix
get the same K/V for it, as a real model would give them, so prefix caching and forks behave
as in a real engine. Values are random normal, never zeros.
"""

from __future__ import annotations

import torch

from kernels.reference import AttentionCheck
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kernel_check import check_kernel
from lab.memory.kv_pool import PoolConfig

VOCAB = 1024  # distinct token rows in the tables
MAX_POS = 4096  # distinct position rows


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

    def keys_values(self, tokens: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of tokens at positions start.., each [num_layers, n, num_kv_heads, head_dim]."""
        ids = torch.tensor(tokens, dtype=torch.int64) % VOCAB  # [n]
        pos = torch.arange(start, start + len(tokens)) % MAX_POS  # [n]
        k = (self.token_k[ids] + self.pos_k[pos]).transpose(0, 1)  # [L, n, kv_heads, D]
        v = self.token_v[ids].transpose(0, 1)  # [L, n, kv_heads, D]
        return k.contiguous().to(self.dtype), v.contiguous().to(self.dtype)

    def queries(self, tokens: list[int]) -> torch.Tensor:
        """Queries for the given tokens: [n, num_heads, head_dim]."""
        ids = torch.tensor(tokens, dtype=torch.int64) % VOCAB
        return self.token_q[ids].to(self.dtype)

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
