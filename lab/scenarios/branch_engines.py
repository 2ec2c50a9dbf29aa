"""Two engines replaying the same branches on the lab's KVCacheManager, over a real KV pool.

`ForkEngine` is vLLM V0's way (the paper, 2023), the one the guide teaches: the prompt is
prefilled once, branches fork its blocks (ref count + 1), and a branch about to write into a
shared, partly filled block copies that block first (copy-on-write).

`ChildRequestEngine` is vLLM V1's (0.33): there is no fork. Parallel sampling (`n > 1`) becomes
n child requests of the same prompt, all added at once and scheduled in one step: the first
computes the whole prompt, and because V1 hashes full blocks as it allocates them, the others
find those full blocks in the prefix cache and compute only the rest (the prompt's partial last
block, or its last full block, since a hit stops one token short of the prompt). Beam search
runs outside the engine core (`LLM.beam_search`): every step each beam is sent as a new
one-token request, which finds its full blocks in the prefix cache and recomputes its partial
last block; the request ends with that token and frees its blocks (full ones stay cached).

Both engines hold blocks the same way whoever computes the K/V: seeded synthetic K/V by default
(the Copy-on-write page), or a real model's forward steps over the engine's pool
(`lab.scenarios.model_branches`), given as a `KVCompute`.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from kernels.reference import AttentionCheck
from lab.memory.cache_manager import KVCacheManager
from lab.memory.events import Event
from lab.memory.kernel_check import check_kernel
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.scenarios.branches import BranchStep
from lab.serving.synthetic_kv import SyntheticKV


@dataclass(frozen=True)
class Admission:
    """A request admitted at this step (V1): its prefix-cache hit and what it computed."""

    branch: int
    seq_id: int
    hit_tokens: int
    computed: int  # tokens whose K/V it computed
    recomputed: int  # of those, tokens whose K/V had been computed before


@dataclass(frozen=True)
class EngineView:
    """One engine after one step."""

    snapshot: Snapshot
    events: tuple[Event, ...]  # in the order they happened
    branches: dict[int, int]  # every sequence (request) id so far -> its branch
    blocks_used: int  # physical blocks held (ref count > 0)
    computed: int  # tokens whose K/V this step computed
    recomputed: int  # of those, tokens whose K/V had been computed before
    admitted: tuple[Admission, ...]  # V1: requests admitted at this step
    total_computed: int
    total_recomputed: int
    total_copies: int

    @property
    def names(self) -> dict[int, str]:
        """Sequence (request) id -> its branch's name."""
        return {s: branch_name(b) for s, b in self.branches.items()}

    def by_branch(self) -> tuple[Snapshot, dict[int, str]]:
        """The pool with each sequence named by its branch (V1 sends a beam as a new request
        each step: drawn as its branch, it keeps one row and one colour beside V0's)."""
        snap, of = self.snapshot, self.branches
        sequences = sorted((replace(s, seq_id=of[s.seq_id], parent_id=None)
                            for s in snap.sequences), key=lambda s: s.seq_id)
        blocks = tuple(replace(b, owners=tuple(of[o] for o in b.owners)) for b in snap.blocks)
        return (replace(snap, blocks=blocks, sequences=tuple(sequences)),
                {of[s.seq_id]: branch_name(of[s.seq_id]) for s in snap.sequences})


@dataclass(frozen=True)
class BranchFrame:
    step: int
    v0: EngineView  # vLLM V0: fork + copy-on-write
    v1: EngineView  # vLLM V1 (0.33): requests through the prefix cache
    live: tuple[int, ...]  # live branches (the search's beams, or the samples still writing)
    finished: tuple[int, ...]  # branches finished so far (sampling) or dropped (beam)
    naive_blocks: int  # blocks if every live branch held a private copy of its cache
    scores: dict[int, float]  # beam search: cumulative log-probability of each live beam


def branch_name(branch: int) -> str:
    return f"B{branch}"


class KVCompute(Protocol):
    """Computes the K/V of the listed sequences' unwritten positions, in one step, and stores
    it in the manager's pool (which commits it)."""

    def __call__(self, manager: KVCacheManager, seq_ids: list[int]) -> None: ...


