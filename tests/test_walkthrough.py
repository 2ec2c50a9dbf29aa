"""The walkthrough engine: the allocator walk, relocation and the attention view."""

from __future__ import annotations

import random

import pytest
import torch

from lab.memory.block_pool import PoolExhausted
from lab.memory.block_table import blocks_for
from lab.memory.relocate import relocate
from lab.scenarios.attention import can_relocate, replay_attention
from lab.scenarios.block_tables import (
    WalkParams,
    WalkTooBig,
    blocks_held,
    describe_step,
    final_tail_slots,
    last_step,
    replay_walk,
    run_walk,
    synthetic_kv,
    walk_requests,
)
from tests.engine_helpers import decode, make_manager, prefill

SMALL = WalkParams(block_size=4, prompt_len=6, output_len=5, num_requests=3, num_blocks=16,
                   head_dim=16)


def test_guide_example_blocks() -> None:
    """Prompt 30, block size 16: 2 blocks; the third arrives only at the 33rd token."""
    guide = WalkParams(num_requests=1, head_dim=16)
    assert blocks_held(guide, 0, 30) == 2
    assert blocks_held(guide, 0, 32) == 2
    assert blocks_held(guide, 0, 33) == 3
    assert final_tail_slots(guide, 0) == 14  # ends at 34 tokens: 14 unused slots


@pytest.mark.parametrize("step", [0, 1, 3, 7])
def test_replay_matches_the_engine_and_invariants(step: int) -> None:
    frame = replay_walk(SMALL, 3, step)
    manager, names = run_walk(SMALL, 3, step, store_kv=False)
    manager.check_invariants()
    assert frame.snapshot.usage == manager.snapshot().usage
    requests = walk_requests(SMALL, 3)
    expected = sum(blocks_for(len(r.prompt) + min(len(r.output), max(0, step - r.arrival)),
                              SMALL.block_size) for r in requests if r.arrival <= step)
    assert frame.snapshot.usage.blocks_used == expected
    if names:
        assert frame.check is not None and frame.check.ok
    # the tail bound of the guide: fewer than one block per sequence
    assert frame.snapshot.usage.tail_slots < max(1, len(names)) * SMALL.block_size


def test_pool_holds_what_a_token_by_token_run_writes() -> None:
    """The replay writes each token's K/V once at the end; a live run writes them step by
    step. Read back through the block tables, both give the same K/V."""
    step = last_step(SMALL, 1)
    replayed, names = run_walk(SMALL, 1, step)
    kv = synthetic_kv(SMALL, 1)
    for seq_id in names:
        tokens = replayed.sequences[seq_id].tokens
        k, v = replayed.read_kv(seq_id)  # [len, kv_heads, head_dim]
        expect_k, expect_v = kv.keys_values(tokens, 0)  # [1, len, kv_heads, head_dim]
        assert torch.equal(k, expect_k[0]) and torch.equal(v, expect_v[0])


def test_pool_too_small_is_a_clear_error() -> None:
    tight = WalkParams(block_size=4, prompt_len=40, output_len=40, num_requests=3,
                       num_blocks=8)
    with pytest.raises(WalkTooBig, match="need .* blocks .* the pool has 8"):
        replay_walk(tight, 0, 1)


def test_describe_step_names_the_new_block() -> None:
    guide = WalkParams(num_requests=1, head_dim=16)
    lines = describe_step(replay_walk(guide, 0, 4), guide.block_size)  # token #33 lands
    assert any("new block" in line for line in lines)
    assert describe_step(replay_walk(guide, 0, 3), guide.block_size) == [
        "**A** decodes its token #32 (position 31) into slot 15 of physical block 1."]


def test_relocate_copies_blocks_and_keeps_kv() -> None:
    m = make_manager(num_blocks=12, block_size=4, prefix=False)
    kv = synthetic_kv(WalkParams(block_size=4, num_blocks=12, head_dim=8), 0)
    a = prefill(m, kv, [1, 2, 3, 4, 5, 6])
    b = prefill(m, kv, [7, 8, 9])
    decode(m, kv, a, 10)
    before_k, before_v = m.read_kv(a)
    old = list(m.sequences[a].block_table)
    moves = relocate(m, a, random.Random(0))
    new = m.sequences[a].block_table
    assert [o for o, _ in moves] == old and [n for _, n in moves] == new
    assert not set(old) & set(new)
    after_k, after_v = m.read_kv(a)
    assert torch.equal(before_k, after_k) and torch.equal(before_v, after_v)
    m.check_invariants()
    assert all(m.blocks.ref_counts[o] == 0 for o in old)
    assert m.sequences[b].block_table  # the other sequence is untouched
    assert sum(e.kind == "copy" for e in m.events.events) == len(old)


def test_relocate_without_room_changes_nothing() -> None:
    m = make_manager(num_blocks=4, block_size=4, prefix=False)
    kv = synthetic_kv(WalkParams(block_size=4, num_blocks=4, head_dim=8), 0)
    a = prefill(m, kv, list(range(1, 12)))  # 3 blocks of 4
    table = list(m.sequences[a].block_table)
    with pytest.raises(PoolExhausted):
        relocate(m, a, random.Random(0))
    assert m.sequences[a].block_table == table
    m.check_invariants()


def test_shuffled_placement_gives_identical_attention() -> None:
    params = WalkParams(block_size=4, prompt_len=9, output_len=6, num_requests=2,
                        num_blocks=24, head_dim=16)
    assert can_relocate(params, 0, "A")
    first = replay_attention(params, 0, "A", 0)
    moved = replay_attention(params, 0, "A", 2)
    assert moved.block_table != first.block_table
    assert moved.first_table == first.block_table
    assert moved.check.ok and moved.output_shift == 0.0
    assert torch.equal(moved.check.output, first.check.output)
    # the online-softmax bookkeeping ends at the dense output for that head
    final = moved.softmax[-1].output
    reference = moved.check.reference[0, moved.head].double()
    assert torch.allclose(final, reference, atol=1e-5)
    assert len(moved.softmax) == len(moved.block_table)


def test_attention_view_rejects_unknown_request() -> None:
    with pytest.raises(ValueError, match="no request 'Z'"):
        replay_attention(SMALL, 0, "Z", 0)
