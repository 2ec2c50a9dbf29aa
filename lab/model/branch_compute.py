"""The real model as the K/V computation of the branch engines (`lab.scenarios.branch_engines`
takes a `KVCompute`): one forward step of SmolLM2 over an engine's own paged pool."""

from __future__ import annotations

import torch

from lab.memory.cache_manager import KVCacheManager
from lab.model.generation import forward_step
from lab.model.paged_cache import PagedKVCache
from lab.model.transformer import Transformer


class ModelCompute:
    """A `KVCompute`: the model's forward step over an engine's pool, keeping the next-token
    logits of each sequence it ran with the tokens they follow."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.caches: dict[int, PagedKVCache] = {}  # per manager (one per engine)
        self.logits: list[tuple[tuple[int, ...], torch.Tensor]] = []  # this step's, [vocab]

    def __call__(self, manager: KVCacheManager, seq_ids: list[int]) -> None:
        cache = self.caches.get(id(manager))
        if cache is None:
            cache = self.caches[id(manager)] = PagedKVCache(manager, self.model.config)
        logits = forward_step(self.model, cache, seq_ids)  # [num_seqs, vocab]
        self.logits += [(tuple(manager.sequences[s].tokens), row)
                        for s, row in zip(seq_ids, logits)]
