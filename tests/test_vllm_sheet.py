"""The capacity sheet as vLLM v1 computes and logs it, against vLLM's formulas worked by hand.

The functions named are vLLM's: Worker.determine_available_memory and request_memory
(requested = ceil(total x utilization), available = requested - weights - profile),
AttentionSpec.page_size_bytes, get_kv_cache_groups, get_num_blocks,
_report_kv_cache_config and get_max_concurrency_for_kv_cache_config.
"""

from __future__ import annotations

import math

import pytest

from lab.sizing.capacity import GIB, capacity_sheet, load_gpus
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import load_presets
from lab.sizing.sheet_differences import differences
from lab.sizing.vllm_sheet import (
    default_max_num_batched_tokens,
    engine_block_size,
    kv_cache_groups,
    log_lines,
    sheet_lines,
    vllm_sheet,
    vllm_sheet_from_gpu,
)

PRESETS, GPUS = load_presets(), load_gpus()


def sheet_on(name: str, gpu: str, *, tp: int = 1, max_model_len: int | None = None,
             other: int = 2 * GIB, dtype: str = "fp16"):
    spec = PRESETS[name]
    layout = kv_layout(spec, dtype, tp)
    block, _ = engine_block_size(layout, 16)
    total = GPUS[gpu].cuda_bytes
    return layout, vllm_sheet_from_gpu(
        layout, total_memory=total, utilization=0.9, weights_memory=spec.weight_bytes(tp),
        other_memory=other, block_size=block,
        max_model_len=max_model_len or spec.max_position_embeddings,
        max_num_batched_tokens=default_max_num_batched_tokens(gpu, total))


def test_full_attention_llama_31_8b_on_an_h100() -> None:
    """Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128), bf16, an H100 at 0.9, block 16,
    max_model_len 131,072, 2 GiB for activations and the runtime.

    The issue's premise, the guide's formula from the driver's total (nvidia-smi 79.65 GiB):
      int(79.65 GiB x 0.9) = 76,971,182,652 B; - weights 2 x 8,030,261,248 = 16,060,522,496;
      - 2 GiB = 58,763,176,508 B; / (16 x 131,072 B per block) = 28,020 blocks, 448,320 tokens.
    vLLM starts from what CUDA reports instead, 81,089 MiB = 85,027,979,264 B (470 MiB less):
      requested_memory = ceil(85,027,979,264 x 0.9) = 76,525,181,338 B
      available = 76,525,181,338 - 16,060,522,496 - 2,147,483,648 = 58,317,175,194 (54.31 GiB)
      page_size = 2 x 16 x 8 x 128 x 2 = 65,536 B; one group of all 32 layers
      num_gpu_blocks = 58,317,175,194 // 65,536 // 32 = 889,849 // 32 = 27,807
      GPU KV cache size = 27,807 // 1 x 16 = 444,912 tokens
      per request cdiv(131,072, 16) = 8,192 blocks: concurrency 27,807 / 8,192 = 3.39x
    So 28,020 / 448,320 holds for the guide's formula from nvidia-smi's total only; from CUDA's
    total the same 2 GiB estimate gives 211 blocks fewer. What vLLM really logs depends on the
    reserve its profile measures (about 1.6 GiB in v1 logs of this model, which brings it back
    near 28,000 blocks), so the engine-inspection page starts from the logged memory.
    """
    plain = capacity_sheet(kv_layout(PRESETS["Llama-3.1-8B"]),
                           gpu_bytes=GPUS["H100 80 GB"].memory_bytes, utilization=0.9,
                           weight_bytes=16_060_522_496, reserve_bytes=2 * GIB, block_size=16,
                           context=8192)
    assert (plain.num_blocks, plain.num_tokens) == (28_020, 448_320)
    _, sheet = sheet_on("Llama-3.1-8B", "H100 80 GB")
    assert sheet.total_memory == 85_027_979_264
    assert sheet.requested_memory == 76_525_181_338
    assert sheet.weights_memory == 16_060_522_496
    assert sheet.available_kv_memory == 58_317_175_194
    assert (sheet.page_size_bytes, sheet.group_size, len(sheet.groups)) == (65_536, 32, 1)
    assert (sheet.num_blocks, sheet.num_tokens) == (27_807, 444_912)
    assert sheet.blocks_per_request == 8_192
    assert log_lines(sheet) == ["Available KV cache memory: 54.31 GiB",
                                "GPU KV cache size: 444,912 tokens",
                                "Maximum concurrency for 131,072 tokens per request: 3.39x"]


