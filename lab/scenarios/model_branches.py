"""A generation's n samples held two ways on the real model: vLLM V0's fork and vLLM V1's
child requests, each engine on a KV pool of its own, the model computing every K/V they hold.

The page's generation (`lab.model.generation`) forks its samples, the V0 way. Its tokens are
replayed here through the two engines of `lab.scenarios.branch_engines`: `ForkEngine` prefills
the prompt once and forks it (copy-on-write of the shared partial last block when a sample
first writes there); `ChildRequestEngine` admits n child requests of the prompt, the later ones
hitting the first one's full blocks in the prefix cache and computing the rest again in a block
of their own. What differs is only how each engine holds the K/V; the next-token logits both
compute for the same tokens are compared, and V1's should be V0's.

The replay writes into the cache only what the model computes: a sample's last token (the one
it stops at) is sampled, never fed back, so it is not replayed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from lab.memory.block_table import blocks_for
from lab.memory.kv_pool import PoolConfig
from lab.model.branch_compute import ModelCompute
from lab.model.transformer import Transformer
from lab.scenarios.branch_engines import BranchFrame, ChildRequestEngine, ForkEngine
from lab.scenarios.branches import BranchScript, BranchStep


def replay_script(prompt: tuple[int, ...], samples: list[list[int]]) -> BranchScript:
    """The samples as branch decisions: step 0 prefills the prompt and makes the n branches;
    step k writes each sample's token k - 1; a sample ends at the step that writes its
    last-but-one token (at step 0 if it stopped at its first token)."""
    n = len(samples)
    steps = []
    for k in range(max(len(s) for s in samples)):
        live = [b for b in range(n) if len(samples[b]) > k]
        tokens = tuple((b, samples[b][k - 1]) for b in live) if k else ()
        ended = tuple(b for b in live if len(samples[b]) == k + 1)
        forks = tuple((b, 0) for b in range(1, n)) if k == 0 else ()
        steps.append(BranchStep((), forks, tokens, ended,
                                dict.fromkeys((b for b in live if b not in ended), 0.0)))
    return BranchScript(tuple(prompt), tuple(steps))


@dataclass(frozen=True)
class LogitCheck:
    """V1's next-token logits against V0's for the same tokens, over the steps so far."""

    compared: int  # (step, sequence) pairs both engines computed logits for
    max_abs_diff: float
    same_choice: bool  # the most likely next token agrees every time


@dataclass(frozen=True)
class TwoWayStep:
    frame: BranchFrame  # both engines after the step (the Copy-on-write page's frame)
    check: LogitCheck


def replay(model: Transformer, pool: PoolConfig, prompt: tuple[int, ...],
           samples: list[list[int]]) -> Iterator[TwoWayStep]:
    """Both engines step by step over the same samples (PoolExhausted if one does not fit)."""
    script = replay_script(prompt, samples)
    v0_compute, v1_compute = ModelCompute(model), ModelCompute(model)
    v0 = ForkEngine(pool, 0, False, prompt, compute=v0_compute)
    v1 = ChildRequestEngine(pool, 0, False, prompt, beam=False, compute=v1_compute)
    compared, worst, same, finished = 0, 0.0, True, []
    for index, step in enumerate(script.steps):
        view0, view1 = v0.apply(index, step), v1.apply(index, step)
        computed = dict(v0_compute.logits)
        for tokens, row in v1_compute.logits:
            ref = computed[tokens]
            compared += 1
            worst = max(worst, (row - ref).abs().max().item())
            same &= bool(row.argmax() == ref.argmax())
        v0_compute.logits, v1_compute.logits = [], []
        finished += step.ended
        live = tuple(sorted(step.scores))
        sequences = v0.manager.sequences
        naive = sum(blocks_for(len(sequences[b]), pool.block_size) for b in live)
        yield TwoWayStep(BranchFrame(index, view0, view1, live, tuple(finished), naive, {}),
                         LogitCheck(compared, worst, same))
