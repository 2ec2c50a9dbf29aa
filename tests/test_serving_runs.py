"""The replays behind the scheduler's big views: the card's pool, latency distributions, and
the chain's replays that stand for others."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lab.serving.chain import batch_chain, chain_plan, chain_rows, peak_seats, same_replay
from lab.serving.metrics import summarize
from lab.serving.runs import PERCENTS, Latencies, card_sheet, replay
from lab.serving.workloads import from_preset
from lab.sizing.capacity import GIB, capacity_sheet, load_gpus
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import load_presets
from tests.scheduler_helpers import config, llama_h100


def test_the_card_pool_is_the_calculators() -> None:
    spec = load_presets()["Llama-3.1-8B"]
    sheet = card_sheet(spec, "H100 80 GB", 16)
    plain = capacity_sheet(kv_layout(spec), gpu_bytes=load_gpus()["H100 80 GB"].memory_bytes,
                           utilization=0.9, weight_bytes=spec.weight_bytes(),
                           reserve_bytes=2 * GIB, block_size=16, context=1024)
    assert sheet.num_blocks == plain.num_blocks == 28_020  # the calculator's guide formula
    assert card_sheet(spec, "H200 141 GB", 16).num_blocks > 1.9 * sheet.num_blocks
    assert card_sheet(load_presets()["Llama-3.1-70B"], "L4", 16).num_blocks == 0  # no room


def test_latencies_are_the_summarys_percentiles() -> None:
    requests = from_preset("alpaca", 30, seed=1, max_tokens=64)
    sched = replay(requests, config(num_blocks=24, max_num_seqs=8, max_num_batched_tokens=64),
                   llama_h100(), 0)
    lat, s = Latencies.of(sched), summarize(sched)
    assert lat.ttft_s.shape == lat.itl_s.shape == PERCENTS.shape
    assert (lat.requests, lat.gaps) == (s.ttft.count, s.itl.count)
    p50, p90 = int(np.flatnonzero(PERCENTS == 50)[0]), int(np.flatnonzero(PERCENTS == 90)[0])
    assert np.isclose(lat.ttft_s[p50], s.ttft.p50) and np.isclose(lat.itl_s[p90], s.itl.p90)
    assert np.all(np.diff(lat.itl_s) >= 0)


def test_a_replay_whose_seats_never_filled_stands_for_more_seats() -> None:
    requests = from_preset("alpaca", 60, seed=2, max_tokens=128)
    cfg = config(num_blocks=40, max_num_seqs=8, max_num_batched_tokens=256,
                 allocator="contiguous")  # reservations hold it under 8 live requests
    plan = [cfg, replace(cfg, max_num_seqs=64), replace(cfg, max_num_seqs=4)]
    runs = [replay(requests, c, llama_h100(), 0) for c in plan]
    peaks = {0: peak_seats(runs[0])}
    assert peaks[0] < 8
    assert same_replay(plan, 1, peaks) == 0
    assert same_replay(plan, 2, peaks) is None  # fewer seats: not the same run
    a, b = summarize(runs[0]), summarize(runs[1])  # and the one it stands for is the same run
    assert (a.iterations, a.makespan_s, a.ttft.p90, a.itl.p90, a.preemptions) == (
        b.iterations, b.makespan_s, b.ttft.p90, b.itl.p90, b.preemptions)
    full = {0: len(requests)}  # a replay whose seats filled stands for none
    assert same_replay(plan, 1, {0: 8}) is None and same_replay(plan, 1, full) is None


def test_the_chain_with_stand_ins_is_the_chain_with_every_replay() -> None:
    requests = from_preset("alpaca", 60, seed=3, max_tokens=128)
    cfg = config(num_blocks=48, max_num_seqs=32, max_num_batched_tokens=256)
    rows = batch_chain(requests, cfg, llama_h100(), 0, 0.05, seat_options=(4, 16, 64))
    plan = chain_plan(cfg, (4, 16, 64))
    every = [(c, summarize(replay(requests, c, llama_h100(), 0))) for c in plan]
    for got, want in zip(rows, chain_rows(every, cfg, 0.05)):
        assert (got.best_max_num_seqs, got.throughput, got.live_seqs) == (
            want.best_max_num_seqs, want.throughput, want.live_seqs)
