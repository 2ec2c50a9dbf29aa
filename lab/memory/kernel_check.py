"""The kernel check on the real pool: the Triton kernel and dense attention over the same blocks.

Every page that shows attention runs `check_kernel` for the sequences on screen: their newest
tokens attend over each sequence's K/V through its block table, once with the Triton
`paged_attention` kernel and once with the float64 dense reference, and `kernels.reference.compare`
judges the difference.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from kernels.paged_attention import paged_attention
from kernels.reference import AttentionCheck, compare, dense_attention
from lab.memory.cache_manager import KVCacheManager


def check_kernel(manager: KVCacheManager, seq_ids: Sequence[int], queries: torch.Tensor,
                 query_lens: Sequence[int] | None = None,
                 context_lens: Sequence[int] | None = None) -> AttentionCheck:
    """Kernel vs reference for one step: sequence i's last query_lens[i] tokens of its first
    context_lens[i] attend (default: one new token each, over the whole sequence).

    queries: [sum(query_lens), num_heads, head_dim], the sequences' new tokens laid end to end.
    A sequence may hold more tokens than its context (a prefill chunk of a longer prompt); the
    K/V of the context must be in the pool.
    """
    seqs = [manager.sequences[i] for i in seq_ids]
    query_lens = [1] * len(seqs) if query_lens is None else list(query_lens)
    context_lens = [len(s) for s in seqs] if context_lens is None else list(context_lens)
    for seq, n in zip(seqs, context_lens):
        if seq.num_written < n:
            raise ValueError(f"sequence {seq.seq_id}: K/V of {n - seq.num_written} "
                             "token(s) not written yet")
    device = manager.pool.device
    tables = manager.block_table_tensor(seq_ids)  # [num_seqs, max_blocks]
    seq_lens = torch.tensor(context_lens, dtype=torch.int32, device=device)  # [num_seqs]
    starts = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32,
                          device=device)  # [num_seqs + 1]
    query = queries.to(device, manager.config.dtype)  # [num_tokens, num_heads, head_dim]
    args = (query, manager.pool.key_caches[0], manager.pool.value_caches[0], tables, seq_lens,
            starts)
    return compare(paged_attention(*args), dense_attention(*args), len(seqs))
