"""The block pool: physical block ids, ref counts, the free queue and the prefix-cache map.

It knows nothing about tensors or sequences; `KVCacheManager` drives it. It behaves like vLLM
v1's (0.33) `BlockPool`: the free queue is handed out from its front; a block whose last
reference is dropped goes to the back if it holds a block hash (cached blocks are evicted
least recently freed first) and to the front if it does not (a partial block has nothing
worth keeping, so it is reused first); a hash may name several blocks (no de-duplication) and
a lookup takes the one that got the hash first.

Every public mutator checks its whole input first and raises a typed error (a KVCacheError)
before changing anything.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from lab.memory.events import EventLog


class KVCacheError(Exception):
    """Base class of the engine's typed errors."""


class PoolExhausted(KVCacheError):
    def __init__(self, needed: int, free: int) -> None:
        super().__init__(f"the KV pool is exhausted: {needed} block(s) needed, {free} free")
        self.needed = needed
        self.free = free


class InvalidBlockRequest(KVCacheError, ValueError):
    """A malformed call: an id that is not an int in [0, num_blocks), an id named twice, a
    block count that is not a non-negative int."""


class BlockStateError(KVCacheError):
    """A well-formed call that the block's state forbids: freeing or sharing a free block,
    a prefix hit on a block without a hash, caching a free block or one already cached."""


