"""Prefix caching scenario: shared system prompts, hash chains, hit rate, LRU eviction."""

import json

import pytest

from lab.figures.prefix import cache_over_time
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.prefix_cache import (
    PrefixCacheStory,
    PrefixConfig,
    PrefixStepper,
    event_steps,
    hit_question,
    make_workload,
)
from lab.serving.workloads import RequestSpec

SYSTEM = tuple(range(100, 116))  # 16 tokens: two full blocks of 8


def request(req_id: int, arrival: int, prompt: tuple[int, ...],
            output_len: int = 2) -> RequestSpec:
    """Emits output_len tokens: the first in the step that prefills it, then one per step."""
    output = tuple(range(900, 900 + output_len))
    return RequestSpec(req_id, len(prompt), output_len, float(arrival), tokens=prompt + output)


def scenario(requests: list[RequestSpec], num_blocks: int = 16,
             store_kv: bool = False) -> PrefixStepper:
    cfg = PrefixConfig(PoolConfig(num_blocks=num_blocks, block_size=8),
                       num_requests=len(requests), system_len=16, question_max=8, output_max=4)
    return PrefixStepper(cfg, tuple(requests), 0, store_kv)


def run(cfg: PrefixConfig, seed: int) -> tuple:
    return PrefixCacheStory(cfg, seed).frames()


def drive(s: PrefixStepper) -> list:
    frames = []
    while not s.done:
        frames.append(s.advance())
    return frames


def test_second_request_hits_the_shared_full_blocks_only():
    a = request(0, 0, SYSTEM + (1, 2, 3, 4, 5), output_len=4)  # 21 tokens: 2 full blocks + 5
    b = request(1, 1, SYSTEM + (6, 7, 8))  # same system prompt, other question
    frames = drive(scenario([a, b]))
    first, second = frames[0].admissions[0], frames[1].admissions[0]
    assert first.hit_tokens == 0
    assert [link.status for link in first.chain] == ["miss", "miss", "partial"]
    assert second.hit_tokens == 16
    assert [link.status for link in second.chain] == ["hit", "hit", "partial"]
    assert [link.block_id for link in second.chain[:2]] == [link.block_id
                                                            for link in first.chain[:2]]
    # The chain: each hash names its parent.
    assert second.chain[0].parent is None
    assert second.chain[1].parent == second.chain[0].block_hash
    shared = second.chain[0].block_id
    assert frames[1].snapshot.blocks[shared].ref_count == 2
    assert (frames[1].hit_tokens, frames[1].query_tokens) == (16, 21 + 19)


def test_the_last_prompt_token_is_never_taken_from_the_cache():
    a = request(0, 0, SYSTEM + (1, 2))
    exact = request(1, 1, SYSTEM)  # exactly two full blocks, both cached
    frames = drive(scenario([a, exact]))
    admission = frames[1].admissions[0]
    assert admission.hit_tokens == 8  # (16 - 1) // 8 = 1 block may hit
    assert [link.status for link in admission.chain] == ["hit", "last"]


def test_finished_requests_leave_cached_free_blocks_that_later_requests_revive():
    a = request(0, 0, SYSTEM + (1,), output_len=1)
    b = request(1, 3, SYSTEM + (2,))
    frames = drive(scenario([a, b]))
    after_a = frames[0]  # a's prefill sampled its one token: it finished at step 0
    assert after_a.record.finished_ids == (0,)
    assert [f.record for f in frames[1:3]] == [None, None]  # idle until b arrives
    assert after_a.snapshot.usage.blocks_used == 0
    assert after_a.snapshot.usage.blocks_cached_free == 2  # the two system-prompt blocks
    revived = frames[3]
    assert revived.admissions[0].hit_tokens == 16
    assert [e.kind for e in revived.events].count("hit") == 2
    assert revived.evictions == 0


