"""Small builders shared by the engine tests."""

from __future__ import annotations

import torch

from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import PoolConfig
from lab.serving.synthetic_kv import SyntheticKV


def make_manager(num_blocks: int = 16, block_size: int = 4, num_layers: int = 1,
                 prefix: bool = True, **kw) -> KVCacheManager:
    config = PoolConfig(num_blocks=num_blocks, block_size=block_size, num_layers=num_layers,
                        num_kv_heads=2, head_dim=8, **kw)
    return KVCacheManager(config, torch.device("cpu"), enable_prefix_cache=prefix)


def prefill(m: KVCacheManager, kv: SyntheticKV, prompt: list[int]) -> int:
    """Admit a prompt and write K/V for its uncached positions; return the sequence id."""
    seq = m.add_sequence(prompt)
    start = seq.num_cached_tokens
    k, v = kv.keys_values(prompt[start:], start)
    m.write(seq.seq_id, start, k, v)
    return seq.seq_id


def decode(m: KVCacheManager, kv: SyntheticKV, seq_id: int, token: int) -> int:
    slot = m.append_token(seq_id, token)
    pos = len(m.sequences[seq_id]) - 1
    k, v = kv.keys_values([token], pos)
    m.write(seq_id, pos, k, v)
    return slot
