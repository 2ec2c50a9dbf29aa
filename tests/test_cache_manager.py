"""The engine on the guide's examples: allocation, fork, copy-on-write, prefix cache, eviction."""

import pytest
import torch

from lab.memory.block_pool import KVCacheError, PoolExhausted
from lab.serving.synthetic_kv import SyntheticKV
from tests.engine_helpers import decode, make_manager, prefill, same


def test_guide_walk_block_size_16_prompt_30():
    m = make_manager(num_blocks=8, block_size=16)
    kv = SyntheticKV(m.config, seed=1)
    sid = prefill(m, kv, list(range(30)))
    seq = m.sequences[sid]
    assert seq.block_table == [0, 1]  # two physical blocks for 30 tokens
    assert [seq.filled_in_block(i) for i in range(2)] == [16, 14]
    assert seq.tail_slots == 2
    for t in (30, 31):  # tokens 31 and 32 fill the second block
        decode(m, kv, sid, t)
    assert seq.block_table == [0, 1] and seq.tail_slots == 0
    decode(m, kv, sid, 32)  # token 33 takes a third block
    assert seq.block_table == [0, 1, 2]
    decode(m, kv, sid, 33)  # the request ends at 34 tokens
    assert len(seq) == 34 and seq.filled_in_block(2) == 2 and seq.tail_slots == 14
    assert m.snapshot().usage.tail_slots == 14
    m.check_invariants()