def test_the_memory_steps_reproduce_a_logged_vllm_profile() -> None:
    """vLLM PR #10511 (its memory-profiling rework) shows Llama-3-8B (the same attention as
    3.1-8B) on an H100: total_gpu_memory 79.22 GiB x 0.90 = 71.29 GiB; weights 14.96 GiB;
    non-torch 1.79 GiB; activation peak 1.26 GiB; available_kv_cache_memory 53.29 GiB.
      requested = ceil(85,061,827,297 x 0.9) = 76,555,644,568 B; - 14.96 GiB - 3.05 GiB
      = 57,217,554,318 B = 53.288 GiB, logged as 53.29; / 2 MiB per block = 27,283 blocks
      (any memory the log would print as 53.29 GiB gives 27,281 to 27,287).
    """
    layout = kv_layout(PRESETS["Llama-3.1-8B"])
    sheet = vllm_sheet_from_gpu(layout, total_memory=int(79.22 * GIB), utilization=0.9,
                                weights_memory=int(14.96 * GIB), other_memory=int(3.05 * GIB),
                                block_size=16, max_model_len=8192, max_num_batched_tokens=8192)
    assert sheet.available_kv_memory == 57_217_554_318
    assert log_lines(sheet)[0] == "Available KV cache memory: 53.29 GiB"
    assert sheet.num_blocks == 27_283


def test_sliding_window_hybrid_gemma_3_27b_on_an_h200() -> None:
    """Gemma-3-27B: 62 layers, 16 KV heads, head_dim 128; no layer_types in its config, so
    Gemma3TextConfig's pattern 6: 10 full-attention layers, 52 with a 1,024-token window.
    bf16, an H200 at 0.9, block 16, max_model_len 131,072, max_num_batched_tokens 8,192
    (vllm serve's default on a card of 70 GiB or more), 2 GiB reserve.
      total 143,156 MiB = 150,109,945,856 B; requested = ceil(x 0.9) = 135,098,951,271 B
      weights 2 x 27,432,406,640 = 54,864,813,280 B
      available = 135,098,951,271 - 54,864,813,280 - 2,147,483,648 = 78,086,654,343 B
      page_size = 2 x 16 x 16 x 128 x 2 = 131,072 B, the same for both layer kinds
      groups (_get_kv_cache_groups_uniform_page_size): 52 is not under 1.5 x 10, so the group
      size is 10: 1 full group, cdiv(52, 10) = 6 sliding groups of 9, 9, 9, 9, 8, 8 layers
      (8 padding slots); 7 groups, 10 KV tensors
      num_gpu_blocks = 78,086,654,343 // 131,072 // 10 = 595,753 // 10 = 59,575
      GPU KV cache size = 59,575 // 7 x 16 = 8,510 x 16 = 136,160 tokens
      one request: full cdiv(131,072, 16) = 8,192 blocks; each sliding group
      cdiv(min(1,023 + 8,192, 131,072), 16) + 1 = 576 + 1 = 577; 8,192 + 6 x 577 = 11,654
      concurrency 59,575 / 11,654 = 5.11x
    """
    _, sheet = sheet_on("Gemma-3-27B", "H200 141 GB")
    assert sheet.max_num_batched_tokens == 8192
    assert sheet.requested_memory == 135_098_951_271
    assert sheet.available_kv_memory == 78_086_654_343
    assert (sheet.page_size_bytes, sheet.group_size) == (131_072, 10)
    assert [(g.kind, g.num_layers) for g in sheet.groups] == [
        ("full attention", 10), *[("sliding window", n) for n in (9, 9, 9, 9, 8, 8)]]
    assert sheet.padding_layers == 8
    assert (sheet.num_blocks, sheet.num_tokens) == (59_575, 136_160)
    assert sheet.blocks_per_request == 8_192 + 6 * 577
    assert sheet.max_concurrency == pytest.approx(5.11, abs=0.005)


