"""Compute mode: real K/V tensors, the Triton kernel every iteration, swaps that copy real bytes."""

from __future__ import annotations

import pytest
import torch

from lab.memory.swap import SwapSpace
from lab.serving.scheduler import Scheduler
from lab.serving.synthetic_kv import SyntheticKV
from tests.engine_helpers import decode, make_manager, prefill, same
from tests.scheduler_helpers import config, llama_h100, specs


def expected_kv(kv: SyntheticKV, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = kv.keys_values(tokens, 0)  # [1, n, kv_heads, head_dim]
    return k[0], v[0]


@pytest.fixture(scope="module")
def swap_run():
    """A small compute-mode run that swaps, with every running request's K/V checked against
    the seeded K/V after every iteration."""
    cfg = config(num_blocks=8, block_size=4, max_num_batched_tokens=32, engine="v0",
                 preemption_mode="swap", compute=True)
    sched = Scheduler(specs((8, 6), (5, 6), (7, 12)), cfg, llama_h100(), seed=5)
    swapped_in, mismatches = set(), []
    while (record := sched.step()) is not None:
        sched.check_invariants()
        swapped_in |= {int(x.split()[1]) for x in record.decisions if "swapped in" in x}
        manager, kv = sched.backend.manager, sched.backend.kv
        for req in sched.running():
            k, v = manager.read_kv(req.seq_id)
            want_k, want_v = expected_kv(kv, req.planned[:req.num_computed])
            if not (same(k, want_k) and same(v, want_v)):
                mismatches.append((record.index, req.req_id))
    return sched, swapped_in, mismatches


def test_swapped_requests_come_back_with_the_same_kv(swap_run):
    sched, swapped_in, mismatches = swap_run
    assert swapped_in, "the scenario must swap a request out and back in"
    assert mismatches == []
    assert sched.swapped_out_bytes == sched.swapped_in_bytes > 0
    assert all(r.num_output == r.spec.output_len for r in sched.requests.values())


def test_kernel_matches_dense_attention_every_iteration(swap_run):
    sched, _, _ = swap_run
    checks = [r.check for r in sched.records]
    assert all(c is not None and c.ok for c in checks)


def test_swap_space_round_trip_lands_in_other_blocks():
    m = make_manager(num_blocks=6, block_size=4)
    kv = SyntheticKV(m.config, seed=1)
    space = SwapSpace(m, num_cpu_blocks=4)
    first = prefill(m, kv, [3, 1, 4, 1, 5, 9])
    decode(m, kv, first, 2)
    before = m.read_kv(first)
    old_table = list(m.sequences[first].block_table)
    swapped = space.swap_out(first)
    assert m.blocks.num_free == 6 and space.blocks.num_free == 2
    other = prefill(m, kv, [7] * 5)  # takes the blocks the first one left
    new_id = space.swap_in(swapped)
    after = m.read_kv(new_id)
    assert m.sequences[new_id].block_table != old_table
    assert same(before[0], after[0]) and same(before[1], after[1])
    assert space.blocks.num_free == 4
    m.free(other)
    m.check_invariants()


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("num_requests, budget", [(3, 8), (8, 32), (8, 128)])
def test_the_kernel_check_runs_every_iteration_of_every_setting(chunked, mode, num_requests,
                                                                 budget) -> None:
    """Admission control's per-iteration kernel check (the page's "Triton kernel each
    iteration"): chunked prefill on and off, both preemption modes, a tight pool so requests
    are preempted, every iteration's kernel output equal to the dense reference."""
    lengths = [(5 + 3 * i, 4 + i % 3) for i in range(num_requests)]
    cfg = config(num_blocks=12, block_size=4, max_num_batched_tokens=budget,
                 enable_chunked_prefill=chunked, preemption_mode=mode, compute=True,
                 max_num_seqs=8, engine="v0" if mode == "swap" else "v1")
    sched = Scheduler(specs(*lengths), cfg, llama_h100(), seed=1)
    while (record := sched.step()) is not None:
        sched.check_invariants()
        assert record.check is not None and record.check.ok, record.index
    assert all(r.num_output == r.spec.output_len for r in sched.requests.values()
               if not r.reject_reason)