def test_slot_formula_and_readback_through_a_scattered_table():
    m = make_manager(num_blocks=8, block_size=4)
    kv = SyntheticKV(m.config, seed=2)
    a = prefill(m, kv, [1, 2, 3, 4, 5])
    b = prefill(m, kv, [9, 8, 7])
    for t in range(6):  # interleave so a's blocks are not adjacent
        decode(m, kv, a, 10 + t)
        decode(m, kv, b, 20 + t)
    sa = m.sequences[a]
    assert sa.block_table != sorted(range(sa.num_blocks))
    for pos in range(len(sa)):
        bt = sa.block_table
        assert sa.slot(pos) == bt[pos // 4] * 4 + pos % 4
    k, v = m.read_kv(a)
    want_k, want_v = kv.keys_values(sa.tokens, 0)
    assert same(k, want_k[0]) and same(v, want_v[0])


def test_fork_shares_and_copy_on_write_copies_only_the_partial_block():
    m = make_manager(num_blocks=8, block_size=4)
    kv = SyntheticKV(m.config, seed=3)
    parent = prefill(m, kv, list(range(6)))  # blocks: full + 2 of 4
    child = m.fork(parent).seq_id
    p, c = m.sequences[parent], m.sequences[child]
    assert p.block_table == c.block_table
    assert all(m.blocks.ref_counts[b] == 2 for b in p.block_table)
    shared_last = p.block_table[-1]
    before = m.pool.key_caches[0][shared_last].clone()
    decode(m, kv, child, 100)  # child writes into the shared partial block: copy first
    copies = [e for e in m.events.events if e.kind == "copy"]
    assert len(copies) == 1 and copies[0].detail["src"] == shared_last
    assert c.block_table[0] == p.block_table[0]  # the full block stays shared
    assert c.block_table[-1] != shared_last
    assert m.blocks.ref_counts[shared_last] == 1
    assert same(m.pool.key_caches[0][shared_last], before)  # parent's block untouched
    decode(m, kv, parent, 200)  # parent is now the only holder: writes in place, no copy
    assert p.block_table[-1] == shared_last
    assert len([e for e in m.events.events if e.kind == "copy"]) == 1
    for sid in (parent, child):
        s = m.sequences[sid]
        k, _ = m.read_kv(sid)
        assert same(k, kv.keys_values(s.tokens, 0)[0][0])
    m.check_invariants()


def test_fork_at_a_block_boundary_copies_nothing():
    m = make_manager(num_blocks=8, block_size=4)
    kv = SyntheticKV(m.config, seed=4)
    parent = prefill(m, kv, list(range(8)))
    child = m.fork(parent).seq_id
    decode(m, kv, child, 1)
    decode(m, kv, parent, 2)
    assert not [e for e in m.events.events if e.kind == "copy"]
    assert m.blocks.num_used == 4  # two shared + one new each
    m.check_invariants()


def test_exhaustion_raises_typed_error_and_leaves_state_untouched():
    m = make_manager(num_blocks=3, block_size=4)
    kv = SyntheticKV(m.config, seed=5)
    sid = prefill(m, kv, list(range(12)))  # all three blocks
    before = (list(m.blocks.ref_counts), m.blocks.free_queue(), len(m.sequences), len(m.events))
    with pytest.raises(PoolExhausted) as err:
        m.add_sequence([1, 2])
    assert err.value.needed == 1 and err.value.free == 0
    with pytest.raises(PoolExhausted):
        m.append_token(sid, 7)
    assert len(m.sequences[sid]) == 12
    after = (list(m.blocks.ref_counts), m.blocks.free_queue(), len(m.sequences), len(m.events))
    assert before == after
    m.check_invariants()


def test_prefix_cache_reuses_full_blocks_never_the_last_token():
    m = make_manager(num_blocks=16, block_size=4)
    kv = SyntheticKV(m.config, seed=6)
    system = list(range(50, 58))  # two full blocks
    first = prefill(m, kv, system + [1, 2, 3])
    second = m.add_sequence(system + [4, 5])
    assert second.num_cached_tokens == 8
    assert second.block_table[:2] == m.sequences[first].block_table[:2]
    assert m.prefix_hit_tokens == 8 and m.prefix_query_tokens == 11 + 10
    # A prompt that is exactly the cached blocks still recomputes its last token's block.
    exact = m.add_sequence(system)
    assert exact.num_cached_tokens == 4
    m.check_invariants()


def test_freed_cached_blocks_are_reused_then_evicted_in_lru_order():
    m = make_manager(num_blocks=4, block_size=2)
    kv = SyntheticKV(m.config, seed=7)
    sid = prefill(m, kv, [1, 2, 3, 4, 5, 6])  # three full blocks, all cached
    table = list(m.sequences[sid].block_table)
    m.free(sid)
    # tail block first in the free queue after the never-used block
    assert m.blocks.free_queue() == [3, table[2], table[1], table[0]]
    again = m.add_sequence([1, 2, 3, 4, 9])  # hits the first two cached blocks
    assert again.block_table[:2] == table[:2] and again.num_cached_tokens == 4
    m.free(again.seq_id)
    other = m.add_sequence([7, 7, 7, 7, 7, 7, 7])  # needs all 4 blocks: evicts every cached one
    assert len(other.block_table) == 4
    assert not m.blocks.cached
    assert [e.kind for e in m.events.events].count("evict") == 3
    m.check_invariants()


def test_hash_collision_is_detected_by_comparing_tokens():
    from lab.memory.cache_manager import KVCacheManager
    from lab.memory.kv_pool import PoolConfig

    config = PoolConfig(num_blocks=8, block_size=2, num_kv_heads=1, head_dim=4)
    m = KVCacheManager(config, torch.device("cpu"), hash_fn=lambda parent, tokens: "same")
    kv = SyntheticKV(config, seed=8)
    prefill(m, kv, [1, 2, 3])
    other = m.add_sequence([5, 6, 7])  # same (bad) hash, other tokens: must not hit
    assert other.num_cached_tokens == 0
    assert m.blocks.collisions == 1


def test_bad_requests_give_clear_errors():
    m = make_manager()
    with pytest.raises(ValueError, match="prompt"):
        m.add_sequence([])
    with pytest.raises(KVCacheError, match="no live sequence"):
        m.append_token(42, 1)
    sid = m.add_sequence([1, 2, 3]).seq_id
    with pytest.raises(KVCacheError, match="not written"):
        m.fork(sid)


def test_extend_allocates_only_at_block_boundaries_and_is_all_or_nothing():
    m = make_manager(num_blocks=4, block_size=4)
    kv = SyntheticKV(m.config, seed=9)
    sid = prefill(m, kv, [1, 2, 3])
    m.extend(sid, [4, 5, 6, 7, 8, 9])  # 3 + 6 = 9 tokens -> 3 blocks
    seq = m.sequences[sid]
    assert seq.num_blocks == 3
    assert [e.detail["slot"] for e in m.events.events if e.kind == "append"] == seq.slots(3, 9)
    before = (list(m.blocks.ref_counts), list(seq.tokens), list(seq.block_table))
    with pytest.raises(PoolExhausted):
        m.extend(sid, list(range(8)))  # would need 2 more blocks, 1 is free
    assert before == (list(m.blocks.ref_counts), list(seq.tokens), list(seq.block_table))
    m.check_invariants()


def test_write_batch_stores_several_sequences_in_one_call():
    m = make_manager(num_blocks=8, block_size=4, num_layers=2)
    kv = SyntheticKV(m.config, seed=10)
    a, b = m.add_sequence([1, 2, 3]), m.add_sequence([4, 5, 6, 7, 8])
    ka, va = kv.keys_values(a.tokens, 0)
    kb, vb = kv.keys_values(b.tokens, 0)
    m.write_batch([a.seq_id, b.seq_id], torch.cat([ka, kb], 1), torch.cat([va, vb], 1))
    for seq, want in ((a, ka), (b, kb)):
        assert seq.num_written == len(seq)
        assert same(m.read_kv(seq.seq_id, layer=1)[0], want[1])
    # read_slots: every layer at once, at any [S, C] grid of slots (here b's, then a's reversed)
    slots = torch.tensor([b.slots(0, 3), a.slots(0, 3)[::-1]])  # [2, 3]
    keys, values = m.pool.read_slots(slots)  # each [layers, 2, 3, KV, D]
    assert keys.shape == (2, 2, 3, m.config.num_kv_heads, m.config.head_dim)
    assert same(keys[:, 0], kb[:, :3]) and same(values[:, 1], va.flip(1))
    with pytest.raises(ValueError, match="unwritten"):
        m.write_batch([a.seq_id], ka, va)  # nothing left to write


def test_a_freed_partial_block_goes_to_the_front_and_cached_ones_to_the_back():
    m = make_manager(num_blocks=6, block_size=4)
    kv = SyntheticKV(m.config, seed=11)
    sid = prefill(m, kv, [1, 2, 3, 4, 5, 6])  # block 0 full (cached), block 1 partial
    assert m.blocks.free_queue() == [2, 3, 4, 5]
    m.free(sid)  # tail first: the partial block 1 to the front, the cached block 0 to the back
    assert m.blocks.free_queue() == [1, 2, 3, 4, 5, 0]
    other = prefill(m, kv, [9, 9, 9])  # reuses the partial block: nothing cached is evicted
    assert m.sequences[other].block_table == [1]
    assert not [e for e in m.events.events if e.kind == "evict"]
    again = m.add_sequence([1, 2, 3, 4, 7])
    assert again.num_cached_tokens == 4 and again.block_table[0] == 0
    m.check_invariants()


def test_a_hash_may_name_two_blocks_and_a_hit_takes_the_earliest():
    m = make_manager(num_blocks=6, block_size=4)
    kv = SyntheticKV(m.config, seed=12)
    prompt = list(range(1, 9))  # two full blocks
    a = prefill(m, kv, prompt)  # blocks 0 1, both cached
    b = prefill(m, kv, prompt)  # hit capped at 1 block: block 1's content recomputed into 2
    assert m.sequences[b].block_table == [0, 2]
    h1 = m.blocks.block_hash[1].value
    assert m.blocks.block_hash[2].value == h1 and m.blocks.cached[h1] == [1, 2]  # no de-dup
    m.free(a)  # block 1 to the back of the free queue, still cached
    c = prefill(m, kv, prompt + [9])
    assert m.sequences[c].block_table[:2] == [0, 1]  # the copy cached first
    m.free(c)
    d = prefill(m, kv, [7] * 16)  # four blocks: 3 4 5, then 1, whose hash is evicted
    assert m.sequences[d].block_table == [3, 4, 5, 1] and m.blocks.cached[h1] == [2]
    m.free(d)
    e = m.add_sequence(prompt + [9])
    assert e.num_cached_tokens == 8 and e.block_table[:2] == [0, 2]  # the surviving copy
    m.check_invariants()
