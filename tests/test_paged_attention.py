"""The Triton paged-attention kernel against the dense float64 reference (CPU: interpreter).

Every case builds fresh random K/V in a NaN-filled cache (any read of a slot that is not part of
a sequence turns the output into NaN), behind a block table of shuffled physical ids whose
unused entries point outside the cache.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from kernels.attention_plan import H100_SMS, plan_attention
from kernels.backend import device
from kernels.paged_attention import launch_paged_attention, paged_attention, prepare_launch
from kernels.paged_inputs import check_paged_inputs
from kernels.reference import dense_attention, gather_kv, online_softmax_steps
from kernels.whole_batch import shared_prefix_len, whole_batch_layout

DEVICE = device()  # the backend's: CUDA when present, else the CPU (Triton's interpreter)


@dataclass(frozen=True)
class Case:
    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    seqs: tuple[tuple[int, int], ...]  # (new tokens, seq_len) per sequence


CASES = [
    Case("decode_edges_gqa1", 2, 2, 64, 16, ((1, 1), (1, 15), (1, 16), (1, 17))),
    Case("prefill_gqa4_d80", 8, 2, 80, 16, ((15, 15), (16, 16), (17, 17))),
    Case("mixed_gqa5_d128", 10, 2, 128, 16, ((5, 40), (1, 33), (9, 9))),
    Case("mqa_d96_bs128", 4, 1, 96, 128, ((1, 127), (1, 128), (3, 129), (1, 1))),
    Case("bs1_mixed", 4, 2, 64, 1, ((1, 1), (4, 20), (1, 50))),
    Case("bs24_gqa2", 6, 3, 64, 24, ((2, 25), (1, 24), (1, 23))),
    Case("empty_query_seq", 4, 2, 64, 16, ((1, 10), (0, 5), (2, 30))),
    Case("long_decode_d128", 8, 2, 128, 16, ((1, 300), (1, 457), (1, 17))),
    Case("long_chunked_prefill", 4, 4, 64, 32, ((260, 300), (1, 350))),
]


def make_inputs(case: Case, dtype: torch.dtype, device: str | torch.device,
                seed: int) -> dict[str, torch.Tensor]:
    """Random query, NaN-filled caches holding random K/V for each sequence, shuffled tables."""
    gen = torch.Generator().manual_seed(seed)
    bs, kvh, d = case.block_size, case.num_kv_heads, case.head_dim
    needed = [-(-seq_len // bs) for _, seq_len in case.seqs]
    num_blocks = sum(needed) + 3  # a few spare blocks nobody owns
    physical = torch.randperm(num_blocks, generator=gen)  # shuffled physical ids
    width = max(needed) + 2
    block_tables = torch.full((len(case.seqs), width), num_blocks + 7, dtype=torch.int32)
    key_cache = torch.full((num_blocks, bs, kvh, d), float("nan"))
    value_cache = torch.full((num_blocks, bs, kvh, d), float("nan"))
    used = 0
    for row, ((_, seq_len), n) in enumerate(zip(case.seqs, needed)):
        block_tables[row, :n] = physical[used:used + n]
        used += n
        pos = torch.arange(seq_len)
        blocks, offsets = block_tables[row, pos // bs].long(), pos % bs
        key_cache[blocks, offsets] = torch.randn(seq_len, kvh, d, generator=gen)
        value_cache[blocks, offsets] = torch.randn(seq_len, kvh, d, generator=gen)
    q_lens = torch.tensor([q for q, _ in case.seqs])
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)])
    query = torch.randn(int(q_lens.sum()), case.num_heads, d, generator=gen)
    tensors = {
        "query": query.to(dtype),  # [num_tokens, num_heads, head_dim]
        "key_cache": key_cache.to(dtype),  # [num_blocks, block_size, num_kv_heads, head_dim]
        "value_cache": value_cache.to(dtype),
        "block_tables": block_tables,  # [num_seqs, width]
        "seq_lens": torch.tensor([s for _, s in case.seqs], dtype=torch.int32),
        "query_start_loc": query_start_loc.to(torch.int32),  # [num_seqs + 1]
    }
    return {name: t.to(device) for name, t in tensors.items()}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


@pytest.mark.parametrize("whole_batch", [True, False], ids=["whole_batch", "per_sequence"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_dense_reference_float32(case: Case, whole_batch: bool) -> None:
    """Both program layouts: the interpreter's default (one program for many sequences and
    every head) and a GPU's (one program per sequence, KV head and tile of new tokens)."""
    inputs = make_inputs(case, torch.float32, DEVICE, seed=CASES.index(case))
    shapes = check_paged_inputs(**inputs)
    out = launch_paged_attention(shapes, **inputs, whole_batch=whole_batch)
    ref = dense_attention(**inputs)
    assert out.shape == inputs["query"].shape and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [CASES[2], CASES[4]], ids=lambda c: c.name)
