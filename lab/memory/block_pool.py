"""The block pool: physical block ids, ref counts, the free queue and the prefix-cache map.

It knows nothing about tensors or sequences; `KVCacheManager` drives it. Every public
mutator either succeeds or raises before changing anything.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from lab.memory.events import EventLog


class KVCacheError(Exception):
    """Base class of the engine's typed errors."""


class PoolExhausted(KVCacheError):
    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"the KV pool is exhausted: {needed} block(s) needed, {free} free")
        self.needed = needed
        self.free = free


@dataclass(frozen=True)
class BlockHash:
    """A full block's identity for the prefix cache: a hash chained over all earlier blocks."""

    value: str
    parent: str | None
    tokens: tuple[int, ...]


class BlockPool:
    def __init__(self, num_blocks: int, events: EventLog | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.events = events if events is not None else EventLog()
        self.ref_counts = [0] * num_blocks
        # Free queue: front = next to be allocated (and so evicted). OrderedDict gives O(1)
        # pop from the front, push to the back and removal from the middle (a prefix hit on a
        # cached free block takes it out of the queue).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[str, int] = {}  # hash value -> physical block id
        self.collisions = 0  # lookups whose hash matched but whose tokens did not

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_queue(self) -> list[int]:
        """Free block ids, the next one to be allocated first."""
        return list(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The cached block holding exactly these tokens after exactly this parent, if any."""
        block_id = self.cached.get(block_hash.value)
        if block_id is None:
            return None
        if self.block_hash[block_id] != block_hash:  # same hash value, different content
            self.collisions += 1
            return None
        return block_id

    # -- mutators --------------------------------------------------------------------------
    def allocate(self, n: int, seq_id: int | None = None) -> list[int]:
        if n > self.num_free:
            raise PoolExhausted(n, self.num_free)
        taken = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            old = self.block_hash[block_id]
            if old is not None:  # reusing a cached free block drops its cached contents
                del self.cached[old.value]
                self.block_hash[block_id] = None
                self.events.emit("evict", seq_id, block_id, hash=old.value)
            self.ref_counts[block_id] = 1
            self.events.emit("allocate", seq_id, block_id)
            taken.append(block_id)
        return taken

    def share(self, block_id: int, seq_id: int | None = None) -> None:
        """One more block table points at a live block (fork)."""
        if self.ref_counts[block_id] < 1:
            raise KVCacheError(f"cannot share block {block_id}: it is not in use")
        self.ref_counts[block_id] += 1
        self.events.emit("share", seq_id, block_id, ref_count=self.ref_counts[block_id])

    def touch(self, block_id: int, seq_id: int | None = None) -> None:
        """A prefix-cache hit: take a reference, pulling the block out of the free queue."""
        if self.ref_counts[block_id] == 0:
            del self._free[block_id]
        self.ref_counts[block_id] += 1
        self.events.emit("hit", seq_id, block_id, ref_count=self.ref_counts[block_id])

    def free(self, block_ids: list[int], seq_id: int | None = None) -> None:
        """Drop one reference to each block, in the order given; blocks at zero join the back
        of the free queue (cached ones keep their hash until they are reused)."""
        for block_id in block_ids:
            if self.ref_counts[block_id] < 1:
                raise KVCacheError(f"block {block_id} freed more often than referenced")
        for block_id in block_ids:
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free[block_id] = None
            self.events.emit("free", seq_id, block_id, ref_count=self.ref_counts[block_id])

    def cache(self, block_id: int, block_hash: BlockHash, seq_id: int | None = None) -> bool:
        """Register a full block under its hash. False when that content is cached already."""
        if block_hash.value in self.cached or self.block_hash[block_id] is not None:
            return False
        self.block_hash[block_id] = block_hash
        self.cached[block_hash.value] = block_id
        self.events.emit("cache", seq_id, block_id, hash=block_hash.value)
        return True

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        free = set(self._free)
        assert len(free) == len(self._free)
        for block_id, refs in enumerate(self.ref_counts):
            assert refs >= 0, f"block {block_id} has ref count {refs}"
            assert (refs == 0) == (block_id in free), f"block {block_id}: refs {refs}, free queue"
        assert self.num_free + self.num_used == self.num_blocks
        for value, block_id in self.cached.items():
            assert self.block_hash[block_id] is not None
            assert self.block_hash[block_id].value == value
        assert sum(h is not None for h in self.block_hash) == len(self.cached)
