"""Compile the paged-attention kernels ahead of time for a Hopper GPU (sm_90) this machine may
lack, through the wrapper's own plan and launch arguments, and report what ptxas made of them:
registers, spills, shared memory, how many programs fit on an SM, and how wide the K/V loads
are. tests/test_kernels_aot.py holds the kernels to these numbers, so that GPU performance
cannot regress on a machine without a GPU.

    PAGED_LAB_AOT=1 python bench/aot.py [--json out.json]

PAGED_LAB_AOT=1 keeps kernels/backend.py from turning on Triton's interpreter (which replaces
@triton.jit and cannot compile); such a process compiles kernels but runs none.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from kernels.attention_plan import H100_SMS, plan_attention
from kernels.launch import KernelCall
from kernels.paged_attention import prepare_launch
from kernels.paged_inputs import check_paged_inputs

HOPPER = GPUTarget("cuda", 90, 32)
# What one Hopper SM holds: registers, shared memory (each program reserves 1 KB more), threads,
# programs
SM_REGISTERS, SM_SHARED, CTA_RESERVED, SM_THREADS, SM_CTAS = 65536, 233472, 1024, 2048, 32


@dataclass(frozen=True)
class Config:
    """One call the AOT check compiles: 32 query / 8 KV heads, as in the benchmark."""

    dtype: str
    head_dim: int
    block_size: int
    seqs: tuple[tuple[int, int], ...]  # (new tokens, seq_len) per sequence
    phase: str  # "decode" or "prefill", for the report
    sliding_window: int | None = None  # a local attention layer's limit (kernels/paged_inputs)
    attention_chunk_size: int | None = None

    @property
    def window(self) -> str:
        """The layer's limit in the report ("" for full attention)."""
        if self.sliding_window:
            return f"sliding{self.sliding_window}"
        return f"chunk{self.attention_chunk_size}" if self.attention_chunk_size else ""


def main_configs() -> list[Config]:
    """bf16 and fp16, head_dim 64 and 128, block sizes 16 and 32; decode of one long context
    (split across programs, then merged), of a batch (one program per sequence), and a prefill
    batch (query tiles of several sequences). Then local attention layers, bf16 (fp16 compiles
    the same code): gpt-oss's sliding window of 128 on a decode batch and a prefill, and
    Llama-4's chunk of 8,192 on the long decode (split). A chunk compiles the same kernel as a
    window (the limits are runtime values)."""
    out = []
    for dtype in ("bfloat16", "float16"):
        for head_dim in (64, 128):
            for block_size in (16, 32):
                out += [Config(dtype, head_dim, block_size, ((1, 32768),), "decode"),
                        Config(dtype, head_dim, block_size, ((1, 2048),) * 64, "decode"),
                        Config(dtype, head_dim, block_size, ((2048, 2048), (700, 1500)),
                               "prefill")]
    for head_dim in (64, 128):
        local = [(((1, 2048),) * 64, "decode", {"sliding_window": 128}),
                 (((1, 32768),), "decode", {"attention_chunk_size": 8192}),
                 (((2048, 2048), (700, 1500)), "prefill", {"sliding_window": 128})]
        out += [Config("bfloat16", head_dim, 16, seqs, phase, **limits)
                for seqs, phase, limits in local]
    return out


@dataclass(frozen=True)
class Report:
    config: str
    window: str  # a local attention layer's limit, "" for full attention
    kernel: str
    registers: int
    spill_stores: int  # bytes
    spill_loads: int
    shared: int  # bytes of shared memory a program uses
    num_warps: int
    ctas_per_sm: int  # programs an SM holds at once (registers, shared memory, threads)
    cp_async_16: int  # 16-byte cp.async copies (global -> shared) in the PTX
    ld_global_v4: int  # 16-byte vector loads from global memory
    narrow_loads: int  # global loads of 1 or 2 bytes
    sass_instructions: int  # 0 if cuobjdump is missing
    compile_s: float