def test_half_precision_in_the_interpreter(case: Case, dtype: torch.dtype) -> None:
    """The pool may hold fp16/bf16 on the CPU too (bf16 dots run in float32 there)."""
    inputs = make_inputs(case, dtype, DEVICE, seed=30)
    out = paged_attention(**inputs)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), dense_attention(**inputs).float(),
                               atol=1.5e-2, rtol=1e-2)


SPLIT_CASES = [CASES[7], Case("split_chunked_gqa2", 4, 2, 64, 16, ((6, 300), (1, 200), (2, 2)))]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.name)
def test_context_split_across_programs_matches(case: Case) -> None:
    """The flash-decoding path (a GPU takes it for long contexts) forced on: 2 and 5 splits,
    so some splits of short sequences see no key at all."""
    inputs = make_inputs(case, torch.float32, DEVICE, seed=20)
    shapes = check_paged_inputs(**inputs)
    ref = dense_attention(**inputs)
    for num_splits in (2, 5):
        out = launch_paged_attention(shapes, **inputs, num_splits=num_splits)
        assert relative_error(out, ref) < 1e-5
    with pytest.raises(ValueError, match="num_splits"):
        launch_paged_attention(shapes, **inputs, num_splits=2, whole_batch=True)


# Shapes whose GPU plan takes each of its paths: query tiles found by a binary search (a
# prefill longer than a tile), contexts split and merged (chunks of MIN_SPLIT_KEYS), a
# sequence with no keys first, head_dim short of a power of two (masked K/V loads), block
# size 32 and 128, one KV head.
GPU_PLAN_CASES = [
    Case("tiles_and_splits_gqa4", 8, 2, 64, 16, ((40, 40), (1, 700), (17, 300))),
    Case("zero_length_first_gqa4", 16, 4, 64, 16, ((0, 0), (1, 700), (3, 40))),
    Case("decodes_and_a_prefill_d128_bs32", 8, 2, 128, 32, ((1, 900), (1, 33), (70, 70))),
    Case("masked_d80", 8, 2, 80, 16, ((1, 600), (20, 20))),
    CASES[3],  # mqa_d96_bs128
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", GPU_PLAN_CASES, ids=lambda c: c.name)
def test_an_h100s_plan_matches_in_the_interpreter(case: Case, dtype: torch.dtype) -> None:
    """The launch an H100/H200 would get (its tile sizes, split count, in-kernel chunking and
    merge), run by the interpreter here: the GPU path's index arithmetic is checked on a
    machine without one (a GPU then adds only code generation, which tests/test_kernels_aot.py
    checks)."""
    inputs = make_inputs(case, dtype, DEVICE, seed=40 + GPU_PLAN_CASES.index(case))
    shapes = check_paged_inputs(**inputs)
    plan = plan_attention(shapes, dtype, compiled=True, num_sms=H100_SMS)
    assert not plan.whole_batch and not plan.dot_f32
    out = prepare_launch(plan, shapes, **inputs).run()
    ref = dense_attention(**inputs)
    if dtype == torch.float32:
        assert relative_error(out, ref) < 1e-5
    else:
        torch.testing.assert_close(out.float(), ref.float(), atol=1.5e-2, rtol=1e-2)


def test_the_h100_plan_cases_take_every_path() -> None:
    plans = [plan_attention(check_paged_inputs(**make_inputs(c, torch.float16, "cpu", 0)),
                            torch.float16, compiled=True, num_sms=H100_SMS)
             for c in GPU_PLAN_CASES]
    assert any(p.num_splits > 1 for p in plans) and any(p.num_splits == 1 for p in plans)
    assert any(not p.one_tile_per_seq for p in plans) and any(p.one_tile_per_seq for p in plans)
    assert any(p.head_pad > c.head_dim for p, c in zip(plans, GPU_PLAN_CASES))


def test_custom_scale_and_strided_query() -> None:
    inputs = make_inputs(CASES[2], torch.float32, DEVICE, seed=7)
    wide = torch.randn(inputs["query"].shape[0], 2 * CASES[2].num_heads, CASES[2].head_dim,
                       generator=torch.Generator().manual_seed(8)).to(DEVICE)
    inputs["query"] = wide[:, 1::2]  # a strided view: every other head
    out = paged_attention(**inputs, scale=0.3)
    ref = dense_attention(**inputs, scale=0.3)
    assert relative_error(out, ref) < 1e-5
    contiguous = {**inputs, "query": inputs["query"].contiguous()}
    assert torch.equal(out, paged_attention(**contiguous, scale=0.3))
    assert relative_error(out, dense_attention(**inputs)) > 1e-3  # the scale did matter


def test_output_depends_on_block_table_mapping() -> None:
    """Swapping two table entries changes causal attention: the kernel reads through the table."""
    case = Case("swap", 2, 2, 64, 4, ((4, 12),))  # new tokens at 8..11 see part of block 2
    inputs = make_inputs(case, torch.float32, DEVICE, seed=3)
    out = paged_attention(**inputs)
    swapped = inputs["block_tables"].clone()
    swapped[0, [0, 2]] = swapped[0, [2, 0]]
    out_swapped = paged_attention(**{**inputs, "block_tables": swapped})
    ref_swapped = dense_attention(**{**inputs, "block_tables": swapped})
    assert relative_error(out_swapped, ref_swapped) < 1e-5
    assert not torch.allclose(out, out_swapped)


def test_gather_kv_follows_the_block_table() -> None:
    cache = torch.randn(6, 4, 2, 8, generator=torch.Generator().manual_seed(0))
    table = torch.tensor([5, 0, 3], dtype=torch.int32)
    got = gather_kv(cache, table, 10)  # [10, 2, 8]
    expected = torch.cat([cache[5], cache[0], cache[3, :2]])
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="^length"):
        gather_kv(cache, table, 13)


