"""vLLM V1's (0.33) rules in the lab's loop, each against the paper's V0 engine where they
differ: a chunk's blocks after a whole-sequence check, recompute only, no admission in a step
that preempted, re-admission hitting its own blocks, long_prefill_token_threshold, the
watermark only while something runs."""

from __future__ import annotations

import pytest

from lab.serving.config import SchedulerConfig
from lab.serving.metrics import summarize
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec
from tests.scheduler_helpers import config, decisions, llama_h100, run, specs


def first_step(engine: str) -> Scheduler:
    sched = Scheduler(specs((40, 3)), config(num_blocks=16, block_size=4, engine=engine,
                                             max_num_batched_tokens=16), llama_h100())
    sched.step()
    return sched


def test_v1_allocates_the_chunk_v0_the_whole_prompt():
    v1, v0 = first_step("v1"), first_step("v0")
    assert v1.records[0].prefill_tokens == v0.records[0].prefill_tokens == 16
    assert v1.backend.blocks.num_used == 4  # 16 tokens of a 40-token prompt: 4 blocks of 4
    assert v0.backend.blocks.num_used == 10  # the whole prompt's blocks at admission
    assert "it takes all its 10 blocks at once (vLLM V0)" in v0.records[0].decisions[0]


def test_the_engines_defaults_and_swap():
    assert SchedulerConfig().watermark_blocks == 0
    assert config(num_blocks=200, engine="v0").watermark_blocks == 2  # 1 %
    assert config(num_blocks=200, engine="v0", watermark=0.0).watermark_blocks == 0
    with pytest.raises(ValueError, match="vLLM V1 preempts by recompute only"):
        config(preemption_mode="swap")
    assert config(engine="v0", preemption_mode="swap").as_engine("v1").preemption_mode == \
        "recompute"


def test_v1_holds_the_watermark_back_only_while_something_runs():
    # Alone, a 99-block request may take every block of 100 despite a 5 % watermark; V0 kept
    # the watermark always, so the same request is rejected there.
    alone = run(specs((99, 1)), num_blocks=100, block_size=1, watermark=0.05)
    assert alone.num_finished == 1
    v0 = run(specs((99, 1)), num_blocks=100, block_size=1, watermark=0.05, engine="v0")
    assert v0.num_rejected == 1


def test_no_admission_in_a_step_that_preempted_and_readmission_hits_its_own_blocks():
    # Two requests fill a 6-block pool; request 1 is preempted when request 0 needs a block,
    # request 2 waits through that step, and request 1 comes back hitting its own blocks.
    requests = (RequestSpec(0, 8, 9), RequestSpec(1, 9, 6), RequestSpec(2, 4, 2, 1.0))
    sched = run(requests, num_blocks=6, block_size=4, max_num_batched_tokens=32,
                enable_prefix_caching=True)
    lines = decisions(sched)
    step = next(r for r in sched.records if r.preemptions)
    assert step.preempted_ids == (1,) and not step.admitted_ids
    assert any(x.startswith("no admission in this step: it preempted") for x in step.decisions)
    back = next(x for x in lines if x.startswith("request 1 re-admitted"))
    assert "from the prefix cache, its own blocks from before its preemption" in back
    assert sched.readmit_hit_tokens >= 8
    assert summarize(sched).readmit_hit_tokens == sched.readmit_hit_tokens


def test_long_prefill_threshold_caps_chunks_only_when_others_run_or_wait():
    alone = run(specs((40, 2)), num_blocks=32, block_size=4, long_prefill_token_threshold=8)
    assert alone.records[0].prefill_tokens == 40  # one request: no cap
    two = run(specs((40, 2), (40, 2)), num_blocks=32, block_size=4,
              long_prefill_token_threshold=8)
    assert two.records[0].prefill_tokens == 16  # 8 + 8: both capped


def test_priority_victim_gives_back_its_tokens_of_the_step():
    # Request 1 (low priority) is scheduled before request 0 needs a block: V1 preempts it
    # anyway (the largest (priority, arrival)) and its tokens of the step return to the budget.
    requests = (RequestSpec(0, 4, 8, 0.0, 0), RequestSpec(1, 4, 8, 0.0, 1))
    sched = Scheduler(requests, config(num_blocks=3, block_size=4, policy="priority"),
                      llama_h100(), detail=True)
    while sched.step() is not None:
        if sched.detail.preemptions:
            break
    assert [p[0] for p in sched.detail.preemptions] == [1]
    assert [e.req_id for e in sched.detail.scheduled] == [0]
