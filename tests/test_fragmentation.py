"""Fragmentation: the contiguous baseline vs the paged pool on one workload, and the sweep."""

import dataclasses
import json
from dataclasses import replace

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import (
    FragConfig,
    FragmentationStory,
    FragPlay,
    block_size_sweep,
    make_workload,
)
from lab.serving.workloads import RequestSpec


def req(req_id: int, arrival: int, prompt_len: int, output_len: int,
        max_tokens: int = 0) -> RequestSpec:
    base = 10 * req_id
    tokens = tuple(range(base, base + prompt_len)) + tuple(range(500 + base,
                                                                 500 + base + output_len))
    return RequestSpec(req_id, prompt_len, output_len, float(arrival), max_tokens=max_tokens,
                       tokens=tokens)


def simulate(cfg: FragConfig, requests: list[RequestSpec]) -> list:
    play = FragPlay(cfg, tuple(replace(r, max_tokens=cfg.max_output) for r in requests), 0)
    frames = []
    while not play.done:
        frames.append(play.advance())
    return frames


def run(cfg: FragConfig, seed: int) -> tuple:
    story = FragmentationStory(cfg, seed)
    return story.requests(), story.frames()


def test_three_requests_by_hand():
    # 8 blocks of 8 = 64 slots. Contiguous reserves 10 + 24 = 34: one at a time, and the
    # 30-slot hole left over is external fragmentation for the next 34-slot reservation.
    cfg = FragConfig(PoolConfig(num_blocks=8, block_size=8), num_requests=3, prompt_min=10,
                     prompt_max=10, mean_output=3, max_output=24)
    frames = simulate(cfg, [req(i, 0, 10, 3) for i in range(3)])
    first = frames[0]
    c, p = first.contiguous, first.paged
    # Step 0 prefills R0's prompt and samples its first token, which now holds a slot too.
    assert (c.used, c.internal, c.free, c.external) == (11, 23, 30, 30)
    assert (c.running, c.waiting) == (1, 2)
    # Paged: 2 blocks per 10-token prompt, 6 blocks for all three; 5 tail slots each.
    assert (p.used, p.internal, p.free, p.external) == (33, 15, 16, 0)
    assert (p.running, p.waiting) == (3, 0)
    assert [(r.req_id, r.start, r.reserved, r.used) for r in first.regions] == [(0, 0, 34, 11)]
    assert first.holes == ((34, 30),)
    # Each request samples its 3 tokens at steps t, t + 1, t + 2: paged finishes all three at
    # step 2; contiguous serves them one after another, a region freed after a step being
    # reserved again in the next.
    assert len(frames) == 9
    assert frames[2].paged.finished == 3 and frames[2].contiguous.finished == 1
    assert [f.contiguous.running for f in frames] == [1, 1, 0] * 3
    assert [r.req_id for r in frames[3].regions] == [1]


def test_paged_preempts_when_decode_runs_out_of_blocks():
    # 4 blocks of 4. Both 4-token prompts are admitted; at 12 tokens each they need 6 blocks.
    cfg = FragConfig(PoolConfig(num_blocks=4, block_size=4), num_requests=2, prompt_min=4,
                     prompt_max=4, mean_output=8, max_output=8)
    frames = simulate(cfg, [req(0, 0, 4, 8), req(1, 0, 4, 8)])
    assert frames[-1].preemptions >= 1
    assert frames[-1].paged.finished == 2 and frames[-1].contiguous.finished == 2
    assert max(f.contiguous.running for f in frames) == 1  # 12-slot reservations, 16 slots


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_accounting_holds_every_step(seed):
    cfg = FragConfig()
    requests, frames = run(cfg, seed)
    for f in frames:
        for s in (f.contiguous, f.paged):
            assert s.used + s.internal + s.free == cfg.capacity
            assert 0 <= s.external <= s.free
        assert f.paged.external == 0
        assert f.paged.internal < max(1, f.paged.running) * cfg.pool.block_size  # < 1/seq
        assert f.contiguous.internal == sum(r.reserved - r.used for r in f.regions)
        assert f.snapshot.usage.blocks_used == sum(
            len(s.block_table) for s in f.snapshot.sequences)
    last = frames[-1]
    assert last.contiguous.finished == last.paged.finished == len(requests)
    assert max(f.paged.running for f in frames) > max(f.contiguous.running for f in frames)


