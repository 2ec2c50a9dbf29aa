"""Copy-on-write scenarios: parallel sampling and beam search on the real allocator, vLLM V0's
fork + copy-on-write beside vLLM V1 (0.33)'s requests through the prefix cache."""

import dataclasses
import json
import threading

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.copy_on_write import BranchConfig, BranchStepper, CopyOnWriteStory
from lab.scenarios.story import LiveRun
from tests.engine_helpers import same


def run(cfg: BranchConfig, seed: int) -> tuple:
    return CopyOnWriteStory(cfg, seed).frames()


def describe(frame, cfg: BranchConfig) -> list[str]:
    return CopyOnWriteStory(cfg, 0).caption(frame)


def pool(num_blocks: int = 32, block_size: int = 16) -> PoolConfig:
    return PoolConfig(num_blocks=num_blocks, block_size=block_size)


def ref_counts(view) -> dict[int, int]:
    return {b.block_id: b.ref_count for b in view.snapshot.blocks if b.ref_count}


def hits(view) -> list[tuple[int, int, int]]:
    """(branch, prefix-hit tokens, tokens computed) of each request admitted at a step."""
    return [(a.branch, a.hit_tokens, a.computed) for a in view.admitted]


def tables(view) -> dict[int, tuple[int, ...]]:
    return {s.seq_id: s.block_table for s in view.snapshot.sequences}


def test_v0_parallel_sampling_shares_the_prompt_then_copies_only_the_partial_block():
    # Prompt 30, block size 16: block 0 full (16 tokens), block 1 partial (14 of 16).
    frames = run(BranchConfig(mode="parallel", num_branches=4, prompt_len=30), seed=0)
    start = frames[0]
    assert start.live == (0, 1, 2, 3)
    assert ref_counts(start.v0) == {0: 4, 1: 4}  # four block tables, two physical blocks
    assert (start.v0.blocks_used, start.naive_blocks, start.v0.computed) == (2, 8, 30)
    first = frames[1]
    copies = [e for e in first.v0.events if e.kind == "copy"]
    # Three branches copy the shared partial block; the last one writes into it in place.
    assert [(e.detail["src"], e.detail["dst"]) for e in copies] == [(1, 2), (1, 3), (1, 4)]
    assert ref_counts(first.v0) == {0: 4, 1: 1, 2: 1, 3: 1, 4: 1}
    assert (first.v0.blocks_used, first.naive_blocks, first.v0.total_copies) == (5, 8, 3)
    assert tables(first.v0) == {0: (0, 2), 1: (0, 3), 2: (0, 4), 3: (0, 1)}


def test_v1_child_requests_hit_the_first_ones_full_blocks_and_recompute_the_tail():
    """vLLM V1: four child requests of the same 30-token prompt, scheduled in one step. The
    first computes it all; the others hit its full block 0 (hashed as it was allocated) and
    each computes the 14-token tail again into a block of its own. Nothing is ever copied."""
    frames = run(BranchConfig(mode="parallel", num_branches=4, prompt_len=30), seed=0)
    v1 = frames[0].v1
    assert hits(v1) == [(0, 0, 30), (1, 16, 14), (2, 16, 14), (3, 16, 14)]
    assert ref_counts(v1) == {0: 4, 1: 1, 2: 1, 3: 1, 4: 1}
    assert tables(v1) == {0: (0, 1), 1: (0, 2), 2: (0, 3), 3: (0, 4)}
    assert (v1.blocks_used, v1.computed, v1.recomputed) == (5, 72, 42)  # V0: 2 blocks, 30
    # From the first new token on, both hold the same 5 blocks: V0 paid 3 copies, V1 42 tokens.
    assert frames[1].v1.blocks_used == frames[1].v0.blocks_used == 5
    assert all(f.v1.total_copies == 0 for f in frames)
    assert frames[-1].v1.total_recomputed == 42 and frames[-1].v0.total_recomputed == 0
    assert [f.v1.computed for f in frames[1:]] == [f.v0.computed for f in frames[1:]]


