"""The whole-batch program layout of the paged-attention kernel (the interpreter's), built on
the host with a few torch ops: which rows a program takes, which columns (KV head, key) it walks,
and where each column's key is found (its block-table entry, its slot). The kernel itself still
reads every key's physical block from the block table; see kernels/paged_attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
import triton

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)


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
    through sequence 0's table row; then each sequence's other keys. A row (sequence s, position
    p, query head h) sees, among KV head h // group's columns, s's other keys up to p and the
    shared keys up to p.
    """

    query_rows: torch.Tensor  # [rows, HEAD_PAD] row (t, h) is query[t, h], zero-padded
    first_key: torch.Tensor  # [rows] int64: the column of the row's sequence's first other key
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
        """The fields in the order the kernel takes them (query_ptr, first_key_ptr, ...)."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @classmethod
    def num_args(cls) -> int:
        return len(fields(cls))


def whole_batch_layout(query: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor, num_kv_heads: int, block_size: int,
                       slot_stride: int, head_stride: int, rows_per_program: int, head_pad: int,
                       tile_n: int, shared: int = 0) -> WholeBatchLayout:
    """Lay out a batch for the whole-batch programs (see WholeBatchLayout); `shared` keys of
    every sequence are laid out once (at most `shared_prefix_len`)."""
    device = query.device
    num_tokens, num_heads, head_dim = query.shape
    group = num_heads // num_kv_heads
    seq_lens = seq_lens.long()
    seq_ids = torch.arange(len(seq_lens), device=device)
    skipped = shared * (seq_ids > 0)  # [num_seqs] positions sequence 0 lays out for it
    counts = seq_lens - skipped  # [num_seqs] columns each sequence adds, per KV head
    key_start = torch.cumsum(counts, 0) - counts  # [num_seqs] its first column
    key_seq = torch.repeat_interleave(seq_ids, counts)  # [keys]
    num_keys = len(key_seq)
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()  # [num_seqs]
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
    first_key, last_key = position_0 + shared, position_0 + row_pos  # [rows]
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