def calls_for(config: Config) -> list[KernelCall]:
    """The kernel calls the wrapper makes for this config on an H100/H200, on small CPU stand-ins
    with the real shapes and strides (one physical block serves every table entry)."""
    dtype = getattr(torch, config.dtype)
    heads, kv_heads, d, bs = 32, 8, config.head_dim, config.block_size
    q_lens = [q for q, _ in config.seqs]
    seq_lens = [s for _, s in config.seqs]
    query = torch.empty(sum(q_lens), heads, d, dtype=dtype)
    cache = torch.empty(1, bs, kv_heads, d, dtype=dtype)
    tables = torch.zeros(len(seq_lens), -(-max(seq_lens) // bs), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    shapes = check_paged_inputs(query, cache, cache, tables, lens, starts,
                                sliding_window=config.sliding_window,
                                attention_chunk_size=config.attention_chunk_size)
    plan = plan_attention(shapes, dtype, compiled=True, num_sms=H100_SMS)
    return list(prepare_launch(plan, shapes, query, cache, cache, tables, lens, starts).calls)


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def _bind(call: KernelCall, target: GPUTarget) -> tuple:
    """What a launch of this call binds: its arguments, their specialisation (a runtime
    integer becomes a constant 1 or "divisible by 16" unless do_not_specialize), options."""
    fn = call.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    return backend, *binder(*call.args, **call.kwargs)


def compiled_variants(calls: list[KernelCall], target: GPUTarget = HOPPER) -> dict[str, int]:
    """How many kernels these calls compile, by kernel: a launch compiles anew whenever the
    specialisation of its arguments or its options differ from every earlier one's."""
    keys: dict[str, set[str]] = {}
    for call in calls:
        _, _, specialization, options = _bind(call, target)
        keys.setdefault(call.kernel.__name__, set()).add(f"{specialization}{options}")
    return {name: len(k) for name, k in keys.items()}


def growing_decode_calls(max_len: int = 32768, step: int = 61,
                         **limits: int) -> list[KernelCall]:
    """The calls of one sequence decoding from 1 to max_len keys (every step-th step), on a
    full attention layer or a local one (sliding_window= or attention_chunk_size=)."""
    return [call for seq_len in range(1, max_len + 1, step)
            for call in calls_for(Config("bfloat16", 128, 16, ((1, seq_len),), "decode",
                                         **limits))]


def compile_call(call: KernelCall, target: GPUTarget = HOPPER) -> tuple[dict, str, bytes]:
    """Compile one call as a launch would (same specialisation of its arguments); return
    ptxas's numbers, the PTX and the cubin."""
    fn = call.kernel
    backend, bound, specialization, options = _bind(call, target)
    options, signature, constexprs, attrs = fn._pack_args(backend, call.kwargs, bound,
                                                          specialization, options)
    log = io.StringIO()
    triton.knobs.nvidia.dump_ptxas_log = True  # ptxas -v: registers and spills, printed
    triton.knobs.compilation.always_compile = True  # a cached kernel would print no log
    with contextlib.redirect_stdout(log):
        kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                options=options.__dict__)
    text = log.getvalue()
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    numbers = {"registers": int(re.search(r"Used (\d+) registers", text).group(1)),
               "spill_stores": int(spills.group(1)), "spill_loads": int(spills.group(2)),
               "shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps}
    return numbers, kernel.asm["ptx"], kernel.asm["cubin"]


def sass_instructions(cubin: bytes) -> int:
    try:
        tool = triton.knobs.nvidia.cuobjdump.path
    except RuntimeError:
        return 0
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    return _count(r"/\*[0-9a-f]{4,}\*/\s+[@A-Z]", sass)


def ctas_per_sm(registers: int, shared: int, num_warps: int) -> int:
    threads = 32 * num_warps
    per_cta_registers = -(-registers // 8) * 8 * threads  # allocated 8 registers at a time
    return min(SM_REGISTERS // per_cta_registers, SM_SHARED // (shared + CTA_RESERVED),
               SM_THREADS // threads, SM_CTAS)


def report(config: Config, call: KernelCall) -> Report:
    start = time.perf_counter()
    numbers, ptx, cubin = compile_call(call)
    name = (f"{config.phase} {config.dtype} d{config.head_dim} bs{config.block_size} "
            f"{config.window + ' ' if config.window else ''}"
            f"{len(config.seqs)}x{max(s for _, s in config.seqs)}")
    return Report(name, config.window, call.kernel.__name__, **numbers,
                  ctas_per_sm=ctas_per_sm(numbers["registers"], numbers["shared"],
                                          numbers["num_warps"]),
                  cp_async_16=_count(r"cp\.async\.c[ga]\.shared\.global[^;]*,\s*(?:0x10|16)\b",
                                     ptx),
                  ld_global_v4=_count(r"ld\.global(?:\.\w+)*\.v4\.(?:b32|u32|f32)", ptx),
                  narrow_loads=_count(r"ld\.global(?:\.\w+)*\.(?:[bus]16|[bus]8)\s", ptx),
                  sass_instructions=sass_instructions(cubin),
                  compile_s=round(time.perf_counter() - start, 2))


COLUMNS = ("config", "kernel", "registers", "spills (B)", "shared KB", "CTAs/SM",
           "16-B cp.async", "ld.global.v4", "1-2 B loads", "SASS instr.")


def to_markdown(reports: list[Report]) -> str:
    cells = [(r.config, r.kernel.strip("_"), r.registers, f"{r.spill_stores}/{r.spill_loads}",
              round(r.shared / 1024), r.ctas_per_sm, r.cp_async_16, r.ld_global_v4,
              r.narrow_loads, r.sass_instructions) for r in reports]
    table = [COLUMNS, ("---",) * len(COLUMNS), *cells]
    return "\n".join("| " + " | ".join(map(str, row)) + " |" for row in table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the reports as JSON here")
    args = parser.parse_args()
    if triton.knobs.runtime.interpret:
        parser.error("run with PAGED_LAB_AOT=1 and TRITON_INTERPRET unset: the interpreter "
                     "cannot compile")
    reports = [report(c, call) for c in main_configs() for call in calls_for(c)]
    print(to_markdown(reports))
    growing = growing_decode_calls()
    variants = compiled_variants(growing)
    print(f"\nkernels compiled for one sequence decoding 1 to 32,768 keys: {variants}")
    # a local layer compiles its own variants once (LOCAL); its limits are runtime values
    with_local = compiled_variants(growing + growing_decode_calls(sliding_window=128)
                                   + growing_decode_calls(attention_chunk_size=8192))
    print(f"the same, also on a sliding window of 128 and a chunk of 8,192: {with_local}")
    if args.json:
        args.json.write_text(json.dumps({"reports": [asdict(r) for r in reports],
                                         "growing_decode_variants": variants,
                                         "growing_decode_variants_with_local_layers":
                                             with_local}, indent=1))


if __name__ == "__main__":
    main()