def test_lru_eviction_under_pressure():
    # 5 blocks. a1 (17 tokens + 1 output, blocks 0 1 2) frees its tail first: its partial
    # block 2 goes to the front of the free queue, its cached blocks 1 and 0 to the back:
    # 2 3 4 1 0. b needs 4 fresh blocks: 2 3 4 1, so cached block 1 (the second system-prompt
    # block) is evicted and block 0 survives: a2 hits 8 tokens, not 16.
    other = tuple(range(300, 316))
    a1 = request(0, 0, SYSTEM + (1,), output_len=1)
    b = request(1, 2, other + (2, 3, 4, 5, 6, 7, 8, 9, 10, 11), output_len=2)
    a2 = request(2, 4, SYSTEM + (5,))
    frames = drive(scenario([a1, b, a2], num_blocks=5))
    assert frames[0].snapshot.usage.blocks_cached_free == 2
    assert frames[0].snapshot.free_queue == (2, 3, 4, 1, 0)
    b_admit = frames[2]
    evicted = [e.block_id for e in b_admit.events if e.kind == "evict"]
    assert evicted == [1] and b_admit.evictions == 1
    assert b_admit.snapshot.free_queue == (0,)
    a2_admit = next(f for f in frames if f.admissions and f.admissions[0].req_id == 2)
    assert a2_admit.admissions[0].hit_tokens == 8
    assert [link.status for link in a2_admit.admissions[0].chain] == ["hit", "miss", "partial"]


def test_seeded_run_counts_and_invariants():
    cfg = PrefixConfig()
    assert cfg.pool.block_size == 16  # the guide's block size
    frames = run(cfg, 0)
    assert frames == run(cfg, 0)
    assert len(frames) == 17  # the last request ends one step after its prefill sampled token 1
    last = frames[-1]
    assert (last.hit_tokens, last.query_tokens) == (128, 336)
    assert last.hit_rate == pytest.approx(128 / 336)
    # The default pool is small enough that three apps' prompts do not all stay cached: app B's
    # system prompt blocks are evicted, and the next request of app B misses them.
    assert last.evictions == 3
    assert sorted(e for f in frames for e in f.evicted) == ["B·L0", "B·L1", "R2"]
    for f in frames:
        u = f.snapshot.usage
        assert u.blocks_used + u.blocks_free == cfg.pool.num_blocks
        assert u.blocks_cached_free <= u.blocks_free
        bs = cfg.pool.block_size
        for a in f.admissions:
            assert a.hit_tokens % bs == 0
            assert a.hit_tokens <= (a.prompt_len - 1) // bs * bs


def test_default_evicts_for_most_seeds_without_preempting():
    cfg = PrefixConfig()
    evicting = 0
    for seed in range(8):
        frames = run(cfg, seed)
        assert not any(f.record and f.record.preempted_ids for f in frames)
        evicting += any("·" in e for f in frames for e in f.evicted)  # a system prompt block
    assert evicting >= 7


def test_the_story_ends_with_every_block_back_in_the_free_queue():
    story = PrefixCacheStory(PrefixConfig(), 0)
    frames = story.frames()
    last = frames[-1]
    assert last.snapshot.usage.blocks_used == 0 and not last.seq_of_request
    assert last.snapshot.usage.blocks_free == story.config.pool.num_blocks
    words = " ".join(story.caption(last))
    assert "every block is back in the free queue" in words
    assert f"{last.snapshot.usage.blocks_cached_free} of them still cached" in words
    assert "back in the free queue" not in " ".join(story.caption(frames[-2]))


