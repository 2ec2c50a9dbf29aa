"""The mixed-attention walk (lab/scenarios/mixed_attention.py): two KV cache groups over one
pool, on the HybridKVCacheManager, with the default settings worked by hand.

Default walk: blocks of 4, a sliding window of 8, a 16-token system prompt, a pool of 18
blocks. A (prompt 20) arrives at step 1, B (prompt 19) at step 3, C (prompt 18) at step 12,
when A leaves.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from lab.memory.block_table import blocks_for
from lab.memory.kv_cache_groups import NULL_BLOCK, ChunkedLocal, FullAttention, SlidingWindow
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.mixed_attention import (
    MixedAttentionStory,
    MixedParams,
    PoolTooSmall,
    event_steps,
    mixed_requests,
)
from lab.serving.scheduler import Scheduler
from tests.scheduler_helpers import config, llama_h100, specs

FULL, WINDOW = 0, 1


@pytest.fixture(scope="module")
def frames():
    return MixedAttentionStory(MixedParams(), 0).frames()


def view(frame, name: str):
    return next(r for r in frame.requests if r.name == name)


def test_out_of_window_blocks_become_null_and_go_back_at_the_right_steps(frames) -> None:
    # Step 1: A's 20-token prompt takes 5 blocks in each group, nothing null yet.
    a = view(frames[1], "A")
    assert a.tables == ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))
    # Step 2: A decodes position 20, whose window is positions 13-20: logical blocks 0-2
    # (positions 0-11) turn null and blocks 5, 6, 7 go back to the pool, still cached.
    change = frames[2].changes["A"][WINDOW]
    assert change.nulled == ((0, 5), (1, 6), (2, 7))
    assert view(frames[2], "A").tables[WINDOW][:3] == (NULL_BLOCK,) * 3
    states = {b.block_id: b for b in frames[2].blocks}
    assert all(states[b].state == "cached" and states[b].group == WINDOW for b in (5, 6, 7))
    # Step 5: position 23's window starts at 16: logical block 3 (block 8) leaves.
    assert frames[5].changes["A"][WINDOW].nulled == ((3, 8),)
    # Steps 3 and 4 null nothing for A (the window starts at 14 and 15, inside block 3).
    assert not frames[3].changes["A"][WINDOW].nulled
    assert not frames[4].changes["A"][WINDOW].nulled


@pytest.mark.parametrize("block_size, window", [(4, 8), (4, 6), (8, 16), (4, 4), (8, 12)])
def test_null_entries_follow_the_window_at_every_decode(block_size: int, window: int) -> None:
    params = MixedParams(PoolConfig(num_blocks=40, block_size=block_size, num_layers=2),
                         window=window, output_len=24)
    story = MixedAttentionStory(params, 1)
    for frame in story.frames():
        for name, pos in frame.decoded.items():
            req = view(frame, name)
            table = req.tables[WINDOW]
            nulls = sum(b == NULL_BLOCK for b in table)
            # Token pos sees positions pos - W + 1 .. pos: every block wholly before is null,
            # the nulls come first, and the full-attention group holds every block.
            assert nulls == max(0, pos - window + 1) // block_size
            assert all(b == NULL_BLOCK for b in table[:nulls])
            assert NULL_BLOCK not in table[nulls:]
            assert req.held[FULL] == blocks_for(pos + 1, block_size)


def test_the_sliding_group_levels_off_while_the_full_group_grows() -> None:
    story = MixedAttentionStory(MixedParams(output_len=30), 0)
    frames = story.frames()
    steady = story.steady_window_blocks()
    assert steady == 8 // 4 + 1  # W / block size + 1 when the block size divides W
    a = [(f.decoded["A"], view(f, "A").held) for f in frames if "A" in f.decoded]
    window_held = [h[WINDOW] for _, h in a]
    assert max(window_held[1:]) == steady and min(window_held[1:]) == steady - 1
    assert all(h[WINDOW] <= steady for _, h in a[1:])
    full_held = [h[FULL] for _, h in a]
    assert full_held == sorted(full_held) and full_held[-1] == blocks_for(20 + 30, 4)
    assert full_held[-1] > 4 * steady


def test_a_hit_is_what_every_group_can_serve(frames) -> None:
    # B (step 3): A still holds the system prompt's full-attention blocks 0-3 and block 8 of
    # its window; block 7 (positions 8-11) is free but cached. Both groups serve 16 tokens;
    # B's window table is null before position 9's window and takes 7 back from the free queue.
    (b,) = frames[3].arrivals
    assert (b.hit_tokens, b.group_hits) == (16, (16, 16))
    assert b.hit_blocks == ((0, 1, 2, 3), (NULL_BLOCK, NULL_BLOCK, 7, 8))
    assert b.from_free == (7,)
    assert view(frames[3], "B").tables == ((0, 1, 2, 3, 12), (NULL_BLOCK, NULL_BLOCK, 7, 8, 13))
    # C (step 12, when A leaves): full attention alone still finds the 4 blocks of the system
    # prompt, but the window group's blocks of positions 8-15 were evicted at step 10, so the
    # hit shrinks to what both groups serve: nothing.
    (c,) = frames[12].arrivals
    assert (c.name, c.hit_tokens, c.group_hits) == ("C", 0, (16, 0))
    assert {(g, p) for _, g, p in frames[10].evicted} == {(WINDOW, 8), (WINDOW, 12)}
    assert "**0 tokens**" in MixedAttentionStory(MixedParams(), 0).caption(frames[12])[2]


def test_every_block_goes_back_at_the_end(frames) -> None:
    last = frames[-1]
    assert last.step == 19 and not last.requests
    assert last.num_free == 18
    assert {b.state for b in last.blocks} <= {"free", "cached"}
    assert set(last.left) == {"C"}
    for frame in frames:  # the pool's count agrees with the blocks on the frame
        assert frame.num_free == sum(b.state != "used" for b in frame.blocks)


@pytest.mark.parametrize("seed, output_len, num_blocks", [(0, 1, 18), (2, 40, 64), (3, 12, 30)])
def test_invariants_hold_in_other_walks(seed: int, output_len: int, num_blocks: int) -> None:
    story = MixedAttentionStory(MixedParams(PoolConfig(num_blocks, 4, num_layers=2),
                                            output_len=output_len), seed)
    stepper = story.stepper()
    while not stepper.done:
        stepper.advance()  # the stepper checks the manager's invariants after every step
        stepper.manager.check_invariants()
    assert stepper.manager.num_free == num_blocks and not stepper.manager.requests()


def test_kv_read_back_through_each_group_is_what_was_written() -> None:
    story = MixedAttentionStory(MixedParams(), 0)
    stepper = story.stepper(store_kv=True)
    while stepper.step < 9:
        stepper.advance()
    bs = 4
    for name in ("A", "B"):
        req_id = stepper.ids[name]
        n = stepper.written[name]
        tokens = stepper.requests[req_id].tokens[:n]
        keys, values = stepper.kv.keys_values(list(tokens), 0)  # [L, n, H, D]
        for g, table in enumerate(stepper.manager.block_tables(req_id)):
            first = sum(b == NULL_BLOCK for b in table) * bs  # the window group's first held
            slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(first, n)])
            k, v = stepper.pool.read_slots(slots)  # [L, n - first, H, D]
            assert torch.equal(k[g].cpu(), keys[g, first:]) and torch.equal(v[g].cpu(),
                                                                             values[g, first:])


def test_the_full_attention_kernel_matches_dense_attention() -> None:
    run = MixedAttentionStory(MixedParams(), 0).live()
    for step in (1, 3, 12):
        check = run.check(step)
        assert check.ok and check.num_seqs >= 1
        (full_label, full), (window_label, window) = run.measured(step)
        assert full_label == "full attention" and full.ok
        assert window_label == "sliding window" and window.ok
    assert run.check(0) is None


def test_the_sliding_window_kernel_reads_only_the_window() -> None:
    """The window group's tables hold null blocks (-1) before the window: the kernel must not
    read them, and it equals dense attention under the window's mask."""
    run = MixedAttentionStory(MixedParams(), 0).live()
    for step in (2, 5, 9, 13):
        assert run.check(step).ok
        _, (_, window) = run.measured(step)
        assert window is not None and window.ok
        manager = run.stepper.manager
        assert any(NULL_BLOCK in manager.block_tables(r)[WINDOW] for r in manager.requests())