class BlockHash(NamedTuple):
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
        # Free queue: front = next to be allocated (and so evicted). OrderedDict is a linked
        # list in C: O(1) pop from the front, push to either end and removal from the middle
        # (a prefix hit on a cached free block takes it out of the queue).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        # hash value -> the blocks holding it, earliest cached first. Several blocks hold one
        # hash when a prompt's capped last block is recomputed while its content is cached.
        self.cached: dict[str, list[int]] = {}
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
        return n <= len(self._free)

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The earliest-cached block holding exactly these tokens after exactly this parent."""
        holders = self.cached.get(block_hash.value)
        if holders is None:
            return None
        for block_id in holders:
            if self.block_hash[block_id] == block_hash:
                return block_id
        self.collisions += 1  # same hash value, different content
        return None

    # -- checks ----------------------------------------------------------------------------
    def _check_in_use(self, block_ids: Sequence[int], action: str) -> None:
        """Every id is a block of this pool, named once, and in use; else a typed error."""
        refs, n = self.ref_counts, self.num_blocks
        for block_id in block_ids:  # one test on the path every valid call takes
            if not (type(block_id) is int and 0 <= block_id < n and refs[block_id] > 0):
                self._refuse(block_ids, action)
        if len(block_ids) > 1 and len(set(block_ids)) != len(block_ids):
            self._refuse(block_ids, action)

    def _refuse(self, block_ids: Sequence[int], action: str, need_hash: bool = False) -> None:
        """Raise the error for the first thing wrong: a malformed call (an id that is not a
        block of this pool, or one named twice), then a block in the wrong state."""
        for block_id in block_ids:
            if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
                raise InvalidBlockRequest(f"cannot {action} {block_id!r}: not a block id of "
                                          f"this pool (ints 0 to {self.num_blocks - 1})")
        if len(set(block_ids)) != len(block_ids):
            raise InvalidBlockRequest(f"cannot {action} {list(block_ids)}: a block is named twice")
        for block_id in block_ids:
            if need_hash and self.block_hash[block_id] is None:
                raise BlockStateError(f"cannot {action} block {block_id}: it holds no hash")
            if not need_hash and self.ref_counts[block_id] < 1:
                raise BlockStateError(f"cannot {action} block {block_id}: it is free")
        raise AssertionError(f"{action} {list(block_ids)} refused without a reason")

    # -- mutators --------------------------------------------------------------------------
    def allocate(self, n: int, seq_id: int | None = None) -> list[int]:
        """Take n blocks from the front of the free queue; a cached one loses its hash."""
        if type(n) is not int or n < 0:
            raise InvalidBlockRequest(f"cannot allocate {n!r} blocks")
        free = self._free
        if n > len(free):
            raise PoolExhausted(n, len(free))
        keep = self.events.keep
        taken = []
        for _ in range(n):
            block_id = free.popitem(last=False)[0]
            if self.block_hash[block_id] is not None:
                self._evict(block_id, seq_id)
            self.ref_counts[block_id] = 1
            if keep:
                self.events.emit("allocate", seq_id, block_id)
            taken.append(block_id)
        return taken

    def _evict(self, block_id: int, seq_id: int | None) -> None:
        """A cached free block is handed out again: it no longer holds its content."""
        value = self.block_hash[block_id].value
        holders = self.cached[value]
        holders.remove(block_id)
        if not holders:
            del self.cached[value]
        self.block_hash[block_id] = None
        if self.events.keep:  # skip building the detail of an event not kept
            self.events.emit("evict", seq_id, block_id, hash=value)

    def share(self, block_id: int, seq_id: int | None = None) -> None:
        """One more block table points at a live block (fork)."""
        self._check_in_use((block_id,), "share")
        self.ref_counts[block_id] += 1
        if self.events.keep:
            self.events.emit("share", seq_id, block_id, ref_count=self.ref_counts[block_id])

    def touch(self, block_id: int, seq_id: int | None = None) -> None:
        """A prefix-cache hit: take a reference, pulling the block out of the free queue."""
        if not (type(block_id) is int and 0 <= block_id < self.num_blocks
                and self.block_hash[block_id] is not None):  # a hit is a block holding a hash
            self._refuse((block_id,), "take a prefix hit on", need_hash=True)
        if self.ref_counts[block_id] == 0:
            del self._free[block_id]
        self.ref_counts[block_id] += 1
        if self.events.keep:
            self.events.emit("hit", seq_id, block_id, ref_count=self.ref_counts[block_id])

    def free(self, block_ids: Sequence[int], seq_id: int | None = None) -> None:
        """Drop one reference to each block, in the order given (a sequence frees its table
        tail first). A block at zero joins the free queue: at the back if it holds a hash (it
        stays hittable until it is handed out again), at the front if not (the hashless ones
        of one call go there together, in the order given)."""
        self._check_in_use(block_ids, "free")
        refs, free, keep = self.ref_counts, self._free, self.events.keep
        front = []
        for block_id in block_ids:
            refs[block_id] -= 1
            if refs[block_id] == 0:
                if self.block_hash[block_id] is None:
                    front.append(block_id)
                else:
                    free[block_id] = None
            if keep:
                self.events.emit("free", seq_id, block_id, ref_count=refs[block_id])
        for block_id in reversed(front):
            free[block_id] = None
            free.move_to_end(block_id, last=False)

    def cache(self, block_id: int, block_hash: BlockHash, seq_id: int | None = None) -> None:
        """Register a full, live block under its hash, even if other blocks hold it already."""
        self._check_in_use((block_id,), "cache")
        if self.block_hash[block_id] is not None:
            raise BlockStateError(f"block {block_id} is cached already")
        self.block_hash[block_id] = block_hash
        self.cached.setdefault(block_hash.value, []).append(block_id)
        if self.events.keep:
            self.events.emit("cache", seq_id, block_id, hash=block_hash.value)

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        free = set(self._free)
        for block_id, refs in enumerate(self.ref_counts):
            assert refs >= 0, f"block {block_id} has ref count {refs}"
            assert (refs == 0) == (block_id in free), f"block {block_id}: refs {refs}, free queue"
        assert self.num_free + self.num_used == self.num_blocks
        holders = [b for blocks in self.cached.values() for b in blocks]
        assert len(holders) == len(set(holders)), "a block cached under two hashes"
        for value, blocks in self.cached.items():
            assert blocks, f"hash {value} names no block"
            assert all(self.block_hash[b] is not None and self.block_hash[b].value == value
                       for b in blocks), value
        assert sum(h is not None for h in self.block_hash) == len(holders)
