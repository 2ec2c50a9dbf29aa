"""The walkthrough engine: the allocator walk, relocation and the attention view."""

from __future__ import annotations

import random

import pytest
import torch

from lab.memory.block_pool import PoolExhausted
from lab.memory.block_table import blocks_for
from lab.memory.kv_pool import PoolConfig
from lab.memory.relocate import relocate
from lab.scenarios.attention import AttentionConfig, AttentionStory
from lab.scenarios.block_tables import BlockTablesStory, WalkParams, WalkTooBig
from lab.serving.synthetic_kv import SyntheticKV
from tests.engine_helpers import decode, make_manager, prefill, same

SMALL = WalkParams(PoolConfig(num_blocks=16, block_size=4, head_dim=16), prompt_len=6,
                   output_len=5, num_requests=3)
GUIDE = WalkParams(PoolConfig(head_dim=16), num_requests=1)  # prompt 30, block size 16


def test_guide_example_blocks() -> None:
    """Prompt 30, block size 16: 2 blocks; the third arrives only at the 33rd token."""
    story = BlockTablesStory(GUIDE, 0)
    frames = story.frames()
    assert story.blocks_held(frames, 30) == 2
    assert story.blocks_held(frames, 32) == 2
    assert story.blocks_held(frames, 33) == 3
    assert story.tail_slots(frames, 0) == 14  # ends at 34 tokens: 14 unused slots


def test_the_walk_ends_with_every_block_back_in_the_pool() -> None:
    """The cache disappears when the request ends: a finished request leaves at the next step,
    its blocks freed, and the last frame is the empty pool."""
    story = BlockTablesStory(SMALL, 3)
    frames = story.frames()
    assert len(frames) == story.last_step + 1
    assert frames[-1].snapshot.usage.blocks_used == 0 and not frames[-1].seq_names
    assert frames[-2].snapshot.usage.blocks_used > 0
    for r in story.requests:
        leave = int(r.arrival_s) + r.output_len + 1
        held = blocks_for(r.total_len, SMALL.pool.block_size)
        name = "ABC"[r.req_id]
        assert name in frames[leave - 1].seq_names.values()
        assert name not in frames[leave].seq_names.values()
        line = next(x for x in story.caption(frames[leave]) if x.startswith(f"**{name}** has"))
        assert f"its {held} block(s)" in line
    assert story.caption(frames[-1])[-1] == "Every request has finished: the pool is empty again."


def test_the_pool_check_counts_the_most_blocks_held_at_once() -> None:
    """A pool too small for all requests together still fits a walk whose first request
    leaves before the last arrives."""
    spread = WalkParams(PoolConfig(num_blocks=4, block_size=4, head_dim=16), prompt_len=4,
                        output_len=1, num_requests=3)
    story = BlockTablesStory(spread, 0)
    total = sum(blocks_for(r.total_len, 4) for r in story.requests)
    assert story.blocks_required() < total
    story.frames()  # plays without WalkTooBig


@pytest.mark.parametrize("step", [0, 1, 3, 7])
def test_frames_match_the_real_pool_and_invariants(step: int) -> None:
    story = BlockTablesStory(SMALL, 3)
    frame = story.frames()[step]
    live = story.live()
    stepper = live.at(step)
    stepper.manager.check_invariants()
    assert frame.snapshot == stepper.manager.snapshot()
    expected = sum(blocks_for(r.prompt_len + min(r.output_len, max(0, step - int(r.arrival_s))),
                              SMALL.pool.block_size)
                   for r in story.requests  # a finished request leaves the step after its last
                   if r.arrival_s <= step <= r.arrival_s + r.output_len)
    assert frame.snapshot.usage.blocks_used == expected
    check = live.check(step)
    if frame.seq_names:
        assert check is not None and check.ok
    else:
        assert check is None
    # the tail bound of the guide: fewer than one block per sequence
    assert frame.snapshot.usage.tail_slots < max(1, len(frame.seq_names)) * SMALL.pool.block_size


