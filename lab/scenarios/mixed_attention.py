"""Mixed attention, a gpt-oss-like model: two KV cache groups over one block pool, step by step.

gpt-oss alternates sliding-window layers (a window of 128 tokens) with full-attention layers;
vLLM 0.33 serves it with one KV cache group per kind over a single block pool (its hybrid KV
cache manager). Here the window is a few blocks (8 tokens over blocks of 4 by default), so a
learner sees it pass in a few steps. The KV pool has one layer per group, each with its own K/V.

Three requests share a system prompt: A arrives at step 1, B at step 3, C at the step A leaves.
Each arrival looks its prompt up in the prefix cache (each group on its own, the hit being what
every group can serve) and prefills the rest; then every request in the pool decodes one token
per step. Before each token gets its slot, the sliding-window group turns the blocks that left
the window into the null block and gives them back to the pool: its blocks per request level
off near window / block size + 1 while the full-attention group's keep growing. A request with
all its tokens leaves at the next step, and every block it holds goes back to the pool. Nothing
is scheduled: arrivals are fixed, and a pool too small for them is refused.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.hybrid_cache_manager import HybridKVCacheManager
from lab.memory.kernel_check import check_tables, merge_checks
from lab.memory.kv_cache_groups import NULL_BLOCK, FullAttention, SlidingWindow
from lab.memory.kv_pool import KVPool, PoolConfig
from lab.scenarios.mixed_frames import (
    Arrival,
    BlockView,
    GroupChange,
    MixedFrame,
    RequestView,
    caption,
    returned,
)
from lab.scenarios.story import LiveRun, Story
from lab.serving.synthetic_kv import VOCAB, SyntheticKV

GROUP_LABELS = ("full attention", "sliding window")
MAX_MODEL_LEN = 4096
MAX_BATCHED_TOKENS = 2048  # bounds the window group's admission cap; no step comes near it
OWN_LEN = {"A": 4, "B": 3, "C": 2}  # each request's own prompt tokens after the system prompt
OTHER_OUTPUT = 6  # B's and C's output tokens
B_ARRIVAL = 3


class PoolTooSmall(ValueError):
    """The requests need more blocks at once than the pool has (a message for the learner)."""


@dataclass(frozen=True)
class MixedParams:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(
        num_blocks=18, block_size=4, num_layers=len(GROUP_LABELS)))
    window: int = 8
    system_len: int = 16
    output_len: int = 10  # request A's

    def __post_init__(self) -> None:
        for name in ("window", "system_len", "output_len"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.pool.num_layers != len(GROUP_LABELS):
            raise ValueError(f"the pool needs one layer per KV cache group "
                             f"({len(GROUP_LABELS)}), got {self.pool.num_layers}")


@dataclass(frozen=True)
class Request:
    name: str
    tokens: tuple[int, ...]  # prompt, then output
    prompt_len: int
    arrival: int

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def last_decode(self) -> int:
        return self.arrival + self.output_len

    @property
    def leaves(self) -> int:
        return self.last_decode + 1


def mixed_requests(params: MixedParams, seed: int) -> tuple[Request, ...]:
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(params.system_len)]
    a_leaves = 1 + params.output_len + 1
    plan = (("A", params.output_len, 1), ("B", OTHER_OUTPUT, B_ARRIVAL),
            ("C", OTHER_OUTPUT, a_leaves))
    return tuple(Request(name, tuple(system + [rng.randrange(VOCAB)
                                               for _ in range(OWN_LEN[name] + output)]),
                         params.system_len + OWN_LEN[name], arrival)
                 for name, output, arrival in plan)


class MixedStepper:
    def __init__(self, params: MixedParams, seed: int, store_kv: bool = False,
                 group_checks: dict[int, tuple] | None = None) -> None:
        self.params = params
        self.requests = mixed_requests(params, seed)
        self.ids = {r.name: i for i, r in enumerate(self.requests)}
        pool = params.pool
        self.manager = HybridKVCacheManager(
            [FullAttention(), SlidingWindow(params.window)], pool.num_blocks, pool.block_size,
            MAX_BATCHED_TOKENS, MAX_MODEL_LEN)
        self.pool = KVPool(pool) if store_kv else None
        self.kv = SyntheticKV(pool, seed) if store_kv else None
        self.written: dict[str, int] = {}  # request in the pool -> tokens with K/V
        self.where: dict[int, tuple[int, int]] = {}  # block -> (group, first position) last held
        self.group_checks = group_checks if group_checks is not None else {}
        self.step = -1
        self.last_step = max(r.leaves for r in self.requests)

    @property
    def done(self) -> bool:
        return self.step >= self.last_step

    def advance(self) -> MixedFrame:
        self.step += 1
        m = self.manager
        m.events.step = self.step
        mark = len(m.events)
        decoded, changes, left, kept, arrivals = {}, {}, {}, {}, []
        for r in self.requests:
            if r.name not in self.written:
                continue
            if self.step == r.leaves:
                left[r.name] = tuple(b for t in m.block_tables(self.ids[r.name]) for b in t
                                     if b != NULL_BLOCK)
                m.free(self.ids[r.name])
                refs = m.blocks.ref_counts
                kept[r.name] = tuple(b for b in left[r.name] if refs[b])  # shared: still held
                del self.written[r.name]
            elif self.step <= r.last_decode:
                pos = r.prompt_len + self.step - r.arrival - 1
                changes[r.name] = self._allocate(r, pos, 1)
                decoded[r.name] = pos
        for r in self.requests:
            if r.arrival == self.step:
                arrivals.append(self._admit(r))
        m.check_invariants()
        events = m.events.since(mark)
        evicted = tuple((e.block_id, *self.where[e.block_id]) for e in events
                        if e.kind == "evict")
        views = tuple(RequestView(r.name, self.written[r.name],
                                  tuple(map(tuple, m.block_tables(self.ids[r.name]))))
                      for r in self.requests if r.name in self.written)
        for view in views:
            for g, table in enumerate(view.tables):
                for i, b in enumerate(table):
                    if b != NULL_BLOCK:
                        self.where[b] = (g, i * self.params.pool.block_size)
        return MixedFrame(self.step, self.params.pool.block_size, views, self._blocks(views),
                          decoded, tuple(arrivals), changes, left, evicted, m.num_free, kept)

    def _allocate(self, r: Request, start: int, num_new: int,
                  hit: tuple[list[int], ...] | None = None) -> tuple[GroupChange, ...]:
        req_id = self.ids[r.name]
        before = self.manager.block_tables(req_id)
        if self.manager.allocate_slots(req_id, list(r.tokens[:start + num_new]), start,
                                       num_new, hit) is None:
            raise PoolTooSmall(
                f"At step {self.step} request {r.name} needs more blocks than the "
                f"{self.manager.num_free} free of the pool's {self.params.pool.num_blocks}. "
                "Enlarge the pool, or shorten A's output or the system prompt.")
        self._write(r, start, start + num_new)
        after = self.manager.block_tables(req_id)
        return tuple(GroupChange(tuple(a[len(b):]),
                                 tuple((i, b[i]) for i in range(len(b))
                                       if b[i] != NULL_BLOCK and a[i] == NULL_BLOCK))
                     for b, a in zip(before, after))

    def _admit(self, r: Request) -> Arrival:
        prompt = list(r.tokens[:r.prompt_len])
        hit_tokens, hit = self.manager.find_prefix_hit(prompt)
        group_hits = self.manager.group_hits(prompt)
        refs = self.manager.blocks.ref_counts
        idle = tuple(b for blocks in hit for b in blocks if b != NULL_BLOCK and refs[b] == 0)
        changes = self._allocate(r, hit_tokens, r.prompt_len - hit_tokens, hit)
        changes = tuple(GroupChange(c.new[len(h):], c.nulled) for c, h in zip(changes, hit))
        return Arrival(r.name, r.prompt_len, self.params.system_len, hit_tokens, group_hits,
                       tuple(map(tuple, hit)), idle, changes)

    def _write(self, r: Request, start: int, end: int) -> None:
        """Store the K/V of positions [start, end) of r in each group's layer, at the slots of
        that group's block table (positions before a hit are in the pool already)."""
        self.written[r.name] = end
        if self.kv is None:
            return
        bs = self.params.pool.block_size
        keys, values = self.kv.keys_values(list(r.tokens[start:end]), start)  # [L, n, H, D]
        for g, table in enumerate(self.manager.block_tables(self.ids[r.name])):
            slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(start, end)],
                                 dtype=torch.int64, device=self.pool.device)  # [n]
            self.pool.write_layer(g, slots, keys[g].to(self.pool.device),
                                  values[g].to(self.pool.device))

    def _blocks(self, views: tuple[RequestView, ...]) -> tuple[BlockView, ...]:
        holders: dict[int, list[str]] = {}
        filled: dict[int, int] = {}
        bs = self.params.pool.block_size
        for view in views:
            for table in view.tables:
                for i, b in enumerate(table):
                    if b != NULL_BLOCK:
                        holders.setdefault(b, []).append(view.name)
                        filled[b] = max(filled.get(b, 0), min(bs, view.num_tokens - i * bs))
        pool = self.manager.blocks
        out = []
        for b in range(pool.num_blocks):
            state = "used" if pool.ref_counts[b] else "cached" if pool.block_hash[b] else "free"
            group, first = self.where.get(b, (None, None)) if state != "free" else (None, None)
            out.append(BlockView(b, state, group, first, tuple(holders.get(b, ())),
                                 filled.get(b, 0)))
        return tuple(out)

    def check_attention(self) -> AttentionCheck | None:
        """Each group's layer: the newest token of every request in the pool attends through
        that group's block tables, kernel vs dense attention with the group's mask."""
        if self.kv is None or not self.written:
            return None
        names = list(self.written)
        lens = [self.written[n] for n in names]
        newest = [self.requests[self.ids[n]].tokens[k - 1] for n, k in zip(names, lens)]
        queries = self.kv.queries(newest)  # [num_seqs, heads, D]
        checks = []
        for g, label in enumerate(GROUP_LABELS):
            window = self.params.window if g else None
            tables = [self.manager.block_tables(self.ids[n])[g] for n in names]
            checks.append((label, check_tables(self.pool, tables, lens, queries, layer=g,
                                               sliding_window=window)))
        self.group_checks[self.step] = tuple(checks)
        return merge_checks([c for _, c in checks if c is not None])

    def measured(self, step: int) -> tuple | None:
        """Each group's check at `step`: ((group label, AttentionCheck or None), ...), None
        before that step is checked (by any stepper of this live run)."""
        return self.group_checks.get(step)

    def events(self) -> dict[str, list[dict]]:
        return {"paged": self.manager.events.as_dicts()}


