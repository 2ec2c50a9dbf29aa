"""Tokens per second of SmolLM2-135M: the paged KV cache against the dense contiguous cache.

Batch 1 is one greedy sequence; batch 8 is eight samples forked from one prompt, decoded
together. Rows:
- dense: contiguous per-sequence cache, plain attention (the reference).
- paged: the lab's KV pool and block tables with the backend's default kernel plan (CUDA: the
  Triton kernel on every layer; CPU: the Triton interpreter on one layer per step, checked
  against float64 dense attention, the other layers a torch gather through the block tables).
- paged, gather only: the same pool and tables with no Triton attention: the cost of paging
  itself. K/V writes still go through KVPool.write (the cache-write kernel).
The rows run in lockstep: one generation per row, advanced one step at a time in turn (the order
rotating each step), so each row's step k runs within a fraction of a second of the others'. On
this shared machine the speed drifts by 20-30 % over seconds; step by step, that drift hits every
row alike. "Decode tok/s" is batch / the median decode step's wall time (the prefill step left
out); "CPU ms/step" is this process's CPU time in the median decode step; "paged/dense" is the
median over every decode step of every round of the dense step's time / this row's step time in
the same turn. Times include Python overhead.

    python bench/model.py [--tokens 32] [--batches 1 8] [--threads N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from kernels.backend import backend
from lab.memory.cache_manager import KVCacheManager
from lab.model.dense_cache import DenseKVCache
from lab.model.generation import SamplingParams, SequenceCache, generate
from lab.model.gguf import LoadedModel, load_smollm2
from lab.model.paged_cache import KernelPlan, PagedKVCache, pool_config_for

PROMPT = "Write a short story about a robot who learns to paint."


def make_cache(lm: LoadedModel, kind: str, plan: KernelPlan | None, prompt_len: int,
               params: SamplingParams) -> SequenceCache:
    model = lm.model
    if kind == "dense":
        return DenseKVCache(model.config, prompt_len + params.max_new_tokens, model.device,
                            model.dtype)
    blocks = params.n * (-(-(prompt_len + params.max_new_tokens) // 16) + 1)
    manager = KVCacheManager(pool_config_for(model.config, blocks, 16, model.dtype),
                             model.device)
    return PagedKVCache(manager, model.config, plan)


@dataclass
class RowTimes:
    walls: list[float] = field(default_factory=list)  # per decode step, seconds
    cpus: list[float] = field(default_factory=list)
    total: float = 0.0  # every step, the prefill too
    tokens: list[list[int]] = field(default_factory=list)  # per sequence, last round


def lockstep(lm: LoadedModel, rows: list[tuple[str, KernelPlan | None]], batch: int,
             tokens: int, times: list[RowTimes]) -> None:
    """One generation per row, advanced a step at a time in turn; appends to times[i]."""
    prompt = lm.tokenizer.chat_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=tokens, n=batch, temperature=0.0)
    steps = [generate(lm.model, make_cache(lm, kind, plan, len(prompt), params), prompt, params)
             for kind, plan in rows]
    outs: list[dict[int, list[int]]] = [{} for _ in rows]
    live = list(range(len(rows)))
    turn = 0
    while live:
        for i in live[turn % len(live):] + live[:turn % len(live)]:  # rotate who goes first
            wall, cpu = time.perf_counter(), time.process_time()
            step = next(steps[i], None)  # the forward pass that produced this step's logits
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if step is None:
                live.remove(i)
                continue
            times[i].total += wall
            if step.index > 0:  # step 0 is the prefill
                times[i].walls.append(wall)
                times[i].cpus.append(cpu)
            for seq_id, token in step.tokens.items():
                outs[i].setdefault(seq_id, []).append(token)
        turn += 1
    for t, out in zip(times, outs):
        t.tokens = [out[k] for k in sorted(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="generations per row (in lockstep); medians over all their steps")
    args = parser.parse_args()
    if args.tokens < 2:
        parser.error("--tokens must be at least 2 (one prefill token, one decode step)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_smollm2()
    default_plan = "every layer" if backend().is_cuda else "one layer"
    rows = [("dense", "dense", None), (f"paged ({default_plan} Triton)", "paged", None),
            ("paged, gather only", "paged", "none")]
    print(f"backend: {backend().label}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}; "
          f"{args.tokens} new tokens per sequence, greedy, float32; {args.rounds} rounds, the "
          "rows in lockstep (paged/dense: the median of the step-by-step ratios)")
    caches = [(kind, plan) for _, kind, plan in rows]
    lockstep(lm, caches, 1, 4, [RowTimes() for _ in rows])  # warm-up: first calls allocate
    print(f"| {'cache':34} | batch | tok/s | decode tok/s | CPU ms/step | paged/dense "
          "| same tokens |")
    print(f"|{'-' * 36}|------:|------:|-------------:|------------:|------------:"
          "|:-----------:|")
    median = statistics.median
    for batch in args.batches:
        times = [RowTimes() for _ in rows]
        same = [True] * len(rows)
        for _ in range(args.rounds):
            lockstep(lm, caches, batch, args.tokens, times)
            same = [ok and t.tokens == times[0].tokens for ok, t in zip(same, times)]
        dense = times[0]
        for (label, _, _), row, ok in zip(rows, times, same):
            ratio = median(d / w for d, w in zip(dense.walls, row.walls))
            total = args.rounds * batch * args.tokens / row.total
            print(f"| {label:34} | {batch:5} | {total:5.1f} | {batch / median(row.walls):12.1f} "
                  f"| {1000 * median(row.cpus):11.0f} | {ratio:11.2f} | "
                  f"{'yes' if ok else 'NO':^11} |", flush=True)


if __name__ == "__main__":
    main()
