"""The whole-batch layout of the paged-attention kernel: the interpreter's, where each program
and each op costs Python time (kernels/paged_attention.py is the GPU's, and the one to read
first; the arithmetic is the same, kernels/online_softmax.py).

One program takes a tile of the batch's (token, query head) rows, from any sequences. Its
columns are (KV head, key) pairs: the batch's contexts laid end to end, once per KV head. The
wrapper lays out the rows and columns with a few torch ops (each much cheaper than an
interpreted op), saying for each column which block-table entry holds its key's block (its
sequence's row, its logical block) and where the key's slot and KV head sit; the kernel still
reads the physical block from the table. A row sees only its own sequence's keys, in its own KV
head's columns. Keys that every sequence reads from the same physical blocks (forks of one
prompt) are laid out once. A decode step is then one program, not sequences x KV heads of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels.attention_plan import AttentionPlan
from kernels.launch import KernelCall, Launch
from kernels.online_softmax import LOG2E, NEG_BIG, attend_tile, dot_dtype
from kernels.paged_inputs import NO_LIMIT, AttentionShapes, first_visible_key


@triton.jit
def _whole_batch_kernel(
    out_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr,
    query_rows_ptr, first_key_ptr, last_key_ptr, shared_first_ptr, shared_last_ptr,
    key_entry_ptr, key_slot_ptr, program_lo_ptr, program_end_ptr,  # the WholeBatchLayout
    qk_scale,  # softmax scale * log2(e): the kernel works in base 2
    stride_cb: tl.int64,  # of the caches' blocks
    BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    TILE_N: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    SHARED_PREFIX: tl.constexpr,  # keys every sequence shares are laid out once
):
    # The program's rows: BLOCK_Q consecutive rows of the layout's, each [1, HEAD_PAD] wide.
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_Q + tl.arange(0, BLOCK_Q)[:, None]  # [M, 1]
    dims = tl.arange(0, HEAD_PAD)[None, :]  # [1, D]
    q_offs = rows * HEAD_PAD + dims  # [M, D] the layout's query rows, also out's
    q = tl.load(query_rows_ptr + q_offs).to(DOT_DTYPE)  # [M, D]
    # A row sees, in its own KV head's columns, its sequence's keys up to its own, and the keys
    # every sequence shares up to its own position.
    first_key = tl.load(first_key_ptr + rows)  # [M, 1]
    last_key = tl.load(last_key_ptr + rows)  # [M, 1]
    if SHARED_PREFIX:
        shared_first = tl.load(shared_first_ptr + rows)  # [M, 1]
        shared_last = tl.load(shared_last_ptr + rows)  # [M, 1]
    # K/V columns past head_dim read their KV head's first value, so the loads need no mask
    # (q is zero there, those outputs are never stored). A GPU would see non-contiguous offsets
    # and load 2 bytes at a time: this layout is for the interpreter.
    col_offs = tl.where(dims < HEAD_DIM, dims, 0)  # [1, D] within the KV head
    m_i = tl.full([BLOCK_Q, 1], NEG_BIG, tl.float32)  # running max (base 2)
    l_i = tl.full([BLOCK_Q, 1], 0.0, tl.float32)  # running sum
    acc = tl.full([BLOCK_Q, HEAD_PAD], 0.0, tl.float32)  # [M, D]
    tile = tl.arange(0, TILE_N).to(tl.int64)
    # Columns past the program's last read the last key again (the layout pads a tile of
    # them) and are masked out, so every read stays inside the table and cache.
    for start in range(tl.load(program_lo_ptr + pid), tl.load(program_end_ptr + pid), TILE_N):
        cols = start + tile  # [N]
        physical = tl.load(block_tables_ptr + tl.load(key_entry_ptr + cols)).to(tl.int64)
        offs = (physical * stride_cb + tl.load(key_slot_ptr + cols))[:, None] + col_offs
        k = tl.load(key_cache_ptr + offs).to(DOT_DTYPE)  # [N, D]
        v = tl.load(value_cache_ptr + offs).to(DOT_DTYPE)
        across = cols[None, :]  # [1, N]
        visible = (across >= first_key) & (across <= last_key)  # [M, N]
        if SHARED_PREFIX:
            visible = visible | ((across >= shared_first) & (across <= shared_last))
        m_i, l_i, acc = attend_tile(q, k, v, visible, m_i, l_i, acc, qk_scale, PRECISION)
    tl.store(out_ptr + q_offs, acc / l_i)  # every row has a key (padding repeats the last)


def shared_prefix_len(block_tables: torch.Tensor, seq_lens: torch.Tensor,
                      block_size: int) -> int:
    """Keys every sequence of the batch reads from the same physical blocks: the leading
    block-table entries equal in every row, in whole blocks every sequence fills (forks of one
    prompt share its full blocks). 0 for a single sequence (nothing to share)."""
    if len(seq_lens) < 2:
        return 0
    full = int(seq_lens.min()) // block_size  # blocks every sequence fills
    same = (block_tables[:, :full] == block_tables[:1, :full]).all(0)  # [full]
    return int(same.long().cumprod(0).sum()) * block_size


@dataclass(frozen=True)
class WholeBatchLayout:
    """The whole-batch program layout, built by the wrapper with a few torch ops.

    Rows are the batch's (token, query head) pairs, token-major, padded to whole programs with
    copies of the last row. Columns are (KV head, key) pairs: the batch's keys laid end to end
    once per KV head, one KV head after another, padded by a tile. Within a KV head's columns,
    keys that every sequence reads from the same blocks (`shared_prefix_len`) come first, once,
    through sequence 0's table row; then each sequence's other keys, those its new tokens can
    see. A row (sequence s, position p, query head h) sees, among KV head h // group's columns,
    s's other keys up to p (from its window's or chunk's first, on a local attention layer) and
    the shared keys up to p.
    """

    query_rows: torch.Tensor  # [rows, HEAD_PAD] row (t, h) is query[t, h], zero-padded
    first_key: torch.Tensor  # [rows] int64: the column of the first of its sequence's other
    #                          keys the row sees
    last_key: torch.Tensor  # [rows] int64: the row's own column (none other if < first_key)
    shared_first: torch.Tensor  # [rows] int64: the first shared column of the row's KV head
    shared_last: torch.Tensor  # [rows] int64: the last one it sees (none if < shared_first)
    key_entry: torch.Tensor  # [columns + tile] int64: offset of the key's block-table entry
    #                          (its sequence's row * stride + its logical block); the tile of
    #                          padding repeats the last key
    key_slot_offs: torch.Tensor  # [columns + tile] int64: offset of the key's slot within its
    #                              block plus its KV head's within the slot
    program_lo: torch.Tensor  # [programs] int64: the first column a program walks
    program_end: torch.Tensor  # [programs] int64: one past its last

    def kernel_args(self) -> tuple[torch.Tensor, ...]:
        """The fields in the order the kernel takes them (query_rows_ptr, first_key_ptr, ...)."""
        return tuple(getattr(self, f.name) for f in fields(self))


def whole_batch_layout(query: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor, num_kv_heads: int, block_size: int,
                       slot_stride: int, head_stride: int, rows_per_program: int, head_pad: int,
                       tile_n: int, shared: int = 0, sliding_window: int = NO_LIMIT,
                       chunk: int = NO_LIMIT) -> WholeBatchLayout:
    """Lay out a batch for the whole-batch programs (see WholeBatchLayout); `shared` keys of
    every sequence are laid out once (at most `shared_prefix_len`). With a sliding window or
    chunk (kernels/paged_inputs.py), a sequence's keys before the first one its first new token
    sees are not laid out (their table entries may be null), and a row sees its own window."""
    device = query.device
    num_tokens, num_heads, head_dim = query.shape
    group = num_heads // num_kv_heads
    seq_lens = seq_lens.long()
    seq_ids = torch.arange(len(seq_lens), device=device)
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()  # [num_seqs]
    # [num_seqs] leading positions a sequence does not lay out itself: the shared ones (laid
    # out by sequence 0), or those before its first new token's window (nobody sees them)
    skipped = torch.maximum(shared * (seq_ids > 0),
                            first_visible_key(seq_lens - query_lens, sliding_window, chunk))
    counts = seq_lens - skipped  # [num_seqs] columns each sequence adds, per KV head
    key_start = torch.cumsum(counts, 0) - counts  # [num_seqs] its first column
    key_seq = torch.repeat_interleave(seq_ids, counts)  # [keys]
    num_keys = len(key_seq)
    token_seq = torch.repeat_interleave(seq_ids, query_lens)  # [num_tokens]
    # A token's position: its sequence's length, less the new tokens after it (itself counted).
    after = query_start_loc[1:].long()[token_seq] - torch.arange(num_tokens, device=device)
    position = seq_lens[token_seq] - after  # [num_tokens]
    num_rows = num_tokens * num_heads
    padded_rows = triton.cdiv(num_rows, rows_per_program) * rows_per_program
    row = torch.arange(padded_rows, device=device)
    row_token = (row // num_heads).clamp(max=num_tokens - 1)
    row_seq, row_pos = token_seq[row_token], position[row_token]  # [rows]
    segment = (row % num_heads) // group * num_keys  # [rows] first column of its KV head
    position_0 = segment + key_start[row_seq] - skipped[row_seq]  # [rows] where position 0 sits
    row_first = torch.maximum(first_visible_key(row_pos, sliding_window, chunk),
                              torch.tensor(shared, device=device))  # [rows] first own key
    first_key, last_key = position_0 + row_first, position_0 + row_pos  # [rows]
    shared_last = segment + row_pos.clamp(max=shared - 1)  # [rows] (segment - 1 if no sharing)
    query_rows = F.pad(query.reshape(num_rows, head_dim),
                       (0, head_pad - head_dim, 0, padded_rows - num_rows))  # [rows, HEAD_PAD]
    key_pos = torch.arange(num_keys, device=device) - key_start[key_seq] + skipped[key_seq]
    entry = key_seq * block_tables.stride(0) + key_pos // block_size  # [keys]
    slot = key_pos % block_size * slot_stride  # [keys]
    heads = torch.arange(num_kv_heads, device=device)[:, None] * head_stride  # [KV, 1]
    by_program = (-1, rows_per_program)
    lo = (segment if shared else first_key).view(by_program).amin(1)  # [programs]
    end = torch.maximum(last_key, shared_last).view(by_program).amax(1) + 1  # [programs]
    return WholeBatchLayout(query_rows.contiguous(), first_key, last_key, segment, shared_last,
                            _pad_with_last(entry.repeat(num_kv_heads), tile_n),
                            _pad_with_last((slot + heads).reshape(-1), tile_n), lo, end)


def _pad_with_last(columns: torch.Tensor, n: int) -> torch.Tensor:
    """The last tile may reach a tile past the columns: it reads the last key's slot again.
    (Not key 0's, which a sequence of length 0 first in the batch does not have: its table
    entry is not checked and may point outside the cache.)"""
    return torch.cat([columns, columns[-1:].expand(n)])


def whole_batch_launch(plan: AttentionPlan, shapes: AttentionShapes, query: torch.Tensor,
                       key_cache: torch.Tensor, value_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor) -> Launch:
    """The whole-batch kernel call of one paged-attention call (a plan with whole_batch) on
    inputs `check_paged_inputs` accepted; its float32 rows are copied to the output."""
    out = torch.empty_like(query, memory_format=torch.contiguous_format)  # [T, H, D]
    if shapes.max_query_len == 0:
        return Launch(out, ())
    layout = whole_batch_layout(query, block_tables, seq_lens, query_start_loc,
                                shapes.num_kv_heads, shapes.block_size, key_cache.stride(1),
                                key_cache.stride(2), plan.block_q, plan.head_pad, plan.tile_n,
                                plan.shared, *shapes.limits)
    rows = torch.empty(layout.query_rows.shape, dtype=torch.float32,
                       device=query.device)  # [padded rows, HEAD_PAD]
    call = KernelCall(_whole_batch_kernel, plan.grid, (
        rows, key_cache, value_cache, block_tables, *layout.kernel_args(),
        shapes.scale * LOG2E, key_cache.stride(0),
    ), dict(BLOCK_Q=plan.block_q, HEAD_DIM=shapes.head_dim, HEAD_PAD=plan.head_pad,
            TILE_N=plan.tile_n, DOT_DTYPE=dot_dtype(query.dtype, plan.dot_f32),
            PRECISION=plan.precision, SHARED_PREFIX=plan.shared > 0,
            num_warps=plan.num_warps, num_stages=plan.num_stages))
    return Launch(out, (call,), rows)