@dataclass(frozen=True)
class MixedAttentionStory(Story[MixedFrame]):
    page = "mixed_attention"
    config: MixedParams
    seed: int

    def stepper(self, store_kv: bool = False,
                group_checks: dict[int, tuple] | None = None) -> MixedStepper:
        return MixedStepper(self.config, self.seed, store_kv, group_checks)

    def live(self) -> LiveRun:
        """One store of per-group checks for every stepper of the run (a replay checks again)."""
        group_checks: dict[int, tuple] = {}
        return LiveRun(self, lambda: self.stepper(store_kv=True, group_checks=group_checks))

    @property
    def requests(self) -> tuple[Request, ...]:
        return mixed_requests(self.config, self.seed)

    def check_fits(self) -> None:
        """Raise PoolTooSmall, saying what to change, when the pool cannot hold the walk."""
        self.frames()

    def steady_window_blocks(self) -> int:
        """The most blocks a request holds in the sliding-window group once its window has
        moved on: the W - 1 tokens before the newest and the newest, over block boundaries."""
        return blocks_for(self.config.window - 1, self.config.pool.block_size) + 1

    def caption(self, frame: MixedFrame) -> list[str]:
        return caption(frame, self.config.pool.num_blocks, self.config.pool.block_size,
                       self.config.window, GROUP_LABELS)


