"""The continuous-batching scheduler: admission, chunked prefill, preemption, rejection."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from lab.serving.config import COMPUTE_POOL, SchedulerConfig
from lab.serving.metrics import summarize
from lab.serving.request import RequestState
from lab.serving.runs import block_size_sweep
from lab.serving.workloads import from_preset
from tests.scheduler_helpers import config, decisions, llama_h100, run, specs


def test_preemption_by_recompute_is_explained_and_recomputed():
    sched = run(specs((8, 12), (8, 12), (8, 12)), num_blocks=8, block_size=4,
                max_num_batched_tokens=64, max_num_seqs=8)
    lines = decisions(sched)
    pattern = re.compile(r"request (\d+) preempted by recompute: no free block for "
                         r"(request (\d+)|its own next tokens); its blocks are freed and its "
                         r"(\d+) computed tokens dropped, its (\d+) sampled tokens kept; it goes "
                         r"back to the front of the waiting queue")
    hits = [pattern.fullmatch(line) for line in lines if "preempted by" in line]
    assert hits and all(hits)
    other = next(h for h in hits if h.group(3) is not None)
    victim, needy = int(other.group(1)), int(other.group(3))
    assert victim > needy  # the newest request goes first
    assert sched.preemptions["recompute"] == len(hits)
    for req in sched.requests.values():
        assert req.state is RequestState.FINISHED and req.num_output == 12
        assert req.num_computed_total == 8 + 12 - 1 + req.num_recomputed
    assert sched.requests[victim].num_recomputed > 0
    assert sched.recomputed_tokens == sum(r.num_recomputed for r in sched.requests.values())


def test_swap_preemption_moves_bytes_and_recomputes_nothing():
    sched = run(specs((8, 12), (8, 12), (8, 12)), num_blocks=8, block_size=4,
                max_num_batched_tokens=64, engine="v0", preemption_mode="swap")
    lines = decisions(sched)
    assert any(re.fullmatch(r"request \d+ preempted by swap \(vLLM V0\): its blocks, [\d,]+ "
                            r"bytes, copied to CPU memory: .*", x) for x in lines)
    assert any("swapped in" in x for x in lines)
    assert sched.swapped_out_bytes == sched.swapped_in_bytes > 0
    assert sched.recomputed_tokens == 0
    assert all(r.num_output == 12 for r in sched.requests.values())


def test_priority_policy_preempts_the_least_important():
    sched = run(specs((8, 12), (8, 12), (8, 12), priorities=(2, 0, 1)), num_blocks=8,
                block_size=4, max_num_batched_tokens=64, policy="priority")
    victims = [int(x.split()[1]) for x in decisions(sched) if "preempted by" in x]
    assert victims and victims[0] == 0  # priority 2: the least important


def test_never_fitting_request_is_rejected_with_a_reason():
    for allocator in ("paged", "contiguous"):
        sched = run(specs((100, 100), (4, 4)), num_blocks=8, block_size=4, allocator=allocator)
        big = sched.requests[0]
        assert big.state is RequestState.REJECTED
        assert "max_tokens 100" in big.reject_reason
        assert sched.requests[1].state is RequestState.FINISHED
        assert decisions(sched)[0] == f"request 0 rejected: {big.reject_reason}"


def test_chunked_prefill_splits_a_long_prompt():
    sched = run(specs((40, 3)), max_num_batched_tokens=16, num_blocks=16, block_size=4)
    assert [r.prefill_tokens for r in sched.records[:3]] == [16, 16, 8]
    assert sched.records[0].decisions[0] == (
        "request 0 admitted: 40 tokens; a prefill chunk of 16 of its 40 to compute: the whole "
        "sequence (10 blocks) was checked to fit, it holds 4 blocks now")
    assert sched.records[1].decisions[0] == (
        "request 0: next prefill chunk, tokens 16-31 of 40, 4 blocks more")
    req = sched.requests[0]
    assert req.first_token_s == pytest.approx(sum(r.seconds for r in sched.records[:3]))


def test_without_chunked_prefill_a_too_long_request_is_rejected():
    sched = run(specs((40, 3), (8, 3)), max_num_batched_tokens=16, num_blocks=32,
                enable_chunked_prefill=False)
    assert "chunked prefill is off" in sched.requests[0].reject_reason
    assert sched.requests[1].state is RequestState.FINISHED


def test_watermark_holds_blocks_back_at_admission():
    sched = run(specs((90, 2), (6, 2)), num_blocks=100, block_size=1, watermark=0.05)
    assert config(num_blocks=100, watermark=0.05).watermark_blocks == 5
    waits = [x for x in decisions(sched) if "waits" in x]
    assert waits[0] == "request 1 waits: needs 6 blocks, 10 free, 5 held back as watermark"
    no_mark = run(specs((90, 2), (6, 2)), num_blocks=100, block_size=1, watermark=0.0)
    assert no_mark.records[0].num_seqs == 2  # without the watermark both fit at once


def test_budget_and_seats_limit_each_iteration():
    sched = run(specs(*[(5, 6)] * 10), max_num_batched_tokens=12, max_num_seqs=3, num_blocks=64)
    assert max(r.batch_tokens for r in sched.records) <= 12
    assert max(r.num_seqs for r in sched.records) == 3


def test_contiguous_admits_fewer_than_paged_on_the_same_memory():
    requests = from_preset("alpaca", 60, seed=2, max_tokens=256)
    common = dict(num_blocks=96, block_size=16, max_num_seqs=64, explain=False)
    paged = summarize(run(requests, allocator="paged", **common))
    contiguous = summarize(run(requests, allocator="contiguous", **common))
    assert paged.finished == contiguous.finished == 60
    assert paged.mean_running > 1.5 * contiguous.mean_running
    assert paged.throughput_tok_s > contiguous.throughput_tok_s
    assert contiguous.preemptions == 0


def test_same_seed_same_trace():
    requests = from_preset("sharegpt", 20, seed=4, rate=50.0, max_tokens=64)
    a = run(requests, seed=9, num_blocks=40, block_size=8)
    b = run(requests, seed=9, num_blocks=40, block_size=8)
    assert a.records == b.records and len(a.records) > 10


def test_cost_model_roofline():
    cost = llama_h100()
    decode = cost.iteration(new_tokens=1, context_tokens=100, attn_pairs=100)
    assert decode.bound == "memory"
    assert decode.seconds == pytest.approx(cost.weight_bytes / cost.bandwidth, rel=0.01)
    prefill = cost.iteration(new_tokens=4096, context_tokens=4096, attn_pairs=4096 * 4097 // 2)
    assert prefill.bound == "compute"
    assert 100 < cost.crossover_batch(context=100) < 1000  # short contexts: compute catches up
    assert cost.crossover_batch(context=2000) == float("inf")  # long ones: KV reads dominate


def test_block_costs_price_small_blocks() -> None:
    cost = llama_h100()
    dense = cost.iteration(new_tokens=64, context_tokens=64_000, attn_pairs=64_000)
    for block_size in (1, 16):
        visits = 64 * -(-1000 // block_size)  # 64 sequences of 1,000 tokens
        paged = cost.iteration(64, 64_000, 64_000, block_visits=visits, block_ops=64)
        extra_bytes = visits * cost.block_visit_tokens * cost.kv_bytes_per_token
        assert paged.memory_s - dense.memory_s == pytest.approx(extra_bytes / cost.bandwidth)
        assert paged.bookkeeping_s == pytest.approx(64 * cost.block_op_s)
        assert paged.seconds == pytest.approx(max(paged.memory_s, paged.compute_s)
                                              + paged.bookkeeping_s)
    # At block size 16 the kernel's K/V reads cost 20% more than dense ones (its calibration).
    assert cost.block_visit_tokens / 16 == pytest.approx(0.2)


def test_the_block_size_sweep_has_two_sides() -> None:
    """Tiny blocks pay per block (kernel visits, allocations), huge ones waste the pool: both
    ends lose throughput against the default."""
    requests = from_preset("sharegpt", 200, seed=0, max_tokens=1024)
    cfg = SchedulerConfig(pool=replace(COMPUTE_POOL, num_blocks=512, block_size=16),
                          max_num_seqs=64, max_num_batched_tokens=2048)
    tiny, default, huge = block_size_sweep(requests, cfg, llama_h100(), 0, sizes=(1, 16, 256))
    assert tiny.throughput < default.throughput > huge.throughput
    assert tiny.waste_share < default.waste_share < huge.waste_share
