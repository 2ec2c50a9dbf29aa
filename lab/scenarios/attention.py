"""Attention over blocks: what the kernel reads for one sequence, and why placement is invisible.

`replay_attention(params, seed, request, placement)` runs the allocator walk to its end (all
requests decoded, blocks interleaved in the pool), then relocates the chosen request's blocks
`placement` times (real copies, see lab/relocate.py). For the request's newest token it returns
the kernel's output against dense attention, the output's change since placement 0 (zero: the
block table hides where blocks live), and the per-block online-softmax bookkeeping of one head.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kernels.reference import AttentionCheck, SoftmaxStep, online_softmax_steps
from lab.memory.block_table import blocks_for
from lab.memory.kernel_check import check_kernel
from lab.memory.relocate import relocate
from lab.memory.snapshot import Snapshot
from lab.scenarios.block_tables import (
    WalkParams,
    blocks_required,
    last_step,
    run_walk,
    synthetic_kv,
    walk_requests,
)

MAX_PLACEMENTS = 20


@dataclass(frozen=True)
class AttentionFrame:
    request: str
    seq_id: int
    seq_names: dict[int, str]
    num_tokens: int
    block_table: tuple[int, ...]  # logical block -> physical block, after the relocations
    first_table: tuple[int, ...]  # the same at placement 0
    snapshot: Snapshot
    check: AttentionCheck  # kernel vs dense for the request's newest token
    output_shift: float  # max |output now - output at placement 0|
    softmax: tuple[SoftmaxStep, ...]  # one head, block by block in logical order
    head: int
    trace_json: str


def replay_attention(params: WalkParams, seed: int, request: str, placement: int,
                     head: int = 0) -> AttentionFrame:
    if not 0 <= placement <= MAX_PLACEMENTS:
        raise ValueError(f"placement must be in [0, {MAX_PLACEMENTS}], got {placement}")
    if not 0 <= head < params.num_kv_heads:
        raise ValueError(f"head must be in [0, {params.num_kv_heads}), got {head}")
    manager, names = run_walk(params, seed, last_step(params, seed))
    by_name = {name: seq_id for seq_id, name in names.items()}
    if request not in by_name:
        raise ValueError(f"no request {request!r}: choose one of {sorted(by_name)}")
    seq_id = by_name[request]
    seq = manager.sequences[seq_id]
    kv = synthetic_kv(params, seed)
    query = kv.queries([seq.tokens[-1]])  # [1, num_heads, head_dim]
    first_table = tuple(seq.block_table)
    first = check_kernel(manager, [seq_id], query)
    rng = random.Random(f"{seed}/{request}")
    for _ in range(placement):
        manager.events.next_step()
        relocate(manager, seq_id, rng)
    check = check_kernel(manager, [seq_id], query) if placement else first
    shift = (check.output - first.output).abs().max().item()
    keys, values = manager.read_kv(seq_id)  # [len, num_kv_heads, head_dim] via the block table
    steps = online_softmax_steps(query[0, head], keys[:, head], values[:, head],
                                 params.block_size)
    trace = manager.events.to_json(page="attention", seed=seed, request=request,
                                   placement=placement)
    return AttentionFrame(request, seq_id, names, len(seq), tuple(seq.block_table), first_table,
                          manager.snapshot(), check, shift, tuple(steps), head, trace)


def can_relocate(params: WalkParams, seed: int, request: str) -> bool:
    """Whether the free blocks left at the end of the walk can hold a copy of this request's
    blocks (a relocation frees as many as it takes, so one possible means all are)."""
    free = params.num_blocks - blocks_required(params, seed)
    by_name = {r.name: r for r in walk_requests(params, seed)}
    return blocks_for(by_name[request].total_len, params.block_size) <= free
