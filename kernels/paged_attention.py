"""Paged attention: a Triton kernel that reads K/V block by block through the block table.

A program's rows are (new token, query head) pairs; it walks the keys a tile of positions at a
time: each key's logical block (pos // block_size) is looked up in the block table to find the
physical block, and K/V are loaded from there. An online softmax in float32 (running max,
running sum, rescaled accumulator) combines the tiles. Causal: the i-th of a sequence's q new
tokens sits at position seq_len - q + i and sees positions up to its own.

Two layouts of programs, the same arithmetic:
- per sequence (a GPU): one program per (sequence, KV head, tile of that sequence's new
  tokens); its rows are the query heads that share the KV head, so the group is served by one
  pass over the cache. When there are too few programs to fill the SMs and the contexts are long,
  each tile's context is split across several programs (flash-decoding); a second small kernel
  merges their partial softmax states.
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

from functools import cache

import torch
import triton
import triton.language as tl

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels.backend import kernel_launch
from kernels.paged_inputs import AttentionShapes, check_paged_inputs
from kernels.whole_batch import WholeBatchLayout, shared_prefix_len, whole_batch_layout

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)  # running-max start: finite, so masked rows never give NaN


@triton.jit
def _paged_attention_kernel(
    out_ptr, query_ptr, key_cache_ptr, value_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    first_key_ptr, last_key_ptr, shared_first_ptr, shared_last_ptr, key_entry_ptr, key_slot_ptr,
    program_lo_ptr, program_end_ptr,  # ^ used if WHOLE_BATCH (kernels/whole_batch.py)
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    stride_t, stride_h,  # of query and out (both contiguous)
    stride_cb, stride_cs, stride_ch, stride_bt,
    block_size, head_dim,
    partial_out_ptr, partial_m_ptr, partial_l_ptr, num_tokens, num_heads,  # used if NUM_SPLITS > 1
    GROUP: tl.constexpr, HEADS_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    HEAD_PAD: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
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
    col_ok = dims < head_dim  # [1, D]
    # K/V columns past head_dim read their KV head's first value, so the loads need no mask:
    # q is zero in those columns and their outputs are never stored.
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
        col_offs = tl.where(col_ok, dims, 0)  # [1, D] within the KV head (key_slot_offs has it)
    else:  # program (sequence, KV head, tile of that sequence's new tokens[, split])
        rows = tl.arange(0, BLOCK_Q * HEADS_PAD)[:, None]  # [M, 1]
        in_group = rows % HEADS_PAD  # [M, 1] query head among the KV head's
        seq = pid
        kv_head = tl.program_id(1).to(tl.int64)
        tile_split = tl.program_id(2).to(tl.int64)
        first_q = (tile_split // NUM_SPLITS) * BLOCK_Q
        split = tile_split % NUM_SPLITS
        q_start = tl.load(query_start_loc_ptr + seq).to(tl.int64)
        q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64) - q_start
        if first_q >= q_len:
            return
        context_len = tl.load(seq_lens_ptr + seq).to(tl.int64) - q_len  # keys before the new
        q_idx = first_q + rows // HEADS_PAD  # [M, 1] index among this sequence's new tokens
        token = q_start + q_idx
        row_ok = (q_idx < q_len) & (in_group < GROUP)
        last_key = context_len + q_idx  # [M, 1] a row sees keys up to its own position
        kv_end = context_len + tl.minimum(first_q + BLOCK_Q, q_len)  # keys this tile needs
        # With several splits, each covers its own whole-tile share of [0, kv_end) (maybe none).
        chunk = (((kv_end + NUM_SPLITS - 1) // NUM_SPLITS + TILE_N - 1) // TILE_N) * TILE_N
        kv_lo = split * chunk
        kv_hi = tl.minimum(kv_lo + chunk, kv_end)
        table_row = block_tables_ptr + seq * stride_bt
        head = kv_head * GROUP + in_group  # [M, 1] query head
        q_offs = token * stride_t + head * stride_h + dims  # [M, D], also out's
        q_mask = row_ok & col_ok  # [M, D]
        q = tl.load(query_ptr + q_offs, mask=q_mask, other=0.0)  # [M, D]
        col_offs = tl.where(col_ok, kv_head * stride_ch + dims, 0)  # [1, D] within a slot
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
        # key lists by a tile; per sequence they are clamped onto the last needed key) and are
        # masked out below, so every read stays inside the block table and the cache.
        if WHOLE_BATCH:
            entry = tl.load(key_entry_ptr + cols)  # [N] its table row + its logical block
            physical = tl.load(block_tables_ptr + entry).to(tl.int64)  # [N] physical blocks
            slot_offs = tl.load(key_slot_ptr + cols)  # [N] its slot and KV head (offset)
            visible = (across >= first_key) & (across <= last_key)  # [M, N]
            if SHARED_PREFIX:
                visible = visible | ((across >= shared_first) & (across <= shared_last))
        else:
            pos = tl.minimum(cols, kv_end - 1)  # [N] position in the sequence
            physical = tl.load(table_row + pos // block_size).to(tl.int64)  # [N]
            slot_offs = (pos % block_size) * stride_cs
            visible = across <= last_key  # [M, N]
        offs = (physical * stride_cb + slot_offs)[:, None] + col_offs  # [N, D]
        k = tl.load(key_cache_ptr + offs)  # [N, D]
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
        v = tl.load(value_cache_ptr + offs)  # [N, D]
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    if WHOLE_BATCH:  # float32 rows, every one with a key (padding rows repeat the last row)
        tl.store(out_ptr + q_offs, acc / l_i)
    elif NUM_SPLITS == 1:  # each row writes where its query came from
        out = acc / tl.where(row_ok, l_i, 1.0)  # [M, D]
        tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:  # keep this split's unnormalised state; _merge_splits_kernel combines the splits
        part = (split * num_tokens + token) * num_heads + head  # [M, 1]
        tl.store(partial_m_ptr + part, m_i, mask=row_ok)
        tl.store(partial_l_ptr + part, l_i, mask=row_ok)
        tl.store(partial_out_ptr + part * head_dim + dims, acc, mask=q_mask)


@triton.jit
def _merge_splits_kernel(out_ptr, partial_out_ptr, partial_m_ptr, partial_l_ptr,
                         stride_ot, stride_oh, num_tokens, num_heads, head_dim,
                         NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
                         HEAD_PAD: tl.constexpr):
    # One program per (token, head): rescale each split's sum and output to the global max.
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < NUM_SPLITS
    part = (splits * num_tokens + token) * num_heads + head  # [S]
    m = tl.load(partial_m_ptr + part, mask=split_ok, other=NEG_BIG)
    weight = tl.exp2(m - tl.max(m, 0))  # [S]; 0 for splits that saw no key
    total = tl.sum(tl.load(partial_l_ptr + part, mask=split_ok, other=0.0) * weight, 0)
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < head_dim
    acc = tl.load(partial_out_ptr + part[:, None] * head_dim + dims[None, :],
                  mask=split_ok[:, None] & dim_ok[None, :], other=0.0)  # [S, D]
    out = tl.sum(acc * weight[:, None], 0) / total  # [D]
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_ok)


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(shapes: AttentionShapes, programs: int, device: torch.device) -> int:
    """Split long contexts across programs when (sequence, KV head, tile) leaves SMs idle.

    Only for compiled kernels: in the interpreter more programs only cost more Python time.
    """
    if device.type != "cuda":
        return 1
    sms = _sm_count(device)
    if programs >= sms:
        return 1
    return max(1, min(triton.cdiv(2 * sms, programs), shapes.max_seq_len // 512, 16))


def launch_paged_attention(shapes: AttentionShapes, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           num_splits: int | None = None,
                           whole_batch: bool | None = None) -> torch.Tensor:
    """Launch the kernel on inputs `check_paged_inputs` accepted (benchmarks time this alone).

    num_splits: how many programs share one tile's context (flash-decoding); None chooses.
    whole_batch: one program per tile of the batch's (token, query head) rows, all sequences
    and heads at once, instead of one per (sequence, KV head, tile). None chooses it for the
    interpreter, where each program and each op costs Python time; a GPU wants many small
    programs.
    """
    query = query.contiguous()  # out shares its offsets
    out = torch.empty_like(query)  # [num_tokens, num_heads, head_dim]
    if shapes.max_query_len == 0:
        return out
    if whole_batch is None:
        whole_batch = not query.is_cuda and not num_splits
    if whole_batch and (num_splits or 1) > 1:
        raise ValueError("num_splits: splitting a context across programs needs "
                         "whole_batch=False")
    group = shapes.num_heads // shapes.num_kv_heads
    head_pad = max(16, triton.next_power_of_2(shapes.head_dim))
    shared = shared_prefix_len(block_tables, seq_lens, shapes.block_size) if whole_batch else 0
    # Tile sizes: on a GPU, 16..64 rows of (token, head) and 32..64 positions per step (smaller
    # for wide rows, to stay within shared memory); in the interpreter, fewer, larger tiles.
    if query.is_cuda:
        max_rows = tile_n = 64 if head_pad * query.element_size() <= 256 else 32
    elif whole_batch:  # a tile of columns wide enough for the batch's contexts, up to 1024
        columns = shapes.num_kv_heads * (shapes.total_keys - shared * (shapes.num_seqs - 1))
        max_rows, tile_n = 256, max(16, min(1024, triton.next_power_of_2(columns)))
    else:
        max_rows, tile_n = 128, 256
    # Triton's interpreter keeps bfloat16 as raw 16-bit integers and cannot multiply them.
    dot_f32 = not query.is_cuda and query.dtype == torch.bfloat16
    if whole_batch:  # rows of (token, query head): as many a program as fit, at least 16
        heads_pad, num_splits = 1, 1  # (tl.dot needs 16 rows)
        block_q = max(16, min(max_rows, triton.next_power_of_2(shapes.num_tokens
                                                                * shapes.num_heads)))
        layout = whole_batch_layout(query, block_tables, seq_lens, query_start_loc,
                                    shapes.num_kv_heads, shapes.block_size, key_cache.stride(1),
                                    key_cache.stride(2), block_q, head_pad, tile_n, shared)
        rows = layout.query_rows  # [padded rows, HEAD_PAD]
        kernel_out = torch.empty(rows.shape, dtype=torch.float32, device=query.device)
        grid = (rows.shape[0] // block_q, 1, 1)
        whole = layout.kernel_args()
    else:
        heads_pad = triton.next_power_of_2(group)
        min_q = max(1, 16 // heads_pad)  # tl.dot needs at least 16 rows
        block_q = max(min_q, min(max(1, max_rows // heads_pad),
                                 triton.next_power_of_2(shapes.max_query_len)))
        q_tiles = triton.cdiv(shapes.max_query_len, block_q)
        if num_splits is None:
            num_splits = choose_num_splits(
                shapes, shapes.num_seqs * shapes.num_kv_heads * q_tiles, query.device)
        grid = (shapes.num_seqs, shapes.num_kv_heads, q_tiles * num_splits)
        kernel_out = out
        whole = (query, *(query_start_loc,) * (WholeBatchLayout.num_args() - 1))  # unused
    partial_shape = (num_splits, shapes.num_tokens, shapes.num_heads)
    partial_m = torch.empty(partial_shape if num_splits > 1 else (1,), dtype=torch.float32,
                            device=query.device)  # [num_splits, num_tokens, num_heads]
    partial_l = torch.empty_like(partial_m)
    partial_out = torch.empty((*partial_shape, shapes.head_dim) if num_splits > 1 else (1,),
                              dtype=torch.float32, device=query.device)
    with kernel_launch():
        _paged_attention_kernel[grid](
            kernel_out, whole[0], key_cache, value_cache, block_tables, seq_lens,
            query_start_loc, *whole[1:],
            shapes.scale * LOG2E,
            query.stride(0), query.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
            shapes.block_size, shapes.head_dim,
            partial_out, partial_m, partial_l, shapes.num_tokens, shapes.num_heads,
            GROUP=group, HEADS_PAD=heads_pad, BLOCK_Q=block_q, HEAD_PAD=head_pad, TILE_N=tile_n,
            PRECISION="ieee" if query.dtype == torch.float32 or dot_f32 else "tf32",
            NUM_SPLITS=num_splits, DOT_F32=dot_f32, WHOLE_BATCH=whole_batch,
            SHARED_PREFIX=shared > 0,
        )
    if whole_batch:  # rows are (token, head) pairs
        num_rows = shapes.num_tokens * shapes.num_heads
        out.copy_(kernel_out[:num_rows, :shapes.head_dim].view(out.shape))
    if num_splits > 1:
        with kernel_launch():
            _merge_splits_kernel[(shapes.num_tokens, shapes.num_heads)](
                out, partial_out, partial_m, partial_l, out.stride(0), out.stride(1),
                shapes.num_tokens, shapes.num_heads, shapes.head_dim,
                NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
                HEAD_PAD=head_pad,
            )
    return out


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