def test_online_softmax_steps_end_at_softmax() -> None:
    gen = torch.Generator().manual_seed(4)
    query, keys, values = (torch.randn(16, generator=gen), torch.randn(37, 16, generator=gen),
                           torch.randn(37, 16, generator=gen))
    steps = online_softmax_steps(query, keys, values, block_size=8)
    assert [s.block for s in steps] == [0, 1, 2, 3, 4]
    maxima = [s.running_max for s in steps]
    assert maxima == sorted(maxima)  # the running max never decreases
    scores = keys.double() @ query.double() / 4.0  # scale = 16 ** -0.5
    assert steps[-1].running_max == pytest.approx(scores.max().item())
    assert steps[-1].running_sum == pytest.approx(torch.exp(scores - scores.max()).sum().item())
    expected = torch.softmax(scores, 0) @ values.double()
    assert torch.allclose(steps[-1].output, expected, atol=1e-12)


def _bad(name: str, **changes: object) -> tuple[str, dict[str, object]]:
    return name, changes


def int32s(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


BASE = Case("base", 4, 2, 64, 16, ((1, 20), (3, 3)))
T = make_inputs(BASE, torch.float32, DEVICE, seed=11)
BAD_INPUTS = [
    _bad("query", query=T["query"][0]),
    _bad("query", query=T["query"].to(torch.int32)),
    _bad("query", query=torch.randn(4, 3, 64, device=DEVICE)),  # 3 heads over 2 KV heads
    _bad("query", query=[[0.0]]),
    _bad("key_cache", key_cache=T["key_cache"].half()),
    _bad("key_cache", query=torch.randn(4, 4, 32, device=DEVICE)),  # head_dim 32 vs the cache's 64
    _bad("key_cache", key_cache=T["key_cache"].transpose(2, 3).contiguous().transpose(2, 3)),
    _bad("value_cache", value_cache=T["value_cache"][:, :8]),
    _bad("block_tables", block_tables=T["block_tables"].long()),
    _bad("block_tables", block_tables=T["block_tables"][:, :1]),
    _bad("block_tables", block_tables=T["block_tables"][:1]),
    _bad("block_tables", block_tables=torch.full_like(T["block_tables"], -1)),
    _bad("seq_lens", seq_lens=T["seq_lens"].long()),
    _bad("seq_lens", seq_lens=int32s(20, 2)),  # 2 < 3 new tokens
    _bad("seq_lens", seq_lens=T["seq_lens"].to("meta")),
    _bad("query_start_loc", query_start_loc=T["query_start_loc"][:2]),
    _bad("query_start_loc", query_start_loc=int32s(0, 1, 3)),
    _bad("query_start_loc", query_start_loc=int32s(0, 5, 4)),
    _bad("scale", scale=float("nan")),
]


@pytest.mark.parametrize(("name", "changes"), BAD_INPUTS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_INPUTS)])
def test_bad_input_raises_value_error_naming_the_argument(name: str,
                                                          changes: dict[str, object]) -> None:
    inputs = {**T, **changes}
    with pytest.raises(ValueError, match=f"^{name}:"):
        paged_attention(**inputs)
    with pytest.raises(ValueError, match=f"^{name}:"):
        dense_attention(**inputs)


