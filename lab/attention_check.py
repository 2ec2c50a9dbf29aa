"""Run the paged-attention kernel on the real pool and compare it with dense attention.

Every page that shows attention calls `check_step` (or `check_decode`, one new token per
sequence) for the sequences on screen: their new tokens attend over each sequence's K/V
through its block table, once with the Triton kernel and once with the float64 dense reference. The result says how far apart
they are and whether that is within the lab's tolerance.
"""

from __future__ import annotations

import itertools

from dataclasses import dataclass

import torch

from kernels.paged_attention import paged_attention
from kernels.reference import dense_attention
from lab.cache_manager import KVCacheManager

# Relative error (max abs error / max |reference|) allowed for float32; half precisions
# use an elementwise allclose with these (atol, rtol), as in DESIGN.md.
FLOAT32_REL_TOL = 1e-5
HALF_TOLERANCE = (1.5e-2, 1e-2)


@dataclass(frozen=True)
class AttentionCheck:
    max_abs_error: float  # max |kernel - reference| over every output element
    rel_error: float  # max_abs_error / max |reference|
    ok: bool  # within the tolerance for this dtype
    tolerance: str  # the rule, in words, for the badge's help text
    num_seqs: int
    output: torch.Tensor  # kernel output [num_seqs, num_heads, head_dim]
    reference: torch.Tensor  # dense output [num_seqs, num_heads, head_dim]


def compare(output: torch.Tensor, reference: torch.Tensor) -> AttentionCheck:
    """Error of `output` against `reference` (same shape), judged by the output's dtype."""
    out, ref = output.double().cpu(), reference.double().cpu()
    max_abs = (out - ref).abs().max().item() if out.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    if output.dtype == torch.float32:
        ok, rule = rel < FLOAT32_REL_TOL, f"float32: relative error < {FLOAT32_REL_TOL:g}"
    else:
        atol, rtol = HALF_TOLERANCE
        ok = bool(torch.allclose(out, ref, atol=atol, rtol=rtol))
        rule = f"{str(output.dtype).removeprefix('torch.')}: atol {atol:g}, rtol {rtol:g}"
    return AttentionCheck(max_abs, rel, bool(ok), rule, output.shape[0], output.cpu(), ref)


def check_step(manager: KVCacheManager, seq_ids: list[int], query_lens: list[int],
               queries: torch.Tensor) -> AttentionCheck:
    """Kernel vs reference for one step: sequence i's last query_lens[i] tokens attend.

    queries: [sum(query_lens), num_heads, head_dim], the sequences' new tokens laid end to end;
    every token's K/V must already be in the pool.
    """
    seqs = [manager.sequences[i] for i in seq_ids]
    for seq in seqs:
        if seq.num_written != len(seq):
            raise ValueError(f"sequence {seq.seq_id}: K/V of {len(seq) - seq.num_written} "
                             "token(s) not written yet")
    device = manager.pool.device
    tables = manager.block_table_tensor(seq_ids)  # [num_seqs, max_blocks]
    seq_lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32, device=device)
    starts = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32,
                          device=device)  # [num_seqs + 1]
    query = queries.to(device, manager.config.dtype)  # [num_tokens, num_heads, head_dim]
    args = (query, manager.pool.key_caches[0], manager.pool.value_caches[0], tables, seq_lens,
            starts)
    return compare(paged_attention(*args), dense_attention(*args))


def check_decode(manager: KVCacheManager, seq_ids: list[int],
                 queries: torch.Tensor) -> AttentionCheck:
    """check_step with one new token per sequence; queries [num_seqs, num_heads, head_dim]."""
    return check_step(manager, seq_ids, [1] * len(seq_ids), queries)
