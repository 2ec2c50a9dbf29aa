"""Time the paged-attention kernel against dense attention on a contiguous cache, decode batches.

On CUDA: 32 query heads, 8 KV heads, head_dim 128, bf16, block size 16, batch x context from
1 x 2k to 256 x 2k and 1 x 32k (what does not fit in memory is skipped). Each call is captured
once in a CUDA graph and its replays timed by triton.testing.do_bench, which writes 256 MB
before each replay (the L2 cache holds none of the K/V): no Python, no launch overhead, cold
caches. GB/s = K+V bytes / time, also as a fraction of the device's measured copy bandwidth (a
1 GiB copy: bytes read + written / time), the floor a memory-bound kernel can reach. Dense
attention runs on the same K/V laid out contiguously: torch's SDPA as it chooses, and each of
its kernels (FlashAttention, memory-efficient, cuDNN) that takes these shapes.
Without CUDA the kernel runs in Triton's interpreter, so only tiny float32 sizes run, in both
program layouts (whole batch, the interpreter's default; per sequence, a GPU's), timed with
perf_counter; those times measure Python, not a GPU.

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
from kernels.paged_attention import launch_paged_attention, plan_call
from kernels.paged_inputs import check_paged_inputs

BLOCK_SIZE = 16
GPU_CONFIGS = [(1, 2048), (1, 8192), (1, 32768), (8, 2048), (8, 8192), (32, 8192), (64, 2048),
               (64, 8192), (256, 2048)]
CPU_CONFIGS = [(1, 128), (4, 256), (4, 512), (16, 256)]


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


def cpu_ms(fn: Callable[[], object], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def gpu_ms(fn: Callable[[], object]) -> float:
    """Median ms of fn's GPU work: captured in a CUDA graph, replayed by do_bench with the L2
    cache flushed before each replay."""
    import triton.testing

    fn()  # compiles and allocates outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")


def copy_gbps() -> float:
    """The device's copy bandwidth: a 1 GiB tensor copied, bytes read + written / time."""
    src = torch.empty(1 << 29, dtype=torch.int16, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    ms = gpu_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def dense_kernels() -> dict[str, object]:
    """torch's SDPA kernels by name (None: as SDPA chooses)."""
    from torch.nn.attention import SDPBackend
    return {"sdpa": None, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def dense_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: object) -> float | None:
    """Time SDPA with one kernel forced (None: its own choice); None if it refuses them."""
    from torch.nn.attention import sdpa_kernel

    def run() -> torch.Tensor:
        if kernel is None:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    try:
        return gpu_ms(run)
    except RuntimeError:  # this kernel does not take these shapes or dtypes
        return None


def run_config(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
               dtype: torch.dtype, warmup: int, reps: int, whole_batch: bool,
               copy_bandwidth: float | None = None) -> dict:
    device = backend().device
    paged, k_dense, v_dense = decode_inputs(batch, context, heads, kv_heads, head_dim, dtype,
                                            device)
    shapes = check_paged_inputs(**paged)
    q_dense = paged["query"][:, :, None, :]  # [batch, heads, 1, head_dim]

    def run_paged() -> torch.Tensor:
        return launch_paged_attention(shapes, **paged, whole_batch=whole_batch)
    out = run_paged()
    ref = F.scaled_dot_product_attention(q_dense, k_dense, v_dense, enable_gqa=True)[:, :, 0]
    kv_bytes = 2 * batch * context * kv_heads * head_dim * paged["key_cache"].element_size()
    row = {"batch": batch, "context": context, "heads": f"{heads}/{kv_heads}",
           "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."),
           "layout": "whole batch" if whole_batch else "per sequence",
           "max_abs_diff": (out.float() - ref.float()).abs().max().item()}
    if backend().is_cuda:
        plan = plan_call(shapes, paged["query"], paged["block_tables"], paged["seq_lens"],
                         whole_batch=whole_batch)
        row["splits"] = plan.num_splits
        row["paged_ms"] = gpu_ms(run_paged)
        row["dense"] = {name: dense_ms(q_dense, k_dense, v_dense, kernel)
                        for name, kernel in dense_kernels().items()}
        row["dense_ms"] = row["dense"]["sdpa"]
    else:
        row["paged_ms"] = cpu_ms(run_paged, warmup, reps)
        row["dense_ms"] = cpu_ms(lambda: F.scaled_dot_product_attention(
            q_dense, k_dense, v_dense, enable_gqa=True), warmup, reps)
    row["paged_gbps"] = kv_bytes / row["paged_ms"] / 1e6
    row["of_copy"] = row["paged_gbps"] / copy_bandwidth if copy_bandwidth else None
    row["paged_over_dense"] = row["paged_ms"] / row["dense_ms"] if row["dense_ms"] else None
    return row


