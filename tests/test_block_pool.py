"""The block pool's contract, for any input: a stateful property test against a plain model.

Every call is drawn from valid and invalid inputs alike (ids out of range, negative, not ints,
named twice; freeing or sharing free blocks; hits on blocks without a hash; caching a block
twice). A call the model deems valid must succeed and do exactly what the model does (vLLM's
free order included); any other must raise the typed error it predicts and change nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lab.memory.block_pool import (
    BlockHash,
    BlockPool,
    BlockStateError,
    InvalidBlockRequest,
    PoolExhausted,
)
from lab.memory.events import EventLog

N = 6
# Few hash values, so that several blocks hold one, and one collision (same value, other tokens).
HASHES = [BlockHash("a", None, (1,)), BlockHash("b", "a", (2,)), BlockHash("a", None, (9,))]
ids = st.one_of(st.integers(-2, N + 1), st.sampled_from(["1", 1.0, None, True]))


class PoolModel:
    """What the pool should hold: ref counts, the free queue in order, hashes by block."""

    def __init__(self) -> None:
        self.refs = [0] * N
        self.queue = list(range(N))
        self.hashes: dict[int, BlockHash] = {}
        self.order: list[int] = []  # hashed blocks, in the order they got their hash

    def error(self, block_id) -> type | None:
        if type(block_id) is not int or not 0 <= block_id < N:
            return InvalidBlockRequest
        return None

    def lookup(self, h: BlockHash) -> int | None:
        return next((b for b in self.order if self.hashes[b] == h), None)


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(N, EventLog())
        self.model = PoolModel()

    def _state(self):
        p = self.pool
        return (list(p.ref_counts), p.free_queue(), list(p.block_hash),
                {h: list(b) for h, b in p.cached.items()}, len(p.events))

    def _call(self, error: type | None, fn, *args):
        """Run fn(*args): it must raise `error` and change nothing, or succeed if None."""
        if error is None:
            return fn(*args)
        before = self._state()
        with pytest.raises(error):
            fn(*args)
        assert self._state() == before, f"{fn.__name__}{args} changed the pool and raised"
        return None

    @rule(n=st.one_of(st.integers(-2, N + 2), st.sampled_from([1.5, "2", None])))
    def allocate(self, n):
        model = self.model
        error = (InvalidBlockRequest if type(n) is not int or n < 0 else
                 PoolExhausted if n > len(model.queue) else None)
        taken = self._call(error, self.pool.allocate, n)
        if error is None:
            assert taken == model.queue[:n]
            del model.queue[:n]
            for b in taken:
                model.refs[b] = 1
                if b in model.hashes:  # handed out again: its hash is evicted
                    del model.hashes[b]
                    model.order.remove(b)

    @rule(data=st.data())
    def free(self, data):
        model = self.model
        used = [b for b in range(N) if model.refs[b]]
        block_ids = data.draw(st.one_of(
            st.lists(st.sampled_from(used), unique=True) if used else st.just([]),
            st.lists(ids, max_size=4)))
        # A malformed call (an id not of this pool, or named twice) first, then the state.
        error = next((e for e in map(model.error, block_ids) if e), None)
        if error is None and len(set(block_ids)) != len(block_ids):
            error = InvalidBlockRequest
        if error is None and any(model.refs[b] < 1 for b in block_ids):
            error = BlockStateError
        self._call(error, self.pool.free, block_ids)
        if error is None:
            front = []
            for b in block_ids:
                model.refs[b] -= 1
                if model.refs[b] == 0:
                    # vLLM 0.33: a block holding a hash to the back, one without to the front
                    (model.queue if b in model.hashes else front).append(b)
            model.queue[:0] = front

    @rule(block_id=ids)
    def share(self, block_id):
        error = self.model.error(block_id)
        if error is None and self.model.refs[block_id] < 1:
            error = BlockStateError
        self._call(error, self.pool.share, block_id)
        if error is None:
            self.model.refs[block_id] += 1

    @rule(block_id=ids)
    def touch(self, block_id):
        model = self.model
        error = model.error(block_id)
        if error is None and block_id not in model.hashes:
            error = BlockStateError
        self._call(error, self.pool.touch, block_id)
        if error is None:
            if model.refs[block_id] == 0:
                model.queue.remove(block_id)
            model.refs[block_id] += 1

    @rule(block_id=ids, h=st.sampled_from(HASHES))
    def cache(self, block_id, h):
        model = self.model
        error = model.error(block_id)
        if error is None and (model.refs[block_id] < 1 or block_id in model.hashes):
            error = BlockStateError
        self._call(error, self.pool.cache, block_id, h)
        if error is None:
            model.hashes[block_id] = h
            model.order.append(block_id)

    @rule(h=st.sampled_from(HASHES))
    def lookup(self, h):
        assert self.pool.lookup(h) == self.model.lookup(h)

    @invariant()
    def pool_matches_the_model(self):
        p, model = self.pool, self.model
        p.check_invariants()
        assert p.ref_counts == model.refs
        assert p.free_queue() == model.queue
        assert {b: h for b, h in enumerate(p.block_hash) if h is not None} == model.hashes
        for value, blocks in p.cached.items():  # each hash's blocks, earliest cached first
            assert blocks == [b for b in model.order if model.hashes[b].value == value]


PoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                         deadline=None)
test_block_pool_contract = PoolMachine.TestCase


def test_the_two_bugs_of_the_old_pool_are_refused_before_any_change():
    pool = BlockPool(4)
    (b,) = pool.allocate(1)
    with pytest.raises(InvalidBlockRequest):
        pool.free([b, b])  # one reference: freeing it twice would take the count to -1
    with pytest.raises(InvalidBlockRequest):
        pool.free([-1])  # Python's negative index would free the last block
    assert pool.ref_counts == [1, 0, 0, 0] and pool.free_queue() == [1, 2, 3]
