"""Local attention layers (a sliding window, chunked local attention) through the paged-attention
kernel, both program layouts, against the float64 reference with the same mask.

The tables are vLLM's for such a layer: a sequence's entries wholly before the first key its
first new token sees hold the null block. Here the rows that have such entries hold -1 there
(the traces' null) and a garbage block id in turn; the garbage block, the block just before the
cache (where -1 points) and every block the null entries held before are NaN-filled, so any
read of them turns the output into NaN. The shapes are odd on purpose: head_dim 80, 5 query
heads per KV head, lengths 1 and block_size - 1, block_size, block_size + 1, windows and chunks
that do not divide the block size, decode and chunked prefill.
"""

from __future__ import annotations

import pytest
import torch

from kernels.attention_plan import H100_SMS, choose_num_splits, plan_attention, tile_keys
from kernels.paged_attention import launch_paged_attention, paged_attention, prepare_launch
from kernels.paged_inputs import (
    AttentionShapes,
    HostBatch,
    check_paged_inputs,
    first_visible_key,
)
from kernels.reference import dense_attention
from tests.test_paged_attention import DEVICE, Case, make_inputs, relative_error

LOCAL_CASES = [
    Case("decode_gqa5_d80", 10, 2, 80, 16,
         ((1, 1), (1, 15), (1, 16), (1, 17), (1, 61), (1, 44))),
    Case("prefill_chunks_gqa5_d80", 10, 2, 80, 16,
         ((15, 15), (17, 17), (9, 40), (5, 70), (3, 50))),
]
LIMITS = [{"sliding_window": 7}, {"sliding_window": 20}, {"attention_chunk_size": 24}]


