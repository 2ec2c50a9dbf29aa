"""Move a sequence's K/V to other physical blocks: real copies in the pool, block table updated.

This is what "the block table is only an address map" means in practice: after a relocation
the sequence's tokens live in different physical blocks, its block table points at them in the
same logical order, and attention over it gives the same output. Built on the manager's public
API (the block pool allocates and frees; `kernels.cache_ops.copy_blocks` moves the bytes).

The new blocks come from the front of the free queue, assigned to logical blocks in a seeded
shuffled order; the old blocks go back to the free queue (or stay live if another sequence
still shares them). Copied blocks are not registered in the prefix cache.
"""

from __future__ import annotations

import random

import torch

from kernels.cache_ops import copy_blocks
from lab.memory.block_pool import PoolExhausted
from lab.memory.cache_manager import KVCacheManager


def relocate(manager: KVCacheManager, seq_id: int, rng: random.Random) -> list[tuple[int, int]]:
    """Copy every block of `seq_id` to fresh blocks; return the (old, new) physical id pairs."""
    seq = manager.sequences[seq_id]
    if manager.pool is None:
        raise ValueError("relocation copies K/V: the manager needs a KV pool (store_kv=True)")
    if not manager.blocks.can_allocate(seq.num_blocks):
        raise PoolExhausted(seq.num_blocks, manager.blocks.num_free)
    fresh = manager.blocks.allocate(seq.num_blocks, seq_id)
    rng.shuffle(fresh)
    moves = list(zip(seq.block_table, fresh))
    pairs = torch.tensor(moves, dtype=torch.int64, device=manager.pool.device)  # [n, 2]
    for key_cache, value_cache in zip(manager.pool.key_caches, manager.pool.value_caches):
        copy_blocks(key_cache, value_cache, pairs)
    for old, new in moves:
        manager.events.emit("copy", seq_id, new, src=old, dst=new, reason="relocate")
    manager.blocks.free(list(reversed(seq.block_table)), seq_id)
    seq.block_table[:] = fresh
    return moves
