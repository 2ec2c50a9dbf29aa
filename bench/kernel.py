"""Time the paged-attention kernel against dense SDPA on a contiguous cache, for decode batches.

On CUDA: 32 query heads, 8 KV heads, head_dim 128, bf16, block size 16, batch 1..256 and
context 512..32k (configs that do not fit in memory are skipped), timed with CUDA events.
Paged time is the kernel launch alone (input checks done once, outside the timing).
Without CUDA the kernel runs in Triton's interpreter, so only tiny float32 sizes run, in both
program layouts (whole batch, the interpreter's default; per sequence, a GPU's); those times
measure Python, not a GPU.

    python bench/kernel.py [--reps 20] [--out results.json|results.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

from kernels.backend import backend
from kernels.paged_attention import launch_paged_attention
from kernels.paged_inputs import check_paged_inputs

BLOCK_SIZE = 16


def decode_inputs(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                  dtype: torch.dtype,
                  device: torch.device) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Paged inputs (shuffled physical blocks) and the same K/V laid out contiguously."""
    gen = torch.Generator(device=device).manual_seed(batch * 100_003 + context)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    value_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    block_tables = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    block_tables = block_tables.view(batch, blocks_per_seq)  # [batch, blocks_per_seq]
    paged = {
        "query": torch.randn(batch, heads, head_dim, generator=gen, device=device, dtype=dtype),
        "key_cache": key_cache, "value_cache": value_cache, "block_tables": block_tables,
        "seq_lens": torch.full((batch,), context, dtype=torch.int32, device=device),
        "query_start_loc": torch.arange(batch + 1, dtype=torch.int32, device=device),
    }
    rows = block_tables.long()  # gather each sequence's blocks into one contiguous run

    def dense(cache: torch.Tensor) -> torch.Tensor:  # -> [batch, kv_heads, context, head_dim]
        return cache[rows].flatten(1, 2)[:, :context].transpose(1, 2).contiguous()

    return paged, dense(key_cache), dense(value_cache)


def time_ms(fn: Callable[[], object], warmup: int, reps: int, cuda: bool) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_config(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
               dtype: torch.dtype, warmup: int, reps: int, whole_batch: bool) -> dict:
    device = backend().device
    paged, k_dense, v_dense = decode_inputs(batch, context, heads, kv_heads, head_dim, dtype,
                                            device)
    shapes = check_paged_inputs(**paged)
    q_dense = paged["query"][:, :, None, :]  # [batch, heads, 1, head_dim]
    cuda = backend().is_cuda
    paged_ms = time_ms(lambda: launch_paged_attention(shapes, **paged, whole_batch=whole_batch),
                       warmup, reps, cuda)
    dense_ms = time_ms(lambda: F.scaled_dot_product_attention(q_dense, k_dense, v_dense,
                                                              enable_gqa=True), warmup, reps, cuda)
    out = launch_paged_attention(shapes, **paged, whole_batch=whole_batch)
    ref = F.scaled_dot_product_attention(q_dense, k_dense, v_dense, enable_gqa=True)[:, :, 0]
    kv_bytes = 2 * batch * context * kv_heads * head_dim * paged["key_cache"].element_size()
    layout = "whole batch" if whole_batch else "per sequence"
    return {"batch": batch, "context": context, "heads": f"{heads}/{kv_heads}", "layout": layout,
            "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."),
            "paged_ms": paged_ms, "dense_ms": dense_ms, "paged_gbps": kv_bytes / paged_ms / 1e6,
            "paged_over_dense": paged_ms / dense_ms,
            "max_abs_diff": (out.float() - ref.float()).abs().max().item()}


def fits(batch: int, context: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Paged cache plus its dense copy (and gather temporaries) must fit in free GPU memory."""
    kv_bytes = 2 * batch * context * kv_heads * head_dim * torch.empty((), dtype=dtype).itemsize
    return 3 * kv_bytes < 0.8 * torch.cuda.mem_get_info()[0]


def to_markdown(rows: list[dict], machine: str) -> str:
    lines = [f"Machine: {machine}", "",
             "| batch | context | heads | head_dim | dtype | programs | paged ms | dense ms "
             "| paged GB/s | paged/dense | max abs diff |", "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['context']} | {r['heads']} | {r['head_dim']} "
                     f"| {r['dtype']} | {r['layout']} | {r['paged_ms']:.3f} | {r['dense_ms']:.3f} "
                     f"| {r['paged_gbps']:.3g} | {r['paged_over_dense']:.2f} "
                     f"| {r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write results (.json or .md)")
    args = parser.parse_args()

    machine = backend().label
    if backend().is_cuda:
        heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
        configs = [(b, c) for b in (1, 8, 32, 64, 128, 256) for c in (512, 2048, 8192, 32768)]
    else:
        heads, kv_heads, head_dim, dtype = 8, 2, 64, torch.float32
        configs = [(1, 128), (4, 256), (4, 512), (16, 256)]
        args.reps, args.warmup = min(args.reps, 5), 2
        machine += " (tiny float32 sizes only: these times measure Python, not a GPU)"
    print(f"paged attention vs dense SDPA, decode: {machine}")
    rows = []
    for batch, context in configs:
        if backend().is_cuda and not fits(batch, context, kv_heads, head_dim, dtype):
            print(f"skip batch={batch} context={context}: does not fit in free GPU memory")
            continue
        # The interpreter's default program layout, and the per-sequence one a GPU uses.
        for whole_batch in ((False,) if backend().is_cuda else (True, False)):
            rows.append(run_config(batch, context, heads, kv_heads, head_dim, dtype,
                                   args.warmup, args.reps, whole_batch))
            r = rows[-1]
            print(f"batch={batch:4d} context={context:6d} {r['layout']:12}  paged "
                  f"{r['paged_ms']:9.3f} ms  dense {r['dense_ms']:9.3f} ms  "
                  f"{r['paged_gbps']:8.3g} GB/s  paged/dense {r['paged_over_dense']:6.2f}  "
                  f"max|diff| {r['max_abs_diff']:.1e}", flush=True)
        if backend().is_cuda:
            torch.cuda.empty_cache()
    table = to_markdown(rows, machine)
    print("\n" + table)
    if args.out:
        text = json.dumps({"machine": machine, "rows": rows}, indent=1)
        args.out.write_text(text if args.out.suffix == ".json" else table + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
