"""Replay a seeded workload on the allocator and print block operations and requests per second.

Thousands of requests with lognormal prompt and output lengths, a shared system prompt on some
(prefix reuse) and parallel-sampling forks on others. Two modes: allocator only (no tensors),
and with the real KV pool (every token's K/V written by the cache-write kernel), small.

With --against, the allocator-only replay also runs another implementation of the cache
manager in this process: REV, a commit of this repository (extracted with `git archive` into a
temporary folder that is removed afterwards), or PATH, a checkout. Rounds are interleaved and
the table shows medians, with events off (as large replays run) and on (every block operation
and token recorded). The old code is only ever loaded here, at run time.

    python bench/allocator.py [--requests 5000] [--seed 0] [--rounds 5] [--against 61d7d94]
                              [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import io
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.backend import backend
from lab.memory.block_pool import PoolExhausted
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import PoolConfig
from lab.serving.synthetic_kv import SyntheticKV

ROOT = Path(__file__).resolve().parents[1]

# One arrival: its prompt, its output tokens, and a parallel sample's output tokens (None: the
# request is not forked). Drawn up front, so that no random draw is timed.
Arrival = tuple[list[int], list[int], list[int] | None]
BLOCK_OPS = ("allocate", "free", "share", "copy", "evict", "hit")


@dataclass(frozen=True)
class Engine:
    """A cache-manager implementation: this tree's, or an older commit's."""

    label: str
    manager: type
    config: type
    exhausted: type


THIS_TREE = Engine("this tree", KVCacheManager, PoolConfig, PoolExhausted)


def make_workload(requests: int, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(48)]
    arrivals = []
    for _ in range(requests):
        prompt_len = max(1, int(rng.lognormvariate(4.0, 0.8)))
        prompt = (system if rng.random() < 0.5 else []) + [rng.randrange(1000)
                                                           for _ in range(prompt_len)]
        output_len = max(1, int(rng.lognormvariate(4.2, 0.8)))
        outputs = [rng.randrange(1000) for _ in range(output_len)]
        child = [rng.randrange(1000) for _ in range(output_len)] if rng.random() < 0.2 else None
        arrivals.append((prompt, outputs, child))
    return arrivals


def replay(engine: Engine, workload: list[Arrival], num_blocks: int, store_kv: bool,
           record_events: bool, seed: int = 0) -> dict:
    """Admit each arrival (finishing the oldest request while the pool is exhausted), then
    decode one token of every live sequence."""
    config = engine.config(num_blocks=num_blocks, block_size=16, num_kv_heads=2, head_dim=16)
    m = engine.manager(config, store_kv=store_kv, record_events=record_events)
    kv = SyntheticKV(config, seed) if store_kv else None
    # [seq id, its output tokens, how many decoded, its prompt length, its output length]
    live: list[list] = []
    done = rejected = 0

    def write_kv(sid: int, upto: int) -> None:  # the real pool: K/V of [num_written, upto)
        start = m.sequences[sid].num_written
        m.write(sid, start, *kv.keys_values(m.sequences[sid].tokens[start:upto], start))

    # Bound once: the decode loop below runs per token. Allocator only, the K/V of a token
    # counts as written when it is committed.
    append, written = m.append_token, m.commit if kv is None else write_kv
    t0, c0 = time.perf_counter(), time.process_time()
    for prompt, outputs, child in workload:
        seq = None
        while seq is None:
            try:
                seq = m.add_sequence(prompt)
            except engine.exhausted:
                if not live:
                    rejected += 1
                    break
                m.free(live.pop(0)[0])  # finish the oldest request to make room
                done += 1
        if seq is None:
            continue
        written(seq.seq_id, len(prompt))
        live.append([seq.seq_id, outputs, 0, len(prompt), len(outputs)])
        if child is not None and m.blocks.num_free > 4:
            live.append([m.fork(seq.seq_id).seq_id, child, 0, len(prompt), len(child)])
        finished = []
        for entry in live:  # one decode step for every live sequence
            sid, outs, i, length, stop = entry
            try:
                append(sid, outs[i])
            except engine.exhausted:
                break
            i += 1
            written(sid, length + i)
            entry[2] = i
            if i == stop:
                finished.append(entry)
        for entry in finished:
            m.free(entry[0])
            done += 1
        if finished:
            live = [entry for entry in live if entry[2] < entry[4]]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    m.check_invariants()
    kinds = [e.kind for e in m.events.events] if record_events else None
    ops = sum(k in BLOCK_OPS for k in kinds) if kinds else None
    tokens = kinds.count("append") if kinds else None
    return {"wall": wall, "cpu": cpu, "ops": ops, "tokens": tokens, "done": done,
            "rejected": rejected, "hit": m.prefix_hit_tokens / max(1, m.prefix_query_tokens)}


# -- the other implementation ------------------------------------------------------------------
def checkout(against: str, into: Path) -> Path:
    """A folder holding `against`: PATH as it is, or commit REV extracted under `into`."""
    if Path(against).is_dir():
        return Path(against).resolve()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", against],
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return into


def load_engine(root: Path, label: str) -> Engine:
    """Import another tree's cache manager beside this one: its `lab` and `kernels` packages
    are imported with this tree's out of sys.modules, then this tree's are put back (the old
    modules stay alive through the classes that use them)."""
    mine = {name: mod for name, mod in sys.modules.items()
            if name.split(".")[0] in ("lab", "kernels")}
    for name in mine:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        def first(*names: str):
            for name in names:
                try:
                    return importlib.import_module(name)
                except ModuleNotFoundError as missing:  # not this layout; anything else raises
                    if not name.startswith(missing.name or "?"):
                        raise
            raise ModuleNotFoundError(f"none of {names} in {root}")

        manager = first("lab.memory.cache_manager", "lab.cache_manager")
        pool = first("lab.memory.kv_pool", "lab.kv_pool")
        blocks = first("lab.memory.block_pool", "lab.block_pool")
        engine = Engine(label, manager.KVCacheManager, pool.PoolConfig, blocks.PoolExhausted)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in ("lab", "kernels")]:
            del sys.modules[name]
        sys.modules.update(mine)
    assert engine.manager is not KVCacheManager, "loaded this tree again"
    return engine


# -- output ------------------------------------------------------------------------------------
def compare(engines: list[Engine], workload: list[Arrival], rounds: int) -> None:
    times: dict[tuple[str, bool, str], list[float]] = {}  # (label, events, clock) -> seconds
    first: dict[str, dict] = {}
    for _ in range(rounds):  # interleaved: machine load drifts alike for every implementation
        for events in (False, True):
            for engine in engines:  # back to back, so a burst of load hits them alike
                gc.collect()  # no earlier run's garbage collected inside this one
                r = replay(engine, workload, 2048, store_kv=False, record_events=events)
                for clock in ("wall", "cpu"):
                    times.setdefault((engine.label, events, clock), []).append(r[clock])
                if events:
                    first.setdefault(engine.label, r)
    n = len(workload)
    print(f"\nallocator only: {n} requests, 2,048 blocks of 16 tokens, {rounds} interleaved "
          "rounds, medians (cpu: this process's CPU time, less disturbed by other load)")
    print(f"{'implementation':<16}{'events':>7}{'block ops':>11}{'tokens':>9}{'wall s':>8}"
          f"{'cpu s':>7}{'block ops/s':>13}{'requests/s':>12}{'tokens/s':>11}{'prefix hit':>11}")
    for engine in engines:
        r = first[engine.label]
        for events in (False, True):
            wall = statistics.median(times[engine.label, events, "wall"])
            cpu = statistics.median(times[engine.label, events, "cpu"])
            print(f"{engine.label:<16}{'on' if events else 'off':>7}{r['ops']:>11,}"
                  f"{r['tokens']:>9,}{wall:>8.2f}{cpu:>7.2f}{r['ops'] / wall:>13,.0f}"
                  f"{n / wall:>12,.0f}{r['tokens'] / wall:>11,.0f}{r['hit']:>10.1%}")
    new = engines[0].label
    for old in (e.label for e in engines[1:]):
        ops = first[new]["ops"] / first[old]["ops"]  # block ops/s ratio = this x the speed-up
        for events in (False, True):
            for clock in ("wall", "cpu"):
                mine, theirs = times[new, events, clock], times[old, events, clock]
                of_medians = statistics.median(theirs) / statistics.median(mine)
                per_round = sorted(t / m for m, t in zip(mine, theirs))
                print(f"{new} / {old}, events {'on' if events else 'off'}, {clock}: requests/s "
                      f"x{of_medians:.2f}, block ops/s x{of_medians * ops:.2f}; per round "
                      f"x{statistics.median(per_round):.2f} median, "
                      f"x{per_round[0]:.2f}-{per_round[-1]:.2f}")


def profile(workload: list[Arrival]) -> None:
    """Where this tree's allocator-only replay (events off) spends its time."""
    profiler = cProfile.Profile()
    gc.collect()
    profiler.runcall(replay, THIS_TREE, workload, 2048, False, False)
    print("\nprofile, this tree, allocator only, events off (cProfile, by own time):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--against", metavar="REV|PATH",
                    help="also replay this commit's (or checkout's) cache manager, interleaved")
    ap.add_argument("--kv-requests", type=int, default=30,
                    help="requests for the run that writes real K/V (slow in the interpreter)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the replay")
    args = ap.parse_args()
    print(f"backend: {backend().label}")
    workload = make_workload(args.requests, args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="allocator-bench-"))
    try:
        engines = [THIS_TREE]
        if args.against:
            engines.append(load_engine(checkout(args.against, tmp), args.against))
        compare(engines, workload, args.rounds)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.kv_requests:
        r = replay(THIS_TREE, make_workload(args.kv_requests, args.seed), 2048, store_kv=True,
                   record_events=True, seed=args.seed)
        print(f"\nwith real KV pool: {args.kv_requests} requests, {r['ops']} block ops, "
              f"{r['tokens']} tokens, {r['wall']:.2f} s, {r['ops'] / r['wall']:,.0f} block ops/s,"
              f" {r['tokens'] / r['wall']:,.0f} tokens/s, prefix hit {r['hit']:.1%}")
    if args.profile:
        profile(workload)


if __name__ == "__main__":
    main()
