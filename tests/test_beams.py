"""Copy-on-write scenarios: parallel sampling and beam search on the real allocator."""

import dataclasses
import json
import threading

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.copy_on_write import BranchConfig, BranchPlay, CopyOnWriteStory
from lab.scenarios.story import LiveRun
from tests.engine_helpers import same


def run(cfg: BranchConfig, seed: int) -> tuple:
    return CopyOnWriteStory(cfg, seed).frames()


def describe(frame, cfg: BranchConfig) -> list[str]:
    return CopyOnWriteStory(cfg, 0).caption(frame)


def pool(num_blocks: int = 32, block_size: int = 16) -> PoolConfig:
    return PoolConfig(num_blocks=num_blocks, block_size=block_size)


def ref_counts(frame) -> dict[int, int]:
    return {b.block_id: b.ref_count for b in frame.snapshot.blocks if b.ref_count}


def test_parallel_sampling_shares_the_prompt_then_copies_only_the_partial_block():
    # Prompt 30, block size 16: block 0 full (16 tokens), block 1 partial (14 of 16).
    frames = run(BranchConfig(mode="parallel", num_branches=4, prompt_len=30), seed=0)
    start = frames[0]
    assert start.live == (0, 1, 2, 3)
    assert ref_counts(start) == {0: 4, 1: 4}  # four block tables, two physical blocks
    assert (start.blocks_used, start.naive_blocks) == (2, 8)
    first = frames[1]
    copies = [e for e in first.events if e.kind == "copy"]
    # Three branches copy the shared partial block; the last one writes into it in place.
    assert [(e.detail["src"], e.detail["dst"]) for e in copies] == [(1, 2), (1, 3), (1, 4)]
    assert ref_counts(first) == {0: 4, 1: 1, 2: 1, 3: 1, 4: 1}
    assert (first.blocks_used, first.naive_blocks, first.copies) == (5, 8, 3)
    tables = {s.seq_id: s.block_table for s in first.snapshot.sequences}
    assert tables == {0: (0, 2), 1: (0, 3), 2: (0, 4), 3: (0, 1)}


def test_full_shared_last_block_needs_no_copy():
    frames = run(BranchConfig(mode="parallel", num_branches=3, prompt_len=32), seed=0)
    assert frames[1].copies == 0
    assert frames[1].blocks_used == 2 + 3  # shared prompt + one fresh block per branch


def test_branches_free_their_blocks_until_nothing_is_left():
    cfg = BranchConfig(mode="parallel", num_branches=4, prompt_len=30, max_new_tokens=12)
    frames = run(cfg, seed=0)
    assert len(frames) == 13
    assert [len(f.live) for f in frames] == [4, 4, 4, 4, 3, 2, 2, 2, 2, 2, 1, 1, 0]
    for before, after in zip(frames, frames[1:]):
        for seq_id in set(after.finished) - set(before.finished):
            assert all(seq_id not in b.owners for b in after.snapshot.blocks)
    assert frames[-1].blocks_used == 0
    assert all(b.ref_count == 0 for b in frames[-1].snapshot.blocks)
    assert all(f.blocks_used <= f.naive_blocks for f in frames)


def test_beam_search_keeps_width_beams_and_ends_with_one():
    cfg = BranchConfig(mode="beam", num_branches=4, prompt_len=30, max_new_tokens=12)
    frames = run(cfg, seed=0)
    assert len(frames) == cfg.max_new_tokens + 2
    assert len(frames[0].live) == 1
    assert all(len(f.live) == 4 for f in frames[1:-1])
    assert len(frames[-1].live) == 1 and frames[-1].blocks_used == 3  # 42 tokens, 3 blocks
    assert frames[1].copies == 3  # the first expansion forks one beam into four
    assert frames[-1].copies == 18
    for f in frames:
        live_scores = f.scores
        assert set(live_scores) == set(f.live)
        assert f.blocks_used <= f.naive_blocks


