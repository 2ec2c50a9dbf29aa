"""Swap preemption: a sequence's blocks copied to a CPU pool and back.

The CPU pool has its own `BlockPool` of ids and, when the device pool holds tensors, its own
K/V tensors in the same layout [num_cpu_blocks, block_size, num_kv_heads, head_dim] per layer.
Swap-out copies every block of the sequence into CPU blocks and frees the device blocks;
swap-in allocates device blocks for the same tokens (prefix-cache hits are reused as they are)
and copies the rest back, so the K/V read through the new block table is exactly what was there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.memory.block_pool import BlockPool, PoolExhausted
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager


@dataclass
class SwappedSequence:
    tokens: list[int]
    num_written: int
    cpu_blocks: list[int]  # logical index -> CPU block id

    @property
    def num_blocks(self) -> int:
        return len(self.cpu_blocks)


class SwapSpace:
    def __init__(self, manager: KVCacheManager, num_cpu_blocks: int) -> None:
        self.manager = manager
        self.blocks = BlockPool(num_cpu_blocks)
        self.bytes_per_block = manager.config.bytes_per_block
        self.key_caches: list[torch.Tensor] = []
        self.value_caches: list[torch.Tensor] = []
        if manager.pool is not None:  # real copies only when the device pool has tensors
            self.key_caches = [torch.empty((num_cpu_blocks, *t.shape[1:]), dtype=t.dtype)
                               for t in manager.pool.key_caches]  # [cpu_blocks, bs, kv_heads, d]
            self.value_caches = [torch.empty_like(k) for k in self.key_caches]

    def can_swap_out(self, seq_id: int) -> bool:
        return self.blocks.can_allocate(self.manager.sequences[seq_id].num_blocks)

    def swap_out(self, seq_id: int) -> SwappedSequence:
        """Copy the sequence's blocks to the CPU pool and free its device blocks."""
        m = self.manager
        seq = m.sequences[seq_id]
        cpu = self.blocks.allocate(seq.num_blocks, seq_id)
        if self.key_caches:
            src = torch.tensor(seq.block_table, dtype=torch.int64, device=m.pool.device)  # [n]
            dst = torch.tensor(cpu, dtype=torch.int64)  # [n]
            for layer, (k, v) in enumerate(zip(m.pool.key_caches, m.pool.value_caches)):
                self.key_caches[layer][dst] = k[src].cpu()  # [n, block_size, kv_heads, head_dim]
                self.value_caches[layer][dst] = v[src].cpu()
        m.events.emit("swap", seq_id, None, direction="out", device_blocks=list(seq.block_table),
                      cpu_blocks=cpu)
        swapped = SwappedSequence(list(seq.tokens), seq.num_written, cpu)
        m.free(seq_id)
        return swapped

    def blocks_to_swap_in(self, swapped: SwappedSequence) -> int:
        return self.manager.blocks_needed(swapped.tokens)

    def swap_in(self, swapped: SwappedSequence) -> int:
        """Bring a swapped sequence back; return its new sequence id."""
        m = self.manager
        needed = self.blocks_to_swap_in(swapped)
        if needed > m.blocks.num_free:
            raise PoolExhausted(needed, m.blocks.num_free)
        seq = m.add_sequence(swapped.tokens)
        hits = seq.num_cached_tokens // m.block_size  # leading blocks already holding this K/V
        fresh = seq.block_table[hits:]
        if self.key_caches and fresh:
            src = torch.tensor(swapped.cpu_blocks[hits:], dtype=torch.int64)  # [n]
            dst = torch.tensor(fresh, dtype=torch.int64, device=m.pool.device)  # [n]
            for layer, (k, v) in enumerate(zip(m.pool.key_caches, m.pool.value_caches)):
                k[dst] = self.key_caches[layer][src].to(k.device)
                v[dst] = self.value_caches[layer][src].to(v.device)
        m.events.emit("swap", seq.seq_id, None, direction="in", device_blocks=fresh,
                      cpu_blocks=swapped.cpu_blocks[hits:])
        written = max(swapped.num_written, seq.num_written)
        if written > seq.num_written:
            m.commit(seq.seq_id, written)
        self.blocks.free(swapped.cpu_blocks, seq.seq_id)
        assert seq.num_blocks == blocks_for(len(swapped.tokens), m.block_size)
        return seq.seq_id
