"""Replay vLLM 0.33.0's golden traces on the lab's engine and report the first difference.

    python -m lab.vllm.conformance FILE [FILE ...]

One line per file: `identical` with the steps checked and the replay's CPU time, or the first
step and field where the lab and vLLM differ, with both values. The exit status is 0 only when
every file is identical. The formats (their READMEs beside the files say what every field
means):
- `kv-allocator-conformance/1`: operations on vLLM's KV cache manager (admit, append,
  preempt, free), replayed on the lab's `KVCacheManager`;
- `vllm-scheduler-conformance/1`: vLLM's v1 `Scheduler` step by step, replayed on the lab's
  `Scheduler` (its vLLM V1 engine) with the file's configuration;
- `vllm-hybrid-kv-conformance/1`: the same loop over several KV cache groups sharing one pool
  (full attention, sliding window, chunked local), replayed on the lab's `Scheduler` with those
  groups: besides every scheduler field, each step's block table per group (null block -1)
  and each lookup's hit per group.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

from lab.memory.block_pool import PoolExhausted
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_cache_groups import group_spec
from lab.memory.kv_pool import PoolConfig
from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import StepClock
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec

ALLOCATOR, SCHEDULER, HYBRID = ("kv-allocator-conformance/1", "vllm-scheduler-conformance/1",
                                "vllm-hybrid-kv-conformance/1")


class Mismatch(Exception):
    """The first value where the lab differs from vLLM."""

    def __init__(self, where: str, field: str, lab: object, vllm: object) -> None:
        super().__init__(f"first difference at {where}, field {field!r}: lab {lab}, "
                         f"vLLM {vllm}")


def load(path: Path) -> dict:
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        return json.load(f)


def expect(where: str, field: str, lab: object, vllm: object) -> None:
    if lab != vllm:
        raise Mismatch(where, field, lab, vllm)


def prompt_of(data: dict, req: int) -> list[int]:
    pieces = data["pieces"]
    return [t for part in data["requests"][req]["prompt"]
            for t in (pieces[part] if isinstance(part, str) else part)]


# -- kv-allocator-conformance/1 ----------------------------------------------------------------
class AllocatorReplay:
    """The lab's manager driven by a trace's operations, and its state in the trace's terms:
    the KVCacheManager by default, or `cache`, a KV cache of vLLM V1's interface
    (find_prefix_hit, can_admit, allocate_slots, free, block_tables) with one full-attention
    group, e.g. a HybridKVCacheManager."""

    def __init__(self, data: dict, cache=None) -> None:
        self.data = data
        self.cache = cache
        if cache is None:
            config = PoolConfig(num_blocks=data["num_blocks"], block_size=data["block_size"],
                                num_kv_heads=1, head_dim=8)
            cache = self.m = KVCacheManager(config, enable_prefix_cache=True, store_kv=False)
        self.blocks, self.events = cache.blocks, cache.events
        self.live: dict[int, int | list[int]] = {}  # request -> sequence id (cache: tokens)
        self.hit_tokens = 0

    def tokens_of(self, op: dict) -> list[int]:
        req = op["req"]
        tokens = prompt_of(self.data, req) + self.data["requests"][req]["output"][:op["outputs"]]
        expect(f"request {req}'s admission", "num_tokens", len(tokens), op["num_tokens"])
        return tokens

    def apply(self, op: dict) -> dict:
        """Apply one operation; return its outcome fields as the lab sees them."""
        if self.cache is not None:
            return self._apply_v1(op)
        m, req, kind = self.m, op["req"], op["op"]
        if kind == "admit":
            tokens = self.tokens_of(op)
            try:
                seq = m.add_sequence(tokens)
            except PoolExhausted:
                return {"ok": False}
            m.commit(seq.seq_id, len(tokens))  # its full blocks get their hashes now
            self.live[req] = seq.seq_id
            self.hit_tokens += seq.num_cached_tokens
            return {"ok": True, "hit": seq.num_cached_tokens, "table": list(seq.block_table)}
        sid = self.live[req]
        seq = m.sequences[sid]
        if kind == "append":
            try:
                m.append_token(sid, op["token"])
            except PoolExhausted:
                return {"ok": False}
            m.commit(sid, len(seq))  # a block this token fills gets its hash now
            return {"ok": True, "table": list(seq.block_table)}
        assert kind in ("preempt", "free"), kind
        outcome = {"num_tokens": len(seq), "table": list(seq.block_table)}
        m.free(self.live.pop(req))
        return outcome

    def _apply_v1(self, op: dict) -> dict:
        c, req, kind = self.cache, op["req"], op["op"]
        if kind == "admit":
            tokens = self.tokens_of(op)
            hit_tokens, hit = c.find_prefix_hit(tokens)
            if not c.can_admit(len(tokens), hit_tokens, hit):
                return {"ok": False}
            c.allocate_slots(req, tokens, hit_tokens, len(tokens) - hit_tokens, hit)
            self.live[req] = tokens
            self.hit_tokens += hit_tokens
            return {"ok": True, "hit": hit_tokens, "table": c.block_tables(req)[0]}
        if kind == "append":
            tokens = self.live[req] + [op["token"]]
            if c.allocate_slots(req, tokens, len(tokens) - 1, 1) is None:
                return {"ok": False}
            self.live[req] = tokens
            return {"ok": True, "table": c.block_tables(req)[0]}
        assert kind in ("preempt", "free"), kind
        outcome = {"num_tokens": len(self.live.pop(req)), "table": c.block_tables(req)[0]}
        c.free(req)
        return outcome

    def state(self) -> dict:
        blocks = self.blocks
        return {"free": blocks.num_free, "free_queue": blocks.free_queue(),
                "cached": [b for b in range(blocks.num_blocks) if blocks.block_hash[b] is not None]}

    def check_invariants(self) -> None:
        (self.cache or self.m).check_invariants()


def compare(where: str, got: dict, want: dict, fields) -> None:
    for field in fields:
        if field in want and field in got:
            expect(where, field, got[field], want[field])


def replay_allocator(data: dict, cache=None) -> int:
    """Replay an allocator trace on the lab's KVCacheManager (or on `cache`, as
    AllocatorReplay says); return the steps checked."""
    replay = AllocatorReplay(data, cache)
    for step in data["steps"]:
        for i, op in enumerate(step["ops"]):
            where = f"step {step['step']}, operation {i} ({op['op']} of request {op['req']})"
            got = replay.apply(op)
            compare(where, got, op, tuple(got))
            compare(where, replay.state(), op, ("free", "free_queue", "cached"))
        compare(f"the end of step {step['step']}", replay.state(), step,
                 ("free", "free_queue", "cached"))
        replay.check_invariants()
    summary = data["summary"]
    expect("the end", "live requests", sorted(replay.live), [])
    expect("the end", "free", replay.blocks.num_free, data["num_blocks"])
    expect("the end", "hit_tokens", replay.hit_tokens, summary["hit_tokens"])
    if replay.cache is None:  # the manager's own count
        expect("the end", "hit_tokens", replay.m.prefix_hit_tokens, summary["hit_tokens"])
    if replay.events.keep:
        evictions = sum(e.kind == "evict" for e in replay.events.events)
        expect("the end", "cached_blocks_evicted", evictions, summary["cached_blocks_evicted"])
    return len(data["steps"])


# -- vllm-scheduler-conformance/1 --------------------------------------------------------------
def scheduler_config(c: dict) -> SchedulerConfig:
    """The lab's settings for a trace's `config`, refusing what the lab does not model."""
    unsupported = {"synchronous scheduling": not c.get("async_scheduling"),
                   "no speculative decoding": not c.get("speculative_decoding"),
                   "a fixed long_prefill_token_threshold":
                       not c.get("long_prefill_token_threshold_adaptive"),
                   "max_num_active_seqs unset": c.get("max_num_active_seqs") is None}
    missing = [what for what, ok in unsupported.items() if not ok]
    if missing:
        raise ValueError(f"the lab's scheduler models {', '.join(missing)} only")
    pool = PoolConfig(num_blocks=c["num_blocks"], block_size=c["block_size"], num_kv_heads=1,
                      head_dim=8)
    return SchedulerConfig(
        pool=pool, max_num_batched_tokens=c["max_num_batched_tokens"],
        max_num_seqs=c["max_num_seqs"], policy=c["policy"],
        long_prefill_token_threshold=c["long_prefill_token_threshold"],
        enable_prefix_caching=c["enable_prefix_caching"],
        enable_chunked_prefill=c["enable_chunked_prefill"],
        scheduler_reserve_full_isl=c["scheduler_reserve_full_isl"], watermark=c["watermark"],
        max_model_len=c["max_model_len"], explain=False,
        kv_cache_groups=tuple(map(group_spec, c.get("kv_cache_groups", [{"kind": "full"}]))))


def scheduler_requests(data: dict) -> tuple[RequestSpec, ...]:
    specs = []
    for r in data["requests"]:
        prompt = prompt_of(data, r["id"])
        specs.append(RequestSpec(r["id"], len(prompt), len(r["output"]),
                                 arrival_s=float(r["arrival_step"]),
                                 priority=r.get("priority", 0),
                                 tokens=tuple(prompt + r["output"])))
    return tuple(specs)


def _entry(e) -> dict:
    entry = {"req": e.req_id, "kind": e.kind, "computed": e.computed, "tokens": e.tokens,
             "new_blocks": [list(g) for g in e.new_blocks] if e.new_blocks else None}
    if e.kind != "running":
        entry["hit"] = e.computed
    return entry


def replay_scheduler(data: dict) -> int:
    sched = Scheduler(scheduler_requests(data), scheduler_config(data["config"]), StepClock(),
                      detail=True)
    for s in data["steps"]:
        where = f"step {s['step']}"
        known = len(sched.requests)
        expect(where, "step", int(sched.next_start()), s["step"])
        sched.step()
        d = sched.detail
        expect(where, "arrivals", list(sched.requests)[known:], s.get("arrivals", []))
        expect(where, "scheduled (req, tokens)", [(e.req_id, e.tokens) for e in d.scheduled],
               [(e["req"], e["tokens"]) for e in s["scheduled"]])
        for got, want in zip(map(_entry, d.scheduled), s["scheduled"]):
            for field in ("kind", "computed", "hit", "new_blocks"):
                expect(f"{where}, request {want['req']}", field, got[field] if field in got
                       else None, want.get(field))
        expect(where, "preempted", [p[0] for p in d.preemptions], s["preempted"])
        expect(where, "preemptions", [list(p) for p in d.preemptions],
               [[p["req"], p["num_computed_tokens"], p["num_tokens"], p["free_before"]]
                for p in s.get("preemptions", [])])
        expect(where, "lookups", [list(x) for x in d.lookups],
               [[x["req"], x["num_tokens"], x["hit"]] for x in s.get("lookups", [])])
        group_hits, sched.backend.group_hits = sched.backend.group_hits, []
        for (req, _, _), got, want in zip(d.lookups, group_hits, s.get("lookups", [])):
            if "group_hits" in want:
                expect(f"{where}, lookup of request {req}", "group_hits", list(got),
                       want["group_hits"])
        expect(where, "free_after_schedule", d.free_after_schedule, s["free_after_schedule"])
        expect(where, "finished", list(sched.records[-1].finished_ids), s["finished"])
        expect(where, "free", sched.backend.num_free, s["free"])
        expect(where, "running", [r.req_id for r in sched.table.reqs], s["running"])
        expect(where, "waiting", [r.req_id for r in sched.waiting], s["waiting"])
        if "tables" in s:
            kv = sched.backend.kv_cache
            expect(where, "tables", {str(r): [list(g) for g in kv.block_tables(r)]
                                     for r in kv.requests()}, s["tables"])
    expect("the end", "done", sched.done, True)
    expect("the end", "free", sched.backend.num_free, data["config"]["num_blocks"])
    summary = data["summary"]
    expect("the end", "preemptions", sched.preemptions["recompute"], summary["preemptions"])
    expect("the end", "finished", sched.num_finished, summary["finished"])
    return len(data["steps"])


REPLAYERS = {ALLOCATOR: replay_allocator, SCHEDULER: replay_scheduler, HYBRID: replay_scheduler}


def check_file(path: Path) -> tuple[bool, str]:
    """(identical, the file's one line)."""
    try:
        data = load(path)
    except (OSError, ValueError) as e:
        return False, f"{path.name}: cannot read it: {e}"
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt not in REPLAYERS:
        return False, f"{path.name}: unknown format {fmt!r} (known: {', '.join(REPLAYERS)})"
    start = time.process_time()
    try:
        steps = REPLAYERS[fmt](data)
    except Mismatch as e:
        return False, f"{path.name}: {e}"
    except (ValueError, KeyError, TypeError) as e:
        return False, f"{path.name}: cannot replay it: {e!r}"
    cpu = time.process_time() - start
    return True, f"{path.name}: identical, {steps:,} steps checked, replay {cpu:.2f} s CPU"


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    results = [check_file(Path(p)) for p in paths]
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
