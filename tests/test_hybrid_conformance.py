"""The hybrid KV cache manager replays vLLM 0.33.0's recorded decisions, value for value.

The traces (../shared/conformance/hybrid/ and ../shared/conformance/scheduler/, READMEs there)
were recorded from vLLM's v1 Scheduler over its KV cache manager. This test has no scheduler:
it replays what vLLM's scheduler decided, step by step, and asks the lab's manager only what
vLLM asked its own:
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
manager, as the lab's KVCacheManager does: through the scheduler traces' decisions, and through
the allocator traces the KVCacheManager replays (tests/test_conformance.py), down to the free
queue and the cached blocks after every operation.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lab.memory.hybrid_cache_manager import HybridKVCacheManager
from lab.memory.kv_cache_groups import FullAttention
from lab.vllm.conformance import AllocatorReplay, compare, prompt_of

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT.parent / "shared" / "conformance"
ALLOCATOR_FILES = sorted(GOLDEN.glob("*.json*")) if GOLDEN.is_dir() else []
HYBRID = ["tiny_swa.json", "swa128_full_150.json.gz", "chunked64_full_150.json.gz"]
# FCFS traces only: under the priority policy a victim may have been scheduled earlier in its
# step, and the trace does not say how many tokens it had asked for.
SINGLE_GROUP = ["tiny.json", "fcfs_prefix_300.json.gz", "fcfs_noprefix_300.json.gz"]


def load(path: Path) -> dict:
    if not path.is_file():
        pytest.skip(f"golden trace {path} not present")
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        return json.load(f)


class Replay:
    """One trace's decisions driven through a HybridKVCacheManager."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.config = data["config"]
        self.m = HybridKVCacheManager.from_config(self.config, record_events=False)
        self.tokens: dict[int, list[int]] = {}  # request -> prompt + outputs so far
        self.step = -1

    def prompt(self, req: int) -> list[int]:
        pieces = self.data["pieces"]
        return [t for part in self.data["requests"][req]["prompt"]
                for t in (pieces[part] if isinstance(part, str) else part)]

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
            self.tokens[r] = self.prompt(r)
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


class OneFullGroup(AllocatorReplay):
    """The allocator traces (../shared/conformance/*.json*, the ones the lab's KVCacheManager
    replays in tests/test_conformance.py) through a HybridKVCacheManager with one full group:
    the same outcomes, free queue (head first) and cached blocks after every operation."""

    def __init__(self, data: dict) -> None:
        self.data = data
        unbounded = 1 << 20  # no step budget or length limit in these traces
        self.m = HybridKVCacheManager([FullAttention()], data["num_blocks"], data["block_size"],
                                      unbounded, unbounded, record_events=False)
        self.live: dict[int, list[int]] = {}  # request id -> its tokens

    def apply(self, op: dict) -> dict:
        m, req = self.m, op["req"]
        if op["op"] == "admit":
            tokens = prompt_of(self.data, req) + self.data["requests"][req]["output"][
                :op["outputs"]]
            hit_tokens, hit = m.find_prefix_hit(tokens)
            if not m.can_admit(len(tokens), hit_tokens, hit):
                return {"ok": False}
            assert m.allocate_slots(req, tokens, hit_tokens, len(tokens) - hit_tokens, hit)
            self.live[req] = tokens
            return {"ok": True, "hit": hit_tokens, "table": m.block_tables(req)[0]}
        if op["op"] == "append":
            tokens = self.live[req] + [op["token"]]
            if m.allocate_slots(req, tokens, len(tokens) - 1, 1) is None:
                return {"ok": False}
            self.live[req] = tokens
            return {"ok": True, "table": m.block_tables(req)[0]}
        outcome = {"num_tokens": len(self.live.pop(req)), "table": m.block_tables(req)[0]}
        m.free(req)
        return outcome


@pytest.mark.parametrize("path", ALLOCATOR_FILES, ids=lambda p: p.name)
def test_one_full_group_replays_the_allocator_traces(path: Path) -> None:
    data = load(path)
    replay = OneFullGroup(data)
    for step in data["steps"]:
        for i, op in enumerate(step["ops"]):  # its outcome and the state it left
            seen = {**replay.apply(op), **replay.state()}
            compare(f"step {step['step']}, operation {i} ({op['op']})", seen, op, tuple(seen))
        compare(f"step {step['step']}", replay.state(), step, ("free", "free_queue", "cached"))
        replay.m.check_invariants()
    assert not replay.live and replay.m.num_free == data["num_blocks"]
