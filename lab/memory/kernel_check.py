"""The kernel check on the real pool: the Triton kernel and dense attention over the same blocks.

Every page that shows attention runs this check for the sequences on screen: their newest
tokens attend over each sequence's K/V through its block table, once with the Triton
`paged_attention` kernel and once with the float64 dense reference, and `kernels.reference.compare`
judges the difference. `check_kernel` reads the tables of a `KVCacheManager`; `check_tables`
takes any block tables over one layer of a pool (a KV cache group's, whose entries before a
sliding window hold the null block, -1), with that layer's sliding window; `check_expected`
judges the kernel over a cache against the K/V each sequence should hold, so that a wrong
copy or a lost write shows too (the contiguous server's moves).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from kernels.paged_attention import paged_attention
from kernels.reference import AttentionCheck, compare, dense_attention
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import KVPool


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
    context_lens = [len(s) for s in seqs] if context_lens is None else list(context_lens)
    for seq, n in zip(seqs, context_lens):
        if seq.num_written < n:
            raise ValueError(f"sequence {seq.seq_id}: K/V of {n - seq.num_written} "
                             "token(s) not written yet")
    return check_tables(manager.pool, manager.block_table_tensor(seq_ids), context_lens,
                        queries, query_lens)


def check_tables(pool: KVPool, tables: torch.Tensor | Sequence[Sequence[int]],
                 context_lens: Sequence[int], queries: torch.Tensor,
                 query_lens: Sequence[int] | None = None, *, layer: int = 0,
                 sliding_window: int | None = None) -> AttentionCheck:
    """Kernel vs reference over `layer` of the pool, sequence i's block table tables[i]
    (a tensor, int32 [num_seqs, max_blocks], or lists, padded here), its first context_lens[i]
    tokens, its last query_lens[i] of them as queries (default: one each). With a
    sliding_window W a query sees its last W positions, itself included; the table entries
    before the first block any query sees are never read (the null block may sit there)."""
    query_lens = [1] * len(context_lens) if query_lens is None else list(query_lens)
    device = pool.device
    tables = tables.to(device) if isinstance(tables, torch.Tensor) else _padded(tables, device)
    seq_lens = torch.tensor(list(context_lens), dtype=torch.int32, device=device)  # [num_seqs]
    starts = torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32,
                          device=device)  # [num_seqs + 1]
    query = queries.to(device, pool.config.dtype)  # [num_tokens, num_heads, head_dim]
    args = (query, pool.key_caches[layer], pool.value_caches[layer], tables, seq_lens, starts)
    limits = {} if sliding_window is None else {"sliding_window": sliding_window}
    return compare(paged_attention(*args, **limits), dense_attention(*args, **limits),
                   len(context_lens))


def check_expected(key_cache: torch.Tensor, value_cache: torch.Tensor,
                   tables: Sequence[Sequence[int]], queries: torch.Tensor,
                   expected: list[tuple[torch.Tensor, torch.Tensor]]) -> AttentionCheck:
    """The Triton kernel over a cache against float64 dense attention over the K/V each
    sequence should hold (`expected`, each [n, num_kv_heads, head_dim]): a wrong copy, a wrong
    block table or a lost write shows as an error. Sequence i's query (queries[i],
    [num_heads, head_dim]) is its newest token, attending over its n positions through
    tables[i] (block ids of key_cache [num_blocks, block_size, kv_heads, head_dim])."""
    device = key_cache.device
    lens = [k.shape[0] for k, _ in expected]
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)  # [num_seqs]
    starts = torch.arange(len(lens) + 1, dtype=torch.int32, device=device)  # one query each
    query = queries.to(device, key_cache.dtype)  # [num_seqs, num_heads, head_dim]
    out = paged_attention(query, key_cache, value_cache, _padded(tables, device), seq_lens,
                          starts)
    # The reference's cache: the expected K/V end to end, one slot a block.
    offsets = list(itertools.accumulate(lens, initial=0))
    ref_tables = [list(range(a, b)) for a, b in zip(offsets, offsets[1:])]
    keys = torch.cat([k for k, _ in expected])[:, None].to(device, key_cache.dtype)
    values = torch.cat([v for _, v in expected])[:, None].to(device, key_cache.dtype)
    ref = dense_attention(query, keys, values, _padded(ref_tables, device), seq_lens, starts)
    return compare(out, ref, len(lens))


def _padded(rows: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """Block tables of unequal lengths as one tensor, padded with block 0 (never read: a
    sequence's length stops the kernel first)."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.int32,
                        device=device).reshape(len(rows), width)  # [num_seqs, width]


def merge_checks(checks: list[AttentionCheck]) -> AttentionCheck | None:
    """Several checks judged as one (the same tolerance over every output)."""
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]
    return compare(torch.cat([c.output for c in checks]),
                   torch.cat([c.reference for c in checks]), sum(c.num_seqs for c in checks))
