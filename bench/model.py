"""Tokens per second of SmolLM2-135M: the paged KV cache against the dense contiguous cache.

Batch 1 is one greedy sequence; batch 8 is eight samples forked from one prompt, decoded
together. Rows:
- dense: contiguous per-sequence cache, plain attention (the reference).
- paged: the lab's KV pool and block tables with the backend's default kernel plan (CUDA: the
  Triton kernel on every layer; CPU: the Triton interpreter on one layer per step, checked
  against float64 dense attention, the other layers a torch gather through the block tables).
- paged, gather only: the same pool and tables with no Triton attention: the cost of paging
  itself. K/V writes still go through KVPool.write (the cache-write kernel).
"Decode tok/s" is batch / the median decode step's wall time (the prefill step left out);
"CPU ms/step" is this process's CPU time in the median decode step. Medians, because on a
shared CPU a burst of another process's work slows a few steps, not most; each row also runs
--rounds times, interleaved with the others, and the table shows medians over the rounds.
Times include Python overhead.

    python bench/model.py [--tokens 32] [--batches 1 8] [--threads N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lab.backend import backend  # noqa: E402
from lab.cache_manager import KVCacheManager  # noqa: E402
from lab.dense_cache import DenseKVCache  # noqa: E402
from lab.generation import SamplingParams, SequenceCache, generate  # noqa: E402
from lab.gguf_model import LoadedModel, load_smollm2  # noqa: E402
from lab.paged_generation import KernelPlan, PagedKVCache, pool_config_for  # noqa: E402

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


def time_run(lm: LoadedModel, kind: str, plan: KernelPlan | None, batch: int,
             tokens: int) -> tuple[float, float, float, list[list[int]]]:
    """(total tok/s, decode tok/s, CPU ms per decode step, tokens per sequence).

    Decode tok/s and CPU ms come from the median decode step: a burst of load from another
    process slows a few steps, not the median."""
    prompt = lm.tokenizer.chat_tokens(PROMPT)
    params = SamplingParams(max_new_tokens=tokens, n=batch, temperature=0.0)
    cache = make_cache(lm, kind, plan, len(prompt), params)
    out: dict[int, list[int]] = {}
    walls, cpus = [], []  # per decode step
    start = last = time.perf_counter()
    last_cpu = time.process_time()
    for step in generate(lm.model, cache, prompt, params):
        now, now_cpu = time.perf_counter(), time.process_time()
        if step.index > 0:  # step 0 is the prefill
            walls.append(now - last)
            cpus.append(now_cpu - last_cpu)
        last, last_cpu = now, now_cpu
        for seq_id, token in step.tokens.items():
            out.setdefault(seq_id, []).append(token)
    decode = batch / statistics.median(walls)
    cpu_ms = 1000 * statistics.median(cpus)
    return batch * tokens / (last - start), decode, cpu_ms, [out[k] for k in sorted(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="the rows run this many times, interleaved; medians are shown")
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
    print(f"backend: {backend().describe()}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}; "
          f"{args.tokens} new tokens per sequence, greedy, float32; median of {args.rounds} "
          "interleaved rounds (paged/dense: the median of each round's ratio)")
    time_run(lm, "dense", None, 1, 4)  # warm-up: first calls allocate and import lazily
    print(f"| {'cache':34} | batch | tok/s | decode tok/s | CPU ms/step | paged/dense "
          "| same tokens |")
    print(f"|{'-' * 36}|------:|------:|-------------:|------------:|------------:"
          "|:-----------:|")
    median = statistics.median
    for batch in args.batches:
        runs: list[list[tuple[float, float, float, list[list[int]]]]] = [[] for _ in rows]
        for _ in range(args.rounds):  # interleaved, so a change in the machine's load hits all
            for i, (_, kind, plan) in enumerate(rows):
                runs[i].append(time_run(lm, kind, plan, batch, args.tokens))
        dense = runs[0]
        for (label, _, _), row in zip(rows, runs):
            ratio = median(r[1] / d[1] for r, d in zip(row, dense))
            same = "yes" if all(r[3] == d[3] for r, d in zip(row, dense)) else "NO"
            print(f"| {label:34} | {batch:5} | {median(r[0] for r in row):5.1f} | "
                  f"{median(r[1] for r in row):12.1f} | {median(r[2] for r in row):11.0f} | "
                  f"{ratio:11.2f} | {same:^11} |", flush=True)


if __name__ == "__main__":
    main()
