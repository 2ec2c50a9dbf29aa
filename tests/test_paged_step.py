"""The model's paged step in the every-layer plan (a GPU's): its inputs checked once, on the
host; layers that read nothing back from the device and copy no host data to it (on a GPU: no
host sync, so the layers can be captured in a CUDA graph); and, with CUDA, the captured decode
step replayed. A tiny model config with random Q/K/V, no weights."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import dense_attention
from lab.memory.cache_manager import KVCacheManager
from lab.model.paged_cache import PagedKVCache, PagedStep, pool_config_for
from lab.model.transformer import ModelConfig
from tests.engine_helpers import DEVICE, HostSyncs

CONFIG = ModelConfig(num_layers=3, num_heads=8, num_kv_heads=2, head_dim=32)
QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def random_qkv(num_tokens: int, seed: int) -> list[QKV]:
    """Per layer: query [T, H, D], key and value [T, KV, D]."""
    gen = torch.Generator().manual_seed(seed)
    c = CONFIG
    return [tuple(torch.randn(num_tokens, heads, c.head_dim, generator=gen).to(DEVICE)
                  for heads in (c.num_heads, c.num_kv_heads, c.num_kv_heads))
            for _ in range(c.num_layers)]


def run_layers(step: PagedStep, qkv: list[QKV]) -> list[torch.Tensor]:
    return [step(layer, *tensors) for layer, tensors in enumerate(qkv)]


def decoding_cache() -> tuple[PagedKVCache, list[int]]:
    """Two prompts prefilled and a fork of the first (sharing its blocks), one new token
    appended to each: a decode step whose fork copied its shared partial block."""
    manager = KVCacheManager(pool_config_for(CONFIG, num_blocks=32, block_size=4), DEVICE)
    cache = PagedKVCache(manager, CONFIG, "every layer")
    cache.whole_batch = False  # a GPU's program layout, in the interpreter too
    ids = [cache.add(list(range(1, 10))), cache.add(list(range(20, 26)))]
    step = cache.begin_step(ids)
    run_layers(step, random_qkv(15, seed=0))
    cache.end_step(step)
    ids.append(cache.fork(ids[0]))
    for i, seq_id in enumerate(ids):
        cache.append(seq_id, 40 + i)
    return cache, ids


def test_a_decode_step_reads_nothing_back_from_the_device() -> None:
    cache, ids = decoding_cache()
    qkv = random_qkv(len(ids), seed=1)
    with HostSyncs() as setup:
        step = cache.begin_step(ids)  # builds its tensors from the host's lists
    with HostSyncs() as layers:
        outs = run_layers(step, qkv)
    assert setup.reads == []
    assert layers.reads == [] and layers.uploads == []
    cache.end_step(step)
    assert cache.reports[-1].check is not None and cache.reports[-1].check.ok
    pool = cache.manager.pool
    for layer, ((query, _, _), out) in enumerate(zip(qkv, outs)):  # each layer, not only the last
        ref = dense_attention(query, pool.key_caches[layer], pool.value_caches[layer],
                              step.block_tables, step.seq_lens, step.query_start_loc)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    cache.manager.check_invariants()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_decode_step_captured_in_a_cuda_graph_replays() -> None:
    """Capture the layers of a decode step (cache writes, attention, merges), replay them, then
    put new Q/K/V in the same buffers and replay again: the graph reads them, and writes and
    attends as an eager step does."""
    cache, ids = decoding_cache()
    cache.whole_batch = None  # the GPU's default
    qkv = random_qkv(len(ids), seed=2)
    eager = [out.clone() for out in run_layers(cache.begin_step(ids), qkv)]  # compiles too
    captured_step = cache.begin_step(ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run_layers(captured_step, qkv)
    graph.replay()
    torch.cuda.synchronize()
    for out, expected in zip(captured, eager):
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for tensors, fresh in zip(qkv, random_qkv(len(ids), seed=3)):
        for buffer, value in zip(tensors, fresh):
            buffer.copy_(value)
    graph.replay()
    step = cache.begin_step(ids)
    for out, expected in zip(captured, run_layers(step, qkv)):
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    cache.end_step(step)
    assert cache.reports[-1].check.ok
