"""One serving loop: the scheduler, configured like the walkthrough's old loop, replays it exactly.

Until the fragmentation and prefix-cache pages moved onto the scheduler they ran a loop of their
own (lab/paged_replay.py and ContiguousReplay, removed in the same change). Its per-step numbers
on those pages' default workloads (seeds 0-2) are pinned in tests/data/old_serving_loop.json,
recorded from that loop before it was deleted. The scheduler reproduces them with two
differences, both deliberate, both vLLM's behaviour:

- A request that emits n tokens holds the K/V of n - 1 of them: the last token is sampled and
  the request ends; nothing ever attends to it. The old loop also stored the last token's K/V.
  So the requests below emit one more token than the old loop's output, and then every paged
  number matches step for step.
- A finished request's memory is freed after its iteration and reused from the next one on
  (vLLM frees in update_from_output, after the step). The old loop freed it and admitted the
  next request into it within the same step. Pinned with reservations one slot larger (for the
  extra token), the contiguous numbers match up to the first step at which the old loop reused
  a just-freed region, where the scheduler admits one step later; until then its used slots
  exceed the old loop's by exactly one per running request (a sampled token's slot counts from
  the moment it is sampled; its K/V is written in the next iteration). On the paged pool the
  default workloads never wait for memory, so every step matches.

One difference came later, from the allocator: it now frees blocks in vLLM 0.33's order (a
block without a hash to the front of the free queue, a cached one to the back; see
tests/test_conformance.py), where the old loop's allocator put every freed block at the back.
A partly filled block is now reused before any cached block is evicted, so the prefix-cache
runs evict less (seeds 0, 1, 2: 0, 4, 0 blocks instead of 3, 5, 3), and on these workloads
nothing else changes, hits included.

Since the switch the pages show the scheduler's numbers: each request finishes one step sooner
and holds one token less than before.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import FragConfig, FragStepper, make_workload
from lab.scenarios.prefix_cache import PrefixConfig, PrefixStepper
from lab.scenarios.prefix_cache import make_workload as prefix_workload
from lab.serving.workloads import RequestSpec

PINNED = json.loads((Path(__file__).parent / "data" / "old_serving_loop.json").read_text())
EXTRA_TOKEN = 1  # a token id for the one more output token


def one_more_token(requests: tuple[RequestSpec, ...]) -> tuple[RequestSpec, ...]:
    return tuple(replace(r, output_len=r.output_len + 1, max_tokens=r.max_tokens + 1,
                         tokens=(*r.tokens, EXTRA_TOKEN)) for r in requests)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fragmentation_matches_the_old_loop(seed: int) -> None:
    cfg = FragConfig()
    wide = replace(cfg, max_output=cfg.max_output + 1)  # the requests' +1 token fits
    stepper = FragStepper(wide, one_more_token(make_workload(cfg, seed)), seed)
    old = PINNED["fragmentation"][str(seed)]
    while not stepper.done:
        frame = stepper.advance()
        p, c = frame.paged, frame.contiguous
        paged = [p.running, p.waiting, p.finished, frame.snapshot.usage.blocks_used,
                 frame.preemptions]
        if frame.step < len(old["paged"]):
            assert paged == old["paged"][frame.step], f"paged, step {frame.step}"
        else:  # the contiguous side runs longer now: the paged side stays drained
            assert paged == old["paged"][-1]
        if frame.step < first_reuse(old["contiguous"]):
            running, waiting, finished, used, reserved = old["contiguous"][frame.step]
            assert [c.running, c.waiting, c.finished] == [running, waiting, finished], frame.step
            assert c.capacity - c.free == reserved
            assert c.used == used + c.running, f"contiguous used, step {frame.step}"
        elif frame.step == first_reuse(old["contiguous"]):  # freed now, reused next iteration
            running, _, finished, _, _ = old["contiguous"][frame.step]
            assert c.finished == finished and c.running < running


def first_reuse(rows: list[list[int]]) -> int:
    """The first step at which the old loop freed a region while requests waited."""
    return next(s for s in range(1, len(rows)) if rows[s][2] > rows[s - 1][2] and rows[s - 1][1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prefix_cache_matches_the_old_loop(seed: int) -> None:
    # The settings the old loop's runs were pinned with (the page's defaults then; today's
    # defaults evict at the guide's block size).
    cfg = PrefixConfig(pool=PoolConfig(num_blocks=16, block_size=8), num_apps=2, system_len=20)
    requests, _ = prefix_workload(cfg, seed)
    stepper = PrefixStepper(cfg, one_more_token(requests), seed)
    old = PINNED["prefix_cache"][str(seed)]
    while not stepper.done:
        f = stepper.advance()
        s = stepper.server
        assert [len(s.table), len(s.waiting), s.num_finished, f.snapshot.usage.blocks_used,
                sum(s.preemptions.values()), f.hit_tokens] == old[f.step][:6], f.step
        assert f.evictions <= old[f.step][6], f.step  # vLLM's free order evicts later
    assert stepper.step == len(old) - 1
    assert f.evictions == {0: 0, 1: 4, 2: 0}[seed]


def test_the_pinned_runs_are_not_trivial() -> None:
    for seed, frag in PINNED["fragmentation"].items():
        assert max(row[1] for row in frag["contiguous"]) > 0, "requests wait for a region"
        assert 10 < first_reuse(frag["contiguous"]) < len(frag["contiguous"]) - 10, seed
        assert max(row[3] for row in frag["paged"]) > 24, "the pool is half full at times"
    assert max(row[5] for rows in PINNED["prefix_cache"].values() for row in rows) > 0
    assert max(row[6] for rows in PINNED["prefix_cache"].values() for row in rows) > 0
    assert PoolConfig(num_blocks=48, block_size=16) == FragConfig().pool
