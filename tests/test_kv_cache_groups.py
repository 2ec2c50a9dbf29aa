"""The rules of KV cache groups on small cases worked by hand (vLLM 0.33's hybrid manager).

Block size 4 throughout unless said otherwise; "S" is the sliding-window group, "F" the full
one. The golden traces check the same rules at scale (tests/test_hybrid_conformance.py).
"""

from __future__ import annotations

import pytest

from lab.memory.hybrid_cache_manager import HybridKVCacheManager
from lab.memory.kv_cache_groups import (
    NULL_BLOCK,
    ChunkedLocal,
    FullAttention,
    SlidingWindow,
    group_spec,
)

F, N = FullAttention(), NULL_BLOCK


def manager(*groups, num_blocks: int = 20, batched: int = 16) -> HybridKVCacheManager:
    return HybridKVCacheManager(groups, num_blocks=num_blocks, block_size=4,
                                max_num_batched_tokens=batched, max_model_len=64,
                                record_events=False)


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


# -- the rules of each group kind ----------------------------------------------------------
def test_skipped_tokens_per_kind() -> None:
    assert [F.skipped_tokens(c) for c in (0, 9, 100)] == [0, 0, 0]
    # window 6: token c sees [c - 5, c]
    assert [SlidingWindow(6).skipped_tokens(c) for c in (0, 5, 6, 9, 13)] == [0, 0, 1, 4, 8]
    # chunk 8: token c sees its chunk only, from c // 8 * 8
    assert [ChunkedLocal(8).skipped_tokens(c) for c in (7, 8, 13, 16)] == [0, 8, 8, 16]


def test_admission_caps() -> None:
    # The realistic traces: block 16, 256 tokens a step, max_model_len 2048.
    # Window 128: cdiv(127 + 256, 16) + 1 = 24 + 1; chunk 64: cdiv(64 + 256, 16) = 20.
    assert SlidingWindow(128).admission_cap(16, 256, 2048) == 25
    assert ChunkedLocal(64).admission_cap(16, 256, 2048) == 20
    assert F.admission_cap(16, 256, 2048) is None
    # max_model_len binds: cdiv(min(127 + 256, 100), 16) + 1 = 7 + 1
    assert SlidingWindow(128).admission_cap(16, 256, 100) == 8


def test_sliding_window_hit_scans_right_to_left() -> None:
    cached = {1, 2, 4}  # block index -> cached?
    at = {i: (10 + i,) for i in cached}.get
    # window 8, block 4: a hit needs cdiv(7, 4) = 2 consecutive cached blocks ending at a
    # boundary. From 24 tokens (6 blocks) down: 5 misses, 4 hits (run 1), 3 misses, 2 and 1
    # hit: the run ends at block 2, so the hit is 12 tokens, null before block 1.
    assert SlidingWindow(8).longest_hit(at, 24, 4) == [None, (11,), (12,)]
    # No run of 2 anywhere, but a shorter run from position 0 is still a hit.
    assert SlidingWindow(8).longest_hit({0: (7,)}.get, 24, 4) == [(7,)]
    assert SlidingWindow(8).longest_hit({3: (7,)}.get, 24, 4) == []


def test_chunked_local_hit_starts_at_the_last_chunk_start() -> None:
    # chunk 8, block 4. Limit 15: tokens 0-7 lie before the chunk start 8, so blocks 0 and 1
    # count as computed (null); block 2 (tokens 8-11) is looked up, block 3 is not whole.
    assert ChunkedLocal(8).longest_hit({2: (5,)}.get, 15, 4) == [None, None, (5,)]
    assert ChunkedLocal(8).longest_hit({}.get, 15, 4) == [None, None]
    # Limit 16: every whole block is before the chunk start 16: a hit with nothing cached.
    assert ChunkedLocal(8).longest_hit({}.get, 16, 4) == [None] * 4


# -- a window that does not divide the block size ------------------------------------------
def test_window_of_six_tokens_over_blocks_of_four() -> None:
    m = manager(F, SlidingWindow(6))
    a = tokens(13)
    assert m.allocate_slots(0, a, 0, 13) == ([0, 1, 2, 3], [4, 5, 6, 7])
    assert m.num_free == 12
    # Token 13 sees tokens 8-13; tokens 0-7 (blocks 0 and 1 of S) are out of its window and
    # are dropped before its slot is counted: null in the table, free at the back of the queue
    # (they hold hashes), the one nearest the window first. 14 tokens fit in 4 blocks.
    a.append(200)
    assert m.allocate_slots(0, a, 13, 1) == ([], [])
    assert m.block_tables(0) == ([0, 1, 2, 3], [N, N, 6, 7])
    assert m.num_free == 14
    assert m.blocks.free_queue()[-2:] == [5, 4]
    # At 8 computed tokens 3 are out of the window (no whole block), at 9 tokens 4 (one).
    m2 = manager(F, SlidingWindow(6))
    m2.allocate_slots(0, tokens(9), 0, 8)
    m2.allocate_slots(0, tokens(9), 8, 1)
    assert m2.block_tables(0) == ([0, 1, 4], [2, 3, 5])
    m2.allocate_slots(0, tokens(10), 9, 1)
    assert m2.block_tables(0) == ([0, 1, 4], [N, 3, 5])
    m2.check_invariants()