def fits(batch: int, context: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Paged cache plus its dense copy (and gather temporaries) must fit in free GPU memory."""
    kv_bytes = 2 * batch * context * kv_heads * head_dim * torch.empty((), dtype=dtype).itemsize
    return 3 * kv_bytes < 0.8 * torch.cuda.mem_get_info()[0]


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def to_markdown(rows: list[dict], machine: str) -> str:
    lines = [f"Machine: {machine}", ""]
    if rows and "dense" in rows[0]:  # a GPU: µs, every dense kernel, the copy fraction
        names = list(rows[0]["dense"])
        lines += ["| batch | context | splits | paged µs | paged GB/s | of copy BW | "
                  + " | ".join(f"{n} µs" for n in names) + " | paged/sdpa | max abs diff |",
                  "|" + "---|" * (8 + len(names))]
        for r in rows:
            dense = " | ".join(_num(r["dense"][n] and 1e3 * r["dense"][n], ".1f") for n in names)
            lines.append(f"| {r['batch']} | {r['context']} | {r['splits']} "
                         f"| {1e3 * r['paged_ms']:.1f} | {r['paged_gbps']:.0f} "
                         f"| {_num(r['of_copy'], '.2f')} | {dense} "
                         f"| {_num(r['paged_over_dense'], '.2f')} | {r['max_abs_diff']:.1e} |")
        return "\n".join(lines)
    lines += ["| batch | context | heads | head_dim | dtype | programs | paged ms | dense ms "
              "| paged GB/s | paged/dense | max abs diff |", "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['context']} | {r['heads']} | {r['head_dim']} "
                     f"| {r['dtype']} | {r['layout']} | {r['paged_ms']:.3f} | {r['dense_ms']:.3f} "
                     f"| {r['paged_gbps']:.3g} | {r['paged_over_dense']:.2f} "
                     f"| {r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="timed calls (CPU)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, help="also write results (.json or .md)")
    args = parser.parse_args()

    machine = backend().label
    cuda = backend().is_cuda
    copy_bandwidth = None
    if cuda:
        heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
        configs = GPU_CONFIGS
        copy_bandwidth = copy_gbps()
        machine += f"; copy bandwidth {copy_bandwidth:.0f} GB/s (1 GiB, read + write)"
    else:
        heads, kv_heads, head_dim, dtype = 8, 2, 64, torch.float32
        configs = CPU_CONFIGS
        args.reps, args.warmup = min(args.reps, 5), 2
        machine += " (tiny float32 sizes only: these times measure Python, not a GPU)"
    print(f"paged attention vs dense SDPA, decode: {machine}")
    rows = []
    for batch, context in configs:
        if cuda and not fits(batch, context, kv_heads, head_dim, dtype):
            print(f"skip batch={batch} context={context}: does not fit in free GPU memory")
            continue
        # The interpreter's default program layout, and the per-sequence one a GPU uses.
        for whole_batch in ((False,) if cuda else (True, False)):
            rows.append(run_config(batch, context, heads, kv_heads, head_dim, dtype,
                                   args.warmup, args.reps, whole_batch, copy_bandwidth))
            r = rows[-1]
            print(f"batch={batch:4d} context={context:6d} {r['layout']:12}  paged "
                  f"{r['paged_ms']:9.3f} ms  dense {_num(r['dense_ms'], '9.3f')} ms  "
                  f"{r['paged_gbps']:8.3g} GB/s  of copy {_num(r['of_copy'], '.2f')}  "
                  f"max|diff| {r['max_abs_diff']:.1e}", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    table = to_markdown(rows, machine)
    print("\n" + table)
    if args.out:
        text = json.dumps({"machine": machine, "rows": rows}, indent=1)
        args.out.write_text(text if args.out.suffix == ".json" else table + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