def test_whole_batch_layout_lays_rows_and_contexts_end_to_end() -> None:
    """Sequence 0: 3 keys, its last one new; sequence 1: 2 keys, both new. Two query heads on
    one KV head, head_dim 2; blocks of 2 slots; block tables [[5, 7], [4, 0]]."""
    query = torch.arange(12, dtype=torch.float32).view(3, 2, 2)  # [T, H, D]
    tables = torch.tensor([[5, 7], [4, 0]], dtype=torch.int32)
    layout = whole_batch_layout(query, tables, torch.tensor([3, 2], dtype=torch.int32),
                                torch.tensor([0, 1, 3], dtype=torch.int32), num_kv_heads=1,
                                block_size=2, slot_stride=10, head_stride=100,
                                rows_per_program=4, head_pad=4, tile_n=2)
    # rows: (token, head), padded from 6 to 8 with copies of the last token's
    assert layout.first_key.tolist() == [0, 0, 3, 3, 3, 3, 3, 3]
    assert layout.last_key.tolist() == [2, 2, 3, 3, 4, 4, 4, 4]
    assert layout.query_rows.shape == (8, 4)
    assert layout.query_rows[:6, :2].equal(query.view(6, 2))
    assert not layout.query_rows[:, 2:].any() and not layout.query_rows[6:].any()
    # keys: sequence 0's positions 0-2, then sequence 1's 0-1; entries index the table as
    # row * 2 + logical block; padded by one tile (2) with the last key's entry
    assert layout.key_entry.tolist() == [0, 0, 1, 2, 2, 2, 2]
    assert layout.key_slot_offs.tolist() == [0, 10, 0, 0, 10, 10, 10]  # slot * slot_stride
    assert tables.view(-1)[layout.key_entry[:5]].tolist() == [5, 5, 7, 4, 4]
    # program 0: rows 0-3 (tokens 0, 1) walk keys [0, 4); program 1: rows 4-7 keys [3, 5)
    assert layout.program_lo.tolist() == [0, 3] and layout.program_end.tolist() == [4, 5]
    assert (layout.shared_last < layout.shared_first).all()  # nothing shared


