"""One user's requests to the real model over their own paged KV pool.

The model weights are shared and read-only; the `ModelSession` owns a KVCacheManager whose pool
is shaped for the model (30 layers, 3 KV heads, head dim 64). A request frees the previous
request's sequences (their full blocks stay in the prefix cache as cached-free blocks), admits
the chat prompt — reusing cached prefix blocks — and streams one `GenerationFrame` per generated
token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lab.memory.block_pool import PoolExhausted
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.events import Event
from lab.memory.snapshot import Snapshot
from lab.model.dense_cache import DenseKVCache
from lab.model.generation import SamplingParams, generate
from lab.model.gguf import LoadedModel
from lab.model.paged_cache import ForwardReport, PagedKVCache, pool_config_for
from lab.sizing.kv_formula import kv_layout


@dataclass(frozen=True)
class GenerationFrame:
    """The state after one generation step, for a page to draw."""

    index: int  # generation step: 0 is the token sampled from the prefill
    tokens: dict[int, list[int]]  # sequence id -> generated tokens so far
    finished: frozenset[int]
    snapshot: Snapshot
    events: tuple[Event, ...]  # what the cache did during this step
    report: ForwardReport | None  # the forward step that produced this step's logits
    elapsed_s: float


@dataclass(frozen=True)
class RequestResult:
    """A finished request, summarised for a page."""

    question: str
    prompt: tuple[int, ...]
    num_cached_tokens: int  # prompt tokens whose K/V came from the prefix cache
    final: GenerationFrame
    copies: dict[int, int]  # copy-on-write: destination block -> source block
    first_copy_step: int | None
    reports: tuple[ForwardReport, ...]  # one per forward step, prefill first
    tokens_per_s: float  # every sample's tokens, prefill included
    same_as_dense: bool | None  # the same tokens as the dense contiguous cache without prefix
    # cache (None: not checked, the request was stopped)
    stopped: bool = False  # ended by the learner before every sample finished
    released: Snapshot | None = None  # a stopped request: the pool once its blocks went back


@dataclass(frozen=True)
class RequestInfo:
    prompt: tuple[int, ...]
    num_cached_tokens: int  # prompt tokens whose K/V came from the prefix cache
    seq_ids: tuple[int, ...]  # the root sequence first, then its forks


class ModelSession:
    def __init__(self, loaded: LoadedModel, num_blocks: int = 48, block_size: int = 16,
                 device: torch.device | None = None) -> None:
        self.loaded = loaded
        config = pool_config_for(loaded.model.config, num_blocks, block_size,
                                 loaded.model.dtype)
        self.manager = KVCacheManager(config, device or loaded.model.device)
        self.cache = PagedKVCache(self.manager, loaded.model.config)
        self.request: RequestInfo | None = None
        self.stopped: RequestResult | None = None  # the last request, if it was stopped
        self._idle = threading.Event()  # no request streaming or being wound up
        self._idle.set()
        self._first_report = 0  # index in cache.reports where the current request starts

    @property
    def reports(self) -> list[ForwardReport]:
        """The forward steps of the current request (prefill first)."""
        return self.cache.reports[self._first_report:]

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.loaded.tokenizer.stop_ids

    def blocks_needed(self, prompt: list[int], params: SamplingParams) -> int:
        """Worst case for the request: the prompt's uncached blocks, plus, per sample, the
        blocks its new tokens may open and one copy-on-write copy of the shared last block."""
        bs, full = self.manager.block_size, len(prompt) // self.manager.block_size
        partial = blocks_for(len(prompt), bs) - full  # 1 if the last prompt block is partial
        per_sample = blocks_for(len(prompt) + params.max_new_tokens, bs) - full
        return self.manager.blocks_needed(prompt) + params.n * per_sample - partial

    def release(self) -> None:
        """Free the previous request's sequences: their full blocks stay cached (cached-free)."""
        for seq_id in list(self.manager.sequences):
            self.manager.free(seq_id)
        self.request = None

    def run(self, prompt: list[int], params: SamplingParams) -> Iterator[GenerationFrame]:
        """Generate from a tokenized prompt; PoolExhausted before starting if it may not fit."""
        self.release()
        needed = self.blocks_needed(prompt, params)
        if needed > self.manager.blocks.num_free:
            raise PoolExhausted(needed, self.manager.blocks.num_free)
        self._idle.clear()  # until finish()
        model = self.loaded.model
        self._first_report = len(self.cache.reports)
        tokens: dict[int, list[int]] = {}
        done: set[int] = set()
        mark, start = len(self.manager.events), time.perf_counter()
        for step in generate(model, self.cache, prompt, params, self.stop_ids):
            if self.request is None:
                root = min(step.tokens)
                self.request = RequestInfo(tuple(prompt),
                                           self.manager.sequences[root].num_cached_tokens,
                                           tuple(sorted(step.tokens)))
            for seq_id, token in step.tokens.items():
                tokens.setdefault(seq_id, []).append(token)
            done.update(step.finished)
            events = tuple(self.manager.events.since(mark))
            mark = len(self.manager.events)
            yield GenerationFrame(step.index, {k: list(v) for k, v in tokens.items()},
                                  frozenset(done), self.manager.snapshot(), events,
                                  self.cache.reports[-1] if self.cache.reports else None,
                                  time.perf_counter() - start)

    def finish(self, question: str, frames: list[GenerationFrame], params: SamplingParams,
               *, stopped: bool = False) -> RequestResult:
        """Summarise a streamed request and check it against the dense cache. A stopped
        request keeps what it wrote, frees its sequences at once (their full blocks stay
        cached) and is not checked; `released` is the pool after the release. It is also kept
        as `stopped` (a page stopped mid-run picks it up on the next run)."""
        assert self.request is not None and frames, "finish() follows a run()"
        final = frames[-1]
        released = None
        if stopped:
            request = self.request
            self.release()
            self.request = request
            released = self.manager.snapshot()
        events = [e for f in frames for e in f.events if e.kind == "copy"]
        first_copy = next((f.index for f in frames if any(e.kind == "copy" for e in f.events)),
                          None)
        paged = [final.tokens[s] for s in sorted(final.tokens)]
        generated = sum(len(t) for t in paged)
        same = None if stopped else self.dense_tokens(list(self.request.prompt), params) == paged
        result = RequestResult(question, self.request.prompt, self.request.num_cached_tokens,
                               final, {e.detail["dst"]: e.detail["src"] for e in events},
                               first_copy, tuple(self.reports), generated / final.elapsed_s,
                               same, stopped, released)
        self.stopped = result if stopped else None
        self._idle.set()
        return result

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait for a request being wound up elsewhere (a page run that was stopped ends in
        its own thread while the next run starts): False if it did not end in time."""
        return self._idle.wait(timeout_s)

    def dense_tokens(self, prompt: list[int], params: SamplingParams) -> list[list[int]]:
        """The same request on a dense contiguous cache (no paging, no prefix cache)."""
        model = self.loaded.model
        cache = DenseKVCache(model.config, len(prompt) + params.max_new_tokens, model.device,
                             model.dtype)
        out: dict[int, list[int]] = {}
        for step in generate(model, cache, prompt, params, self.stop_ids):
            for seq_id, token in step.tokens.items():
                out.setdefault(seq_id, []).append(token)
        return [out[k] for k in sorted(out)]


@dataclass(frozen=True)
class SizeCheck:
    """The calculator's formula for this model next to the pool's real tensors."""

    formula_bytes_per_token: int  # 2 x layers x KV heads x head dim x bytes per element
    formula_bytes_per_block: int
    pool_bytes_per_block: int  # the pool's tensors, all layers, K and V, divided by blocks
    pool_nbytes: int
    layer_shape: tuple[int, ...]  # one layer's K (or V) tensor

    @property
    def matches(self) -> bool:
        return self.formula_bytes_per_block == self.pool_bytes_per_block


def size_check(session: ModelSession) -> SizeCheck:
    pool = session.manager.pool
    spec = session.loaded.model.config.kv_spec(session.loaded.name)
    element = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "fp16"}
    layout = kv_layout(spec, element[pool.config.dtype])
    bs = pool.config.block_size
    return SizeCheck(layout.bytes_per_token, layout.block_bytes(bs),
                     pool.nbytes // pool.config.num_blocks, pool.nbytes,
                     tuple(pool.key_caches[0].shape))


@dataclass(frozen=True)
class KernelSummary:
    num_steps: int
    max_abs_error: float  # worst kernel-vs-float64-dense error over the checked layers
    all_ok: bool


def kernel_summary(reports: list[ForwardReport]) -> KernelSummary | None:
    checks = [r.check for r in reports if r.check is not None]
    if not checks:
        return None
    return KernelSummary(len(reports), max(c.max_abs_error for c in checks),
                         all(c.ok for c in checks))