def test_window_hit_needs_only_the_blocks_the_window_covers() -> None:
    m = manager(F, SlidingWindow(6))
    a = tokens(14)
    m.allocate_slots(0, a[:13], 0, 13)
    m.allocate_slots(0, a, 13, 1)  # S blocks 4 and 5 (positions 0, 1) are free, still cached
    # B opens with A's first 12 tokens. F hits blocks 0-2; S needs cdiv(5, 4) = 2 cached
    # blocks ending at token 12: positions 2 (live) and 1 (free, cached). Position 0 is not
    # needed: null. The hit is 12 tokens in both groups.
    b = a[:12] + [999]
    hit_tokens, hit = m.find_prefix_hit(b)
    assert (hit_tokens, hit) == (12, ([0, 1, 2], [N, 5, 6]))
    assert m.group_hits(b) == (12, 12)
    free_before = m.num_free
    # Whole sequence: 4 blocks per group, minus 3 hit positions, plus the hit block 5 that sits
    # in the free queue.
    assert m.can_admit(len(b), hit_tokens, hit)
    assert m.allocate_slots(1, b, 12, 1, hit) == ([8], [9])
    # Token 12 sees tokens 7-12: the window skips 7 tokens, one whole block (null).
    assert m.block_tables(1) == ([0, 1, 2, 8], [N, 5, 6, 9])
    assert m.num_free == free_before - 3  # block 5 left the free queue, 8 and 9 were taken
    assert m.blocks.ref_counts[5] == 1 and m.blocks.ref_counts[6] == 2
    m.check_invariants()


# -- the hybrid prefix hit holds for every group ---------------------------------------------
def full_hits_20_window_hits_0() -> tuple[HybridKVCacheManager, list[int]]:
    """A computes 24 tokens, then one more: S drops its first 4 blocks (hashed, to the back of
    the queue); C, unrelated, takes exactly those 4 blocks. A's full group is still cached."""
    m = manager(F, SlidingWindow(8), num_blocks=14)
    a = tokens(24)
    assert m.allocate_slots(0, a, 0, 24) == ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])
    a.append(200)
    assert m.allocate_slots(0, a, 24, 1) == ([12], [13])  # 24 - 7 = 17 tokens: 4 blocks dropped
    assert m.block_tables(0)[1] == [N, N, N, N, 10, 11, 13]
    assert m.blocks.free_queue() == [9, 8, 7, 6]
    assert m.allocate_slots(1, tokens(8, start=500), 0, 8) == ([9, 8], [7, 6])
    return m, a[:21]


def test_full_group_would_hit_20_tokens_but_the_window_group_0() -> None:
    m, c = full_hits_20_window_hits_0()
    # F alone: blocks 0-4 (20 tokens, the limit is 21 - 1). S alone: position 4 is cached,
    # position 3 is not, so no run of 2 ends at any boundary and none starts at 0.
    assert m.group_hits(c) == (20, 0)
    # A hit must hold for every group: S searching within F's 20 tokens finds nothing.
    assert m.find_prefix_hit(c) == (0, ([], []))


def test_a_window_hit_shortens_the_full_hit() -> None:
    m = manager(F, SlidingWindow(8))
    a = tokens(24)
    m.allocate_slots(0, a, 0, 24)
    m.free(0)
    # Another request takes 5 blocks per group from the queue [12..19, F's 5..0, S's 11..6]:
    # the last two it takes are F's blocks 5 and 4, whose hashes go.
    assert m.allocate_slots(1, tokens(20, start=500), 0, 20) == ([12, 13, 14, 15, 16],
                                                                   [17, 18, 19, 5, 4])
    # F alone: 16 tokens. S alone within 23: positions 4 (16-19) and 3 hit: 20 tokens.
    assert m.group_hits(a) == (16, 20)
    # Combined: S searches within F's 16: positions 3 and 2, the hit is 16, null before 2.
    hit_tokens, hit = m.find_prefix_hit(a)
    assert hit_tokens == 16
    assert hit == ([0, 1, 2, 3], [N, N, 8, 9])


def test_chunked_local_hit_is_cut_by_the_full_group() -> None:
    m = manager(ChunkedLocal(8), F)
    a = tokens(20)
    m.allocate_slots(0, a, 0, 20)  # chunked group [0..4], full group [5..9], all cached
    m.free(0)
    b = a[:19] + [999]
    # The limit is 19: the chunk start below it is 16 and block 4 is not whole, so the
    # chunked group alone hits 16 tokens, all null. F alone: blocks 5-8, 16 tokens.
    assert m.group_hits(b) == (16, 16)
    hit_tokens, hit = m.find_prefix_hit(b)
    assert (hit_tokens, hit) == (16, ([N, N, N, N], [5, 6, 7, 8]))
    # On admission the chunked group holds nulls before its chunk and takes no block for
    # them; F's 4 free cached blocks leave the queue, whose head is then 10.
    assert m.allocate_slots(1, b, 16, 4, hit) == ([10], [11])
    assert m.block_tables(1) == ([N, N, N, N, 10], [5, 6, 7, 8, 11])
    m.check_invariants()