def test_whole_batch_layout_gives_each_kv_head_its_own_columns() -> None:
    """One sequence of 3 keys (one new), 4 query heads on 2 KV heads: KV head 0's three columns,
    then KV head 1's; query heads 0-1 see the first three, heads 2-3 the last three."""
    query = torch.randn(1, 4, 3)  # [T, H, D]
    layout = whole_batch_layout(query, torch.tensor([[6, 2]], dtype=torch.int32),
                                torch.tensor([3], dtype=torch.int32),
                                torch.tensor([0, 1], dtype=torch.int32), num_kv_heads=2,
                                block_size=2, slot_stride=10, head_stride=100,
                                rows_per_program=16, head_pad=4, tile_n=16)
    assert layout.first_key[:4].tolist() == [0, 0, 3, 3]
    assert layout.last_key[:4].tolist() == [2, 2, 5, 5]
    assert layout.key_entry[:6].tolist() == [0, 0, 1, 0, 0, 1]
    assert layout.key_slot_offs[:6].tolist() == [0, 10, 0, 100, 110, 100]
    assert layout.query_rows[:4, :3].equal(query[0]) and not layout.query_rows[4:].any()


def share_prefix(inputs: dict[str, torch.Tensor], blocks: int) -> dict[str, torch.Tensor]:
    """Every sequence's first `blocks` table entries point at sequence 0's (as forks of one
    prompt do); the blocks the others held there are filled with NaN, so reading them shows."""
    tables, key_cache, value_cache = (inputs[n].clone() for n in
                                      ("block_tables", "key_cache", "value_cache"))
    dropped = tables[1:, :blocks].reshape(-1).long()
    key_cache[dropped] = float("nan")
    value_cache[dropped] = float("nan")
    tables[1:, :blocks] = tables[0, :blocks]
    return {**inputs, "block_tables": tables, "key_cache": key_cache, "value_cache": value_cache}


SHARED_CASES = [  # (case, blocks shared, keys the batch's rows share)
    (Case("forks_decode", 9, 3, 64, 16, ((1, 40), (1, 37), (1, 50), (1, 33))), 2, 32),
    # sequence 0's new tokens (positions 30-39) straddle the shared prefix's end (32)
    (Case("prefill_across_prefix", 4, 2, 64, 16, ((10, 40), (1, 45), (3, 34))), 2, 32),
    # the tables share 2 blocks but sequence 1 fills only 1 of them: 16 keys shared
    (Case("short_sequence", 4, 2, 64, 16, ((1, 40), (2, 20), (1, 33))), 2, 16),
]


@pytest.mark.parametrize(("case", "blocks", "keys"), SHARED_CASES,
                         ids=[c.name for c, _, _ in SHARED_CASES])
def test_whole_batch_reads_a_shared_prefix_once_and_matches_the_reference(
        case: Case, blocks: int, keys: int) -> None:
    inputs = share_prefix(make_inputs(case, torch.float32, DEVICE, seed=7), blocks)
    bs = case.block_size
    assert shared_prefix_len(inputs["block_tables"], inputs["seq_lens"], bs) == keys
    ref = dense_attention(**inputs)
    assert not ref.isnan().any()
    for whole_batch in (True, False):
        out = launch_paged_attention(check_paged_inputs(**inputs), **inputs,
                                     whole_batch=whole_batch)
        assert relative_error(out, ref) < 1e-5, whole_batch


