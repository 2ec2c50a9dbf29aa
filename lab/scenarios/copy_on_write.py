"""Copy-on-write stories: parallel sampling and beam search over one prompt, two engines.

The same branches (`lab.scenarios.branches`: seeded decisions, not a model) are replayed by two
engines on the lab's KVCacheManager, each over its own KV pool of the same size:

- vLLM V0 (the paper, 2023), the guide's mechanism: step 0 prefills the prompt once and forks
  it; whenever a branch appends into a last block it shares, that one block is copied first
  (copy-on-write); full shared blocks stay shared; a dropped or finished branch frees its
  references.
- vLLM V1 (0.33): no fork and no copy. The branches are separate requests that share the
  prompt's full blocks through the prefix cache and compute their own partial last block
  (`lab.scenarios.branch_engines.ChildRequestEngine` says exactly how).

Each frame compares memory (blocks held) and compute (tokens computed, and recomputed). With a
KV pool, every token's K/V is written, and the kernel check covers both engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from kernels.reference import AttentionCheck, compare
from lab.memory.block_table import blocks_for
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.branch_engines import BranchFrame, ChildRequestEngine, ForkEngine
from lab.scenarios.branches import beam_script, sampling_script
from lab.scenarios.cow_captions import v0_lines, v1_lines
from lab.scenarios.story import Story

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


class BranchStepper:
    """One prompt, many branches, both engines driven step by step."""

    def __init__(self, cfg: BranchConfig, seed: int, store_kv: bool = False) -> None:
        self.cfg = cfg
        make = sampling_script if cfg.mode == "parallel" else beam_script
        self.script = make(cfg.prompt_len, cfg.num_branches, cfg.max_new_tokens, seed)
        prompt = self.script.prompt
        self.v0 = ForkEngine(cfg.pool, seed, store_kv, prompt)
        self.v1 = ChildRequestEngine(cfg.pool, seed, store_kv, prompt, beam=cfg.mode == "beam")
        self.finished: list[int] = []
        self.step = -1

    @property
    def last_step(self) -> int:
        """Step 0 is the prompt's; then one step per new token; beam search adds a last one
        that keeps only the best beam."""
        return len(self.script.steps) - 1

    @property
    def done(self) -> bool:
        return self.step >= self.last_step

    def advance(self) -> BranchFrame:
        if self.done:
            raise ValueError(f"the story ended at step {self.last_step}")
        self.step += 1
        steps = self.script.steps
        decided = steps[self.step]
        # Beam search sends requests at a step only if the search still needs a next token.
        runs = self.step < self.last_step and bool(steps[self.step + 1].tokens)
        v0 = self.v0.apply(self.step, decided)
        v1 = self.v1.apply(self.step, decided, runs)
        self.finished += [*decided.dropped, *decided.ended]
        live = tuple(sorted(decided.scores))
        sequences = self.v0.manager.sequences
        naive = sum(blocks_for(len(sequences[b]), self.cfg.pool.block_size) for b in live)
        return BranchFrame(self.step, v0, v1, live, tuple(self.finished), naive,
                           dict(decided.scores))

    def check_attention(self) -> AttentionCheck | None:
        """Kernel vs dense attention for what both engines computed at this step."""
        checks = [c for c in (self.v0.check_attention(), self.v1.check_attention()) if c]
        if len(checks) < 2:
            return checks[0] if checks else None
        return compare(torch.cat([c.output for c in checks]),
                       torch.cat([c.reference for c in checks]),
                       sum(c.num_seqs for c in checks))

    def events(self) -> dict[str, list[dict]]:
        return {"vllm_v0": self.v0.manager.events.as_dicts(),
                "vllm_v1": self.v1.manager.events.as_dicts()}


@dataclass(frozen=True)
class CopyOnWriteStory(Story[BranchFrame]):
    page = "copy_on_write"
    config: BranchConfig
    seed: int

    def stepper(self, store_kv: bool = False) -> BranchStepper:
        return BranchStepper(self.config, self.seed, store_kv)

    def caption(self, frame: BranchFrame) -> list[str]:
        """What V0 did, then what V1 did (the page shows the two side by side)."""
        mode = self.config.mode
        return ([f"V0: {line}" for line in v0_lines(frame.v0, frame, mode)]
                + [f"V1: {line}" for line in v1_lines(frame.v1, frame, mode)])


def event_steps(frames: tuple[BranchFrame, ...], mode: Mode) -> list[tuple[int, str]]:
    """The story's notable steps, (step, short label), for "Next event": a copy-on-write copy
    (vLLM V0), a branch that finishes (sampling) or beams dropped (beam search)."""
    events = []
    for before, f in zip(frames, frames[1:]):
        if any(e.kind == "copy" for e in f.v0.events):
            events.append((f.step, "copy-on-write"))
        if set(f.finished) - set(before.finished):
            events.append((f.step, "beams dropped" if mode == "beam" else "a branch ends"))
    return events