def test_bad_settings_get_clear_errors() -> None:
    with pytest.raises(PoolTooSmall, match="pool's 8"):
        MixedAttentionStory(MixedParams(PoolConfig(8, 4, num_layers=2)), 0).frames()
    with pytest.raises(ValueError, match="window"):
        MixedParams(window=0)
    with pytest.raises(ValueError, match="one layer per KV cache group"):
        MixedParams(PoolConfig(18, 4))


def test_requests_share_the_system_prompt_and_the_trace_replays() -> None:
    a, b, c = mixed_requests(MixedParams(), 0)
    assert a.tokens[:16] == b.tokens[:16] == c.tokens[:16]
    assert (a.arrival, b.arrival, c.arrival) == (1, 3, a.leaves)
    trace = json.loads(MixedAttentionStory(MixedParams(), 0).trace(3))
    assert trace["meta"]["page"] == "mixed_attention"
    assert {e["kind"] for e in trace["paged"]} >= {"allocate", "free", "hit", "cache"}


@pytest.mark.parametrize("groups", [(FullAttention(), SlidingWindow(8)),
                                    (FullAttention(), SlidingWindow(6), ChunkedLocal(8))])
def test_the_schedulers_decisions_count_every_groups_blocks(groups) -> None:
    """The scheduler on several KV cache groups (GroupedBackend), explain on: each decision
    line's block counts are the blocks the backend really gave, summed over the groups."""
    cfg = config(num_blocks=60, block_size=4, max_num_batched_tokens=16,
                 enable_prefix_caching=True, kv_cache_groups=groups)
    sched = Scheduler(specs((20, 6), (30, 4), (20, 3)), cfg, llama_h100(), detail=True)
    caps = sched.backend.kv_cache.admission_caps
    checked = 0
    while (record := sched.step()) is not None:
        entries = {e.req_id: e for e in sched.detail.scheduled}
        for line in record.decisions:
            req_id = int(re.match(r"request (\d+)", line).group(1))
            entry = entries.get(req_id)
            if " admitted: " in line:
                # new: the whole tables after admission (hit, null entries, new blocks)
                held = sum(len(t) - t.count(NULL_BLOCK) for t in entry.new_blocks)
                length = int(re.search(r"admitted: (\d+) tokens", line).group(1))
                whole = sum(min(blocks_for(length, 4), cap or blocks_for(length, 4))
                            for cap in caps)
                assert f"whole sequence ({whole} blocks over its {len(groups)} KV cache groups)" \
                    in line, line
                assert f"it holds {held} blocks now" in line, line
                checked += 1
            elif "next prefill chunk" in line:
                more = sum(map(len, entry.new_blocks))
                said = re.search(r"(\d+) blocks? more", line)
                assert (int(said.group(1)) if said else 0) == more, (line, entry.new_blocks)
                checked += 1
    assert checked >= 5


