"""Text generation over any KV cache: prefill, fork into n samples (vLLM V0's way), then decode
step by step.

The loop is the same for the dense baseline (lab/dense_cache.py) and the paged cache
(lab/paged_generation.py); only the `SequenceCache` differs, so their outputs can be compared
token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from lab.model.step_layout import StepLayout
from lab.model.transformer import Transformer


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0 means greedy: always the most likely token
    top_p: float = 1.0  # keep the smallest set of tokens whose probability reaches top_p
    seed: int = 0
    n: int = 1  # parallel samples of the same prompt

    def __post_init__(self) -> None:
        if not 1 <= self.max_new_tokens <= 4096:
            raise ValueError(f"max_new_tokens must be in [1, 4096], got {self.max_new_tokens}")
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 1 <= self.n <= 64:
            raise ValueError(f"n must be in [1, 64], got {self.n}")


class CacheStep(Protocol):
    """One forward step's view of the cache: also the model's `Attention` for that step."""

    layout: StepLayout
    token_ids: torch.Tensor  # [num_tokens] the new tokens, all sequences end to end

    def __call__(self, layer: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor: ...


class SequenceCache(Protocol):
    def add(self, prompt: list[int]) -> int: ...
    def fork(self, seq_id: int) -> int: ...
    def append(self, seq_id: int, token: int) -> None: ...
    def begin_step(self, seq_ids: list[int]) -> CacheStep: ...
    def end_step(self, step: CacheStep) -> None: ...


@dataclass(frozen=True)
class GenerationStep:
    index: int  # 0 for the token sampled from the prefill's logits
    tokens: dict[int, int]  # sequence id -> token sampled at this step
    finished: tuple[int, ...]  # sequences that stopped at this step
    logits: torch.Tensor  # float32 [num_sampled, vocab] the tokens were sampled from


def forward_step(model: Transformer, cache: SequenceCache, seq_ids: list[int]) -> torch.Tensor:
    """Feed every token whose K/V is not cached yet; return next-token logits [num_seqs, vocab]."""
    step = cache.begin_step(seq_ids)
    longest = max(step.layout.seq_lens)
    if longest > model.config.max_positions:
        raise ValueError(f"position {longest - 1} is past the model's "
                         f"{model.config.max_positions}-token context")
    hidden = model.forward(step.token_ids, step.layout.positions, step)  # [T, hidden]
    cache.end_step(step)
    return model.logits(hidden[step.layout.last_token_index])


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> list[int]:
    """One token per row of logits [n, vocab]: greedy, or temperature + top-p sampling."""
    if params.temperature == 0.0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float().cpu() / params.temperature, dim=-1)  # [n, vocab]
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely tokens
        sorted_probs[before >= params.top_p] = 0.0  # the most likely token always stays
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1).tolist()


def generate(model: Transformer, cache: SequenceCache, prompt: list[int],
             params: SamplingParams, stop_ids: frozenset[int] = frozenset()
             ) -> Iterator[GenerationStep]:
    """Prefill the prompt once, fork it into params.n sequences, then decode them together.

    The fork is vLLM V0's (the paper's engine, 2023) way to run n samples, the one the guide
    teaches; vLLM V1 (0.33) adds n child requests of the prompt instead, sharing its full blocks
    through the prefix cache (`lab.scenarios.branch_engines.ChildRequestEngine`).

    Every sampled token is appended to its sequence (its K/V is computed by the next step).
    A sequence stops at a stop token or after params.max_new_tokens tokens.
    """
    generator = torch.Generator().manual_seed(params.seed)
    root = cache.add(prompt)
    logits = forward_step(model, cache, [root])  # [1, vocab]
    live = [root] + [cache.fork(root) for _ in range(params.n - 1)]
    logits = logits.expand(len(live), -1)
    for index in range(params.max_new_tokens):
        tokens = sample(logits, params, generator)
        for seq_id, token in zip(live, tokens):
            cache.append(seq_id, token)
        last = index == params.max_new_tokens - 1
        finished = tuple(s for s, t in zip(live, tokens) if last or t in stop_ids)
        yield GenerationStep(index, dict(zip(live, tokens)), finished, logits)
        live = [s for s in live if s not in finished]
        if not live:
            return
        logits = forward_step(model, cache, live)
