"""Builders shared by the scheduler tests."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from lab.serving.config import COMPUTE_POOL, SchedulerConfig
from lab.serving.cost_model import CostModel, cost_model
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec
from lab.sizing.model_spec import load_presets


@cache
def llama_h100() -> CostModel:
    return cost_model(load_presets()["Llama-3.1-8B"], "H100 80 GB")


def specs(*lengths: tuple[int, int], max_tokens: int | None = None,
          priorities: tuple[int, ...] = ()) -> tuple[RequestSpec, ...]:
    """Requests arriving at once, from (prompt_len, output_len) pairs."""
    return tuple(RequestSpec(i, p, o, 0.0, priorities[i] if priorities else 0,
                             max_tokens or o) for i, (p, o) in enumerate(lengths))


def config(*, num_blocks: int = 64, block_size: int = 16, **settings) -> SchedulerConfig:
    """A scheduler config on a pool of this size (compute mode's geometry)."""
    pool = replace(COMPUTE_POOL, num_blocks=num_blocks, block_size=block_size)
    return SchedulerConfig(pool=pool, **settings)


def run(requests: tuple[RequestSpec, ...], seed: int = 0, check: bool = True,
        **settings) -> Scheduler:
    sched = Scheduler(requests, config(**settings), llama_h100(), seed=seed)
    while sched.step() is not None:
        if check:
            sched.check_invariants()
    return sched


def decisions(sched: Scheduler) -> list[str]:
    return [line for record in sched.records for line in record.decisions]
