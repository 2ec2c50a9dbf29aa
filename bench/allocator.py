"""Replay a seeded workload on the allocator and print block operations per second.

Thousands of requests with lognormal prompt and output lengths, a shared system prompt on some
(prefix reuse) and parallel-sampling forks on others. Two modes: allocator only (no tensors),
and with the real KV pool (every token's K/V written by the cache-write kernel), small.

    python bench/allocator.py [--requests 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.backend import backend
from lab.memory.block_pool import PoolExhausted
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import PoolConfig
from lab.serving.synthetic_kv import SyntheticKV


def replay(requests: int, seed: int, store_kv: bool, num_blocks: int) -> dict:
    rng = random.Random(seed)
    config = PoolConfig(num_blocks=num_blocks, block_size=16, num_kv_heads=2, head_dim=16)
    m = KVCacheManager(config, store_kv=store_kv)
    kv = SyntheticKV(config, seed) if store_kv else None
    system = [rng.randrange(1000) for _ in range(48)]
    live: list[tuple[int, int]] = []  # (seq id, tokens left to decode)
    done = rejected = 0
    start_events = len(m.events)
    t0 = time.perf_counter()

    def write(sid: int, start: int, tokens: list[int]) -> None:
        if kv is None:
            m.commit(sid, start + len(tokens))
        else:
            m.write(sid, start, *kv.keys_values(tokens, start))

    for _ in range(requests):
        prompt_len = max(1, int(rng.lognormvariate(4.0, 0.8)))
        prompt = (system if rng.random() < 0.5 else []) + [rng.randrange(1000)
                                                           for _ in range(prompt_len)]
        output_len = max(1, int(rng.lognormvariate(4.2, 0.8)))
        while True:
            try:
                seq = m.add_sequence(prompt)
                break
            except PoolExhausted:
                if not live:
                    rejected += 1
                    seq = None
                    break
                sid, _ = live.pop(0)  # finish the oldest request to make room
                m.free(sid)
                done += 1
        if seq is None:
            continue
        write(seq.seq_id, seq.num_cached_tokens, prompt[seq.num_cached_tokens:])
        live.append((seq.seq_id, output_len))
        if rng.random() < 0.2 and m.blocks.num_free > 4:
            live.append((m.fork(seq.seq_id).seq_id, output_len))
        for i, (sid, left) in enumerate(live):  # one decode step for every live sequence
            if left == 0:
                continue
            try:
                token = rng.randrange(1000)
                m.append_token(sid, token)
                write(sid, len(m.sequences[sid]) - 1, [token])
                live[i] = (sid, left - 1)
            except PoolExhausted:
                break
        finished = [sid for sid, left in live if left == 0]
        for sid in finished:
            m.free(sid)
            done += 1
        live = [(s, left) for s, left in live if left]
    wall = time.perf_counter() - t0
    m.check_invariants()
    events = m.events.since(start_events)
    ops = sum(e.kind in ("allocate", "free", "share", "copy", "evict", "hit") for e in events)
    appends = sum(e.kind == "append" for e in events)
    hit_rate = m.prefix_hit_tokens / max(1, m.prefix_query_tokens)
    return {"requests": requests, "ops": ops, "appends": appends, "wall": wall, "done": done,
            "rejected": rejected, "hit": hit_rate, "events": len(m.events)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-requests", type=int, default=30,
                    help="requests for the run that writes real K/V (slow in the interpreter)")
    args = ap.parse_args()
    print(f"backend: {backend().label}")
    print(f"{'mode':<22}{'requests':>9}{'block ops':>11}{'tokens':>9}{'wall s':>9}"
          f"{'block ops/s':>13}{'tokens/s':>10}{'prefix hit':>11}")
    for mode, n, store in (("allocator only", args.requests, False),
                           ("with real KV pool", args.kv_requests, True)):
        r = replay(n, args.seed, store, num_blocks=2048)
        print(f"{mode:<22}{r['requests']:>9}{r['ops']:>11}{r['appends']:>9}{r['wall']:>9.2f}"
              f"{r['ops'] / r['wall']:>13,.0f}{r['appends'] / r['wall']:>10,.0f}"
              f"{r['hit']:>10.1%}")


if __name__ == "__main__":
    main()
