"""Attention over blocks: what the kernel reads for one sequence, and why placement is invisible.

The story plays the allocator walk (lab/scenarios/block_tables.py) on the real pool until the
chosen request has all its tokens (its blocks interleaved with the others'), then relocates its
blocks `placement` times (real copies, lab/memory/relocate.py). Step k shows the kernel having read
the first k of the request's logical blocks; every step carries the kernel's output for the
request's newest token against dense attention, the output's change since placement 0 (zero:
the block table hides where blocks live), and the per-block online-softmax bookkeeping of one
head. Unlike the other stories its frames need the K/V values, so it always plays on the pool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kernels.reference import AttentionCheck, SoftmaxStep, online_softmax_steps
from lab.memory.block_table import blocks_for
from lab.memory.kernel_check import check_kernel
from lab.memory.relocate import relocate
from lab.memory.snapshot import Snapshot
from lab.scenarios.block_tables import BlockTablesStory, WalkParams, last_decode, request_name
from lab.scenarios.story import Story

MAX_PLACEMENTS = 20


@dataclass(frozen=True)
class AttentionConfig:
    walk: WalkParams = field(default_factory=lambda: WalkParams(output_len=20))
    request: str = "A"  # whose attention to follow
    placement: int = 0  # relocations of its blocks so far
    head: int = 0  # the KV head whose bookkeeping is shown

    def __post_init__(self) -> None:
        names = [request_name(i) for i in range(self.walk.num_requests)]
        if self.request not in names:
            raise ValueError(f"no request {self.request!r}: choose one of {', '.join(names)}")
        if not 0 <= self.placement <= MAX_PLACEMENTS:
            raise ValueError(f"placement must be in [0, {MAX_PLACEMENTS}], got {self.placement}")
        if not 0 <= self.head < self.walk.pool.num_kv_heads:
            raise ValueError(f"head must be in [0, {self.walk.pool.num_kv_heads}), "
                             f"got {self.head}")


@dataclass(frozen=True)
class AttentionFrame:
    step: int  # logical blocks the kernel has read so far
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

    @property
    def read(self) -> tuple[int, ...]:
        """Physical blocks the kernel has read so far, in logical order."""
        return self.block_table[:self.step]


class AttentionStepper:
    def __init__(self, cfg: AttentionConfig, seed: int) -> None:
        story = BlockTablesStory(cfg.walk, seed)
        walk = story.stepper(store_kv=True)
        index = next(r.req_id for r in story.requests if request_name(r.req_id) == cfg.request)
        while walk.step < last_decode(story.requests[index]):  # until it has all its tokens
            walk.advance()
        manager = walk.manager
        seq_id = {name: s for s, name in walk.names.items()}[cfg.request]
        seq = manager.sequences[seq_id]
        query = walk.kv.queries([seq.tokens[-1]])  # [1, num_heads, head_dim]
        first_table = tuple(seq.block_table)
        first = check_kernel(manager, [seq_id], query)
        rng = random.Random(f"{seed}/{cfg.request}")
        for _ in range(cfg.placement):
            manager.events.next_step()
            relocate(manager, seq_id, rng)
        check = check_kernel(manager, [seq_id], query) if cfg.placement else first
        keys, values = manager.read_kv(seq_id)  # [len, num_kv_heads, head_dim] via the table
        softmax = online_softmax_steps(query[0, cfg.head], keys[:, cfg.head],
                                       values[:, cfg.head], cfg.walk.pool.block_size)
        self.manager = manager
        self.base = AttentionFrame(
            0, cfg.request, seq_id, dict(walk.names), len(seq), tuple(seq.block_table),
            first_table, manager.snapshot(), check,
            (check.output - first.output).abs().max().item(), tuple(softmax))
        self.step = -1

    @property
    def done(self) -> bool:
        return self.step >= len(self.base.block_table)

    def advance(self) -> AttentionFrame:
        self.step += 1
        return self.frame(self.step)

    def frame(self, step: int) -> AttentionFrame:
        b = self.base
        return AttentionFrame(step, b.request, b.seq_id, b.seq_names, b.num_tokens,
                              b.block_table, b.first_table, b.snapshot, b.check,
                              b.output_shift, b.softmax)

    def check_attention(self) -> AttentionCheck:
        return self.base.check

    def events(self) -> dict[str, list[dict]]:
        return {"paged": self.manager.events.as_dicts()}


@dataclass(frozen=True)
class AttentionStory(Story[AttentionFrame]):
    page = "attention"
    config: AttentionConfig
    seed: int

    def stepper(self, store_kv: bool = True) -> AttentionStepper:
        return AttentionStepper(self.config, self.seed)

    def can_relocate(self) -> bool:
        """Whether the free blocks left at the end of the walk can hold a copy of this request's
        blocks (a relocation frees as many as it takes, so one possible means all are)."""
        walk = BlockTablesStory(self.config.walk, self.seed)
        free = self.config.walk.pool.num_blocks - walk.blocks_required()
        request = next(r for r in walk.requests if request_name(r.req_id) == self.config.request)
        return blocks_for(request.total_len, self.config.walk.pool.block_size) <= free

    def caption(self, frame: AttentionFrame) -> list[str]:
        if frame.step == 0:
            return [f"The kernel is about to read **{frame.request}**'s "
                    f"{len(frame.block_table)} blocks in logical order, through its block "
                    "table."]
        s = frame.softmax[frame.step - 1]
        physical = frame.block_table[frame.step - 1]
        line = (f"The kernel reads logical block **L{frame.step - 1}** from physical block "
                f"**{physical}**: running max m = {s.running_max:.4f}, running sum "
                f"ℓ = {s.running_sum:.4f}.")
        if frame.step > 1 and s.running_max > frame.softmax[frame.step - 2].running_max:
            line += " A larger score arrived, so what was summed so far is rescaled."
        return [line]


def event_steps(frames: tuple[AttentionFrame, ...]) -> list[tuple[int, str]]:
    """The read's notable steps, (step, short label), for "Next event": a block whose larger
    score rescales what was summed so far, and the last block read."""
    events = [(f.step, f"rescale at L{f.step - 1}") for f in frames
              if f.step > 1 and f.softmax[f.step - 1].running_max
              > f.softmax[f.step - 2].running_max]
    if len(frames) > 1:
        events.append((frames[-1].step, "last block read"))
    return events