def test_each_hashed_block_says_which_prompt_it_holds():
    cfg = PrefixConfig()
    requests, apps = make_workload(cfg, 0)
    frames = run(cfg, 0)
    bs = cfg.pool.block_size
    for f in frames:
        for block in f.snapshot.blocks:
            assert (block.block_id in f.holds) == (block.block_hash is not None)
        for a in f.admissions:
            for link in a.chain[:cfg.system_len // bs]:  # the system prompt's full blocks
                assert f.holds[link.block_id] == f"{'ABC'[a.app]}·L{link.index}"
    # A block of a request's own question is named after that request, and stays so cached.
    first = frames[0].admissions[0]
    own = [link for link in first.chain if link.block_hash and link.index >= cfg.system_len // bs]
    for link in own:
        assert frames[0].holds[link.block_id] == "R0"
    assert frames[8].evicted == ("B·L1", "B·L0")
    assert "Blocks 3 (B·L1), 2 (B·L0) were free but still cached" in " ".join(
        PrefixCacheStory(cfg, 0).caption(frames[8]))


def test_the_question_is_about_one_admission_the_pool_before_decides():
    cfg = PrefixConfig()
    frames = run(cfg, 0)
    asked = hit_question(frames, cfg.pool.block_size, cfg.system_len)
    # R5 of app B, after B's cached system prompt was evicted at step 8: nothing is found.
    assert (asked.step, asked.admission.req_id, asked.admission.app) == (10, 5, 1)
    assert asked.admission.hit_tokens == 0 and asked.found == ()
    assert "B·L0 had been evicted at step 8" in asked.reason
    before = frames[asked.step - 1]
    assert not any(held.startswith("B·") for held in before.holds.values())


@pytest.mark.parametrize("num_blocks, num_apps, seed", [(8, 3, 1), (16, 3, 0), (16, 1, 0),
                                                        (8, 2, 3), (12, 3, 5)])
def test_the_question_answer_is_what_the_pool_before_shows(num_blocks, num_apps, seed):
    """Counting the leading blocks of its chain in the pool one step before gives the answer:
    nothing the learner cannot see changes it."""
    cfg = PrefixConfig(PoolConfig(num_blocks=num_blocks, block_size=16), num_apps=num_apps)
    frames = run(cfg, seed)
    asked = hit_question(frames, cfg.pool.block_size, cfg.system_len)
    assert asked is not None
    before, a = frames[asked.step - 1], asked.admission
    assert frames[asked.step].admissions[0] == a
    held = {b.block_hash for b in before.snapshot.blocks if b.block_hash}
    counted = 0
    for link in a.chain[:(a.prompt_len - 1) // 16]:
        if link.block_hash not in held:
            break
        counted += 1
    assert counted * 16 == a.hit_tokens
    assert len(asked.found) == counted
    assert str(a.hit_tokens) in asked.reason or a.hit_tokens == 0


def test_event_steps_list_hits_evictions_finishes():
    frames = run(PrefixConfig(), 0)
    events = dict(event_steps(frames))
    assert list(events) == sorted(events)
    assert "evicted: B·L1, B·L0" in events[8]
    assert "R3 finds 32 prompt tokens in the cache" in events[6]
    finishing = {f.step for f in frames if f.record and f.record.finished_ids}
    hitting = {f.step for f in frames if any(a.hit_tokens for a in f.admissions)}
    assert set(events) == finishing | hitting | {f.step for f in frames if f.evicted}
    assert 0 not in events and 10 in events  # R0's admission hits nothing; step 10 evicts


def test_workload_shares_system_prompts():
    cfg = PrefixConfig(num_requests=12, num_apps=3)
    requests, apps = make_workload(cfg, 4)
    by_app: dict[int, set] = {}
    for r, app in zip(requests, apps):
        by_app.setdefault(app, set()).add(r.tokens[:cfg.system_len])
    assert all(len(prompts) == 1 for prompts in by_app.values())
    assert len({next(iter(p)) for p in by_app.values()}) == len(by_app)


def test_real_pool_matches_and_kernel_agrees():
    a = request(0, 0, SYSTEM + (1, 2, 3), output_len=3)
    b = request(1, 1, SYSTEM + (4, 5))
    real = scenario([a, b], store_kv=True)
    for frame in drive(scenario([a, b]))[:2]:
        assert real.advance().snapshot == frame.snapshot
    real.server.check_invariants()
    check = real.check_attention()  # step 1: a decodes while b's prompt is prefilled
    assert check is not None and check.ok and check.num_seqs == 2


def test_bad_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="grow to 54 tokens, 4 blocks.*pool has 3"):
        PrefixConfig(PoolConfig(num_blocks=3, block_size=16))
    with pytest.raises(ValueError, match="question_min"):
        PrefixConfig(question_min=9, question_max=3)


def test_trace_export_replays_to_the_same_events():
    story = PrefixCacheStory(PrefixConfig(), 0)
    trace = json.loads(story.trace(6))
    assert trace["meta"]["step"] == 6 and trace["meta"]["page"] == "prefix_cache"
    frames = story.frames()
    hits = [e for e in trace["paged"] if e["kind"] == "hit"]
    assert len(hits) * 16 == frames[6].hit_tokens  # one event per cached block reused
    assert max(e["step"] for e in trace["paged"]) <= 6


def test_the_run_so_far_shows_no_later_step():
    """The over-time figure stops at the step shown: the question's answer is not on it."""
    frames = run(PrefixConfig(), 0)
    figure = cache_over_time(list(frames), 9)
    for trace in figure.data:
        assert max(trace.x) == 9
    assert list(figure.layout.xaxis.range) == [-0.5, len(frames) - 0.5]  # the axes stay put
    assert cache_over_time(list(frames), 16).layout.yaxis2.range == figure.layout.yaxis2.range