def test_group_blocks_has_one_definition() -> None:
    from lab.memory import cache_manager, hybrid_cache_manager
    assert hybrid_cache_manager.GroupBlocks is cache_manager.GroupBlocks


def test_event_steps_name_the_notable_steps(frames) -> None:
    events = dict(event_steps(frames))
    assert list(events) == sorted(events)
    # The default walk (worked by hand above): A's window frees 5, 6, 7 at step 2 and 8 at
    # step 5; B leaves at step 10; C's hit shrinks to 0 when A leaves at step 12; C at 19.
    assert "blocks 5, 6, 7 left the sliding window" in events[2]
    assert "block 8 left" in events[5]
    assert "B finishes: 6 blocks back to the pool" in events[10]  # A shares 0-3
    assert "C's prefix hit shrinks to 0 tokens" in events[12] and "A finishes" in events[12]
    assert "C finishes" in events[19]
    for step in (1, 3, 6, 7, 11):  # arrivals with a full hit, decodes inside held blocks
        assert step not in events
    # Every step where a block turns null or a request leaves is listed.
    for frame in frames:
        busy = frame.left or any(c.nulled for ch in frame.changes.values() for c in ch)
        assert bool(busy) <= (frame.step in events)


def test_a_leaving_request_gives_back_only_the_blocks_no_one_else_holds(frames) -> None:
    story = MixedAttentionStory(MixedParams(), 0)
    # Step 10: B leaves; the system prompt's full-attention blocks 0-3 are A's too.
    assert frames[10].kept == {"B": (0, 1, 2, 3)}
    left = story.caption(frames[10])[0]
    assert "physical blocks 12, 14, 6, 13, 15, 5 go back to the pool" in left
    assert "Blocks 0, 1, 2, 3 stay in use: A still holds them" in left
    # Step 12: A leaves alone with its blocks; C takes some back at once, from the pool.
    assert frames[12].kept == {"A": ()}
    assert "stay in use" not in story.caption(frames[12])[0]
    end = story.caption(frames[-1])[-1]
    assert "all 18 physical blocks are back in the pool" in end and "still cached" in end
