"""The launch plan for a GPU, decided from shapes alone (kernels/attention_plan.py), and the
checks that read nothing back from the device (a HostBatch, check_slots on a host list)."""

from __future__ import annotations

import pytest
import torch

from kernels.attention_plan import H100_SMS, AttentionPlan, plan_attention
from kernels.cache_ops import check_slots
from kernels.paged_inputs import AttentionShapes, HostBatch, check_paged_inputs
from tests.test_paged_attention import BASE, DEVICE, make_inputs


def gpu_plan(seqs: tuple[tuple[int, int], ...], heads: int = 32, kv_heads: int = 8,
             head_dim: int = 128) -> AttentionPlan:
    """The plan on an H100/H200 for (new tokens, seq_len) per sequence, bf16."""
    shapes = AttentionShapes(sum(q for q, _ in seqs), heads, kv_heads, head_dim, len(seqs), 16,
                             tuple(s for _, s in seqs), tuple(q for q, _ in seqs), 0.1)
    return plan_attention(shapes, torch.bfloat16, compiled=True, num_sms=H100_SMS)


def programs(plan: AttentionPlan) -> int:
    x, y, z = plan.grid
    return x * y * z


def test_splits_fill_the_gpu_two_to_four_programs_an_sm() -> None:
    for seqs in (((1, 32768),), ((1, 8192),) * 8, ((1, 2048),) * 8):
        plan = gpu_plan(seqs)
        assert plan.num_splits > 1
        assert 2 * H100_SMS <= programs(plan) <= 4 * H100_SMS, (seqs, plan.grid)
    assert gpu_plan(((1, 32768),)).num_splits == 50
    assert gpu_plan(((1, 1000),)).num_splits == 4  # chunks of at least 256 keys


def test_full_batches_and_prefills_are_not_split() -> None:
    for seqs in (((1, 2048),) * 64, ((1, 2048),) * 256, ((2048, 2048),),
                 ((1, 2048),) * 63 + ((2048, 2048),)):
        assert gpu_plan(seqs).num_splits == 1, seqs


def test_one_long_context_among_short_ones_is_split() -> None:
    """256 programs already fill the SMs, but the 32k context alone would outlast them all:
    its share per split is at most the batch's keys (x 8 KV heads) per resident program."""
    plan = gpu_plan(((1, 32768),) + ((1, 100),) * 255)
    assert plan.num_splits >= 16
    assert 32768 / plan.num_splits <= (32768 + 255 * 100) * 8 / (3 * H100_SMS)


def test_query_tiles_lie_on_grid_x() -> None:
    decode = gpu_plan(((1, 500),) * 5)
    assert decode.one_tile_per_seq and decode.grid == (5, 8, decode.num_splits)
    mixed = gpu_plan(((1, 500),) * 5 + ((100, 100),))
    assert not mixed.one_tile_per_seq
    assert mixed.grid[0] == 105 // mixed.block_q + 6  # tiles end to end, one spare a sequence
    huge = gpu_plan(((1 << 20, 1 << 20),))  # a 1M-token prefill: past grid z's 65,535
    assert huge.grid == ((1 << 20) // huge.block_q + 1, 8, 1)


def test_a_host_batch_checks_without_reading_the_device() -> None:
    inputs = make_inputs(BASE, torch.float32, DEVICE, seed=11)
    tables = inputs["block_tables"].tolist()
    host = HostBatch.from_tables([20, 3], [1, 3], BASE.block_size, tables)
    assert check_paged_inputs(**inputs, host=host) == check_paged_inputs(**inputs)
    num_blocks = inputs["key_cache"].shape[0]
    bad = [("block_tables", HostBatch((20, 3), (1, 3), 0, num_blocks)),
           ("block_tables", HostBatch((20, 3), (1, 3), -1, 2)),
           ("seq_lens", HostBatch((20,), (1,))),
           ("seq_lens", HostBatch((20, 2), (1, 3))),  # 2 < 3 new tokens
           ("query_start_loc", HostBatch((20, 3), (1, 2)))]  # 3 tokens for a 4-token query
    for name, host in bad:
        with pytest.raises(ValueError, match=f"^{name}:"):
            check_paged_inputs(**inputs, host=host)


@pytest.mark.parametrize("as_tensor", [False, True], ids=["host list", "device tensor"])
def test_check_slots(as_tensor: bool) -> None:
    def slots(*values: int) -> list[int] | torch.Tensor:
        return torch.tensor(values, device=DEVICE) if as_tensor else list(values)
    check_slots(slots(3, -1, 0, -1, 7), num_slots=8)  # skipped tokens may repeat -1
    check_slots(slots(-1, -1), num_slots=8)
    with pytest.raises(ValueError, match="^slot_mapping: slot 8 is outside"):
        check_slots(slots(3, 8), num_slots=8)
    with pytest.raises(ValueError, match="^slot_mapping: the same slot appears twice"):
        check_slots(slots(3, 5, 3), num_slots=8)
