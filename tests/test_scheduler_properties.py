"""Scheduler properties over random workloads and configurations (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lab.serving.config import SchedulerConfig
from lab.serving.request import RequestState
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec
from tests.scheduler_helpers import config, llama_h100


@st.composite
def workloads(draw) -> tuple[RequestSpec, ...]:
    n = draw(st.integers(2, 8))
    max_tokens = draw(st.integers(2, 24))
    poisson = draw(st.booleans())
    out = []
    for i in range(n):
        arrival = draw(st.floats(0, 0.2)) if poisson else 0.0
        out.append(RequestSpec(i, draw(st.integers(1, 16)), draw(st.integers(1, max_tokens)),
                               arrival, draw(st.integers(0, 2)), max_tokens))
    return tuple(out)


@st.composite
def scenarios(draw) -> tuple[tuple[RequestSpec, ...], SchedulerConfig]:
    """A workload, and a pool just big enough for its longest request (plus a little), so
    requests compete for blocks and preemption happens often."""
    requests = draw(workloads())
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    longest = max(r.prompt_len + r.max_tokens for r in requests)
    watermark = draw(st.sampled_from([0.0, 0.1]))
    blocks = -(-longest // block_size) + draw(st.integers(-1, 3))  # -1: the longest never fits
    chunked = draw(st.booleans())
    engine = draw(st.sampled_from(["v1", "v1", "v0"]))
    cfg = config(
        engine=engine, long_prefill_token_threshold=draw(st.sampled_from([0, 0, 3])),
        scheduler_reserve_full_isl=draw(st.booleans()) if engine == "v1" else True,
        num_blocks=max(2, int(blocks / (1 - watermark)) + 1), block_size=block_size,
        max_num_batched_tokens=draw(st.integers(1, 48)) if chunked else longest,
        max_num_seqs=draw(st.integers(2, 6)), watermark=watermark,
        enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])) if engine == "v0"
        else "recompute",
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        allocator=draw(st.sampled_from(["paged", "paged", "contiguous"])),
        enable_prefix_caching=draw(st.booleans()), num_cpu_blocks=draw(st.sampled_from([0, 3])))
    return requests, cfg


def replay(requests, cfg: SchedulerConfig, seed: int, view: bool = False) -> Scheduler:
    """Run to the end, checking every iteration; `view`: also draw the page's snapshot."""
    sched = Scheduler(requests, cfg, llama_h100(), seed=seed)
    while (record := sched.step()) is not None:
        assert record.batch_tokens <= cfg.max_num_batched_tokens
        assert 1 <= record.num_seqs <= cfg.max_num_seqs
        assert record.num_running <= cfg.max_num_seqs
        sched.check_invariants()
        if view:  # the page's view syncs lazily appended tokens: the run must not notice
            sched.picture()
        assert sched.iteration < 5000, "the run does not end"
    return sched


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), seed=st.integers(0, 3))
def test_every_request_finishes_once_with_its_output_length(scenario, seed):
    requests, cfg = scenario
    sched = replay(requests, cfg, seed)
    event(f"{cfg.allocator}: {sched.num_finished > 0 and 'ran' or 'all rejected'}")
    for mode, count in sched.preemptions.items():
        if count:
            event(f"preempted by {mode}")
    finished_lines = [line.split()[1] for r in sched.records for line in r.decisions
                      if line.endswith("freed its memory")]
    assert sorted(finished_lines) == sorted(str(r.req_id) for r in sched.requests.values()
                                            if r.state is RequestState.FINISHED)
    assert sched.num_finished + sched.num_rejected == len(requests)
    for req in sched.requests.values():
        if req.state is RequestState.REJECTED:
            assert req.reject_reason and req.num_computed_total == 0
            continue
        assert req.state is RequestState.FINISHED
        assert req.num_output == req.spec.output_len
        # Every position's K/V once, the last output token's never; plus what preemption by
        # recompute threw away (prefix-cache hits save some of it back).
        expected = req.spec.prompt_len + req.spec.output_len - 1 + req.num_recomputed
        if cfg.enable_prefix_caching:
            assert req.num_computed_total <= expected
        else:
            assert req.num_computed_total == expected
    assert sched.recomputed_tokens == sum(r.num_recomputed for r in sched.requests.values())
    if cfg.allocator == "paged":
        assert sched.backend.blocks.num_free == cfg.num_blocks  # everything given back
        assert sched.backend.swap.blocks.num_free == sched.backend.swap.blocks.num_blocks


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), seed=st.integers(0, 3))
def test_same_seed_same_trace(scenario, seed):
    requests, cfg = scenario
    a, b = replay(requests, cfg, seed, view=True), replay(requests, cfg, seed)
    assert a.records == b.records
    assert [r.planned for r in a.requests.values()] == [r.planned for r in b.requests.values()]
