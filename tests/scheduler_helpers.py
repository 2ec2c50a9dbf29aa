"""Builders shared by the scheduler tests."""

from __future__ import annotations

from functools import cache

from lab.serving.cost_model import CostModel, cost_model
from lab.serving.request import SchedulerConfig
from lab.serving.runs import check_invariants
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


def run(requests: tuple[RequestSpec, ...], seed: int = 0, check: bool = True,
        **config) -> Scheduler:
    sched = Scheduler(requests, SchedulerConfig(**config), llama_h100(), seed=seed)
    while sched.step() is not None:
        if check:
            check_invariants(sched)
    return sched


def decisions(sched: Scheduler) -> list[str]:
    return [line for record in sched.records for line in record.decisions]
