"""The guide's capacity sheet (from card memory to blocks and concurrency), the GPU presets,
and weight bytes per format. vLLM's own sheet is tests/test_vllm_sheet.py."""

from __future__ import annotations

import pytest

from lab.sizing.capacity import (
    GIB,
    LAB_MAX_BLOCKS,
    blocks_for_budget,
    capacity_sheet,
    kv_budget_sheet,
    lab_pool,
    load_gpus,
    weight_bytes_per_gpu,
)
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import ModelSpec, load_presets

LLAMA3_8B = ModelSpec("Llama-3-8B", num_layers=32, num_attention_heads=32, num_kv_heads=8,
                      head_dim=128, num_params=8_030_261_248)


def test_vllm_logged_case_llama3_8b() -> None:
    """vLLM logs 11.12 GiB of KV memory for Llama-3-8B; block size 16 gives ~5,690 blocks and
    "maximum concurrency for 8192 tokens per request: 11.1x"."""
    sheet = kv_budget_sheet(kv_layout(LLAMA3_8B, "fp16"), int(11.12 * GIB), 16, 8192)
    assert sheet.block_bytes == 16 * 131_072  # 2 MiB per block across 32 layers
    assert sheet.num_blocks == int(11.12 * GIB) // (2 * 2**20) == 5693
    assert sheet.num_tokens == 5693 * 16
    assert sheet.seq_blocks == 8192 / 16
    assert round(sheet.max_concurrency, 1) == 11.1


def test_gpu_memory_utilization_is_a_fraction_of_the_whole_card() -> None:
    layout = kv_layout(LLAMA3_8B, "fp16")
    gpu = load_gpus()["H100 80 GB"]
    weights = weight_bytes_per_gpu(LLAMA3_8B.num_params, "bf16")
    sheet = capacity_sheet(layout, gpu_bytes=gpu.memory_bytes, utilization=0.9,
                           weight_bytes=weights, reserve_bytes=2 * GIB, block_size=16,
                           context=8192)
    budget = int(gpu.memory_bytes * 0.9) - 2 * 8_030_261_248 - 2 * GIB
    assert sheet.kv_budget_bytes == budget
    assert sheet.num_blocks == budget // (2 * 2**20)
    assert sheet.max_concurrency == sheet.num_blocks / 512


def test_weights_are_sharded_by_tensor_parallelism() -> None:
    params = load_presets()["Llama-3.1-70B"].num_params
    assert weight_bytes_per_gpu(params, "bf16") == 2 * params
    assert weight_bytes_per_gpu(params, "bf16", tp=4) == -(-2 * params // 4)
    assert weight_bytes_per_gpu(params, "fp32") == 4 * params
    assert weight_bytes_per_gpu(params, "fp8") == params


def test_quantized_formats_count_their_scales_and_keep_16_bit_parts() -> None:
    # int4, group 128: 4 bits + (16-bit scale + 4-bit zero) / 128 = 0.51953 B per weight.
    assert weight_bytes_per_gpu(1_280_000, "int4") == 1_280_000 * (4 + 20 / 128) / 8
    assert weight_bytes_per_gpu(1_280_000, "int4", group_size=0) == 640_000  # per channel
    assert weight_bytes_per_gpu(1_280_000, "int8", group_size=64) == 1_280_000 * (8 + 24 / 64) / 8
    # 1,000 of 1,280,000 kept in 16 bits (embeddings, norms): 2 B each.
    assert weight_bytes_per_gpu(1_280_000, "fp8", unquantized_params=1_000) == 1_279_000 + 2_000
    # mxfp4 quantizes the experts only: 4.25 bits each; the rest stays bf16.
    assert weight_bytes_per_gpu(1_280_000, "mxfp4", expert_params=1_024_000) == (
        1_024_000 * 4.25 / 8 + 256_000 * 2)
    # A dense model in mxfp4: every weight but the unquantized ones.
    assert weight_bytes_per_gpu(1_280_000, "mxfp4", unquantized_params=280_000) == (
        1_000_000 * 4.25 / 8 + 280_000 * 2)


def test_weights_that_do_not_fit_leave_no_blocks() -> None:
    spec = load_presets()["Llama-3.1-405B"]
    layout = kv_layout(spec, "fp16")
    sheet = capacity_sheet(layout, gpu_bytes=load_gpus()["H100 80 GB"].memory_bytes,
                           utilization=0.9, weight_bytes=weight_bytes_per_gpu(spec.num_params,
                                                                             "bf16"),
                           reserve_bytes=0, block_size=16, context=4096)
    assert sheet.kv_budget_bytes < 0
    assert sheet.num_blocks == 0 and sheet.num_tokens == 0 and sheet.max_concurrency == 0


def test_sliding_window_models_fit_more_long_sequences() -> None:
    gemma = kv_layout(load_presets()["Gemma-2-9B"], "fp16")
    sheet = kv_budget_sheet(gemma, 40 * GIB, 16, 8192)
    blocks_needed = (21 * 512 + 21 * 257) / 42  # in all-layer block units
    assert sheet.seq_blocks == blocks_needed
    assert sheet.max_concurrency == pytest.approx(sheet.num_blocks / blocks_needed)
    assert sheet.max_concurrency > sheet.num_tokens / 8192


def test_bad_sheet_inputs_are_refused() -> None:
    layout = kv_layout(LLAMA3_8B, "fp16")
    for utilization in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError):
            capacity_sheet(layout, gpu_bytes=GIB, utilization=utilization, weight_bytes=0,
                           reserve_bytes=0, block_size=16, context=1)
    with pytest.raises(ValueError):
        kv_budget_sheet(layout, GIB, 0, 10)
    assert blocks_for_budget(-5, 100) == 0


