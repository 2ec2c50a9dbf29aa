"""A sequence: its tokens and its block table (logical block index -> physical block id)."""

from __future__ import annotations

from dataclasses import dataclass, field


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens: the ceiling of num_tokens / block_size."""
    return -(-num_tokens // block_size)


@dataclass(slots=True)  # slots: its fields are read on every token
class Sequence:
    seq_id: int
    block_size: int
    tokens: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_written: int = 0  # leading positions whose K/V is in the pool
    num_cached_tokens: int = 0  # leading prompt tokens found in the prefix cache at admission
    block_hashes: list[str] = field(default_factory=list)  # hash chain of the leading full blocks
    parent_id: int | None = None  # the sequence this one was forked from

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_blocks(self) -> int:
        return len(self.block_table)

    @property
    def tail_slots(self) -> int:
        """Allocated but unused slots in the last block: the only internal waste of paging."""
        return self.num_blocks * self.block_size - len(self.tokens)

    def slot(self, pos: int) -> int:
        """slot = block_table[pos // block_size] * block_size + pos % block_size."""
        if not 0 <= pos < self.num_blocks * self.block_size:
            raise IndexError(f"position {pos} is outside sequence {self.seq_id}'s blocks")
        return self.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def slots(self, start: int, end: int) -> list[int]:
        return [self.slot(pos) for pos in range(start, end)]

    def filled_in_block(self, logical_index: int) -> int:
        """How many of this sequence's tokens sit in its logical block `logical_index`."""
        return max(0, min(self.block_size, len(self.tokens) - logical_index * self.block_size))
