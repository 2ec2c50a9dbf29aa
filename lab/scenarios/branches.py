"""What the sampler decides, once, for both engines of the copy-on-write page.

Parallel sampling: n branches of one prompt, each stopping at its own (seeded) length. Beam
search: each step keeps the `width` best (beam, next token) pairs; a beam chosen twice goes on
as two beams, a beam not chosen is dropped. The decisions are drawn from the seed, not from a
model: the engines then replay the same branches, tokens and drops, so what differs between
them is only how each one holds the K/V (fork and copy-on-write, or requests through the prefix
cache).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from lab.serving.synthetic_kv import VOCAB


@dataclass(frozen=True)
class BranchStep:
    """One step's decisions, in the order they take effect."""

    dropped: tuple[int, ...]  # beams not among the best, dropped before the step's tokens
    forks: tuple[tuple[int, int], ...]  # (new branch, the branch it continues), in order
    tokens: tuple[tuple[int, int], ...]  # (branch, token) written at this step
    ended: tuple[int, ...]  # branches that end after their token (sampling), or at the end
    scores: dict[int, float]  # beam search: cumulative log-probability of each live beam


@dataclass(frozen=True)
class BranchScript:
    prompt: tuple[int, ...]
    steps: tuple[BranchStep, ...]  # step 0 is the prompt's


def sampling_script(prompt_len: int, n: int, max_new_tokens: int, seed: int) -> BranchScript:
    """Branch 0 is the prompt's; 1..n-1 continue it. Branch i writes one token per step until
    its own length (seeded, unknown to the server) is reached."""
    rng, prompt = _start(prompt_len, n, max_new_tokens, seed)
    lengths = _lengths(rng, n, max_new_tokens)
    live = list(range(n))
    steps = [BranchStep((), tuple((b, 0) for b in range(1, n)), (), (), dict.fromkeys(live, 0.0))]
    written = dict.fromkeys(live, 0)
    while live:
        tokens = tuple((b, rng.randrange(VOCAB)) for b in live)
        for b in live:
            written[b] += 1
        ended = tuple(b for b in live if written[b] == lengths[b])
        live = [b for b in live if b not in ended]
        steps.append(BranchStep((), (), tokens, ended, dict.fromkeys(live, 0.0)))
    return BranchScript(prompt, tuple(steps))


def beam_script(prompt_len: int, width: int, max_new_tokens: int, seed: int) -> BranchScript:
    """Beam 0 is the prompt; each of max_new_tokens steps keeps the `width` best candidates
    (every live beam proposes `width` next tokens); then a step keeps only the best, and a
    last one returns it as the answer (its request ends)."""
    rng, prompt = _start(prompt_len, width, max_new_tokens, seed)
    _lengths(rng, width, max_new_tokens)  # drawn as for sampling: one seed, one prompt
    scores = {0: 0.0}
    next_id = 1
    steps = [BranchStep((), (), (), (), dict(scores))]
    for _ in range(max_new_tokens):
        candidates = []
        for beam in sorted(scores):
            for _ in range(width):
                logprob = -rng.expovariate(1.0)
                candidates.append((scores[beam] + logprob, beam, rng.randrange(VOCAB)))
        picks: dict[int, list[tuple[float, int]]] = {}
        for score, beam, token in sorted(candidates, reverse=True)[:width]:
            picks.setdefault(beam, []).append((score, token))
        dropped = tuple(b for b in scores if b not in picks)
        for beam in dropped:
            del scores[beam]
        forks, tokens = [], []
        for beam, chosen in sorted(picks.items()):
            targets = [beam] + list(range(next_id, next_id + len(chosen) - 1))
            next_id += len(chosen) - 1
            forks += [(t, beam) for t in targets[1:]]
            for target, (score, token) in zip(targets, chosen):
                scores[target] = score
                tokens.append((target, token))
        steps.append(BranchStep(dropped, tuple(forks), tuple(tokens), (), dict(scores)))
    best = max(scores, key=lambda b: (scores[b], -b))
    ended = tuple(b for b in scores if b != best)
    steps.append(BranchStep((), (), (), ended, {best: scores[best]}))
    steps.append(BranchStep((), (), (), (best,), {}))  # the answer is returned: it ends too
    return BranchScript(prompt, tuple(steps))


def _start(prompt_len: int, n: int, max_new_tokens: int, seed: int
           ) -> tuple[random.Random, tuple[int, ...]]:
    rng = random.Random(seed)
    return rng, tuple(rng.randrange(VOCAB) for _ in range(prompt_len))


def _lengths(rng: random.Random, n: int, max_new_tokens: int) -> list[int]:
    return [rng.randint(max(1, max_new_tokens // 3), max_new_tokens) for _ in range(n)]