def test_shared_prefix_len_counts_whole_equal_blocks_every_sequence_fills() -> None:
    tables = torch.tensor([[3, 4, 5, 6], [3, 4, 9, 8], [3, 4, 5, 7]], dtype=torch.int32)
    lens = torch.tensor([64, 64, 64], dtype=torch.int32)
    assert shared_prefix_len(tables, lens, 16) == 32  # column 2 differs in row 1
    assert shared_prefix_len(tables, torch.tensor([64, 31, 64], dtype=torch.int32), 16) == 16
    assert shared_prefix_len(tables[:1], lens[:1], 16) == 0  # one sequence shares nothing
    assert shared_prefix_len(torch.tensor([[1, 2], [0, 2]], dtype=torch.int32),
                             torch.tensor([32, 32], dtype=torch.int32), 16) == 0


def test_whole_batch_layout_lays_a_shared_prefix_once() -> None:
    """Two sequences of 5 and 4 keys sharing their first 2 (block size 2, table width 3); one
    new token each, one head."""
    tables = torch.tensor([[6, 1, 2], [6, 3, 0]], dtype=torch.int32)
    layout = whole_batch_layout(torch.ones(2, 1, 2), tables, torch.tensor([5, 4]),
                                torch.tensor([0, 1, 2]), num_kv_heads=1, block_size=2,
                                slot_stride=1, head_stride=100, rows_per_program=16,
                                head_pad=16, tile_n=4, shared=2)
    # columns: shared positions 0-1 and sequence 0's 2-4 (table row 0), sequence 1's 2-3 (row 1)
    assert tables.view(-1)[layout.key_entry[:7]].tolist() == [6, 6, 1, 1, 2, 3, 3]
    assert layout.key_slot_offs[:7].tolist() == [0, 1, 0, 1, 0, 0, 1]
    # row 0 (sequence 0, position 4) sees columns 2-4 and shared 0-1; row 1 (sequence 1,
    # position 3) sees columns 5-6 and shared 0-1
    assert layout.first_key[:2].tolist() == [2, 5] and layout.last_key[:2].tolist() == [4, 6]
    assert layout.shared_first[:2].tolist() == [0, 0]
    assert layout.shared_last[:2].tolist() == [1, 1]
    assert layout.program_lo.tolist() == [0] and layout.program_end.tolist() == [7]


def test_kernels_from_several_threads_take_turns() -> None:
    """Streamlit serves each browser session in its own thread. Triton's interpreter patches
    triton.language process-wide while a kernel runs, so concurrent launches must take turns
    (kernels.backend.kernel_launch); unguarded, this test fails with interpreter errors."""
    inputs = [make_inputs(CASES[2], torch.float32, DEVICE, seed=40 + i) for i in range(3)]
    refs = [dense_attention(**x) for x in inputs]
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            for _ in range(4):
                assert relative_error(paged_attention(**inputs[i]), refs[i]) < 1e-5
        except Exception as e:
            errors.append(f"input {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("whole_batch", [True, False], ids=["whole_batch", "per_sequence"])
def test_a_zero_length_sequence_first_in_the_batch(whole_batch: bool) -> None:
    """Sequence 0 has no keys, so none of its block-table entries is used or checked (they
    point outside the cache): no program may read through them, padding included."""
    case = Case("zero_length_first", 4, 2, 64, 16, ((0, 0), (1, 10), (2, 20)))
    inputs = make_inputs(case, torch.float32, DEVICE, seed=12)
    for name in ("key_cache", "value_cache"):  # NaN past the cache: a read there shows
        cache = inputs[name]
        room = torch.full((cache.shape[0] + 16, *cache.shape[1:]), float("nan"),
                          device=cache.device)
        room[:cache.shape[0]] = cache
        inputs[name] = room[:cache.shape[0]]
    assert (inputs["block_tables"][0] >= inputs["key_cache"].shape[0]).all()
    out = launch_paged_attention(check_paged_inputs(**inputs), **inputs, whole_batch=whole_batch)
    assert torch.isfinite(out).all()
    assert relative_error(out, dense_attention(**inputs)) < 1e-5