def with_null_entries(inputs: dict[str, torch.Tensor], limits: dict[str, int],
                      all_garbage: bool = False) -> tuple[dict[str, torch.Tensor], list[int]]:
    """The inputs with vLLM's null entries for this layer (see the module docstring: -1 and a
    garbage id in turn, or only the garbage id), and the null value of each row that has
    some."""
    shapes = check_paged_inputs(**inputs, **limits)
    tables = inputs["block_tables"].clone()
    num_blocks = inputs["key_cache"].shape[0]
    caches = {}
    for name in ("key_cache", "value_cache"):  # one NaN block before the cache: block -1
        room = torch.full((num_blocks + 1, *inputs[name].shape[1:]), float("nan"),
                          dtype=inputs[name].dtype, device=inputs[name].device)
        room[1:] = inputs[name]
        caches[name] = room[1:]
    owned = {int(b) for row, n in enumerate(shapes.seq_lens)
             for b in tables[row, :-(-n // shapes.block_size)]}
    garbage = min(set(range(num_blocks)) - owned)  # NaN: make_inputs fills unowned blocks so
    nulls: list[int] = []
    for row, first_key in enumerate(shapes.first_keys()):
        dropped = first_key // shapes.block_size
        if not dropped:
            continue
        for cache in caches.values():  # freed: whatever lands there later is not this one's
            cache[tables[row, :dropped].long()] = float("nan")
        nulls.append(garbage if all_garbage or len(nulls) % 2 else -1)
        tables[row, :dropped] = nulls[-1]
    return {**inputs, **caches, "block_tables": tables}, nulls


def local_inputs(case: Case, limits: dict[str, int], dtype: torch.dtype = torch.float32,
                 all_garbage: bool = False) -> dict[str, torch.Tensor]:
    inputs, nulls = with_null_entries(make_inputs(case, dtype, DEVICE, seed=70), limits,
                                      all_garbage)
    assert len(set(nulls)) == (1 if all_garbage else 2)  # the case has both kinds to avoid
    return inputs


def test_the_rule_is_vllms() -> None:
    """A window of 4 at position 10 sees 7-10, the last 4 positions (FlashAttention's window
    (3, 0); vLLM's sliding-window manager skips the first c - W + 1 = 7 tokens); a chunk of 8
    sees from its chunk's start (vLLM skips c // 8 * 8 tokens)."""
    assert first_visible_key(10, sliding_window=4) == 7
    assert first_visible_key(2, sliding_window=4) == 0
    assert first_visible_key(10, chunk=8) == 8 and first_visible_key(7, chunk=8) == 0
    assert first_visible_key(10) == 0
    positions = torch.tensor([0, 3, 8, 15, 16])
    assert first_visible_key(positions, 8, 16).tolist() == [0, 0, 1, 8, 16]


@pytest.mark.parametrize("whole_batch", [True, False], ids=["whole_batch", "per_sequence"])
@pytest.mark.parametrize("limits", LIMITS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("case", LOCAL_CASES, ids=lambda c: c.name)
def test_local_attention_matches_the_masked_reference(case: Case, limits: dict[str, int],
                                                      whole_batch: bool) -> None:
    inputs = local_inputs(case, limits)
    shapes = check_paged_inputs(**inputs, **limits)
    out = launch_paged_attention(shapes, **inputs, whole_batch=whole_batch)
    ref = dense_attention(**inputs, **limits)
    assert torch.isfinite(out).all() and torch.isfinite(ref).all()
    assert relative_error(out, ref) < 1e-5
    # the mask matters: full causal attention over the same keys differs
    assert relative_error(ref, dense_attention(**make_inputs(case, torch.float32, DEVICE,
                                                             seed=70))) > 1e-3


LONG = Case("long_local_gqa5_d80", 10, 2, 80, 16, ((1, 700), (6, 500), (1, 17), (9, 300)))


@pytest.mark.parametrize("limits", [{"sliding_window": 300}, {"attention_chunk_size": 400}],
                         ids=["sliding_window300", "chunk400"])
def test_an_h100s_plan_and_splits_with_a_window(limits: dict[str, int]) -> None:
    """The launch an H100 would get: query tiles found by binary search, masked head_dim 80
    loads, and each tile's keys split across programs (flash-decoding), the longest's 300 in
    a share of 256 keys and the rest, a short sequence's second share empty."""
    inputs = local_inputs(LONG, limits)
    shapes = check_paged_inputs(**inputs, **limits)
    ref = dense_attention(**inputs, **limits)
    plan = plan_attention(shapes, torch.float32, compiled=True, num_sms=H100_SMS)
    assert not plan.whole_batch and not plan.one_tile_per_seq and plan.num_splits == 2
    out = prepare_launch(plan, shapes, **inputs).run()
    assert torch.isfinite(out).all()
    assert relative_error(out, ref) < 1e-5


def test_a_kernel_that_read_the_null_entries_would_fail() -> None:
    """The poison is real: the same tables through full attention read the garbage block
    (NaN out) or, with -1, are refused by the checks."""
    case, limits = LOCAL_CASES[0], LIMITS[0]
    with pytest.raises(ValueError, match="^block_tables:"):
        paged_attention(**local_inputs(case, limits))  # full attention uses the -1 entries
    garbage = local_inputs(case, limits, all_garbage=True)
    shapes = check_paged_inputs(**garbage)  # full attention: the garbage id is in range
    for whole_batch in (True, False):
        out = launch_paged_attention(shapes, **garbage, whole_batch=whole_batch)
        assert out[4:].isnan().all()  # the sequences of 61 and 44 keys read their null entries
    assert torch.isfinite(paged_attention(**garbage, **limits)).all()


def test_the_plan_reads_only_the_window() -> None:
    """A decode at position 32,767 with a window of 128 reads the window's 8 blocks (at 32,769:
    9, the window straddles a block boundary), so it is not split; with Llama-4's chunk of
    8,192 it reads the chunk, split in shares of 256 keys or more on an H100."""
    def shapes(seq_len: int = 32768, **limits: int) -> AttentionShapes:
        return AttentionShapes(1, 32, 8, 128, 1, 16, (seq_len,), (1,), 0.1, **limits)

    assert tile_keys(shapes(), 1) == [32768]
    assert tile_keys(shapes(sliding_window=128), 1) == [128]  # 32640-32767
    assert tile_keys(shapes(32770, sliding_window=128), 1) == [130]  # from 32642 // 16 * 16
    assert choose_num_splits(shapes(sliding_window=128), 1, H100_SMS) == 1
    chunked = shapes(attention_chunk_size=8192)
    assert tile_keys(chunked, 1) == [8192]  # position 32767 sees its chunk [24576, 32767]
    assert 2 <= choose_num_splits(chunked, 1, H100_SMS) <= 32


def test_a_host_batch_checks_only_the_visible_entries() -> None:
    case, limits = LOCAL_CASES[1], LIMITS[1]
    inputs = local_inputs(case, limits)
    shapes = check_paged_inputs(**inputs, **limits)
    host = HostBatch.from_tables(list(shapes.seq_lens), list(shapes.query_lens),
                                 case.block_size, inputs["block_tables"].tolist(), **limits)
    assert host.min_block >= 0
    assert check_paged_inputs(**inputs, host=host, **limits) == shapes


@pytest.mark.parametrize(("name", "limits"), [
    ("sliding_window", {"sliding_window": 0}), ("sliding_window", {"sliding_window": 2.5}),
    ("sliding_window", {"sliding_window": True}),
    ("attention_chunk_size", {"attention_chunk_size": -8}),
    ("sliding_window", {"sliding_window": 8, "attention_chunk_size": 16}),
])
def test_bad_limits_raise_value_error_naming_the_argument(name: str,
                                                          limits: dict[str, object]) -> None:
    inputs = make_inputs(LOCAL_CASES[0], torch.float32, DEVICE, seed=1)
    for attention in (paged_attention, dense_attention):
        with pytest.raises(ValueError, match=f"^{name}:"):
            attention(**inputs, **limits)
