"""Copy-on-write scenarios: parallel sampling and beam search over one prompt.

Step 0 prefills the prompt once. Parallel sampling then forks it into n branches that share
every prompt block; each branch samples its own tokens and stops at its own length. Beam search
keeps the `width` best (beam, next token) pairs each step: a beam chosen twice is forked, a beam
not chosen is freed. Whenever a branch appends into a last block it shares, that one block is
copied first (copy-on-write); full shared blocks stay shared.

Token choices are seeded, not sampled from a model: the allocator sees exactly the forks,
appends and frees a real sampler would cause. With a KV pool, every token's K/V is written.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.events import Event
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.scenarios.story import Story
from lab.serving.synthetic_kv import VOCAB, SyntheticKV

Mode = Literal["parallel", "beam"]


@dataclass(frozen=True)
class BranchConfig:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_blocks=32, block_size=16))
    mode: Mode = "parallel"
    num_branches: int = 4  # n samples, or the beam width
    prompt_len: int = 30
    max_new_tokens: int = 12

    def __post_init__(self) -> None:
        if self.mode not in ("parallel", "beam"):
            raise ValueError(f"mode must be 'parallel' or 'beam', got {self.mode!r}")
        for name in ("num_branches", "prompt_len", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        worst = self.num_branches * blocks_for(self.prompt_len + self.max_new_tokens,
                                               self.pool.block_size)
        if worst > self.pool.num_blocks:
            raise ValueError(
                f"{self.num_branches} branches of up to {self.prompt_len + self.max_new_tokens} "
                f"tokens may need {worst} blocks if nothing stays shared, but the pool has "
                f"{self.pool.num_blocks}: add blocks, or use fewer branches or tokens")


@dataclass(frozen=True)
class BranchFrame:
    step: int
    snapshot: Snapshot  # the pool after the step
    events: tuple[Event, ...]  # what this step did (fork/share, copy, allocate, free, ...)
    live: tuple[int, ...]  # live branch (sequence) ids
    finished: tuple[int, ...]  # branches finished so far (sampling) or pruned (beam)
    blocks_used: int  # physical blocks in use, with sharing
    naive_blocks: int  # blocks if every live branch held a private copy of its cache
    copies: int  # copy-on-write block copies so far
    scores: dict[int, float]  # beam search: cumulative log-probability of each live beam


class BranchPlay:
    """One prompt, many branches, driven step by step on a KVCacheManager."""

    def __init__(self, cfg: BranchConfig, seed: int, store_kv: bool = False) -> None:
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.manager = KVCacheManager(cfg.pool, enable_prefix_cache=False, store_kv=store_kv)
        self.kv = SyntheticKV(cfg.pool, seed) if store_kv else None
        self.prompt = [self.rng.randrange(VOCAB) for _ in range(cfg.prompt_len)]
        # Parallel sampling: each branch's length is fixed by the seed (unknown to the server).
        self.lengths = [self.rng.randint(max(1, cfg.max_new_tokens // 3), cfg.max_new_tokens)
                        for _ in range(cfg.num_branches)]
        self.target_len: dict[int, int] = {}  # parallel sampling: seq_id -> tokens to generate
        self.scores: dict[int, float] = {}
        self.finished: list[int] = []
        self.copies = 0
        self.step = -1

    @property
    def last_step(self) -> int:
        """Step 0 prefills; then one step per new token; beam search adds a final pruning."""
        if self.cfg.mode == "parallel":
            return max(self.lengths)
        return self.cfg.max_new_tokens + 1

    @property
    def done(self) -> bool:
        return self.step >= self.last_step

    def advance(self) -> BranchFrame:
        if self.done:
            raise ValueError(f"the scenario ended at step {self.last_step}")
        self.step += 1
        self.manager.events.step = self.step  # events are stamped with this step
        start = len(self.manager.events)
        if self.step == 0:
            self._prefill()
        elif self.cfg.mode == "parallel":
            self._sample_step()
        elif self.step <= self.cfg.max_new_tokens:
            self._beam_step()
        else:
            self._keep_best()
        events = tuple(self.manager.events.since(start))
        self.copies += sum(e.kind == "copy" for e in events)
        return self.frame(events)

    def _prefill(self) -> None:
        seq = self.manager.add_sequence(self.prompt)
        if self.kv is not None:
            keys, values = self.kv.keys_values(self.prompt, 0)  # [L, prompt_len, kv_heads, D]
            self.manager.write(seq.seq_id, 0, keys, values)
        else:
            self.manager.commit(seq.seq_id, len(self.prompt))
        self.scores[seq.seq_id] = 0.0
        if self.cfg.mode == "parallel":  # n samples from the start, all sharing the prompt
            branches = [seq.seq_id] + [self.manager.fork(seq.seq_id).seq_id
                                       for _ in range(self.cfg.num_branches - 1)]
            self.target_len = dict(zip(branches, self.lengths))
            self.scores.update(dict.fromkeys(branches, 0.0))

    def _append(self, choices: list[tuple[int, int]]) -> None:
        """Append one token per (seq_id, token); write all their K/V in one pool write."""
        appended = []
        for seq_id, token in choices:
            self.manager.append_token(seq_id, token)
            appended.append((seq_id, len(self.manager.sequences[seq_id]) - 1, token))
        if self.kv is not None:
            self.kv.write_appended(self.manager, appended)
        else:
            for seq_id, pos, _ in appended:
                self.manager.commit(seq_id, pos + 1)

    def _finish(self, seq_id: int) -> None:
        self.manager.free(seq_id)
        del self.scores[seq_id]
        self.finished.append(seq_id)

    def _sample_step(self) -> None:
        live = list(self.scores)
        self._append([(s, self.rng.randrange(VOCAB)) for s in live])
        for seq_id in live:
            if len(self.manager.sequences[seq_id]) - self.cfg.prompt_len == self.target_len[seq_id]:
                self._finish(seq_id)

    def _beam_step(self) -> None:
        """Keep the `width` best (beam, token) pairs: prune, fork, then append."""
        width = self.cfg.num_branches
        candidates = []
        for seq_id in sorted(self.scores):  # each beam proposes `width` next tokens
            for _ in range(width):
                logprob = -self.rng.expovariate(1.0)
                candidates.append((self.scores[seq_id] + logprob, seq_id,
                                   self.rng.randrange(VOCAB)))
        best = sorted(candidates, reverse=True)[:width]
        picks: dict[int, list[tuple[float, int]]] = {}
        for score, seq_id, token in best:
            picks.setdefault(seq_id, []).append((score, token))
        for seq_id in [s for s in self.scores if s not in picks]:
            self._finish(seq_id)  # pruned: its blocks lose one reference
        choices = []
        for seq_id, chosen in sorted(picks.items()):
            targets = [seq_id] + [self.manager.fork(seq_id).seq_id for _ in chosen[1:]]
            for target, (score, token) in zip(targets, chosen):
                self.scores[target] = score
                choices.append((target, token))
        self._append(choices)

    def _keep_best(self) -> None:
        best = max(self.scores, key=lambda s: (self.scores[s], -s))
        for seq_id in [s for s in self.scores if s != best]:
            self._finish(seq_id)

    # -- reading ---------------------------------------------------------------------------
    def frame(self, events: tuple[Event, ...] = ()) -> BranchFrame:
        live = tuple(sorted(self.scores))
        naive = sum(blocks_for(len(self.manager.sequences[s]), self.cfg.pool.block_size)
                    for s in live)
        return BranchFrame(self.step, self.manager.snapshot(), events, live,
                           tuple(self.finished), self.manager.blocks.num_used, naive,
                           self.copies, dict(self.scores))

    def check_attention(self) -> AttentionCheck | None:
        """Kernel vs dense attention for every live branch's newest token."""
        if self.kv is None or not self.scores:
            return None
        return self.kv.check_newest(self.manager, sorted(self.scores))

    def events(self) -> dict[str, list[dict]]:
        return {"paged": self.manager.events.as_dicts()}