def test_seeded_run_is_deterministic_and_exact():
    cfg = FragConfig()
    requests, frames = run(cfg, 0)
    again = run(cfg, 0)
    assert (requests, frames) == again
    assert run(cfg, 1)[0] != requests
    assert len(frames) == 143  # 144 before the pages ran on the scheduler (one step sooner)
    assert max(f.contiguous.running for f in frames) == 3
    assert max(f.paged.running for f in frames) == 9
    drained = next(f.step for f in frames if f.paged.finished == len(requests))
    assert drained == 72


def test_workload_respects_limits():
    cfg = FragConfig(num_requests=40, max_output=50, mean_output=20)
    for r in make_workload(cfg, 3):
        assert cfg.prompt_min <= r.prompt_len <= cfg.prompt_max
        assert 1 <= r.output_len <= cfg.max_output


def test_block_size_sweep_by_hand():
    # One request, prompt 3, output 2: it holds 3, 4, then 5 tokens.
    rows = {row.block_size: row for row in block_size_sweep((req(0, 0, 3, 2),), (1, 4))}
    assert rows[1].tail_slots == 0 and rows[1].table_entries == 4  # (3 + 4 + 5) / 3
    four = rows[4]
    assert four.table_entries == pytest.approx(4 / 3)  # 1, 1, 2 blocks
    assert four.tail_slots == pytest.approx(4 / 3)  # 1, 0, 3 empty slots
    assert four.tail_pct == pytest.approx(25.0)  # 4 of 16 allocated slots
    assert four.table_bytes == pytest.approx(16 / 3)


def test_sweep_trades_waste_for_metadata():
    requests, _ = run(FragConfig(), 0)
    rows = block_size_sweep(requests)
    assert [r.block_size for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert rows[0].tail_slots == 0
    tails = [r.tail_slots for r in rows]
    entries = [r.table_entries for r in rows]
    assert tails == sorted(tails) and entries == sorted(entries, reverse=True)


def test_bad_config_says_what_is_wrong():
    with pytest.raises(ValueError, match="reserve 256 slots.*holds only 160"):
        FragConfig(PoolConfig(num_blocks=10, block_size=16), prompt_max=96, max_output=160)
    with pytest.raises(ValueError, match="mean output"):
        FragConfig(mean_output=200, max_output=100)


def test_paged_side_on_the_real_pool_matches_and_passes_the_kernel_check():
    story = FragmentationStory(FragConfig(num_requests=4), 5)
    frames = story.frames()
    live = story.play(store_kv=True)
    for frame in frames[:6]:
        assert live.advance().snapshot == frame.snapshot
    live.servers["paged"].check_invariants()
    check = live.check_attention()  # the kernel over the batch the paged server ran at step 5
    record = frames[5].records["paged"]
    assert check is not None and check.ok and check.num_seqs == record.num_seqs


def test_trace_export_holds_both_systems_up_to_the_step():
    cfg = FragConfig()
    trace = json.loads(FragmentationStory(cfg, 0).trace(5))
    assert trace["meta"] == {"page": "fragmentation", "seed": 0, "step": 5,
                             "params": json.loads(json.dumps(dataclasses.asdict(cfg),
                                                             default=str))}
    for system in ("contiguous", "paged"):
        assert {e["step"] for e in trace[system]} <= set(range(6))
    reserved = [e for e in trace["contiguous"] if e["kind"] == "allocate"]
    assert reserved[0]["detail"] == {"start": 0, "reserved": 65 + 160}  # R0: prompt + max