# -- admission, failure and release ----------------------------------------------------------
def test_admission_caps_a_windowed_group() -> None:
    # Window 8, 12 tokens a step: S holds at most cdiv(7 + 12, 4) + 1 = 6 blocks at once.
    # A 40-token prompt needs 10 blocks in F but counts 6 in S: 16, not 20.
    prompt = tokens(40)
    m = manager(F, SlidingWindow(8), num_blocks=16, batched=12)
    assert m.admission_caps == (None, 6)
    assert m.blocks_to_admit(len(prompt), ([], [])) == 16
    assert m.can_admit(len(prompt), 0, ([], []))
    assert not m.can_admit(len(prompt), 0, ([], []), reserve=1)  # a watermark of 1 block
    # The first chunk (12 tokens, 3 blocks per group) fits, but not with 11 of 16 kept free.
    assert m.allocate_slots(0, prompt, 0, 12, reserve=11) is None
    assert m.num_free == 16
    m.allocate_slots(9, tokens(4, start=900), 0, 4)  # one block per group elsewhere: 14 free
    assert not m.can_admit(len(prompt), 0, ([], []))


def test_a_failed_allocation_takes_no_block_but_frees_out_of_window_ones() -> None:
    m = manager(F, SlidingWindow(8), num_blocks=10)
    a = tokens(21)
    m.allocate_slots(0, a, 0, 16)  # F [0, 1, 2, 3], S [4, 5, 6, 7]
    m.allocate_slots(1, tokens(4, start=700), 0, 4)  # F [8], S [9]: the pool is full
    # Tokens 16-20 need 2 more blocks per group. Token 16 sees 9-16: S first drops blocks 5
    # and 4 (as vLLM does, even when it then refuses), then 4 blocks are counted, 2 are free.
    assert m.allocate_slots(0, a, 16, 5) is None
    assert m.block_tables(0) == ([0, 1, 2, 3], [N, N, 6, 7])
    assert m.blocks.free_queue() == [5, 4]
    # A chunk of 4 needs one block per group: it fits.
    assert m.allocate_slots(0, a, 16, 4) == ([5], [4])
    m.check_invariants()


def test_free_goes_group_by_group_last_block_first() -> None:
    m = manager(F, SlidingWindow(8), num_blocks=14)
    a = tokens(22)
    m.allocate_slots(0, a[:12], 0, 12)  # F [0, 1, 2], S [3, 4, 5]
    m.allocate_slots(0, a, 12, 10)  # S drops block 3 at 12 computed; F/S get 3 more each
    assert m.block_tables(0) == ([0, 1, 2, 6, 7, 8], [N, 4, 5, 9, 10, 11])
    m.free(0)
    # Partial last blocks (8 in F, 11 in S: tokens 20-21) go to the front, each group's call
    # on its own; cached blocks to the back, F's table from its tail, then S's.
    assert m.blocks.free_queue() == [11, 8, 12, 13, 3, 7, 6, 2, 1, 0, 10, 9, 5, 4]
    assert m.requests() == [] and m.num_free == 14
    m.check_invariants()


def test_one_cached_copy_per_group() -> None:
    m = manager(F, SlidingWindow(8))
    m.allocate_slots(0, tokens(8), 0, 8)
    # The same two token blocks are cached once in each group, under (block hash, group).
    keys = [value.split("/") for value in m.blocks.cached]
    assert len(keys) == 4
    assert sorted(g for _, g in keys) == ["0", "0", "1", "1"]
    assert len({h for h, _ in keys}) == 2
    assert m.find_prefix_hit(tokens(9)) == (8, ([0, 1], [2, 3]))


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("entry, message", [
    ({"kind": "sliding_window"}, "sliding window is a positive number"),
    ({"kind": "chunked_local", "chunk": 0}, "attention chunk is a positive number"),
    ({"kind": "mamba"}, "unknown KV cache group kind"),
    ("full", "described by a dict"),
])
def test_group_spec_refuses_bad_entries(entry: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        group_spec(entry)


def test_allocate_slots_refuses_bad_calls() -> None:
    m = manager(F, SlidingWindow(8))
    with pytest.raises(ValueError, match="num_new_tokens"):
        m.allocate_slots(0, tokens(4), 0, 0)
    with pytest.raises(ValueError, match="not in the request's 4 tokens"):
        m.allocate_slots(0, tokens(4), 2, 3)
    with pytest.raises(ValueError, match="a hit of 4 tokens"):
        m.allocate_slots(0, tokens(8), 4, 4, ([0], []))
    m.allocate_slots(0, tokens(8), 0, 4)
    with pytest.raises(ValueError, match="is running"):
        m.allocate_slots(0, tokens(8), 4, 4, ([0], [1]))
    assert m.num_free == 18
    m.check_invariants()
