"""The paged-attention kernels compiled ahead of time for an H100/H200 (sm_90) on this machine,
GPU or not, through the wrapper's own plan and launch arguments (bench/aot.py, run in a
process without Triton's interpreter): what keeps GPU performance from regressing unseen.

For every main config (bf16 and fp16, head_dim 64 and 128, decode and prefill, block sizes 16
and 32), and the same calls on local attention layers (a sliding window, a chunk): no register
spills, registers and shared memory that leave at least two programs per SM, and K/V read with
16-byte cp.async copies, never 1 or 2 bytes at a time. And a sequence decoding from 1 to 32k
keys compiles two attention kernels and one merge, not one per length (a local layer: two more,
not one per window).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Found without importing triton here (kernels/backend.py must set up the interpreter first).
PTXAS = Path(importlib.util.find_spec("triton").origin).parent / "backends/nvidia/bin/ptxas"

pytestmark = pytest.mark.skipif(not PTXAS.exists(), reason="Triton's bundled ptxas is missing")


@pytest.fixture(scope="module")
def aot(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """bench/aot.py's JSON, compiled into a Triton cache inside the test's tmp dir."""
    tmp = tmp_path_factory.mktemp("aot")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PAGED_LAB_AOT="1", TRITON_CACHE_DIR=str(tmp / "triton-cache"))
    out = tmp / "aot.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "aot.py"), "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def attention_reports(aot: dict) -> list[dict]:
    return [r for r in aot["reports"] if r["kernel"] == "_paged_attention_kernel"]


def test_every_main_config_compiles_both_kernels(aot: dict) -> None:
    configs = {r["config"].rsplit(" ", 1)[0] for r in attention_reports(aot) if not r["window"]}
    assert configs == {f"{phase} {dtype} d{d} bs{bs}" for phase in ("decode", "prefill")
                       for dtype in ("bfloat16", "float16") for d in (64, 128)
                       for bs in (16, 32)}
    merged = {r["config"] for r in aot["reports"] if r["kernel"] == "_merge_splits_kernel"}
    assert merged and all(" 1x32768" in c for c in merged)  # batch 1 at 32k keys is split


def test_no_register_spills(aot: dict) -> None:
    spilled = [(r["config"], r["kernel"], r["spill_stores"], r["spill_loads"])
               for r in aot["reports"] if r["spill_stores"] or r["spill_loads"]]
    assert spilled == []


def test_at_least_two_programs_fit_on_an_sm(aot: dict) -> None:
    """Registers (allocated 8 at a time for 32 x num_warps threads) and shared memory of a
    program leave room for a second one, whose loads hide the first one's latency."""
    crowded = [(r["config"], r["kernel"], r["registers"], r["shared"], r["ctas_per_sm"])
               for r in aot["reports"] if r["ctas_per_sm"] < 2]
    assert crowded == []


def test_kv_loads_are_16_byte_cp_async_copies(aot: dict) -> None:
    """K and V go global -> shared memory 16 bytes a copy (pipelined across loop steps); no
    load anywhere reads 1 or 2 bytes (bf16/fp16 one element at a time)."""
    for r in attention_reports(aot):
        assert r["cp_async_16"] >= 8, r
        assert r["narrow_loads"] == 0, r
    assert all(r["narrow_loads"] == 0 for r in aot["reports"])


def test_a_growing_context_does_not_recompile(aot: dict) -> None:
    """One sequence decoding from 1 to 32k keys: one attention kernel without splits (short
    contexts), one with them, one merge; the split count and lengths are runtime values."""
    assert aot["growing_decode_variants"] == {"_paged_attention_kernel": 2,
                                              "_merge_splits_kernel": 1}


def test_local_attention_layers_compile_within_the_same_limits(aot: dict) -> None:
    """gpt-oss's sliding window of 128 and Llama-4's chunk of 8,192: the local variant of the
    kernel, without and with splits, held to the limits above like every report."""
    local = {r["config"] for r in attention_reports(aot) if r["window"]}
    assert local == {f"{phase} bfloat16 d{d} bs16 {window} {batch}" for d in (64, 128)
                     for phase, window, batch in (("decode", "sliding128", "64x2048"),
                                                  ("decode", "chunk8192", "1x32768"),
                                                  ("prefill", "sliding128", "2x2048"))}
    merged = {r["config"] for r in aot["reports"] if r["kernel"] == "_merge_splits_kernel"}
    assert {c for c in merged if "chunk8192" in c} == {c for c in local if "chunk8192" in c}


def test_a_local_layer_compiles_its_variants_once(aot: dict) -> None:
    """The same decode on a sliding window of 128 and on a chunk of 8,192 as well: two more
    attention kernels (the local one without and with splits), no other merge; the limits are
    runtime values, so neither a window's size nor a length compiles anew."""
    assert aot["growing_decode_variants_with_local_layers"] == {"_paged_attention_kernel": 4,
                                                                "_merge_splits_kernel": 1}
