"""Contiguous reservations over a real K/V tensor: a guess, growth in place, moves that really
copy, waste, and the kernel check that proves a move kept every byte."""

from __future__ import annotations

import pytest
import torch

from kernels.backend import device
from lab.memory.contiguous import NoContiguousRegion
from lab.memory.contiguous_kv import ContiguousKVCache, Growth, Move
from lab.memory.kernel_check import check_expected
from lab.memory.kv_pool import PoolConfig

# 64 slots; a token's K and V: 2 x 1 layer x 2 KV heads x 8 dims x 4 bytes = 128 bytes
CONFIG = PoolConfig(num_blocks=4, block_size=16, num_kv_heads=2, head_dim=8)
BYTES_PER_TOKEN = 128


def kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (1, n, CONFIG.num_kv_heads, CONFIG.head_dim)  # [layers, n, kv_heads, head_dim]
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def decode(cache: ContiguousKVCache, req_id: int, n: int, seed: int) -> torch.Tensor:
    """n decode tokens, one at a time; returns their keys [n, kv_heads, head_dim]."""
    keys, values = kv(n, seed)
    for i in range(n):
        slot = cache.append(req_id)
        cache.write([slot], keys[:, i:i + 1], values[:, i:i + 1])
    return keys[0]


def test_a_move_copies_the_kv_and_frees_the_old_region() -> None:
    cache = ContiguousKVCache(CONFIG, guess=4)
    a_keys, a_values = kv(4, seed=1)
    cache.admit(0, 4, a_keys, a_values)  # A: slots 0-7 (prompt 4 + guess 4)
    cache.admit(1, 4, *kv(4, seed=2))  # B: slots 8-15, right after A
    decoded = decode(cache, 0, 4, seed=3)  # A fills its 8 slots
    before_k, before_v = (t.clone() for t in cache.read_kv(0))
    assert cache.is_full(0) and cache.allocator.room_after(0) == 0

    move = cache.grow(0)  # prompt 4 + 2 x 4: 12 slots, first fit after B
    assert move == Move(0, src=0, dst=16, old_size=8, new_size=12, tokens=8,
                        nbytes=8 * BYTES_PER_TOKEN, seconds=move.seconds)
    assert move.seconds is not None and move.seconds >= 0
    region = cache.allocator.regions[0]
    assert (region.start, region.reserved, region.used) == (16, 12, 8)
    after_k, after_v = cache.read_kv(0)
    assert torch.equal(after_k, before_k) and torch.equal(after_v, before_v)
    assert torch.equal(after_k.cpu(), torch.cat([a_keys[0], decoded]))
    assert cache.allocator.holes()[0] == (0, 8)  # the old region is free
    assert cache.bytes_copied == 8 * BYTES_PER_TOKEN and cache.moves == [move]
    events = [e for e in cache.events.events if e.kind == "copy"]
    assert [e.detail["reason"] for e in events] == ["move"]
    cache.check_invariants()


def test_growth_in_place_when_the_next_slots_are_free() -> None:
    cache = ContiguousKVCache(CONFIG, guess=4)
    cache.admit(0, 4, *kv(4, seed=1))
    decode(cache, 0, 4, seed=2)
    before = cache.read_kv(0)[0].clone()
    growth = cache.grow(0)
    assert growth == Growth(0, start=0, old_size=8, new_size=12)
    assert cache.moves == [] and cache.bytes_copied == 0
    assert torch.equal(cache.read_kv(0)[0], before)
    decode(cache, 0, 4, seed=3)
    assert cache.is_full(0) and cache.grow(0) == Growth(0, 0, 12, 20)  # 4 + 2 x 8


def test_a_guess_high_enough_never_grows_and_its_waste_is_counted() -> None:
    cache = ContiguousKVCache(CONFIG, guess=20)
    cache.admit(0, 4, *kv(4, seed=1))  # 24 slots reserved
    decode(cache, 0, 6, seed=2)  # the request stops after 6 output tokens
    assert not cache.is_full(0) and cache.moves == [] and cache.growths == []
    usage = cache.picture().usage
    assert (usage.reserved, usage.used, usage.internal) == (24, 10, 14)
    # A 30-token prompt needs 30 + 20 = 50 slots: 54 slots are not in use, but 14 of them
    # are A's reservation and only 40 are free, so it must wait.
    assert not cache.can_admit(1, 30, 30)
    with pytest.raises(NoContiguousRegion, match="no contiguous region of 50"):
        cache.admit(1, 30, held=30)
    assert list(cache.allocator.regions) == [0]