def event_steps(frames: Sequence[MixedFrame]) -> list[tuple[int, str]]:
    """The steps where something notable happens, each with a short label, in step order:
    blocks turn null and go back to the pool, a prefix hit shrinks to what every group
    serves, a request finishes (leaves, its blocks back in the pool)."""
    events = []
    for frame in frames:
        said = []
        nulled = {name: [b for change in changes for _, b in change.nulled]
                  for name, changes in frame.changes.items()}
        for arrival in frame.arrivals:
            nulled.setdefault(arrival.name, []).extend(
                b for change in arrival.changes for _, b in change.nulled)
        for name, blocks in nulled.items():
            if blocks:
                said.append(f"{name}: {_block_list(blocks)} left the sliding window, the null "
                            "block in its table, back to the pool")
        for arrival in frame.arrivals:
            if arrival.hit_tokens < max(arrival.group_hits):
                said.append(f"{arrival.name}'s prefix hit shrinks to {arrival.hit_tokens} "
                            f"tokens (full attention alone: {arrival.group_hits[0]})")
        for name in frame.left:
            freed, _ = returned(frame, name)
            said.append(f"{name} finishes: {len(freed)} blocks back to the pool")
        if said:
            events.append((frame.step, "; ".join(said)))
    return events


def _block_list(blocks: list[int]) -> str:
    return (f"block {blocks[0]}" if len(blocks) == 1
            else "blocks " + ", ".join(map(str, blocks)))