def test_full_last_prompt_block_v0_shares_it_v1_computes_it_again_per_child():
    """Prompt 32 = two full blocks. V0 shares both and copies nothing. V1's hit stops one token
    short of the prompt, so each later child recomputes the whole last block (16 tokens) into
    a block of its own, and holds it for the whole run."""
    frames = run(BranchConfig(mode="parallel", num_branches=3, prompt_len=32), seed=0)
    assert frames[1].v0.total_copies == 0
    assert frames[1].v0.blocks_used == 2 + 3  # shared prompt + one fresh block per branch
    assert hits(frames[0].v1) == [(0, 0, 32), (1, 16, 16), (2, 16, 16)]
    assert (frames[0].v1.blocks_used, frames[0].v1.recomputed) == (4, 32)
    assert frames[1].v1.blocks_used == 4 + 3
    assert all(f.v1.blocks_used - f.v0.blocks_used == 2 for f in frames[:4])


def test_branches_free_their_blocks_until_nothing_is_left():
    cfg = BranchConfig(mode="parallel", num_branches=4, prompt_len=30, max_new_tokens=12)
    frames = run(cfg, seed=0)
    assert len(frames) == 13
    assert [len(f.live) for f in frames] == [4, 4, 4, 4, 3, 2, 2, 2, 2, 2, 1, 1, 0]
    for before, after in zip(frames, frames[1:]):
        for branch in set(after.finished) - set(before.finished):
            assert all(branch not in b.owners for b in after.v0.snapshot.blocks)
    for view in (frames[-1].v0, frames[-1].v1):
        assert view.blocks_used == 0 and all(b.ref_count == 0 for b in view.snapshot.blocks)
    # V1's full blocks stay cached in the free queue: hittable by a later prompt.
    assert frames[-1].v1.snapshot.usage.blocks_cached_free > 0
    assert all(f.v0.blocks_used <= f.naive_blocks for f in frames)


def test_beam_search_keeps_width_beams_and_ends_with_every_block_back():
    cfg = BranchConfig(mode="beam", num_branches=4, prompt_len=30, max_new_tokens=12)
    frames = run(cfg, seed=0)
    # Step 0 the prompt, 12 token steps, the best beam kept, then returned (its request ends).
    assert len(frames) == cfg.max_new_tokens + 3
    assert len(frames[0].live) == 1
    assert all(len(f.live) == 4 for f in frames[1:-2])
    assert len(frames[-2].live) == 1 and frames[-2].v0.blocks_used == 3  # 42 tokens, 3 blocks
    assert frames[-1].live == () and frames[-1].v0.blocks_used == 0
    assert frames[1].v0.total_copies == 3  # the first expansion forks one beam into four
    assert frames[-1].v0.total_copies == 18
    for f in frames:
        assert set(f.scores) == set(f.live)
        assert f.v0.blocks_used <= f.naive_blocks


def test_v1_beam_search_sends_every_beam_as_a_new_request_each_step():
    """vLLM V1's beam search (outside the engine core): each step every beam is a new
    one-token request. Last step's requests end first; the new ones hit the full blocks in the
    prefix cache and recompute their partial last block."""
    cfg = BranchConfig(mode="beam", num_branches=4, prompt_len=30, max_new_tokens=12)
    frames = run(cfg, seed=0)
    assert hits(frames[0].v1) == [(0, 0, 30)]
    # Step 1: 31 tokens each, hit 16 (block 0), compute 15: 14 prompt tokens again + 1 new.
    assert hits(frames[1].v1) == [(0, 16, 15), (1, 16, 15), (2, 16, 15), (3, 16, 15)]
    assert (frames[1].v1.computed, frames[1].v1.recomputed) == (60, 56)
    assert frames[1].v0.computed == 4  # V0: one new token per beam
    kinds = [e.kind for e in frames[1].v1.events]
    assert kinds.index("free") < kinds.index("hit")  # the prompt's request ended first
    # Step 2: 32 tokens, the hit stops one short (16): the full second block is recomputed.
    assert [h[1:] for h in hits(frames[2].v1)] == [(16, 16)] * 4
    # Step 6: 36 tokens, blocks 0 and 2 (32 tokens) hit, 4 computed (3 of them again).
    assert [h[1:] for h in hits(frames[6].v1)] == [(32, 4)] * 4
    assert frames[6].v1.recomputed == 12
    # The last token step sends nothing (its tokens need no forward pass), nor do the ends.
    assert [f.v1.admitted for f in frames[-3:]] == [(), (), ()]
    assert all(f.v1.blocks_used == 0 for f in frames[-3:])
    assert frames[-1].v1.total_copies == 0
    assert frames[-1].v1.total_recomputed > 10 * frames[-1].v0.total_copies


