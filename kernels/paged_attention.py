"""Paged attention: a Triton kernel that reads K/V block by block through the block table.

Start here. One program takes one tile of one sequence's new tokens for one KV head; its rows
are (new token, query head) pairs, the query heads that share that KV head, so the group is
served by one pass over the cache. It walks the sequence's keys a tile of positions at a time:
each key's logical block (pos // block_size) is looked up in the sequence's block-table row to
find the physical block, and K and V are loaded from there. An online softmax in float32
(kernels/online_softmax.py) combines the tiles. Causal: the i-th of a sequence's q new tokens
sits at position seq_len - q + i and sees positions up to its own; a sliding-window or chunked
local layer sees fewer (kernels/paged_inputs.py states vLLM's rule), and the program then
starts at the block holding its first token's first visible key: it never reads a block, nor a
block-table entry, that none of its tokens can see (vLLM's null block sits there).

Flash-decoding: when these programs would leave the GPU part idle, or one long context would
outlast the rest, each tile's context is split across grid z, every split writes its partial
softmax state, and a second kernel merges them. kernels/attention_plan.py decides the tile
sizes and the split count from the shapes alone.

For the GPU's code: block size, head size and tile sizes are constexprs (a key's block is a
shift, its slot a mask); K/V rows are contiguous runs of head_dim values at 16-byte aligned
offsets, so the compiler reads them with 16-byte vector loads through cp.async (bench/aot.py
compiles the real launches for sm_90 and tests/test_kernels_aot.py holds them to it).

Triton's interpreter (a machine without CUDA) pays Python time for every program and every op,
so there the wrapper runs the same arithmetic in another layout by default, a whole batch in
one program (kernels/whole_batch.py). Both are checked against kernels/reference.py.
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels.attention_plan import AttentionPlan, plan_attention
from kernels.launch import KernelCall, Launch
from kernels.online_softmax import LOG2E, NEG_BIG, attend_tile, dot_dtype
from kernels.paged_inputs import AttentionShapes, check_paged_inputs
from kernels.whole_batch import shared_prefix_len, whole_batch_launch


@triton.jit
def _find_tile(query_start_loc_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr,
               ONE_TILE_PER_SEQ: tl.constexpr):
    """Program pid's sequence, and the index of its tile's first new token in that sequence.
    The tiles of all sequences lie end to end on grid x: tile t of sequence s is program
    query_start_loc[s] // BLOCK_Q + s + t, found by a binary search over query_start_loc."""
    if ONE_TILE_PER_SEQ:  # every sequence's new tokens fit one tile: program x is the sequence
        seq = pid
        first_q = pid * 0
    else:
        seq = pid * 0  # query_start_loc[seq] // BLOCK_Q + seq <= pid, always
        hi = seq + num_seqs
        while hi - seq > 1:
            mid = (seq + hi) // 2
            if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid:
                seq = mid
            else:
                hi = mid
        first_q = (pid - tl.load(query_start_loc_ptr + seq) // BLOCK_Q - seq) * BLOCK_Q
    return seq, first_q


@triton.jit
def _first_visible_key(position, sliding_window, chunk):
    """The first key a query at `position` sees (kernels/paged_inputs.py: first_visible_key);
    a limit that is NO_LIMIT reaches back to position 0."""
    return tl.maximum(tl.maximum(position - sliding_window + 1, position // chunk * chunk), 0)


@triton.jit(do_not_specialize=["stride_bt", "num_seqs", "num_tokens", "num_splits",
                               "sliding_window", "chunk"])
def _paged_attention_kernel(
    out_ptr, query_ptr, key_cache_ptr, value_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    partial_out_ptr, partial_m_ptr, partial_l_ptr, partial_used_ptr,  # used if SPLIT
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    sliding_window, chunk,  # used if LOCAL: the keys a query sees (NO_LIMIT where none)
    stride_cb: tl.int64, stride_cs, stride_ch,  # of the caches (block, slot, KV head)
    stride_bt, num_seqs, num_tokens, num_splits,  # runtime values that change call to call
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEADS_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, MIN_SPLIT_TILES: tl.constexpr,
    ONE_TILE_PER_SEQ: tl.constexpr,
    SPLIT: tl.constexpr,  # several programs share a tile's context: write partial states
    LOCAL: tl.constexpr,  # a sliding window or chunk: rows see fewer keys
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    # Per-row values are [M, 1] and per-column ones [1, D] from the start, so they broadcast
    # without reshapes (each op costs Python time in the interpreter). Index arithmetic is int64
    # from the start: large caches overflow int32 offsets, and the interpreter checks every
    # int32 add, sub and mul for overflow.
    # 1. The rows: a tile of one sequence's new tokens (grid x) x the query heads of one KV
    #    head (grid y), BLOCK_Q * HEADS_PAD (token, query head) pairs, token-major.
    seq, first_q = _find_tile(query_start_loc_ptr, tl.program_id(0).to(tl.int64), num_seqs,
                              BLOCK_Q, ONE_TILE_PER_SEQ)
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
    dims = tl.arange(0, HEAD_PAD)[None, :]  # [1, D]
    col_ok = dims < HEAD_DIM  # [1, D]
    q_offs = token * (NUM_HEADS * HEAD_DIM) + head * HEAD_DIM + dims  # [M, D], also out's
    q_mask = row_ok & col_ok  # [M, D]
    q = tl.load(query_ptr + q_offs, mask=q_mask, other=0.0).to(DOT_DTYPE)  # [M, D]

    # 2. The keys it reads: [kv_lo, kv_end), from the block holding the first key its first
    #    token sees (0 without a window) to its last token. A split (flash-decoding, grid z)
    #    covers whole tiles of them: an even share, at least MIN_SPLIT_TILES, so a short
    #    context leaves the later splits empty.
    kv_end = context_len + tl.minimum(first_q + BLOCK_Q, q_len)
    kv_lo = 0
    if LOCAL:  # a row sees [first_key, last_key], the tile from its first row's first block
        first_key = _first_visible_key(last_key, sliding_window, chunk)  # [M, 1]
        kv_lo = _first_visible_key(context_len + first_q, sliding_window, chunk)
        kv_lo = kv_lo // BLOCK_SIZE * BLOCK_SIZE
    kv_hi = kv_end
    if SPLIT:
        share = tl.maximum(((kv_end - kv_lo + TILE_N - 1) // TILE_N + num_splits - 1)
                           // num_splits, MIN_SPLIT_TILES) * TILE_N
        if tl.program_id(2) == 0:  # how many splits the merge combines, for each row
            tl.store(partial_used_ptr + token * NUM_HEADS + head,
                     (token * 0 + (kv_end - kv_lo + share - 1) // share).to(tl.int32),
                     mask=row_ok)
        kv_lo += tl.program_id(2) * share
        if kv_lo >= kv_end:  # a split past this tile's keys
            return
        kv_hi = tl.minimum(kv_lo + share, kv_end)

    # 3. A tile of keys at a time: look up each key's physical block in the sequence's block
    #    table row, load K and V from it, fold the tile into the online softmax. Columns past
    #    kv_end are clamped onto the last key (so every read stays inside the blocks the tile
    #    sees) and masked out, as are the keys before a row's first.
    table_row = block_tables_ptr + seq * stride_bt
    col_offs = kv_head * stride_ch + dims  # [1, D] contiguous within a slot
    # tl.full, not tl.zeros: a builtin, where tl.zeros is a @jit helper, and the interpreter
    # re-patches the language on every call of one.
    m_i = tl.full([BLOCK_Q * HEADS_PAD, 1], NEG_BIG, tl.float32)  # running max (base 2)
    l_i = tl.full([BLOCK_Q * HEADS_PAD, 1], 0.0, tl.float32)  # running sum
    acc = tl.full([BLOCK_Q * HEADS_PAD, HEAD_PAD], 0.0, tl.float32)  # [M, D]
    tile = tl.arange(0, TILE_N).to(tl.int64)
    for start in range(kv_lo, kv_hi, TILE_N):
        cols = start + tile  # [N]
        pos = tl.minimum(cols, kv_end - 1)  # [N] position in the sequence
        physical = tl.load(table_row + pos // BLOCK_SIZE).to(tl.int64)  # [N]
        offs = (physical * stride_cb + (pos % BLOCK_SIZE) * stride_cs)[:, None] + col_offs
        k = tl.load(key_cache_ptr + offs, mask=col_ok, other=0.0).to(DOT_DTYPE)  # [N, D]
        v = tl.load(value_cache_ptr + offs, mask=col_ok, other=0.0).to(DOT_DTYPE)
        visible = cols[None, :] <= last_key  # [M, N]
        if LOCAL:
            visible = visible & (cols[None, :] >= first_key)
        m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, qk_scale, PRECISION)

    # 4. The output: each row's where its query came from, or a split's unnormalised state.
    if SPLIT:
        part = (tl.program_id(2) * num_tokens + token) * NUM_HEADS + head  # [M, 1]
        tl.store(partial_m_ptr + part, m_i, mask=row_ok)
        tl.store(partial_l_ptr + part, l_i, mask=row_ok)
        tl.store(partial_out_ptr + part * HEAD_DIM + dims, acc, mask=q_mask)
    else:
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


# -- the wrapper -----------------------------------------------------------------------------
@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_call(shapes: AttentionShapes, query: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, num_splits: int | None = None,
              whole_batch: bool | None = None) -> AttentionPlan:
    """The plan for a call on these tensors (kernels/attention_plan.py). whole_batch None
    chooses it for the interpreter, where each program and each op costs Python time; a GPU
    wants many small programs. The whole-batch layout reads the block tables (a host sync).
    A local attention layer's rows do not all see a shared prefix (its blocks leave the window),
    so the whole-batch layout then lays out every sequence's keys on their own."""
    compiled = query.is_cuda
    if whole_batch is None:
        whole_batch = not compiled and not num_splits
    shared = (shared_prefix_len(block_tables, seq_lens, shapes.block_size)
              if whole_batch and not shapes.local else 0)
    return plan_attention(shapes, query.dtype, compiled,
                          _sm_count(query.device) if compiled else 0, whole_batch, num_splits,
                          shared)


def prepare_launch(plan: AttentionPlan, shapes: AttentionShapes, query: torch.Tensor,
                   key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor,
                   query_start_loc: torch.Tensor) -> Launch:
    """The kernel calls of one paged-attention call on inputs `check_paged_inputs` accepted.

    Reads nothing back from the device on the per-sequence layout (a CUDA graph can capture
    it); the whole-batch layout is built with torch ops on the host's side of the interpreter.
    """
    if plan.whole_batch:
        return whole_batch_launch(plan, shapes, query, key_cache, value_cache, block_tables,
                                  seq_lens, query_start_loc)
    query = query.contiguous()  # out shares its offsets
    out = torch.empty_like(query)  # [num_tokens, num_heads, head_dim]
    if shapes.max_query_len == 0:
        return Launch(out, ())
    split = plan.num_splits > 1
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
        out, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        *partials, shapes.scale * LOG2E, *shapes.limits,
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        block_tables.stride(0), shapes.num_seqs, shapes.num_tokens, plan.num_splits,
    ), dict(NUM_HEADS=shapes.num_heads, GROUP=shapes.num_heads // shapes.num_kv_heads,
            HEADS_PAD=plan.heads_pad, BLOCK_Q=plan.block_q, HEAD_DIM=shapes.head_dim,
            HEAD_PAD=plan.head_pad, BLOCK_SIZE=shapes.block_size, TILE_N=plan.tile_n,
            MIN_SPLIT_TILES=plan.min_split_tiles, ONE_TILE_PER_SEQ=plan.one_tile_per_seq,
            SPLIT=split, LOCAL=shapes.local, DOT_DTYPE=dot_dtype(query.dtype, plan.dot_f32),
            PRECISION=plan.precision, num_warps=plan.num_warps, num_stages=plan.num_stages))]
    if split:
        calls.append(KernelCall(_merge_splits_kernel, (shapes.num_tokens, shapes.num_heads, 1),
                                (out, *partials, shapes.num_tokens),
                                dict(NUM_HEADS=shapes.num_heads, HEAD_DIM=shapes.head_dim,
                                     HEAD_PAD=plan.head_pad, num_warps=1)))  # 16-byte loads
    return Launch(out, tuple(calls))


def launch_paged_attention(shapes: AttentionShapes, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           num_splits: int | None = None,
                           whole_batch: bool | None = None) -> torch.Tensor:
    """Launch the kernel on inputs `check_paged_inputs` accepted (benchmarks time this alone).

    num_splits: how many programs share one tile's context (flash-decoding); None chooses.
    whole_batch: one program per tile of the batch's (token, query head) rows, all sequences
    and heads at once (kernels/whole_batch.py), instead of one per (tile of a sequence's new
    tokens, KV head); None chooses (see plan_call).
    """
    plan = plan_call(shapes, query, block_tables, seq_lens, num_splits, whole_batch)
    return prepare_launch(plan, shapes, query, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc).run()


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, scale: float | None = None,
                    sliding_window: int | None = None,
                    attention_chunk_size: int | None = None) -> torch.Tensor:
    """Causal attention of the new tokens over their sequences' paged K/V.

    query [num_tokens, num_heads, head_dim]; key_cache, value_cache
    [num_blocks, block_size, num_kv_heads, head_dim]; block_tables int32 [num_seqs, max_blocks];
    seq_lens int32 [num_seqs] (context including the new tokens); query_start_loc int32
    [num_seqs + 1]. Returns [num_tokens, num_heads, head_dim] in query's dtype.
    sliding_window, attention_chunk_size: a local attention layer's limit (at most one), as
    vLLM 0.33 applies it (kernels/paged_inputs.py); the table entries before a sequence's first
    visible block are never read and may hold anything (vLLM's null block).
    """
    shapes = check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens,
                                query_start_loc, scale, sliding_window=sliding_window,
                                attention_chunk_size=attention_chunk_size)
    return launch_paged_attention(shapes, query, key_cache, value_cache, block_tables, seq_lens,
                                  query_start_loc)