def test_gpu_presets() -> None:
    gpus = load_gpus()
    for name in ("A100 40 GB", "A100 80 GB", "H100 80 GB", "H200 141 GB", "L4", "L40S",
                 "RTX 4090", "MI300X"):
        assert name in gpus
    for gpu in gpus.values():
        assert 16 < gpu.memory_gib < 256 and gpu.source and gpu.marketed and gpu.cuda_source
        assert gpu.memory_bytes == int(gpu.memory_gib * GIB)
        assert gpu.cuda_bytes == gpu.cuda_total_mib << 20
        # CUDA reports at most what the driver lists, and never much less (ROCm's figures
        # come from two different tools, hence the slack).
        assert 0.97 < gpu.cuda_bytes / gpu.memory_bytes < 1.002, gpu.name
    assert gpus["H200 141 GB"].memory_gib > gpus["H100 80 GB"].memory_gib
    assert gpus["H100 80 GB"].cuda_total_mib == 81_089  # 79.19 GiB, vs nvidia-smi's 79.65


@pytest.mark.parametrize("num_blocks", [0, 1, 63, 64, 65, 5693, 10**7])
def test_lab_pool_scales_down_and_says_the_scale(num_blocks: int) -> None:
    lab_blocks, scale = lab_pool(num_blocks)
    assert lab_blocks <= LAB_MAX_BLOCKS
    if num_blocks <= LAB_MAX_BLOCKS:
        assert (lab_blocks, scale) == (num_blocks, 1)
    else:
        assert lab_blocks * scale <= num_blocks < (lab_blocks + 1) * scale
        assert lab_blocks >= LAB_MAX_BLOCKS // 2


def test_figures_show_the_budget_and_where_it_fills() -> None:
    from lab.figures.calculator import kv_dtype_figure, kv_vs_context_figure, memory_split_figure

    layout = kv_layout(LLAMA3_8B, "fp16")
    fig = kv_vs_context_figure(layout, batch=4, context=8192, kv_budget_bytes=40 * GIB)
    texts = [a.text for a in fig.layout.annotations]
    # 40 GiB / (4 sequences x 131,072 B per token) = 81,920 tokens per sequence.
    assert "budget full at 81,920 tokens" in texts
    assert any("KV budget of the card: 40.0 GiB" in t for t in texts)
    assert max(fig.data[0].x) > 81_920
    gemma = kv_layout(load_presets()["Gemma-2-9B"], "fp16")
    assert [t.name for t in kv_vs_context_figure(gemma, 1, 8192).data] == [
        "full-attention layers", "sliding-window layers"]
    sheet = kv_budget_sheet(layout, 10 * GIB, 16, 8192)
    split = memory_split_figure(sheet, batch_kv_bytes=12 * GIB)  # 2 GiB more than the budget
    assert split.data[-1].name == "KV that does not fit" and split.data[-1].x[0] == 2.0
    bars = kv_dtype_figure(layout, 8192, 1).data[0]
    assert list(bars.x) == ["fp32", "fp16 / bf16", "fp8 (e4m3)", "int8 + scales", "int4 + scales"]
    assert bars.y[0] == 2 * bars.y[1] == 4 * bars.y[2]


def test_every_gpu_preset_carries_the_rates_the_cost_model_uses() -> None:
    from lab.serving.cost_model import cost_model
    from lab.sizing.model_spec import load_presets

    spec = load_presets()["Llama-3.1-8B"]
    for name, gpu in load_gpus().items():
        assert gpu.bandwidth_gbs > 0 and gpu.bf16_tflops > 0, name
        model = cost_model(spec, name)
        # One token with no context: every weight read once, one token's K/V written.
        step = model.iteration(new_tokens=1, context_tokens=0, attn_pairs=0)
        moved = model.weight_bytes + model.kv_bytes_per_token
        assert step.memory_s == pytest.approx(moved / (gpu.bandwidth_gbs * 1e9))


def test_the_figure_and_the_plain_sheet_count_a_recurrent_state() -> None:
    from lab.figures.calculator import kv_vs_context_figure

    qwen = kv_layout(load_presets()["Qwen3-Next-80B-A3B"], "fp16")  # 24,576 B per token
    fig = kv_vs_context_figure(qwen, 1, 8192, kv_budget_bytes=GIB)
    assert [t.name for t in fig.data] == ["full-attention layers", "Gated DeltaNet state"]
    # (1 GiB - 39,518,208 B of state) / 24,576 B per token = 42,082.7: 42,082 tokens fit.
    assert "budget full at 42,082 tokens" in [a.text for a in fig.layout.annotations]
    # The plain sheet counts the state as the blocks its bytes fill: 8,192 / 16 = 512 blocks
    # of KV, and 39,518,208 / (16 x 24,576) = 100.5 blocks of state.
    sheet = kv_budget_sheet(qwen, 10 * GIB, 16, 8192)
    assert sheet.seq_blocks == pytest.approx(512 + 100.5)
    scout = kv_layout(load_presets()["Llama-4-Scout"], "fp16")
    assert [t.name for t in kv_vs_context_figure(scout, 1, 8192).data] == [
        "full-attention layers", "chunked local layers"]