class BranchEngine(ABC):
    def __init__(self, pool: PoolConfig, seed: int, store_kv: bool, prefix_cache: bool,
                 compute: KVCompute | None = None) -> None:
        self.manager = KVCacheManager(pool, enable_prefix_cache=prefix_cache,
                                      store_kv=store_kv or compute is not None)
        self.kv = SyntheticKV(pool, seed) if store_kv and compute is None else None
        self.compute = compute  # None: synthetic K/V (store_kv), or positions only
        self.live: dict[int, int] = {}  # live sequence (request) id -> its branch
        self.branches: dict[int, int] = {}  # every sequence id so far -> its branch
        self._seen: set[int] = set()  # prefixes whose last token's K/V was computed
        self._now: dict[int, int] = {}  # sequence id -> tokens it computed at this step
        self._start = self._recomputed = 0
        self._admitted: list[Admission] = []
        self.total_computed = self.total_recomputed = self.total_copies = 0

    def apply(self, index: int, step: BranchStep, runs: bool = True) -> EngineView:
        """Play one step's decisions (`runs`: whether beam search sends requests at this
        step); return the engine after it."""
        self.manager.events.step = index  # events are stamped with the step
        self._start = len(self.manager.events)
        self._now, self._admitted, self._recomputed = {}, [], 0
        self.run_step(index, step, runs)
        return self._view()

    @abstractmethod
    def run_step(self, index: int, step: BranchStep, runs: bool) -> None:
        """What this engine does at the step: its admissions, copies and frees."""

    def _view(self) -> EngineView:
        events = tuple(self.manager.events.since(self._start))
        copies = sum(e.kind == "copy" for e in events)
        self.total_copies += copies
        computed = sum(self._now.values())
        recomputed = self._recomputed
        self.total_computed += computed
        self.total_recomputed += recomputed
        return EngineView(self.manager.snapshot(), events, dict(self.branches),
                          self.manager.blocks.num_used, computed, recomputed,
                          tuple(self._admitted), self.total_computed, self.total_recomputed,
                          self.total_copies)

    def _hold(self, seq_id: int, branch: int) -> None:
        self.live[seq_id] = branch
        self.branches[seq_id] = branch

    def _compute(self, seq_ids: list[int]) -> None:
        """The K/V of the sequences' unwritten positions is computed at this step."""
        if not seq_ids:
            return
        seqs = [self.manager.sequences[s] for s in seq_ids]
        starts = [seq.num_written for seq in seqs]
        if self.compute is not None:
            self.compute(self.manager, seq_ids)
        for seq, start in zip(seqs, starts):
            if self.compute is None and self.kv is not None:
                keys, values = self.kv.keys_values(seq.tokens[start:], start)  # [L, n, KV, D]
                self.manager.write(seq.seq_id, start, keys, values)
            elif self.compute is None:
                self.manager.commit(seq.seq_id, len(seq))
            self._now[seq.seq_id] = self._now.get(seq.seq_id, 0) + len(seq) - start
            for key in itertools.islice(_prefix_keys(seq.tokens), start, None):
                self._recomputed += key in self._seen
                self._seen.add(key)

    def _append(self, tokens: tuple[tuple[int, int], ...], seq_of: dict[int, int]) -> None:
        """One token per (branch, token), written at its branch's sequence; the step then
        computes them together (a decode step)."""
        for branch, token in tokens:
            self.manager.append_token(seq_of[branch], token)
        self._compute([seq_of[branch] for branch, _ in tokens])

    def _free(self, seq_id: int) -> None:
        self.manager.free(seq_id)
        del self.live[seq_id]

    def check_attention(self) -> AttentionCheck | None:
        """Kernel vs dense attention for what this step computed: each sequence's new tokens
        attend over its whole K/V through its block table (a prompt's tail over its hit)."""
        if self.kv is None or not self._now:
            return None
        seq_ids = [s for s in self._now if s in self.manager.sequences]
        if not seq_ids:
            return None
        lens = [self._now[s] for s in seq_ids]
        tokens = [t for s, n in zip(seq_ids, lens) for t in self.manager.sequences[s].tokens[-n:]]
        return check_kernel(self.manager, seq_ids, self.kv.queries(tokens), query_lens=lens)


class ForkEngine(BranchEngine):
    """vLLM V0: one prefill, forks that share every block, copy-on-write of a shared tail."""

    def __init__(self, pool: PoolConfig, seed: int, store_kv: bool, prompt: tuple[int, ...],
                 compute: KVCompute | None = None):
        super().__init__(pool, seed, store_kv, prefix_cache=False, compute=compute)
        self.prompt = list(prompt)

    def run_step(self, index: int, step: BranchStep, runs: bool) -> None:
        if index == 0:
            seq = self.manager.add_sequence(self.prompt)
            self._hold(seq.seq_id, 0)
            self._compute([seq.seq_id])
        for branch in step.dropped:
            self._free(branch)
        for branch, parent in step.forks:
            child = self.manager.fork(parent)
            assert child.seq_id == branch, (child.seq_id, branch)  # sequence id = branch
            self._hold(branch, branch)
        self._append(step.tokens, {b: b for b in self.live})
        for branch in step.ended:
            self._free(branch)


class ChildRequestEngine(BranchEngine):
    """vLLM V1 (0.33): separate requests that share full blocks through the prefix cache."""

    def __init__(self, pool: PoolConfig, seed: int, store_kv: bool, prompt: tuple[int, ...],
                 beam: bool, compute: KVCompute | None = None):
        super().__init__(pool, seed, store_kv, prefix_cache=True, compute=compute)
        self.beam = beam
        self.tokens: dict[int, list[int]] = {0: list(prompt)}  # branch -> its tokens so far

    def _admit(self, branch: int) -> None:
        seq = self.manager.add_sequence(self.tokens[branch])
        self._hold(seq.seq_id, branch)
        hit, before = seq.num_cached_tokens, self._recomputed
        self._compute([seq.seq_id])
        self._admitted.append(Admission(branch, seq.seq_id, hit, len(seq) - hit,
                                        self._recomputed - before))

    def run_step(self, index: int, step: BranchStep, runs: bool) -> None:
        for branch in step.dropped:
            del self.tokens[branch]
        for branch, parent in step.forks:
            self.tokens[branch] = list(self.tokens[parent])
        for branch, token in step.tokens:
            self.tokens[branch].append(token)
        if not self.beam:  # child requests: all admitted at step 0, then they decode
            if index == 0:
                for branch in [0, *(b for b, _ in step.forks)]:
                    self._admit(branch)
            else:
                self._append(step.tokens, {b: s for s, b in self.live.items()})
            for seq_id in [s for s, b in self.live.items() if b in step.ended]:
                self._free(seq_id)
            return
        # Beam search: last step's one-token requests have finished; this step's beams are
        # sent as new requests (unless the search needs no more tokens).
        for seq_id in list(self.live):
            self._free(seq_id)
        for branch in step.ended:
            del self.tokens[branch]
        if runs:
            for branch in sorted(self.tokens):
                self._admit(branch)


def _prefix_keys(tokens: list[int]) -> Iterator[int]:
    """A key per position naming the tokens up to and including it (a chain of hashes)."""
    key = hash(())
    for token in tokens:
        key = hash((key, token))
        yield key
