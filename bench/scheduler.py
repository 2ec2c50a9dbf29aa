"""Replay a 10,000-request ShareGPT-like workload through the scheduler, allocator only.

Llama-3.1-8B on an H100 80 GB (cost model from the presets), a pool sized by the capacity
sheet (gpu_memory_utilization 0.9, 2 GiB reserve), block size 16, max_num_seqs 256,
max_num_batched_tokens 8192, all requests arriving at once. Prints steps/s and wall time for
the paged pool under vLLM V1 (0.33) and under the paper's V0 (recompute and swap preemption),
a pool an eighth the size, and the contiguous baseline.

    python bench/scheduler.py [--requests 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.serving.config import COMPUTE_POOL, SchedulerConfig
from lab.serving.cost_model import cost_model
from lab.serving.metrics import summarize
from lab.serving.runs import run
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import from_preset, workload_stats
from lab.sizing.capacity import GIB, capacity_sheet, load_gpus, weight_bytes_per_gpu
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import load_presets

MODEL, GPU = "Llama-3.1-8B", "H100 80 GB"


def pool_blocks(block_size: int) -> int:
    spec = load_presets()[MODEL]
    sheet = capacity_sheet(kv_layout(spec), gpu_bytes=load_gpus()[GPU].memory_bytes,
                           utilization=0.9,
                           weight_bytes=weight_bytes_per_gpu(spec.num_params, spec.weight_dtype),
                           reserve_bytes=2 * GIB, block_size=block_size, context=1024)
    return sheet.num_blocks


def calibrate() -> float:
    """How fast this CPU runs plain Python right now (shared machines vary a lot)."""
    t0 = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return (time.perf_counter() - t0) / 2_000_000 * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    requests = from_preset("sharegpt", args.requests, seed=args.seed)
    d = workload_stats(requests)
    cost = cost_model(load_presets()[MODEL], GPU)
    blocks = pool_blocks(16)
    print(f"{d['requests']:,} requests, prompt mean {d['prompt_mean']:.0f}, output mean "
          f"{d['output_mean']:.0f}; {cost.label}; {blocks:,} blocks of 16 tokens")
    runs = [("paged", "v1", "recompute", blocks), ("paged", "v0", "recompute", blocks),
            ("paged", "v0", "swap", blocks), ("paged", "v1", "recompute", blocks // 8),
            ("contiguous", "v1", "recompute", blocks)]
    head = (f"{'allocator':<11}{'engine':<7}{'preempt':<10}{'blocks':>8}{'steps':>8}{'wall s':>8}"
            f"{'cpu s':>7}{'steps/s':>9}{'tok/s (sim)':>13}{'preempts':>9}{'TTFT p50 s':>11}"
            f"{'ITL p99 ms':>11}")
    print(f"CPU calibration: {calibrate():.0f} ns per iteration of a bare Python loop")
    print(head)
    print("-" * len(head))
    for allocator, engine, mode, num_blocks in runs:
        cfg = SchedulerConfig(pool=replace(COMPUTE_POOL, num_blocks=num_blocks, block_size=16),
                              max_num_seqs=256, max_num_batched_tokens=8192, engine=engine,
                              allocator=allocator, preemption_mode=mode, explain=False)
        t0, c0 = time.perf_counter(), time.process_time()
        sched = Scheduler(requests, cfg, cost, seed=args.seed)
        run(sched)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s = summarize(sched)
        print(f"{allocator:<11}{engine:<7}{mode:<10}{num_blocks:>8,}{sched.iteration:>8,}{wall:>8.2f}"
              f"{cpu:>7.2f}"
              f"{sched.iteration / wall:>9,.0f}{s.throughput_tok_s:>13,.0f}{s.preemptions:>9,}"
              f"{s.ttft.p50:>11.2f}{s.itl.p99 * 1e3:>11.1f}")


if __name__ == "__main__":
    main()
