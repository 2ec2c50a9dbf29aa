"""Fragmentation: the contiguous baseline vs the paged pool on one workload, and the sweep."""

import dataclasses
import json
from dataclasses import replace

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import (
    DOUBLING,
    FragConfig,
    FragmentationStory,
    FragStepper,
    MemoryStats,
    block_size_sweep,
    blocked_by_holes,
    doubling_effect,
    event_steps,
    make_workload,
    run_waste,
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
    stepper = FragStepper(cfg, tuple(replace(r, max_tokens=cfg.max_output) for r in requests), 0)
    frames = []
    while not stepper.done:
        frames.append(stepper.advance())
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
    live = story.stepper(store_kv=True)
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


def test_the_story_ends_with_every_block_and_reservation_back_in_the_pool():
    cfg = FragConfig()
    story = FragmentationStory(cfg, 0)
    frames = story.frames()
    last = frames[-1]
    for s in (last.contiguous, last.paged):
        assert (s.free, s.used, s.internal, s.running, s.waiting) == (cfg.capacity, 0, 0, 0, 0)
    assert last.regions == () and last.snapshot.usage.blocks_used == 0
    assert any("back in the free pool" in line for line in story.caption(last))
    assert not any("back in the free pool" in line for line in story.caption(frames[-2]))


def test_run_waste_averages_only_the_steps_a_system_holds_requests():
    def stats(running: int, internal: int) -> MemoryStats:
        return MemoryStats(100, 10, internal, 90 - internal, 0, running, 0, 0)

    class Frame:
        def __init__(self, c: MemoryStats, p: MemoryStats) -> None:
            self.contiguous, self.paged = c, p

    frames = [Frame(stats(1, 50), stats(2, 4)), Frame(stats(1, 30), stats(0, 0)),
              Frame(stats(0, 0), stats(0, 0))]
    assert run_waste(frames, "contiguous") == pytest.approx(40.0)  # not (50 + 30 + 0) / 3
    assert run_waste(frames, "paged") == pytest.approx(4.0)
    default = FragmentationStory(FragConfig(), 0).frames()
    assert run_waste(default, "contiguous") > 10 * run_waste(default, "paged") > 0


def test_event_steps_name_finishes_failed_reservations_and_the_end():
    story = FragmentationStory(FragConfig(), 0)
    frames = story.frames()
    events = dict(event_steps(frames))
    assert list(events) == sorted(events)
    finishing = {f.step for f in frames for r in f.records.values() if r and r.finished_ids}
    assert finishing <= set(events)
    assert "paged has finished all 12 requests" in events[72]
    assert "contiguous has finished all 12 requests" in events[len(frames) - 1]
    # A reservation that fails on holes is listed the step it starts failing, not every step.
    blocked = [f.step for f in frames if blocked_by_holes(f.contiguous, f.next_reservation)]
    assert blocked and "no hole holds the next reservation" in events[blocked[0]]
    starts = [s for s in blocked if s - 1 not in blocked]
    assert all("no hole" in events[s] for s in starts)
    assert sum("no hole" in text for text in events.values()) == len(starts)
    # Quiet steps are not events: stepping event to event skips the long decode stretches.
    assert len(events) < len(frames) / 4


def test_preemption_is_an_event():
    cfg = FragConfig(PoolConfig(num_blocks=4, block_size=4), num_requests=2, prompt_min=4,
                     prompt_max=4, mean_output=8, max_output=8)
    frames = simulate(cfg, [req(0, 0, 4, 8), req(1, 0, 4, 8)])
    first = next(f.step for f in frames if f.preemptions)
    assert "preempted" in dict(event_steps(frames))[first]


def test_doubling_the_block_size_halves_entries_and_doubles_the_tail():
    requests, _ = run(FragConfig(), 0)
    rows = block_size_sweep(requests)
    for size in (4, 8, 16, 32):
        effect, low, high = doubling_effect(rows, size)
        assert (low.block_size, high.block_size) == (size, 2 * size)
        assert effect == "entries about halve, the empty tail about doubles"
        assert 0.4 < high.table_entries / low.table_entries < 0.7
        assert 1.6 < high.tail_slots / low.tail_slots < 2.5
    # One request of 17 then 18 tokens: at 16 it holds two blocks with 15, 14 empty slots, at
    # 32 one block with the same 15, 14: the answer is the engine's, not a rule of thumb.
    short = block_size_sweep((req(0, 0, 17, 1),), (16, 32))
    assert doubling_effect(short, 16)[0] == ("entries about halve, the empty tail stays about "
                                             "the same")
    # Sequences shorter than half a block: the entries cannot halve (there is one).
    tiny = block_size_sweep((req(0, 0, 3, 2),), (16, 32))
    assert doubling_effect(tiny, 16)[0] == ("entries stay about the same, the empty tail about "
                                            "doubles")
    assert set(DOUBLING) >= {doubling_effect(rows, s)[0] for s in (2, 64)}