def test_counts_and_bytes_by_hand() -> None:
    """A and B (prompt 4, guess 2: 6 slots each) side by side at 0-5 and 6-11; A decodes 8
    tokens, B 4, turn by turn. A fills up first: 8 slots, not free after it (B), not in the
    6-slot hole before it: it moves to 12-19 (6 tokens copied). B fills up: A now sits right
    after it, so it moves to 20-27 (6 tokens). A fills 8 slots: 12 needed, the hole 0-11 holds
    them, so it moves back to 0 (8 tokens). Three moves, (6 + 6 + 8) x 128 bytes."""
    cache = ContiguousKVCache(CONFIG, guess=2, store_kv=False)
    cache.admit(0, 4, held=4)
    cache.admit(1, 4, held=4)
    grown = []
    for turn in range(8):
        for req_id in (0, 1) if turn < 4 else (0,):
            if cache.is_full(req_id):
                grown.append(cache.grow(req_id))
            cache.append(req_id)
    assert grown == [Move(0, 0, 12, 6, 8, 6, 6 * BYTES_PER_TOKEN, None),
                     Move(1, 6, 20, 6, 8, 6, 6 * BYTES_PER_TOKEN, None),
                     Move(0, 12, 0, 8, 12, 8, 8 * BYTES_PER_TOKEN, None)]
    assert cache.bytes_copied == 20 * BYTES_PER_TOKEN == 2560 and cache.growths == []
    assert cache.picture().usage.internal == 0  # A: 12 of 12, B: 8 of 8


def test_no_hole_for_the_doubled_region_changes_nothing() -> None:
    cache = ContiguousKVCache(CONFIG, guess=4)
    cache.admit(0, 4, held=8)  # 0-7, full
    cache.admit(1, 40, held=40)  # 8-51
    cache.admit(2, 8, held=8)  # 52-63: the tensor is full
    before = [(r.start, r.reserved, r.used) for r in cache.picture().regions]
    assert cache.grow(0) is None
    assert [(r.start, r.reserved, r.used) for r in cache.picture().regions] == before
    assert cache.moves == [] and cache.growths == []


def test_a_preempted_full_region_comes_back_with_the_growth_it_asked_for() -> None:
    cache = ContiguousKVCache(CONFIG, guess=4)
    cache.admit(0, 4, held=8)
    cache.preempt(0)
    assert 0 not in cache.allocator.regions
    assert cache.reservation(0, 4, 8) == 12  # prompt 4 + 2 x 4
    assert cache.events.events[-2].kind == "preempt"


def test_the_kernel_check_reads_the_moved_region_and_catches_a_bad_copy() -> None:
    cache = ContiguousKVCache(CONFIG, guess=4)
    prompt = kv(4, seed=1)
    cache.admit(0, 4, *prompt)
    cache.admit(1, 4, *kv(4, seed=2))
    keys, values = kv(4, seed=3)
    for i in range(4):
        cache.write([cache.append(0)], keys[:, i:i + 1], values[:, i:i + 1])
    assert isinstance(cache.grow(0), Move)
    expected = [(torch.cat([prompt[0][0], keys[0]]), torch.cat([prompt[1][0], values[0]]))]
    query = torch.randn(1, 4, CONFIG.head_dim, generator=torch.Generator().manual_seed(4))
    pool = cache.pool
    check = check_expected(pool.key_caches[0], pool.value_caches[0], cache.slot_tables([0]),
                            query, expected)
    assert check.ok and check.num_seqs == 1
    # A copy that shifted the region by one slot would read the wrong K/V.
    region = cache.allocator.regions[0]
    shifted = [list(range(region.start + 1, region.start + 1 + region.used))]
    assert not check_expected(pool.key_caches[0], pool.value_caches[0], shifted, query,
                               expected).ok
    assert pool.key_caches[0].device == device()