def test_both_engines_on_the_real_pool_keep_every_branch_exact():
    cfg = BranchConfig(pool(16, 8), mode="beam", num_branches=3, prompt_len=20,
                       max_new_tokens=5)
    scenario = BranchStepper(cfg, seed=3, store_kv=True)
    frames = run(cfg, seed=3)
    for frame in frames[:4]:
        assert scenario.advance() == frame
        for engine in (scenario.v0, scenario.v1):
            engine.manager.check_invariants()
            for seq_id in engine.manager.sequences:
                tokens = engine.manager.sequences[seq_id].tokens
                want_k, want_v = engine.kv.keys_values(tokens, 0)  # [1, n, kv_heads, D]
                got_k, got_v = engine.manager.read_kv(seq_id)  # [n, kv_heads, D]
                assert same(got_k, want_k[0]) and same(got_v, want_v[0])
    check = scenario.check_attention()
    assert check is not None and check.ok and check.num_seqs == 3 + 3  # V0's 3, V1's 3


def test_the_kernel_checks_v1s_prefill_tails_over_their_hits():
    cfg = BranchConfig(pool(16, 8), num_branches=3, prompt_len=20, max_new_tokens=3)
    scenario = BranchStepper(cfg, seed=1, store_kv=True)
    scenario.advance()
    v1 = scenario.v1.check_attention()
    # The three requests' new tokens: 20 + 4 + 4 queries (hits of 16), each over 20 tokens.
    assert v1 is not None and v1.ok and v1.output.shape[0] == 28
    assert scenario.check_attention().num_seqs == 1 + 3  # V0 prefilled once


def test_bad_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="may need 24 blocks.*has 8"):
        BranchConfig(pool(8), num_branches=8, prompt_len=30, max_new_tokens=10)
    with pytest.raises(ValueError, match="mode"):
        BranchConfig(mode="greedy")
    scenario = BranchStepper(BranchConfig(max_new_tokens=1, mode="beam"), seed=0)
    for _ in range(scenario.last_step + 1):
        scenario.advance()
    with pytest.raises(ValueError, match="ended"):
        scenario.advance()


def test_live_run_steps_forward_and_rebuilds_to_go_back():
    cfg = BranchConfig(pool(8, 4), num_branches=2, prompt_len=6, max_new_tokens=4)
    live = LiveRun((cfg, 0), lambda: BranchStepper(cfg, 0, store_kv=True))
    frames = run(cfg, 0)
    for engine in ("v0", "v1"):
        assert getattr(live.at(2), engine).manager.snapshot() == getattr(frames[2], engine).snapshot
    assert live.at(3).step == 3 and live.rebuilds == 0  # forward: one more step
    assert live.at(1).v1.manager.snapshot() == frames[1].v1.snapshot and live.rebuilds == 1
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
        return BranchStepper(cfg, 0, store_kv=True)

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
    v0 = [line for line in describe(frames[0], cfg) if line.startswith("V0: ")]
    assert v0[0] == "V0: **B0** took new block(s) 0, 1 for the prompt."
    assert v0[1].startswith("V0: **B1**, **B2**, **B3** forked from **B0**")
    (copy_line, *v1) = describe(frames[1], cfg)
    assert "block(s) **2, 3, 4**" in copy_line and "**B3** keeps block 1" in copy_line
    assert v1 == []  # V1: every request writes into its own block
    assert describe(frames[-1], cfg) == [
        "V0: **B0** finished: each held block loses one reference; block(s) 5, 2, 0 reach ref "
        "count 0 and return to the free queue.",
        "V1: **B0** finished: each held block loses one reference; block(s) 5, 1, 0 reach ref "
        "count 0 and return to the free queue (full block(s) 1, 0 keep their hash: still "
        "cached)."]


def test_trace_export_stops_at_the_step():
    cfg = BranchConfig()
    trace = json.loads(CopyOnWriteStory(cfg, 0).trace(1))
    assert trace["meta"] == {"page": "copy_on_write", "seed": 0, "step": 1,
                             "params": json.loads(json.dumps(dataclasses.asdict(cfg),
                                                             default=str))}
    copies = [(e["detail"]["src"], e["detail"]["dst"]) for e in trace["vllm_v0"]
              if e["kind"] == "copy"]
    assert copies == [(1, 2), (1, 3), (1, 4)] and {e["step"] for e in trace["vllm_v0"]} == {0, 1}
    assert [e["block_id"] for e in trace["vllm_v1"] if e["kind"] == "hit"] == [0, 0, 0]