def test_equal_layer_counts_make_two_groups_without_padding() -> None:
    # GPT-OSS-20B: 12 sliding (128) + 12 full: 2 groups of 12. At max_model_len 8,192 a
    # sliding layer needs cdiv(min(127 + 8,192, 8,192), 16) + 1 = 513 blocks: one more than a
    # full one (512), because vLLM keeps room for a whole prefill chunk.
    layout = kv_layout(PRESETS["GPT-OSS-20B"])
    groups, size = kv_cache_groups(layout, 16, 8192, 8192)
    assert size == 12 and [(g.kind, g.num_layers, g.pages_per_request) for g in groups] == [
        ("full attention", 12, 512), ("sliding window", 12, 513)]
    # Mistral-7B-v0.1: every layer slides, one uniform group: cdiv(4,095 + 8,192, 16) + 1 = 769.
    groups, size = kv_cache_groups(kv_layout(PRESETS["Mistral-7B-v0.1"]), 16, 32768, 8192)
    assert size == 32 and [(g.kind, g.pages_per_request) for g in groups] == [
        ("sliding window", 769)]


def test_mla_deepseek_v3_on_eight_h200s() -> None:
    """DeepSeek-V3 (MLA: one latent of 512 + 64 per token and layer, 61 layers), fp8 weights,
    tensor parallel 8 on H200s at 0.9, max_model_len 163,840, 2 GiB reserve.
      weights: 669,039,329,792 linear weights x 1 B + 1,960,670,208 embeddings/norms x 2 B
      = 672,960,670,208 B; this rank's eighth = 84,120,083,776 B (78.34 GiB)
      available = 135,098,951,271 - 84,120,083,776 - 2,147,483,648 = 48,831,383,847 B
      FlashMLA forces block size 64: page_size = 64 x 1 x 576 x 2 = 73,728 B (the latent is
      replicated on every rank, and there is no K/V pair: coefficient 1)
      num_gpu_blocks = 48,831,383,847 // 73,728 // 61 = 662,318 // 61 = 10,857
      GPU KV cache size = 10,857 x 64 = 694,848 tokens
      one request cdiv(163,840, 64) = 2,560 blocks: concurrency 10,857 / 2,560 = 4.24x
    """
    layout, sheet = sheet_on("DeepSeek-V3", "H200 141 GB", tp=8)
    assert sheet.weights_memory == 84_120_083_776
    assert sheet.available_kv_memory == 48_831_383_847
    assert (sheet.block_size, sheet.page_size_bytes, sheet.group_size) == (64, 73_728, 61)
    assert (sheet.num_blocks, sheet.num_tokens, sheet.blocks_per_request) == (
        10_857, 694_848, 2_560)
    assert f"{sheet.max_concurrency:.2f}" == "4.24"
    assert "FlashMLA" in engine_block_size(layout, 16)[1]
    assert engine_block_size(layout, 128) == (128, "")  # a multiple of 64 is kept


