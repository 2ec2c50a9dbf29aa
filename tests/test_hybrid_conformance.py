"""The hybrid KV cache manager alone replays vLLM 0.33.0's recorded decisions, value for value.

The traces (../shared/conformance/hybrid/ and ../shared/conformance/scheduler/, READMEs there)
were recorded from vLLM's v1 Scheduler over its KV cache manager. The lab's scheduler replays
every one of them over its backends (`python -m lab.vllm.conformance`, tests/test_conformance.py:
the hybrid traces over this manager). This test has no scheduler, so a difference it finds is
the manager's: it replays what vLLM's scheduler decided, step by step, and asks the lab's
manager only what vLLM asked its own:
- each scheduled running request, in order, gets slots for its tokens; when that fails, the
  step's next preemption victim is freed and the request asks again;
- victims left after that preempted themselves: the last one asked for slots first (which
  freed its out-of-window blocks), then they are freed in order;
- each lookup finds its hit (and each group's own hit); an admitted request then gets slots
  with its hit, a refused one must not fit;
- the sampled tokens join their requests, finished requests are freed.
It compares every value the trace gives: blocks appended or whole tables per group, hits,
free blocks before each preemption, after schedule() and at the end of the step, and every
request's table per group with its null positions. The first difference fails the test,
naming the step, the field and both values.

With one full-attention group the same manager reproduces vLLM's single-group KV cache
manager, as the lab's KVCacheManager does (the lab's scheduler serves one group from that one):
through the scheduler traces' decisions, and through the allocator traces, replayed by the
replayer's own AllocatorReplay, down to the free queue and the cached blocks after every
operation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.memory.hybrid_cache_manager import HybridKVCacheManager
from lab.memory.kv_cache_groups import FullAttention
from lab.vllm import conformance
from lab.vllm.conformance import prompt_of, replay_allocator

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT.parent / "shared" / "conformance"
# The readable trace only: the realistic ones run through the scheduler over this manager.
HYBRID = ["tiny_swa.json"]
ALLOCATOR = sorted(GOLDEN.glob("*.json*")) if GOLDEN.is_dir() else []
# FCFS traces only: under the priority policy a victim may have been scheduled earlier in its
# step, and the trace does not say how many tokens it had asked for.
SINGLE_GROUP = ["tiny.json", "fcfs_prefix_300.json.gz", "fcfs_noprefix_300.json.gz"]


def load(path: Path) -> dict:
    if not path.is_file():
        pytest.skip(f"golden trace {path} not present")
    return conformance.load(path)


class Replay:
    """One trace's decisions driven through a HybridKVCacheManager."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.config = data["config"]
        self.m = HybridKVCacheManager.from_config(self.config, record_events=False)
        self.tokens: dict[int, list[int]] = {}  # request -> prompt + outputs so far
        self.step = -1

    def expect(self, field: str, got: object, want: object) -> None:
        if got != want:
            raise AssertionError(f"step {self.step}: {field}: lab {got}, vLLM {want}")

    def run(self) -> None:
        for s in self.data["steps"]:
            self.step = s["step"]
            self.play(s)
        self.expect("requests holding blocks at the end", self.m.requests(), [])
        self.expect("free blocks at the end", self.m.num_free, self.config["num_blocks"])

    def play(self, s: dict) -> None:
        m = self.m
        for r in s.get("arrivals", []):
            self.tokens[r] = prompt_of(self.data, r)
        victims = list(s["preempted"])
        records = {p["req"]: p for p in s.get("preemptions", [])}

        def preempt_next() -> None:
            victim = victims.pop(0)
            if victim in records:
                self.expect(f"free blocks before preempting {victim}", m.num_free,
                            records[victim]["free_before"])
            m.free(victim)

        budget = self.config["max_num_batched_tokens"]
        for e in s["scheduled"]:
            if e["kind"] != "running":
                continue
            r = e["req"]
            while (new := m.allocate_slots(r, self.tokens[r], e["computed"], e["tokens"])) is None:
                if not victims:
                    raise AssertionError(f"step {self.step}: request {r} got no slots and vLLM "
                                         "preempted no one more")
                preempt_next()
            self.expect(f"new_blocks of running {r}", list(new),
                        e.get("new_blocks", [[] for _ in range(m.num_groups)]))
            budget -= e["tokens"]
        if victims:  # the last one asked for slots, then preempted the others and itself
            last = victims[-1]
            m.free_out_of_window(last, records[last]["num_computed_tokens"])
            while victims:
                preempt_next()

        admitted = {e["req"]: e for e in s["scheduled"] if e["kind"] in ("new", "resumed")}
        for lookup in s.get("lookups", []):
            r = lookup["req"]
            tokens = self.tokens[r]
            self.expect(f"lookup {r} num_tokens", len(tokens), lookup["num_tokens"])
            hit_tokens, hit = m.find_prefix_hit(tokens)
            self.expect(f"lookup {r} hit", hit_tokens, lookup["hit"])
            if "group_hits" in lookup:
                self.expect(f"lookup {r} group_hits", list(m.group_hits(tokens)),
                            lookup["group_hits"])
            entry = admitted.get(r)
            chunk = entry["tokens"] if entry else min(len(tokens) - hit_tokens, budget)
            fits = m.can_admit(len(tokens), hit_tokens, hit)
            ok = fits and m.allocate_slots(r, tokens, hit_tokens, chunk, hit) is not None
            self.expect(f"lookup {r} admitted", ok, entry is not None)
            if entry:
                self.expect(f"admission {r} computed", hit_tokens, entry["computed"])
                self.expect(f"admission {r} tables", list(m.block_tables(r)),
                            entry["new_blocks"])
                budget -= chunk
        self.expect("free_after_schedule", m.num_free, s["free_after_schedule"])

        for e in s["scheduled"]:
            if "sampled" in e:
                self.tokens[e["req"]].append(e["sampled"])
        for r in s["finished"]:
            m.free(r)
        self.expect("free", m.num_free, s["free"])
        if "tables" in s:
            self.expect("tables", {str(r): list(m.block_tables(r)) for r in m.requests()},
                        s["tables"])
        m.check_invariants()


@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_trace(name: str) -> None:
    Replay(load(GOLDEN / "hybrid" / name)).run()


@pytest.mark.parametrize("name", SINGLE_GROUP)
def test_one_full_group_is_the_single_group_manager(name: str) -> None:
    data = load(GOLDEN / "scheduler" / name)
    assert data["config"].get("kv_cache_groups", [{"kind": "full"}]) == [{"kind": "full"}]
    Replay(data).run()


@pytest.mark.parametrize("path", ALLOCATOR or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"no golden traces in {GOLDEN}"))], ids=lambda p: p.name if p else "none")
def test_one_full_group_replays_the_allocator_traces(path: Path) -> None:
    """The allocator traces through a HybridKVCacheManager of one full group: the same
    outcomes, free queue (head first) and cached blocks after every operation."""
    data = load(path)
    unbounded = 1 << 20  # no step budget or length limit in these traces
    cache = HybridKVCacheManager([FullAttention()], data["num_blocks"], data["block_size"],
                                 unbounded, unbounded)
    assert replay_allocator(data, cache) == len(data["steps"])
    assert cache.requests() == [] and cache.num_free == data["num_blocks"]
