"""The compiled kernels on a CUDA device: half precision against the float64 reference.

Skipped cleanly on machines without CUDA (the CPU tests cover float32 in the interpreter).
"""

from __future__ import annotations

import pytest
import torch

from kernels.cache_ops import copy_blocks, write_kv
from kernels.paged_attention import launch_paged_attention, paged_attention
from kernels.paged_inputs import check_paged_inputs
from kernels.reference import dense_attention
from tests.test_attention_windows import local_inputs
from tests.test_paged_attention import CASES, Case, make_inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HALF_DTYPES = [torch.bfloat16, torch.float16]
GPU_CASES = CASES + [
    Case("decode_batch_32x8_d128", 32, 8, 128, 16, tuple((1, 100 + 37 * i) for i in range(24))),
    Case("long_prefill_d128", 32, 8, 128, 16, ((700, 1500), (1, 2049), (64, 64))),
    Case("few_long_contexts_split", 32, 8, 128, 16, ((1, 5000), (1, 3001))),  # flash-decoding
    # one long context among short ones: split as much as it needs, the short ones barely
    Case("one_long_among_short", 32, 8, 128, 16, ((1, 20000),) + ((1, 100),) * 31),
    Case("decodes_and_a_prefill_bs32", 32, 8, 128, 32, ((1, 900),) * 8 + ((2048, 2048),)),
    Case("zero_length_first_d64", 16, 4, 64, 16, ((0, 0), (1, 700), (3, 40))),
]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_kernel_matches_dense_reference_half(case: Case, dtype: torch.dtype) -> None:
    inputs = make_inputs(case, dtype, "cuda", seed=GPU_CASES.index(case))
    out = paged_attention(**inputs)
    ref = dense_attention(**inputs)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=1.5e-2, rtol=1e-2)


LOCAL_CASE = Case("local_gqa8_d64", 64, 8, 64, 16, ((1, 5000), (300, 2000), (1, 130)))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("limits", [{"sliding_window": 128}, {"attention_chunk_size": 1024}],
                         ids=["sliding_window128", "chunk1024"])
def test_local_attention_half(limits: dict[str, int], dtype: torch.dtype) -> None:
    """gpt-oss-like sliding window and a Llama-4-like chunk, compiled, with null entries
    (-1 and a NaN-filled garbage block, tests/test_attention_windows.py) in the tables."""
    inputs = local_inputs(LOCAL_CASE, limits, dtype)
    out = paged_attention(**inputs, **limits)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), dense_attention(**inputs, **limits).float(),
                               atol=1.5e-2, rtol=1e-2)


@pytest.mark.parametrize("whole_batch", [False, True], ids=["per_sequence", "whole_batch"])
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: c.name)
def test_kernel_matches_dense_reference_float32(case: Case, whole_batch: bool) -> None:
    """Compiled, both program layouts (a GPU's default is per sequence)."""
    inputs = make_inputs(case, torch.float32, "cuda", seed=CASES.index(case))
    out = launch_paged_attention(check_paged_inputs(**inputs), **inputs, whole_batch=whole_batch)
    ref = dense_attention(**inputs)
    assert ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item() < 1e-5


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_cache_ops_round_trip(dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (32, 16, 8, 128)  # [num_blocks, block_size, num_kv_heads, head_dim]
    key_cache = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    value_cache = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    n = 300
    slots = torch.randperm(32 * 16, generator=gen, device="cuda")[:n]
    key = torch.randn(n, 8, 128, generator=gen, device="cuda").to(dtype)
    write_kv(key_cache, value_cache, key, -key, slots)
    assert torch.equal(key_cache.view(-1, 8, 128)[slots], key)
    assert torch.equal(value_cache.view(-1, 8, 128)[slots], -key)

    copy_blocks(key_cache, value_cache, torch.tensor([[0, 31], [5, 6]], device="cuda"))
    assert torch.equal(key_cache[31], key_cache[0]) and torch.equal(value_cache[6], value_cache[5])
    untouched = torch.ones(32 * 16, dtype=torch.bool, device="cuda")
    untouched[slots] = False
    untouched.view(32, 16)[[31, 6]] = False
    assert torch.equal(key_cache.view(-1, 8, 128)[untouched], before_k.view(-1, 8, 128)[untouched])
    assert torch.equal(value_cache.view(-1, 8, 128)[untouched],
                       before_v.view(-1, 8, 128)[untouched])


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_a_pool_past_two_billion_elements(dtype: torch.dtype) -> None:
    """K/V offsets past 2^31 elements (int64 index arithmetic): the sequences' blocks sit at
    the end of a 2.3-billion-element pool (4.6 GB per cache), every other block NaN."""
    num_blocks, bs, kv_heads, d = 140_000, 16, 8, 128
    assert num_blocks * bs * kv_heads * d > 2**31
    seqs = ((1, 300), (5, 1000), (1, 33))  # (new tokens, seq_len)
    gen = torch.Generator(device="cuda").manual_seed(7)
    key_cache = torch.full((num_blocks, bs, kv_heads, d), float("nan"), dtype=dtype,
                           device="cuda")
    value_cache = torch.full_like(key_cache, float("nan"))
    needed = [-(-s // bs) for _, s in seqs]
    tail = num_blocks - sum(needed) + torch.randperm(sum(needed), generator=gen, device="cuda")
    block_tables = torch.zeros(len(seqs), max(needed), dtype=torch.int32, device="cuda")
    for row, n in enumerate(needed):
        block_tables[row, :n] = tail[sum(needed[:row]):sum(needed[:row + 1])]
    used = tail.long()
    key_cache[used] = torch.randn(key_cache[used].shape, generator=gen, device="cuda").to(dtype)
    value_cache[used] = torch.randn(key_cache[used].shape, generator=gen,
                                    device="cuda").to(dtype)
    q_lens = torch.tensor([q for q, _ in seqs])
    inputs = {
        "query": torch.randn(int(q_lens.sum()), 32, d, generator=gen, device="cuda").to(dtype),
        "key_cache": key_cache, "value_cache": value_cache, "block_tables": block_tables,
        "seq_lens": torch.tensor([s for _, s in seqs], dtype=torch.int32, device="cuda"),
        "query_start_loc": torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)])
        .to(torch.int32).cuda(),
    }
    out = paged_attention(**inputs)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), dense_attention(**inputs).float(),
                               atol=1.5e-2, rtol=1e-2)