def test_copy_on_write_on_the_real_pool_keeps_every_branch_exact():
    cfg = BranchConfig(pool(16, 8), mode="beam", num_branches=3, prompt_len=20,
                       max_new_tokens=5)
    scenario = BranchPlay(cfg, seed=3, store_kv=True)
    frames = run(cfg, seed=3)
    for frame in frames[:4]:
        assert scenario.advance() == frame
        scenario.manager.check_invariants()
        for seq_id in frame.live:
            tokens = scenario.manager.sequences[seq_id].tokens
            want_k, want_v = scenario.kv.keys_values(tokens, 0)  # [1, n, kv_heads, D]
            got_k, got_v = scenario.manager.read_kv(seq_id)  # [n, kv_heads, D]
            assert same(got_k, want_k[0]) and same(got_v, want_v[0])
    check = scenario.check_attention()
    assert check is not None and check.ok and check.num_seqs == 3


def test_bad_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="may need 24 blocks.*has 8"):
        BranchConfig(pool(8), num_branches=8, prompt_len=30, max_new_tokens=10)
    with pytest.raises(ValueError, match="mode"):
        BranchConfig(mode="greedy")
    scenario = BranchPlay(BranchConfig(max_new_tokens=1, mode="beam"), seed=0)
    for _ in range(scenario.last_step + 1):
        scenario.advance()
    with pytest.raises(ValueError, match="ended"):
        scenario.advance()


def test_live_run_steps_forward_and_rebuilds_to_go_back():
    cfg = BranchConfig(pool(8, 4), num_branches=2, prompt_len=6, max_new_tokens=4)
    live = LiveRun((cfg, 0), lambda: BranchPlay(cfg, 0, store_kv=True))
    frames = run(cfg, 0)
    assert live.at(2).frame(frames[2].events) == frames[2]
    assert live.at(3).step == 3 and live.rebuilds == 0  # forward: one more step
    assert live.at(1).frame(frames[1].events) == frames[1] and live.rebuilds == 1
    check = live.check(1)
    assert check is not None and check.ok and live.check(1) is check  # kept per step
    with pytest.raises(ValueError):
        live.at(-1)


def test_live_run_checks_from_two_threads_run_once():
    """A page's background prefetch and its script may ask for the same step's check at once."""
    cfg = BranchConfig(pool(8, 4), num_branches=2, prompt_len=6, max_new_tokens=4)
    made = []

    def make():
        made.append(1)
        return BranchPlay(cfg, 0, store_kv=True)

    live = LiveRun((cfg, 0), make)
    results = []
    threads = [threading.Thread(target=lambda: results.append(live.check(3))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] is results[1] and results[0].ok  # one check, kept
    assert len(made) == 1 and live.at(3).step == 3  # no rebuild: the second caller waited


def test_describe_names_the_copy_and_the_branch_that_keeps_the_block():
    cfg = BranchConfig(mode="parallel", num_branches=4, prompt_len=30)
    frames = run(cfg, seed=0)
    (fork_line, prompt_line) = describe(frames[0], cfg)
    assert fork_line.startswith("**B1**, **B2**, **B3** forked from **B0**")
    assert "new block(s) 0, 1 for the prompt" in prompt_line
    (copy_line,) = describe(frames[1], cfg)
    assert "block(s) **2, 3, 4**" in copy_line and "**B3** keeps block 1" in copy_line
    assert describe(frames[-1], cfg) == [
        "**B0** finished: each held block loses one reference; block(s) 5, 2, 0 reach ref "
        "count 0 and return to the free queue."]


def test_trace_export_stops_at_the_step():
    cfg = BranchConfig()
    trace = json.loads(CopyOnWriteStory(cfg, 0).trace(1))
    assert trace["meta"] == {"page": "copy_on_write", "seed": 0, "step": 1,
                             "params": json.loads(json.dumps(dataclasses.asdict(cfg),
                                                             default=str))}
    copies = [(e["detail"]["src"], e["detail"]["dst"]) for e in trace["paged"]
              if e["kind"] == "copy"]
    assert copies == [(1, 2), (1, 3), (1, 4)] and {e["step"] for e in trace["paged"]} == {0, 1}
