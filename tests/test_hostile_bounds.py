"""The bounds on work an input can make large, checked before it starts: the scheduler views'
cost model and iteration allowance, and the fragmentation story's length estimate.

bench/hostile.py measures the same bounds on real runs (time and memory, bench/RESULTS.md).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import FragConfig, FragmentationStory
from lab.scenarios.story import MAX_STEPS
from lab.serving.chain import batch_chain, chain_plan
from lab.serving.config import COMPUTE_POOL, SchedulerConfig
from lab.serving.runs import (
    ALLOCATORS,
    IterationAllowance,
    ReplayTooLong,
    check_work,
    likely_iterations,
    replay,
)
from lab.serving.workloads import from_preset, parse_csv
from tests.scheduler_helpers import llama_h100


def big(blocks: int = 2048, seats: int = 128, budget: int = 2048) -> SchedulerConfig:
    return SchedulerConfig(pool=replace(COMPUTE_POOL, num_blocks=blocks, block_size=16),
                           max_num_seqs=seats, max_num_batched_tokens=budget)


@pytest.mark.parametrize("preset, n, max_tokens, cfg", [
    ("sharegpt", 200, 2048, big()), ("sharegpt", 200, 2048, big(blocks=64)),
    ("alpaca", 300, 512, big(seats=4, budget=64)), ("alpaca", 40, 512, big(seats=1, budget=1)),
])
@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_the_iteration_estimate_is_near_a_real_replay(preset, n, max_tokens, cfg,
                                                      allocator) -> None:
    requests, cfg = from_preset(preset, n, max_tokens=max_tokens), replace(cfg,
                                                                          allocator=allocator)
    real = replay(requests, cfg, llama_h100(), 0).iteration
    assert 0.6 * real <= likely_iterations(requests, cfg) <= 1.6 * real


def test_the_default_views_run_and_the_issues_maxima_are_refused() -> None:
    default = from_preset("sharegpt", 1000, max_tokens=2048)
    check_work(default, chain_plan(big()))  # the page's default Batch chain
    example = from_preset("alpaca", 2000, max_tokens=512)  # its compute-bound example
    check_work(example, chain_plan(big(blocks=2000, seats=512, budget=4096)))
    largest = from_preset("sharegpt", 20_000, max_tokens=4096)
    with pytest.raises(ReplayTooLong, match="MiB"):  # ~10 M tokens of planned ids
        check_work(largest, [big(200_000, 512, 32768)])
    with pytest.raises(ReplayTooLong, match="iterations"):  # ~355,000 of them
        check_work(default, [big(seats=1, budget=8)])
    with pytest.raises(ReplayTooLong, match="MiB"):  # ~486,000 records
        check_work(default, [big(seats=1, budget=1)])
    with pytest.raises(ReplayTooLong, match="MiB"):  # a small CSV of long requests
        check_work(parse_csv("32768,32768\n" * 20_000), [big(200_000, 512, 32768)])


def test_a_replay_past_its_budget_stops_with_a_message() -> None:
    requests = from_preset("alpaca", 50, max_tokens=64)
    allowance = IterationAllowance(left=10)
    with pytest.raises(ReplayTooLong, match="scheduler iterations"):
        replay(requests, big(seats=1, budget=8), llama_h100(), 0, allowance=allowance)
    assert allowance.left <= 0


def test_the_chain_reports_progress_within_each_replay() -> None:
    seen: list[float] = []
    batch_chain(from_preset("alpaca", 150, max_tokens=64), big(blocks=32, seats=8, budget=32),
                llama_h100(), 0, 0.05, seat_options=(2, 4),  # fewer seats: none stands in
                progress=seen.append)
    assert len(seen) > 6 and seen == sorted(seen) and seen[-1] <= 1.0  # more than once a run


def test_the_fragmentation_estimate_refuses_what_would_not_end() -> None:
    cfg = FragConfig()  # the page's defaults run, and end well inside the estimate
    assert len(FragmentationStory(cfg, 0).frames()) <= cfg.likely_steps() < MAX_STEPS
    with pytest.raises(ValueError, match="steps to serve"):
        FragConfig(PoolConfig(num_blocks=75, block_size=16), max_output=1024, mean_output=200)
    with pytest.raises(ValueError, match="blocks x steps"):
        FragConfig(PoolConfig(num_blocks=4096, block_size=1), num_requests=40)