def branch_name(seq_id: int) -> str:
    return f"B{seq_id}"


@dataclass(frozen=True)
class CopyOnWriteStory(Story[BranchFrame]):
    page = "copy_on_write"
    config: BranchConfig
    seed: int

    def play(self, store_kv: bool = False) -> BranchPlay:
        return BranchPlay(self.config, self.seed, store_kv)

    def caption(self, frame: BranchFrame) -> list[str]:
        return _caption(frame, self.config.mode)


def _caption(frame: BranchFrame, mode: Mode) -> list[str]:
    """What this step did: forks, copies, new blocks, ended branches (grouped, one line each)."""
    def who(seq_ids) -> str:
        return ", ".join(f"**{branch_name(s)}**" for s in seq_ids)

    events = frame.events
    copied = {e.block_id for e in events if e.kind == "copy"}
    lines = []
    forked = list(dict.fromkeys(e.seq_id for e in events if e.kind == "share"))
    if forked:
        parent = {s.seq_id: s.parent_id for s in frame.snapshot.sequences}
        lines.append(f"{who(forked)} forked from {who(dict.fromkeys(parent[s] for s in forked))}"
                     ": each new block table points at the same blocks (ref count + 1 each), "
                     "nothing is copied.")
    by_src: dict[int, list] = {}
    for e in events:
        if e.kind == "copy":
            by_src.setdefault(e.detail["src"], []).append(e)
    for src, copies in by_src.items():
        keeper = [s.seq_id for s in frame.snapshot.sequences if src in s.block_table]
        lines.append(f"{who(e.seq_id for e in copies)} must write into shared, partly filled "
                     f"block {src}: copy-on-write copies it to block(s) "
                     f"**{', '.join(str(e.detail['dst']) for e in copies)}** first (one each)"
                     + (f"; {who(keeper)} keeps block {src} and writes in place." if keeper
                        else "."))
    fresh = [e for e in events if e.kind == "allocate" and e.block_id not in copied]
    if fresh:
        why = "for the prompt" if frame.step == 0 else "because the last block was full"
        lines.append(f"{who(dict.fromkeys(e.seq_id for e in fresh))} took new block(s) "
                     f"{', '.join(str(e.block_id) for e in fresh)} {why}.")
    ended = [s for s in dict.fromkeys(e.seq_id for e in events if e.kind == "free")
             if s not in frame.live]
    if ended:
        released = [e.block_id for e in events if e.kind == "free" and e.seq_id in ended
                    and e.detail["ref_count"] == 0]
        verb = "finished" if mode == "parallel" else "dropped (not among the best beams)"
        if mode == "beam" and not any(e.kind == "append" for e in events):
            verb = "dropped: the search is over and only the best beam is kept"
        freed = (f"block(s) {', '.join(map(str, released))} reach ref count 0 and return to the "
                 "free queue" if released else "all of them are still shared, none is freed")
        lines.append(f"{who(ended)} {verb}: each held block loses one reference; {freed}.")
    return lines
