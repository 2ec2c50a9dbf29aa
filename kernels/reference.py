"""The dense reference: gather K/V through the block tables, then plain causal attention (with a
sliding window or chunk: the same mask, written out with torch ops).

This is the ground truth the Triton kernel is checked against. It computes in float64 with
ordinary torch ops, one sequence at a time, and shares nothing with the kernel but the input
checks. `online_softmax_steps` replays the kernel's per-block softmax bookkeeping for one head,
so a page can show how the running max and running sum evolve block by block.

`compare` is the lab's one kernel check: the kernel's output against this reference, judged by
`TOLERANCES` (one rule per dtype). Pages, the scheduler's iteration records and the tests all
use it, so "the kernel matches" means the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.paged_inputs import check_paged_inputs


def gather_kv(cache: torch.Tensor, block_table_row: torch.Tensor | list[int],
              length: int, start: int = 0) -> torch.Tensor:
    """Read positions [start, length) of one sequence through its block table (the entries
    before start's block are not read: they may be null).

    cache [num_blocks, block_size, num_kv_heads, head_dim]
    -> [length - start, num_kv_heads, head_dim].
    """
    block_size = cache.shape[1]
    table = torch.as_tensor(block_table_row, dtype=torch.int64, device=cache.device)  # [width]
    if length < 0 or -(-length // block_size) > table.shape[0]:
        raise ValueError(f"length: {length} positions need more than the "
                         f"{table.shape[0]} blocks in block_table_row")
    if not 0 <= start <= length:
        raise ValueError(f"start: {start} is not within [0, {length}]")
    pos = torch.arange(start, length, device=cache.device)  # [length - start]
    physical = table[pos // block_size]  # [length - start]
    if length > start and (physical.min() < 0 or physical.max() >= cache.shape[0]):
        raise ValueError(f"block_table_row: a used entry is outside [0, {cache.shape[0]})")
    return cache[physical, pos % block_size]  # [length - start, num_kv_heads, head_dim]


def dense_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float | None = None,
                    sliding_window: int | None = None,
                    attention_chunk_size: int | None = None) -> torch.Tensor:
    """Same contract as `paged_attention`, computed densely in float64; returns query's dtype."""
    shapes = check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens,
                                query_start_loc, scale, sliding_window=sliding_window,
                                attention_chunk_size=attention_chunk_size)
    group = shapes.num_heads // shapes.num_kv_heads
    out = torch.empty_like(query)  # [num_tokens, num_heads, head_dim]
    starts = query_start_loc.tolist()
    for seq, seq_len in enumerate(seq_lens.tolist()):
        q = query[starts[seq]:starts[seq + 1]].double()  # [q_len, num_heads, head_dim]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)  # [q_len]
        first = seq_len - q_len  # the first new token: gather from the first key it sees
        lo = 0
        if sliding_window is not None:
            lo = max(first - sliding_window + 1, 0)
        if attention_chunk_size is not None:
            lo = first - first % attention_chunk_size
        k = gather_kv(key_cache, block_tables[seq], seq_len, lo).double()  # [keys, kv_heads, d]
        v = gather_kv(value_cache, block_tables[seq], seq_len, lo).double()
        k = k.repeat_interleave(group, dim=1)  # [keys, num_heads, head_dim]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * shapes.scale  # [num_heads, q_len, keys]
        k_pos = torch.arange(lo, seq_len, device=q.device)[None, :]  # [1, keys]
        hidden = k_pos > q_pos[:, None]  # [q_len, keys] the future
        if sliding_window is not None:  # older than the last sliding_window positions
            hidden |= k_pos <= q_pos[:, None] - sliding_window
        if attention_chunk_size is not None:  # before the query's own chunk
            hidden |= k_pos < q_pos[:, None] - q_pos[:, None] % attention_chunk_size
        scores = scores.masked_fill(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # [num_heads, q_len, keys]
        out[starts[seq]:starts[seq + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out


@dataclass(frozen=True)
class SoftmaxStep:
    """The online-softmax state after one block: running max, running sum, output so far."""

    block: int  # logical block index
    running_max: float
    running_sum: float
    output: torch.Tensor  # [head_dim] acc / running_sum after this block


def online_softmax_steps(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         block_size: int, scale: float | None = None) -> list[SoftmaxStep]:
    """One query head over one sequence's K/V, block by block, as the kernel combines them.

    query [head_dim]; keys, values [length, head_dim]. The last step's output equals
    softmax(query . keys * scale) @ values.
    """
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    running_max, running_sum = float("-inf"), 0.0
    acc = torch.zeros(values.shape[-1], dtype=torch.float64)  # [head_dim]
    steps = []
    for block, start in enumerate(range(0, keys.shape[0], block_size)):
        s = keys[start:start + block_size].double() @ query.double() * scale  # [block_size]
        new_max = max(running_max, s.max().item())
        alpha = torch.exp(torch.tensor(running_max - new_max)).item()
        p = torch.exp(s - new_max)  # [block_size]
        running_sum = running_sum * alpha + p.sum().item()
        acc = acc * alpha + p @ values[start:start + block_size].double()
        running_max = new_max
        steps.append(SoftmaxStep(block, running_max, running_sum, acc / running_sum))
    return steps


# -- the kernel check ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tolerance:
    """How far a kernel's output may be from the float64 reference, for one dtype.

    relative: max |out - ref| / max |ref| < rtol (float32, where every element is accurate).
    allclose: |out - ref| <= atol + rtol * |ref| elementwise (half precisions, whose inputs
    are already rounded to 8-11 bits of mantissa).
    """

    kind: str  # "relative" or "allclose"
    rtol: float
    atol: float = 0.0

    def holds(self, out: torch.Tensor, ref: torch.Tensor, rel_error: float) -> bool:
        if self.kind == "relative":
            return rel_error < self.rtol
        return bool(torch.allclose(out, ref, atol=self.atol, rtol=self.rtol))

    def describe(self, dtype: torch.dtype) -> str:
        name = str(dtype).removeprefix("torch.")
        if self.kind == "relative":
            return f"{name}: relative error < {self.rtol:g}"
        return f"{name}: atol {self.atol:g}, rtol {self.rtol:g}"


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance("relative", 1e-5),
    torch.float16: Tolerance("allclose", 1e-2, 1.5e-2),
    torch.bfloat16: Tolerance("allclose", 1e-2, 1.5e-2),
}


@dataclass(frozen=True)
class AttentionCheck:
    """The kernel's output against the dense reference, and the verdict."""

    max_abs_error: float  # max |kernel - reference| over every output element
    rel_error: float  # max_abs_error / max |reference|
    ok: bool  # within TOLERANCES for the output's dtype
    tolerance: str  # the rule, in words, for a badge's help text
    num_seqs: int
    output: torch.Tensor  # kernel output [num_tokens, num_heads, head_dim], on the CPU
    reference: torch.Tensor  # dense output, the same shape


def compare(output: torch.Tensor, reference: torch.Tensor, num_seqs: int) -> AttentionCheck:
    """Judge `output` against `reference` (same shape) by the output dtype's tolerance."""
    out, ref = output.double().cpu(), reference.double().cpu()
    max_abs = (out - ref).abs().max().item() if out.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    rel = max_abs / scale if scale > 0 else max_abs
    tol = TOLERANCES[output.dtype]
    return AttentionCheck(max_abs, rel, tol.holds(out, ref, rel), tol.describe(output.dtype),
                          num_seqs, output.cpu(), reference.cpu())
