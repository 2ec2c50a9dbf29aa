"""Paged attention: a Triton kernel that reads K/V block by block through the block table.

A program's rows are (new token, query head) pairs; it walks the keys a tile of positions at a
time: each key's logical block (pos // block_size) is looked up in the block table to find the
physical block, and K/V are loaded from there. An online softmax in float32 (running max,
running sum, rescaled accumulator) combines the tiles. Causal: the i-th of a sequence's q new
tokens sits at position seq_len - q + i and sees positions up to its own.

Two layouts of programs, the same arithmetic (kernels/attention_plan.py chooses):
- per sequence (a GPU): one program per (tile of one sequence's new tokens, KV head[, split]);
  its rows are the query heads that share the KV head, so the group is served by one pass over
  the cache. The tiles of all sequences lie end to end on grid x; a program finds its sequence
  by a binary search over query_start_loc (or is the sequence, when every sequence's new tokens
  fit one tile). When the programs would leave the GPU part idle, or one long context would
  outlast the rest, each tile's context is split across grid z (flash-decoding) and a second
  kernel merges the splits' partial softmax states. Block size, head size and tile sizes are
  constexprs (a key's block is a shift, its slot a mask); K/V rows are contiguous runs of
  head_dim values at 16-byte aligned offsets, loaded with a mask only when head_dim is not a
  power of two, so the compiler reads them with 16-byte vector loads through cp.async.
- whole batch (the interpreter, where each program and each op costs Python time): one program
  takes a tile of the batch's (token, query head) rows, from any sequences. Its columns are
  (KV head, key) pairs: the batch's contexts laid end to end, once per KV head. The wrapper lays
  out the rows and columns (kernels/whole_batch.py) with a few torch ops (~10x cheaper each than
  an interpreted op), saying for each column which block-table entry holds its key's block (its
  sequence's row, its logical block) and where the key's slot and KV head sit; the kernel still
  reads the physical block from the table. A row sees only its own sequence's keys, in its own
  KV head's columns. Keys that every sequence reads from the same physical blocks (forks of one
  prompt) are laid out once. A decode step is then one program, not sequences x KV heads of
  them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import triton
import triton.language as tl

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels.attention_plan import AttentionPlan, plan_attention
from kernels.backend import kernel_launch
from kernels.paged_inputs import AttentionShapes, check_paged_inputs
from kernels.whole_batch import WholeBatchLayout, shared_prefix_len, whole_batch_layout

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)  # running-max start: finite, so masked rows never give NaN


@triton.jit(do_not_specialize=["stride_bt", "num_seqs", "num_tokens", "num_splits"])
def _paged_attention_kernel(
    out_ptr, query_ptr, key_cache_ptr, value_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    first_key_ptr, last_key_ptr, shared_first_ptr, shared_last_ptr, key_entry_ptr, key_slot_ptr,
    program_lo_ptr, program_end_ptr,  # ^ used if WHOLE_BATCH (kernels/whole_batch.py)
    partial_out_ptr, partial_m_ptr, partial_l_ptr, partial_used_ptr,  # used if SPLIT
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    stride_cb: tl.int64, stride_cs, stride_ch,  # of the caches (block, slot, KV head)
    stride_bt, num_seqs, num_tokens, num_splits,  # runtime values that change call to call
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEADS_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MIN_SPLIT_TILES: tl.constexpr,
    ONE_TILE_PER_SEQ: tl.constexpr, PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,  # several programs share a tile's context: write partial states
    DOT_F32: tl.constexpr,  # float32 dots (interpreter with bf16)
    WHOLE_BATCH: tl.constexpr,
    SHARED_PREFIX: tl.constexpr,  # whole batch: keys every sequence shares are laid out once
):
    # Rows are (new token, query head) pairs, BLOCK_Q * HEADS_PAD of them; the columns of the
    # Q, K, V and output tiles are the dims of one head.
    # Per-row values are [M, 1] and per-column ones [1, D] from the start, so they broadcast
    # without reshapes (each op costs Python time in the interpreter).
    # Index arithmetic is int64 from the start: large caches overflow int32 offsets, and the
    # interpreter checks every int32 add, sub and mul for overflow (seven more ops each). An
    # int32 arange needs no cast where it meets an int64 first (the op is then int64).
    pid = tl.program_id(0).to(tl.int64)
    dims = tl.arange(0, HEAD_PAD)[None, :]  # [1, D]
    col_ok = dims < HEAD_DIM  # [1, D]
    if WHOLE_BATCH:  # program: BLOCK_Q consecutive rows of the wrapper's rows (HEADS_PAD is 1)
        rows = pid * BLOCK_Q + tl.arange(0, BLOCK_Q)[:, None]  # [M, 1]
        q_offs = rows * HEAD_PAD + dims  # [M, D] the wrapper's query rows, also out's
        q = tl.load(query_ptr + q_offs)  # [M, D]
        # Columns are (KV head, key) pairs, one KV head's keys after another's. A row sees, in
        # its own KV head's columns, its sequence's keys up to its own, and the keys every
        # sequence shares up to its own position.
        first_key = tl.load(first_key_ptr + rows)  # [M, 1]
        last_key = tl.load(last_key_ptr + rows)  # [M, 1]
        if SHARED_PREFIX:
            shared_first = tl.load(shared_first_ptr + rows)  # [M, 1]
            shared_last = tl.load(shared_last_ptr + rows)  # [M, 1]
        kv_lo = tl.load(program_lo_ptr + pid)  # the program's columns
        kv_end = tl.load(program_end_ptr + pid)
        kv_hi = kv_end
        # The interpreter's trick: K/V columns past head_dim read their KV head's first value,
        # so the loads need no mask (q is zero there, those outputs are never stored). A GPU
        # would see non-contiguous offsets and load 2 bytes at a time.
        col_offs = tl.where(col_ok, dims, 0)  # [1, D] within the KV head (key_slot_offs has it)
    else:  # program (tile of one sequence's new tokens, KV head, split)
        if ONE_TILE_PER_SEQ:  # every sequence's new tokens fit one tile: program x is the seq
            seq = pid
            first_q = pid * 0
        else:  # tile t of sequence s is program query_start_loc[s] // BLOCK_Q + s + t: find s
            seq = pid * 0  # query_start_loc[seq] // BLOCK_Q + seq <= pid, always
            hi = seq + num_seqs
            while hi - seq > 1:
                mid = (seq + hi) // 2
                if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid:
                    seq = mid
                else:
                    hi = mid
            first_q = (pid - tl.load(query_start_loc_ptr + seq) // BLOCK_Q - seq) * BLOCK_Q
        q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        if first_q >= q_len:  # a tile past its sequence's new tokens
            return
        context_len = tl.load(seq_lens_ptr + seq) - q_len  # keys before the new ones
        rows = tl.arange(0, BLOCK_Q * HEADS_PAD)[:, None]  # [M, 1]
        in_group = rows % HEADS_PAD  # query head among the KV head's
        q_idx = first_q + rows // HEADS_PAD  # [M, 1] index among this sequence's new tokens
        token = q_start + q_idx
        kv_head = tl.program_id(1).to(tl.int64)
        head = kv_head * GROUP + in_group  # [M, 1] query head
        row_ok = (q_idx < q_len) & (in_group < GROUP)
        last_key = context_len + q_idx  # [M, 1] a row sees keys up to its own position
        kv_end = context_len + tl.minimum(first_q + BLOCK_Q, q_len)  # keys this tile needs
        kv_lo = 0
        kv_hi = kv_end
        if SPLIT:  # a split covers whole tiles of [0, kv_end): an even share, at least
            # MIN_SPLIT_TILES, so a short context leaves the later splits empty
            chunk = tl.maximum(((kv_end + TILE_N - 1) // TILE_N + num_splits - 1) // num_splits,
                               MIN_SPLIT_TILES) * TILE_N
            kv_lo = tl.program_id(2) * chunk
            if kv_lo >= kv_end:  # a split past this tile's context
                return
            kv_hi = tl.minimum(kv_lo + chunk, kv_end)
            if tl.program_id(2) == 0:  # how many splits the merge combines, for each row
                tl.store(partial_used_ptr + token * NUM_HEADS + head,
                         (token * 0 + (kv_end + chunk - 1) // chunk).to(tl.int32), mask=row_ok)
        table_row = block_tables_ptr + seq * stride_bt
        q_offs = token * (NUM_HEADS * HEAD_DIM) + head * HEAD_DIM + dims  # [M, D], also out's
        q_mask = row_ok & col_ok  # [M, D]
        q = tl.load(query_ptr + q_offs, mask=q_mask, other=0.0)  # [M, D]
        col_offs = kv_head * stride_ch + dims  # [1, D] contiguous within a slot
    if DOT_F32:
        q = q.to(tl.float32)

    # tl.full, not tl.zeros: a builtin, where tl.zeros is a @jit helper, and the interpreter
    # re-patches the language on every call of one (~0.5 ms each).
    m_i = tl.full([BLOCK_Q * HEADS_PAD, 1], NEG_BIG, tl.float32)  # running max (base 2)
    l_i = tl.full([BLOCK_Q * HEADS_PAD, 1], 0.0, tl.float32)  # running sum
    acc = tl.full([BLOCK_Q * HEADS_PAD, HEAD_PAD], 0.0, tl.float32)  # [M, D]
    tile = tl.arange(0, TILE_N).to(tl.int64)
    for start in range(kv_lo, kv_hi, TILE_N):
        cols = start + tile  # [N]
        across = cols[None, :]  # [1, N]
        # Each key's logical block is looked up in its sequence's block table row: the physical
        # block holding it. Columns past kv_end read a real key (the wrapper pads the whole-batch
        # key lists by a tile with the last key's; per sequence they are clamped onto the last
        # needed key) and are masked out below, so every read stays inside the table and cache.
        if WHOLE_BATCH:
            entry = tl.load(key_entry_ptr + cols)  # [N] its table row + its logical block
            physical = tl.load(block_tables_ptr + entry).to(tl.int64)  # [N] physical blocks
            slot_offs = tl.load(key_slot_ptr + cols)  # [N] its slot and KV head (offset)
            visible = (across >= first_key) & (across <= last_key)  # [M, N]
            if SHARED_PREFIX:
                visible = visible | ((across >= shared_first) & (across <= shared_last))
        else:
            pos = tl.minimum(cols, kv_end - 1)  # [N] position in the sequence
            physical = tl.load(table_row + pos // BLOCK_SIZE).to(tl.int64)  # [N]
            slot_offs = (pos % BLOCK_SIZE) * stride_cs
            visible = across <= last_key  # [M, N]
        offs = (physical * stride_cb + slot_offs)[:, None] + col_offs  # [N, D]
        if WHOLE_BATCH or HEAD_PAD == HEAD_DIM:
            k = tl.load(key_cache_ptr + offs)  # [N, D]
        else:
            k = tl.load(key_cache_ptr + offs, mask=col_ok, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, N]
        s = tl.where(visible, s, float("-inf"))
        # tl.reduce with the combine functions tl.max and tl.sum use (on float32 they are just
        # this): the same code compiled, and the interpreter runs it as one numpy call, where a
        # call of the @jit tl.max re-patches the language first (~0.5 ms, twice a tile).
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max, keep_dims=True))
        alpha = tl.exp2(m_i - m_new)  # [M, 1] rescales what was summed under the old max
        p = tl.exp2(s - m_new)  # [M, N]
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine, keep_dims=True)
        if WHOLE_BATCH or HEAD_PAD == HEAD_DIM:
            v = tl.load(value_cache_ptr + offs)  # [N, D]
        else:
            v = tl.load(value_cache_ptr + offs, mask=col_ok, other=0.0)
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    if WHOLE_BATCH:  # float32 rows, every one with a key (padding rows repeat the last row)
        tl.store(out_ptr + q_offs, acc / l_i)
    elif SPLIT:  # keep this split's unnormalised state; _merge_splits_kernel combines them
        part = (tl.program_id(2) * num_tokens + token) * NUM_HEADS + head  # [M, 1]
        tl.store(partial_m_ptr + part, m_i, mask=row_ok)
        tl.store(partial_l_ptr + part, l_i, mask=row_ok)
        tl.store(partial_out_ptr + part * HEAD_DIM + dims, acc, mask=q_mask)
    else:  # each row writes where its query came from
        out = acc / tl.where(row_ok, l_i, 1.0)  # [M, D]
        tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit(do_not_specialize=["num_tokens"])
def _merge_splits_kernel(out_ptr, partial_out_ptr, partial_m_ptr, partial_l_ptr,
                         partial_used_ptr, num_tokens, NUM_HEADS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr):
    # One program per (token, head): combine the splits that saw its keys (the attention
    # kernel wrote how many), each split's sum and output rescaled to the running max.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    m_i = tl.full([1], NEG_BIG, tl.float32)
    l_i = tl.full([1], 0.0, tl.float32)
    acc = tl.full([HEAD_PAD], 0.0, tl.float32)  # [D]
    for split in range(0, tl.load(partial_used_ptr + token * NUM_HEADS + head)):
        part = (split * num_tokens + token) * NUM_HEADS + head
        m = tl.load(partial_m_ptr + part)
        m_new = tl.maximum(m_i, m)
        alpha, beta = tl.exp2(m_i - m_new), tl.exp2(m - m_new)  # a row that saw no key: 0
        l_i = l_i * alpha + tl.load(partial_l_ptr + part) * beta
        acc = acc * alpha + tl.load(partial_out_ptr + part * HEAD_DIM + dims, mask=dim_ok,
                                    other=0.0) * beta
        m_i = m_new
    tl.store(out_ptr + (token * NUM_HEADS + head) * HEAD_DIM + dims,
             (acc / l_i).to(out_ptr.dtype.element_ty), mask=dim_ok)


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_call(shapes: AttentionShapes, query: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, num_splits: int | None = None,
              whole_batch: bool | None = None) -> AttentionPlan:
    """The plan for a call on these tensors (kernels/attention_plan.py). whole_batch None
    chooses it for the interpreter, where each program and each op costs Python time; a GPU
    wants many small programs. The whole-batch layout reads the block tables (a host sync)."""
    compiled = query.is_cuda
    if whole_batch is None:
        whole_batch = not compiled and not num_splits
    shared = shared_prefix_len(block_tables, seq_lens, shapes.block_size) if whole_batch else 0
    return plan_attention(shapes, query.dtype, compiled,
                          _sm_count(query.device) if compiled else 0, whole_batch, num_splits,
                          shared)


@dataclass(frozen=True)
class KernelCall:
    """One kernel launch: the @triton.jit function, its grid, arguments and keyword arguments
    (constexprs and launch options). The ahead-of-time compile test compiles exactly these."""

    kernel: Any
    grid: tuple[int, int, int]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Launch:
    """A paged-attention call ready to launch: its kernel calls and where the output lands."""

    out: torch.Tensor  # [num_tokens, num_heads, head_dim]
    calls: tuple[KernelCall, ...]
    rows: torch.Tensor | None = None  # whole batch: the kernel's float32 (token, head) rows

    def run(self) -> torch.Tensor:
        with kernel_launch():
            for call in self.calls:
                call.kernel[call.grid](*call.args, **call.kwargs)
        if self.rows is not None:
            num_tokens, num_heads, head_dim = self.out.shape
            self.out.copy_(self.rows[:num_tokens * num_heads, :head_dim].view(self.out.shape))
        return self.out


def prepare_launch(plan: AttentionPlan, shapes: AttentionShapes, query: torch.Tensor,
                   key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   query_start_loc: torch.Tensor) -> Launch:
    """The kernel calls of one paged-attention call on inputs `check_paged_inputs` accepted.

    Reads nothing back from the device on the per-sequence layout (a CUDA graph can capture
    it); the whole-batch layout is built with torch ops on the host's side of the interpreter.
    """
    query = query.contiguous()  # out shares its offsets
    out = torch.empty_like(query)  # [num_tokens, num_heads, head_dim]
    if shapes.max_query_len == 0:
        return Launch(out, ())
    options = dict(num_warps=plan.num_warps, num_stages=plan.num_stages)
    split = plan.num_splits > 1
    rows = None
    if plan.whole_batch:
        layout = whole_batch_layout(query, block_tables, seq_lens, query_start_loc,
                                    shapes.num_kv_heads, shapes.block_size, key_cache.stride(1),
                                    key_cache.stride(2), plan.block_q, plan.head_pad, plan.tile_n,
                                    plan.shared)
        rows = torch.empty(layout.query_rows.shape, dtype=torch.float32, device=query.device)
        kernel_out, whole = rows, layout.kernel_args()  # [padded rows, HEAD_PAD]
    else:
        kernel_out = out
        whole = (query, *(query_start_loc,) * (WholeBatchLayout.num_args() - 1))  # unused
    if split:  # each split's running max and sum, its output, and how many splits a row has
        partial = (plan.num_splits, shapes.num_tokens, shapes.num_heads)
        partials = (torch.empty((*partial, shapes.head_dim), dtype=torch.float32,
                                device=query.device),  # [splits, tokens, heads, head_dim]
                    torch.empty(partial, dtype=torch.float32, device=query.device),
                    torch.empty(partial, dtype=torch.float32, device=query.device),
                    torch.empty(partial[1:], dtype=torch.int32, device=query.device))
    else:
        partials = (out,) * 4  # unused
    calls = [KernelCall(_paged_attention_kernel, plan.grid, (
        kernel_out, whole[0], key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        *whole[1:], *partials, shapes.scale * LOG2E,
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), shapes.num_seqs, shapes.num_tokens, plan.num_splits,
    ), dict(NUM_HEADS=shapes.num_heads, GROUP=shapes.num_heads // shapes.num_kv_heads,
            HEADS_PAD=plan.heads_pad, BLOCK_Q=plan.block_q, HEAD_DIM=shapes.head_dim,
            HEAD_PAD=plan.head_pad, BLOCK_SIZE=shapes.block_size, TILE_N=plan.tile_n,
            MIN_SPLIT_TILES=plan.min_split_tiles, ONE_TILE_PER_SEQ=plan.one_tile_per_seq,
            PRECISION=plan.precision, SPLIT=split, DOT_F32=plan.dot_f32,
            WHOLE_BATCH=plan.whole_batch, SHARED_PREFIX=plan.shared > 0, **options))]
    if split:
        calls.append(KernelCall(_merge_splits_kernel, (shapes.num_tokens, shapes.num_heads, 1),
                                (out, *partials, shapes.num_tokens),
                                dict(NUM_HEADS=shapes.num_heads, HEAD_DIM=shapes.head_dim,
                                     HEAD_PAD=plan.head_pad, num_warps=1)))  # 16-byte loads
    return Launch(out, tuple(calls), rows)


def launch_paged_attention(shapes: AttentionShapes, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           num_splits: int | None = None,
                           whole_batch: bool | None = None) -> torch.Tensor:
    """Launch the kernel on inputs `check_paged_inputs` accepted (benchmarks time this alone).

    num_splits: how many programs share one tile's context (flash-decoding); None chooses.
    whole_batch: one program per tile of the batch's (token, query head) rows, all sequences
    and heads at once, instead of one per (tile of a sequence's new tokens, KV head); None
    chooses (see plan_call).
    """
    plan = plan_call(shapes, query, block_tables, seq_lens, num_splits, whole_batch)
    return prepare_launch(plan, shapes, query, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc).run()


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal attention of the new tokens over their sequences' paged K/V.

    query [num_tokens, num_heads, head_dim]; key_cache, value_cache
    [num_blocks, block_size, num_kv_heads, head_dim]; block_tables int32 [num_seqs, max_blocks];
    seq_lens int32 [num_seqs] (context including the new tokens); query_start_loc int32
    [num_seqs + 1]. Returns [num_tokens, num_heads, head_dim] in query's dtype.
    """
    shapes = check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens,
                                query_start_loc, scale)
    return launch_paged_attention(shapes, query, key_cache, value_cache, block_tables, seq_lens,
                                  query_start_loc)