def test_pool_holds_the_kv_of_every_token() -> None:
    """Read back through the block tables, the pool holds each token's seeded K/V."""
    story = BlockTablesStory(SMALL, 1)
    stepper = story.live().at(story.last_step)
    kv = SyntheticKV(SMALL.pool, 1)
    for seq_id in stepper.names:
        tokens = stepper.manager.sequences[seq_id].tokens
        k, v = stepper.manager.read_kv(seq_id)  # [len, kv_heads, head_dim]
        expect_k, expect_v = kv.keys_values(tokens, 0)  # [1, len, kv_heads, head_dim]
        assert same(k, expect_k[0]) and same(v, expect_v[0])


def test_pool_too_small_is_a_clear_error() -> None:
    tight = WalkParams(PoolConfig(num_blocks=8, block_size=4), prompt_len=40, output_len=40,
                       num_requests=3)
    with pytest.raises(WalkTooBig, match="need .* blocks .* the pool has 8"):
        BlockTablesStory(tight, 0).frames()


def test_caption_names_the_new_block() -> None:
    story = BlockTablesStory(GUIDE, 0)
    frames = story.frames()
    assert any("new block" in line for line in story.caption(frames[4]))  # position 32 lands
    assert story.caption(frames[3]) == [
        "**A** decodes position 31 into slot 15 of physical block 1 (pool slot 31)."]


def test_relocate_copies_blocks_and_keeps_kv() -> None:
    m = make_manager(num_blocks=12, block_size=4, prefix=False)
    kv = SyntheticKV(PoolConfig(num_blocks=12, block_size=4, head_dim=8), 0)
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
    assert same(before_k, after_k) and same(before_v, after_v)
    m.check_invariants()
    assert all(m.blocks.ref_counts[o] == 0 for o in old)
    assert m.sequences[b].block_table  # the other sequence is untouched
    assert sum(e.kind == "copy" for e in m.events.events) == len(old)


def test_relocate_without_room_changes_nothing() -> None:
    m = make_manager(num_blocks=4, block_size=4, prefix=False)
    kv = SyntheticKV(PoolConfig(num_blocks=4, block_size=4, head_dim=8), 0)
    a = prefill(m, kv, list(range(1, 12)))  # 3 blocks of 4
    table = list(m.sequences[a].block_table)
    with pytest.raises(PoolExhausted):
        relocate(m, a, random.Random(0))
    assert m.sequences[a].block_table == table
    m.check_invariants()


def test_shuffled_placement_gives_identical_attention() -> None:
    params = WalkParams(PoolConfig(num_blocks=24, block_size=4, head_dim=16), prompt_len=9,
                        output_len=6, num_requests=2)
    assert AttentionStory(AttentionConfig(params), 0).can_relocate()
    first = AttentionStory(AttentionConfig(params), 0).frames()[0]
    moved = AttentionStory(AttentionConfig(params, placement=2), 0).frames()[-1]
    assert moved.block_table != first.block_table
    assert moved.first_table == first.block_table
    assert moved.check.ok and moved.output_shift == 0.0
    assert same(moved.check.output, first.check.output)
    # the online-softmax bookkeeping ends at the dense output for that head
    final = moved.softmax[-1].output
    reference = moved.check.reference[0, 0].double()  # head 0
    assert torch.allclose(final, reference, atol=1e-5)
    assert len(moved.softmax) == len(moved.block_table)


def test_attention_view_rejects_unknown_request() -> None:
    with pytest.raises(ValueError, match="no request 'Z'"):
        AttentionConfig(SMALL, "Z")


def test_attention_steps_read_one_block_each() -> None:
    story = AttentionStory(AttentionConfig(SMALL), 0)
    frames = story.frames()
    table = frames[0].block_table
    assert len(frames) == len(table) + 1
    assert [f.read for f in frames] == [table[:i] for i in range(len(table) + 1)]
    assert f"physical block **{table[0]}**" in story.caption(frames[1])[0]
