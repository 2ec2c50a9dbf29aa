"""A plain, immutable picture of the cache at one moment, for figures and counters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from lab.memory.block_pool import BlockPool
from lab.memory.block_table import Sequence

BlockStateName = Literal["free", "cached", "used"]


@dataclass(frozen=True)
class BlockState:
    block_id: int
    state: BlockStateName  # free: empty; cached: free but still holding a prefix-cache hash
    ref_count: int
    owners: tuple[int, ...]  # ids of the sequences whose block tables hold it
    filled: int  # slots holding a live token (the fullest holder's view)
    block_hash: str | None


@dataclass(frozen=True)
class SequenceState:
    seq_id: int
    num_tokens: int
    block_table: tuple[int, ...]
    num_cached_tokens: int
    parent_id: int | None


@dataclass(frozen=True)
class Usage:
    blocks_used: int
    blocks_free: int
    blocks_cached_free: int
    slots_allocated: int  # used blocks x block size
    slots_filled: int  # distinct physical slots that hold a live token
    tail_slots: int  # allocated but empty: internal fragmentation of the paged pool


@dataclass(frozen=True)
class Snapshot:
    num_blocks: int
    block_size: int
    blocks: tuple[BlockState, ...]
    sequences: tuple[SequenceState, ...]
    free_queue: tuple[int, ...]
    usage: Usage


def take_snapshot(pool: BlockPool, sequences: Iterable[Sequence], block_size: int) -> Snapshot:
    """The picture of a block pool and the sequences whose block tables point into it."""
    sequences = list(sequences)
    bs = block_size
    owners: dict[int, list[int]] = {}
    filled: dict[int, int] = {}
    for seq in sequences:
        for i, block_id in enumerate(seq.block_table):
            owners.setdefault(block_id, []).append(seq.seq_id)
            filled[block_id] = max(filled.get(block_id, 0), seq.filled_in_block(i))
    blocks = []
    for b in range(pool.num_blocks):
        h = pool.block_hash[b]
        state: BlockStateName = "used" if pool.ref_counts[b] else "cached" if h else "free"
        blocks.append(BlockState(b, state, pool.ref_counts[b], tuple(owners.get(b, ())),
                                 filled.get(b, 0), h.value if h else None))
    states = tuple(
        SequenceState(s.seq_id, len(s), tuple(s.block_table), s.num_cached_tokens, s.parent_id)
        for s in sequences)
    slots_filled = sum(filled.values())
    usage = Usage(pool.num_used, pool.num_free, sum(b.state == "cached" for b in blocks),
                  pool.num_used * bs, slots_filled, pool.num_used * bs - slots_filled)
    return Snapshot(pool.num_blocks, bs, tuple(blocks), states,
                    tuple(pool.free_queue()), usage)