def test_what_vllm_stops_with() -> None:
    _, one_h100 = sheet_on("DeepSeek-V3", "H100 80 GB")
    assert one_h100.failure().startswith("torch.OutOfMemoryError while loading the weights")
    assert log_lines(one_h100) == [one_h100.failure()]
    # Llama-3.1-8B on an L4: ceil(23,579,328,512 x 0.9) - 16,060,522,496 - 2 GiB =
    # 3,013,389,517 B (2.81 GiB) of KV cache, but one 131,072-token request needs 8,192 blocks
    # x 32 layers x 64 KiB = 16 GiB.
    _, l4 = sheet_on("Llama-3.1-8B", "L4")
    assert l4.needed_memory == 16 * GIB and not l4.fits_one_request
    # 3,013,389,517 // 2 MiB = 1,436 blocks of 16 tokens: 22,976 tokens.
    assert l4.estimated_max_model_len() == 1_436 * 16
    assert "estimated maximum model length is 22976" in l4.failure()
    _, none_left = sheet_on("Llama-3.1-8B", "L4", other=8 * GIB)
    assert "No available memory for the cache blocks" in none_left.failure()
    with pytest.raises(ValueError):
        vllm_sheet(kv_layout(PRESETS["Llama-3.1-8B"]), available_kv_memory=GIB, block_size=0,
                   max_model_len=1, max_num_batched_tokens=1)


def test_default_token_budget_follows_vllm_serve() -> None:
    # EngineArgs.get_batch_defaults: 8,192 on cards of 70 GiB or more except the A100.
    assert default_max_num_batched_tokens("H100 80 GB", GPUS["H100 80 GB"].cuda_bytes) == 8192
    assert default_max_num_batched_tokens("MI300X", GPUS["MI300X"].cuda_bytes) == 8192
    assert default_max_num_batched_tokens("A100 80 GB", GPUS["A100 80 GB"].cuda_bytes) == 2048
    assert default_max_num_batched_tokens("L40S", GPUS["L40S"].cuda_bytes) == 2048


def test_every_line_names_its_vllm_function_and_the_differences_are_explained() -> None:
    layout, sheet = sheet_on("Gemma-3-27B", "H200 141 GB")
    lines = sheet_lines(sheet)
    assert all(line.source for line in lines)
    assert any("get_num_blocks" == line.source for line in lines)
    assert "1 × 8,192 (full attention) + 6 × 577 (sliding window) = 11,654" in [
        line.value for line in lines]
    plain = capacity_sheet(layout, gpu_bytes=GPUS["H200 141 GB"].memory_bytes,
                           utilization=0.9, weight_bytes=sheet.weights_memory,
                           reserve_bytes=2 * GIB, block_size=16, context=8192)
    text = " ".join(differences(layout, plain, sheet, 16))
    for words in ("what CUDA reports", "max_model_len = 131,072", "7 groups of 10",
                  "min(1,023 + 8,192, 131,072) = 9,215",
                  # vLLM's own warning: 8 padding slots for 52 sliding layers; in a full request
                  # 6 x 577 blocks hold 8 empty slots of 11,654 x 10: 4.0 %.
                  "'Add 8 padding layers, may waste at most 15.38% KV cache memory'",
                  "empty slots are 4.0% of its blocks' memory"):
        assert words in text
    _, falcon = sheet_on("Falcon-7B", "H100 80 GB")  # 3,608x, but 1,024 requests at a time
    plain = capacity_sheet(kv_layout(PRESETS["Falcon-7B"]), gpu_bytes=1, utilization=1,
                           weight_bytes=0, reserve_bytes=0, block_size=16, context=2048)
    assert "max_num_seqs = 1,024" in " ".join(
        differences(kv_layout(PRESETS["Falcon-7B"]), plain, falcon, 16, 1024))


def test_requested_memory_is_rounded_up() -> None:
    layout = kv_layout(PRESETS["SmolLM2-135M"])
    sheet = vllm_sheet_from_gpu(layout, total_memory=10, utilization=0.55, weights_memory=0,
                                other_memory=0, block_size=16, max_model_len=16,
                                max_num_batched_tokens=16)
    assert sheet.requested_memory == math.ceil(5.5) == 6
