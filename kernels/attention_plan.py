"""How a paged-attention call is laid out in programs, decided on the host from its shapes alone.

No tensor is read here, so a model step plans once and launches every layer with the same plan,
and the ahead-of-time compile test (tests/test_kernels_aot.py) gets exactly the constexprs and
launch options a GPU would use, on a machine without one.

Per sequence (a GPU): a program takes one tile of one sequence's new tokens for one KV head; its
rows are (token, query head) pairs, the query heads that share the KV head. The tiles of all
sequences lie end to end on grid x (no grid-z limit of 65,535; at most one idle program per
sequence). When those programs would leave the GPU part idle, or one long context would
outlast the rest of the batch, each tile's context is split across grid z (flash-decoding) and
a second kernel merges the splits:
- the split count is a runtime argument, so a context growing step by step never recompiles;
- it is chosen from the work, not only the longest context: the longest tile's share per
  split is about the batch's keys per resident program (CTAS_PER_SM programs on every SM),
  never under MIN_SPLIT_KEYS, so one long context among short ones is split as much as it
  needs, and the GPU is filled 2-4 programs per SM. A tile reads the keys its tokens see: its
  context, or only the window's (or chunk's) blocks of a local attention layer;
- in the kernel a split covers at least MIN_SPLIT_KEYS of its own tile's keys: a short
  context uses few of the splits, and the programs of the others return at once.

Whole batch (the interpreter, where every program and every op costs Python time): one program
takes a tile of the batch's (token, query head) rows from any sequences; see
kernels/whole_batch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernels.paged_inputs import AttentionShapes, first_visible_key

CTAS_PER_SM = 3  # resident programs an SM should get: enough loads in flight to hide latency
MIN_SPLIT_KEYS = 256  # below this, a split's merge costs more than its parallelism gains
MAX_SPLITS = 256  # bounds the partial-state buffers: splits x tokens x heads x head_dim floats
H100_SMS = 132  # H100 / H200 SXM: the GPU the compile check and the tests plan for


@dataclass(frozen=True)
class AttentionPlan:
    """The program layout and tile sizes of one paged-attention call."""

    whole_batch: bool
    compiled: bool  # a GPU's compiled kernel (else the interpreter)
    heads_pad: int  # query heads per KV head, padded to a power of two (whole batch: 1)
    block_q: int  # new tokens a program takes (whole batch: (token, head) rows)
    head_pad: int  # head_dim padded to a power of two, at least 16
    tile_n: int  # keys (whole batch: columns) per loop step
    num_splits: int  # programs sharing one tile's context (grid z)
    one_tile_per_seq: bool  # every sequence's new tokens fit one tile: program x = sequence
    min_split_tiles: int
    dot_f32: bool  # float32 dots: the interpreter cannot multiply bfloat16
    precision: str
    grid: tuple[int, int, int]
    shared: int = 0  # whole batch: keys every sequence reads from the same blocks, laid out once
    num_warps: int = 4
    num_stages: int = 3

    @property
    def rows(self) -> int:
        return self.block_q * self.heads_pad


def tile_keys(shapes: AttentionShapes, block_q: int) -> list[int]:
    """Keys each per-sequence tile reads (for one KV head): from the block holding its first
    token's first visible key to its last token (causal; all of the context without a window
    or chunk)."""
    window, chunk = shapes.limits
    keys = []
    for seq_len, q_len in zip(shapes.seq_lens, shapes.query_lens):
        context = seq_len - q_len
        for first_q in range(0, q_len, block_q):
            lo = first_visible_key(context + first_q, window, chunk)
            keys.append(context + min(first_q + block_q, q_len) - lo // shapes.block_size
                        * shapes.block_size)
    return keys


def choose_num_splits(shapes: AttentionShapes, block_q: int, num_sms: int) -> int:
    """How many programs share a tile's context: the longest tile's share per split is about
    the batch's keys per resident program, never under MIN_SPLIT_KEYS."""
    keys = tile_keys(shapes, block_q)
    share = max(triton.cdiv(sum(keys) * shapes.num_kv_heads, CTAS_PER_SM * num_sms),
                MIN_SPLIT_KEYS)
    return max(1, min(triton.cdiv(max(keys, default=0), share), MAX_SPLITS))


def plan_attention(shapes: AttentionShapes, dtype: torch.dtype, compiled: bool, num_sms: int = 0,
                   whole_batch: bool = False, num_splits: int | None = None,
                   shared: int = 0) -> AttentionPlan:
    """The plan for a call with these shapes. compiled: for a GPU with num_sms SMs (else the
    interpreter); num_splits None chooses (a GPU only: in the interpreter more programs only
    cost more Python time); shared: keys the whole-batch layout lays out once."""
    if whole_batch and (num_splits or 1) > 1:
        raise ValueError("num_splits: splitting a context across programs needs "
                         "whole_batch=False")
    group = shapes.num_heads // shapes.num_kv_heads
    head_pad = max(16, triton.next_power_of_2(shapes.head_dim))
    element = torch.empty((), dtype=dtype).element_size()
    # Tile sizes: on a GPU, 16..64 rows of (token, head) and 32..64 keys a step (smaller for
    # wide rows, to stay within shared memory and registers); in the interpreter, fewer,
    # larger tiles.
    if compiled:
        max_rows = tile_n = 64 if head_pad * element <= 256 else 32
    elif whole_batch:  # a tile of columns wide enough for the batch's contexts, up to 1024
        columns = shapes.num_kv_heads * (shapes.visible_keys - shared * (shapes.num_seqs - 1))
        max_rows, tile_n = 256, max(16, min(1024, triton.next_power_of_2(columns)))
    else:
        max_rows, tile_n = 128, 256
    dot_f32 = not compiled and dtype == torch.bfloat16
    precision = "ieee" if dtype == torch.float32 or dot_f32 else "tf32"
    min_split_tiles = triton.cdiv(MIN_SPLIT_KEYS, tile_n) if compiled else 1
    if whole_batch:  # rows of (token, query head): as many a program as fit, at least 16
        block_q = max(16, min(max_rows, triton.next_power_of_2(shapes.num_tokens
                                                                * shapes.num_heads)))
        programs = triton.cdiv(shapes.num_tokens * shapes.num_heads, block_q)
        return AttentionPlan(True, compiled, 1, block_q, head_pad, tile_n, 1, False,
                             min_split_tiles, dot_f32, precision, (programs, 1, 1), shared)
    heads_pad = triton.next_power_of_2(group)
    min_q = max(1, 16 // heads_pad)  # tl.dot needs at least 16 rows
    block_q = max(min_q, min(max(1, max_rows // heads_pad),
                             triton.next_power_of_2(shapes.max_query_len)))
    one_tile = shapes.max_query_len <= block_q
    # Tile t of sequence s is program query_start_loc[s] // block_q + s + t: every sequence's
    # tiles fit, and the programs number num_tokens // block_q + num_seqs.
    tiles = shapes.num_seqs if one_tile else shapes.num_tokens // block_q + shapes.num_seqs
    if num_splits is None:
        num_splits = choose_num_splits(shapes, block_q, num_sms) if compiled else 1
    return AttentionPlan(False, compiled, heads_pad, block_q, head_pad, tile_n, num_splits,
                         one_tile, min_split_tiles, dot_f32, precision,
                         (tiles, shapes.num_kv_heads, num_splits))
