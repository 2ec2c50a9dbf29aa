"""One config per architecture family vLLM 0.33 serves, sized by hand and checked against the lab.

For each family (the files are in tests/data/configs/, their sources in SOURCES.md): the bf16
KV bytes one token adds, the recurrent state one sequence keeps, the KV of one sequence at
8,192 and 131,072 tokens, and the block size vLLM picks (prefix caching off, block size 16
asked). Every number below is derived in the comment above it from the config's own values:
- a KV-holding attention layer adds 2 (K, V) x KV heads x head_dim x 2 bytes per token; MLA one
  latent of (kv_lora_rank + qk_rope_head_dim) x 2 bytes;
- a sliding layer keeps min(T, window) tokens, a chunked local layer min(T, chunk);
- a recurrent layer keeps conv (kernel - 1, conv_dim) and ssm states in its dtype, whatever T;
- vLLM raises a hybrid's block to 16 x cdiv(state page, 16 x per-token attention bytes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.sizing.config_reader import read_hf_config
from lab.sizing.family_terms import family_terms, tensor_parallel_notes
from lab.sizing.kv_cache_groups import hybrid_block, kv_cache_groups
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import ModelSpec
from lab.sizing.vllm_sheet import engine_block_size, log_lines, vllm_sheet

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
K8, K128 = 8_192, 131_072


@dataclass(frozen=True)
class Family:
    file: str
    per_token: int  # bf16 KV bytes per token, every KV-holding layer (and the indexer)
    state: int  # recurrent state bytes per sequence
    kv_8k: int
    kv_128k: int
    block: int  # the block size vLLM picks when 16 is asked
    groups: tuple[tuple[str, int], ...]  # (kind, layers) of each KV cache group


FAMILIES = [
    # gpt-oss-20b: 24 layers, 8 KV heads x head_dim 64: 2 x 8 x 64 x 2 = 2,048 B per layer;
    # layer_types 12 sliding (128) + 12 full. 8k: 2,048 x (12 x 8,192 + 12 x 128) =
    # 204,472,320; 128k: 2,048 x (12 x 131,072 + 12 x 128) = 3,224,371,200. Sinks add no KV.
    Family("gpt-oss-20b.json", 24 * 2_048, 0, 204_472_320, 3_224_371_200, 16,
           (("full attention", 12), ("sliding window", 12))),
    # Gemma-3-27B: 62 x 16 KV heads x 128: 8,192 B per layer; 10 full + 52 sliding (1,024).
    # 8k: 8,192 x (10 x 8,192 + 52 x 1,024) = 1,107,296,256; 128k: 8,192 x (10 x 131,072 +
    # 52 x 1,024) = 11,173,625,856. Groups of 10: 1 full, 6 sliding of 9, 9, 9, 9, 8, 8.
    Family("gemma-3-27b-it.json", 62 * 8_192, 0, 1_107_296_256, 11_173_625_856, 16,
           (("full attention", 10), *(("sliding window", n) for n in (9, 9, 9, 9, 8, 8)))),
    # Llama-4-Scout: 48 x 8 KV heads x 128: 4,096 B per layer; no_rope_layers [1,1,1,0] x 12:
    # 36 RoPE layers chunked (8,192), 12 NoPE full. 8k: 4,096 x 48 x 8,192 = 1,610,612,736;
    # 128k: 4,096 x (12 x 131,072 + 36 x 8,192) = 7,650,410,496. Groups of 12: 1 + 3.
    Family("llama-4-scout-17b-16e.json", 48 * 4_096, 0, 1_610_612_736, 7_650_410_496, 16,
           (("full attention", 12), *(("chunked local", 12),) * 3)),
    # Qwen3-Next-80B-A3B-Thinking (the Instruct model's twin; no layer_types, so
    # full_attention_interval 4 decides): every 4th of 48 layers attends: 12 x 2 KV heads x
    # 256 = 2,048 B per layer, 24,576 B per token. 36 Gated DeltaNet layers: conv 3 x
    # (2 x 16 x 128 + 32 x 128) = 3 x 8,192 = 24,576 values, recurrent 32 x 128 x 128 =
    # 524,288, bf16 (no mamba_ssm_dtype in the file): 1,097,728 B each, 39,518,208 B per
    # sequence. 8k: 24,576 x 8,192 = 201,326,592; 128k: 3,221,225,472.
    # Block 16 x cdiv(1,097,728, 16 x 2,048) = 16 x 34 = 544. Groups of 12: 1 + 3.
    Family("qwen3-next-80b-a3b-thinking.json", 12 * 2_048, 36 * 1_097_728, 201_326_592,
           3_221_225_472, 544, (("full attention", 12), *(("Gated DeltaNet", 12),) * 3)),
    # Granite-4.0-H-Tiny: 4 attention layers x 4 KV heads x 1,536 / 12 = 128: 2,048 B per
    # layer, 8,192 B per token. 36 Mamba2 layers, d_inner 2 x 1,536 = 3,072: conv 3 x (3,072 +
    # 2 x 1 x 128) = 9,984, ssm 48 x 64 x 128 = 393,216, bf16: 806,400 B each, 29,030,400 per
    # sequence. 8k: 67,108,864; 128k: 1,073,741,824. Block 16 x cdiv(806,400, 32,768) = 400.
    # Groups of 4: 1 + 9.
    Family("granite-4.0-h-tiny.json", 4 * 2_048, 36 * 806_400, 67_108_864, 1_073_741_824,
           400, (("full attention", 4), *(("Mamba2", 4),) * 9)),
    # Jamba-1.5-Mini: attention where i % 8 == 4: 4 of 32 layers, 8 KV heads x 4,096 / 32 =
    # 128: 4,096 B per layer, 16,384 per token. 28 Mamba1 layers, d_inner 2 x 4,096 = 8,192:
    # conv 3 x 8,192 = 24,576, ssm 8,192 x 16 = 131,072, bf16: 311,296 B each, 8,716,288 per
    # sequence. 8k: 134,217,728; 128k: 2,147,483,648. Block 16 x cdiv(311,296, 65,536) = 80.
    Family("ai21-jamba-1.5-mini.json", 4 * 4_096, 28 * 311_296, 134_217_728, 2_147_483_648,
           80, (("full attention", 4), *(("Mamba1", 4),) * 7)),
    # Falcon-H1-7B: attention in all 44 layers, 2 KV heads x 128: 1,024 B per layer, 45,056
    # per token; and a Mamba2 mixer in each, d_ssm 3,072: conv 3 x (3,072 + 2 x 1 x 256) =
    # 10,752, ssm 24 x 128 x 256 = 786,432, bf16: 1,594,368 B each, 70,152,192 per sequence.
    # 8k: 369,098,752; 128k: 5,905,580,032. Block 16 x cdiv(1,594,368, 16,384) = 16 x 98.
    Family("falcon-h1-7b.json", 44 * 1_024, 44 * 1_594_368, 369_098_752, 5_905_580_032,
           1_568, (("full attention", 44), ("Mamba2", 44))),
    # DeepSeek-V3.2: 61 MLA layers, (512 + 64) x 2 = 1,152 B, plus the indexer's key,
    # 128 + 128 / 128 x 4 = 132 B: 61 x 1,284 = 78,324 B per token. 8k: 641,630,208; 128k:
    # 10,266,083,328. FlashMLA: block 64; one group of MLA and indexer layers.
    Family("deepseek-v3.2.json", 61 * (1_152 + 132), 0, 641_630_208, 10_266_083_328, 64,
           (("MLA", 61),)),
    # Nemotron-H-56B-Base-8K: hybrid_override_pattern of 118 layers, 10 "*" attention, 54 "M"
    # Mamba2, 54 "-" MLP. Attention: 8 KV heads x head_dim 128 (attention_head_dim, and
    # 8,192 / 64 heads): 4,096 B per layer, 40,960 per token. Mamba2: d_inner 256 heads x 64
    # = 16,384; conv 3 x (16,384 + 2 x 8 groups x 256) = 3 x 20,480 in bf16 = 122,880 B; ssm
    # 256 x 64 x 256 in float32 (vLLM's NemotronH default) = 16,777,216 B: 16,900,096 B each,
    # 912,605,184 per sequence. 8k: 40,960 x 8,192 = 335,544,320; 128k: 5,368,709,120.
    # Block 16 x cdiv(16,900,096, 16 x 4,096) = 16 x 258 = 4,128. Groups of 10 (the fewer
    # kind): 1 + cdiv(54, 10) = 6 Mamba2 groups of 9.
    Family("nemotron-h-56b-base-8k.json", 10 * 4_096, 54 * 16_900_096, 335_544_320,
           5_368_709_120, 4_128, (("full attention", 10), *(("Mamba2", 9),) * 6)),
    # Gemma-3n-E4B: 35 layers, the last 15 share KV: 20 hold it, 16 sliding (512) and 4 full
    # ([sliding x 4, full] x 7 cut at 20), 2 KV heads x 256: 2,048 B per layer, 40,960 per
    # token. 8k: 2,048 x (4 x 8,192 + 16 x 512) = 83,886,080; 128k: 2,048 x (4 x 131,072 +
    # 16 x 512) = 1,090,519,040. Groups of 4: 1 full + 4 sliding.
    Family("gemma-3n-e4b.json", 20 * 2_048, 0, 83_886_080, 1_090_519_040, 16,
           (("full attention", 4), *(("sliding window", 4),) * 4)),
    # MiniCPM3-4B: vLLM caches K and V for 40 heads of 64 + 32 = 96: 2 x 40 x 96 x 2 = 15,360 B
    # per layer, 62 layers: 952,320 B per token. 8k: 7,801,405,440; 128k: 124,822,487,040.
    Family("minicpm3-4b.json", 62 * 15_360, 0, 7_801_405_440, 124_822_487_040, 16,
           (("full attention", 62),)),
]
FAMILY_FILES = {f.file for f in FAMILIES}


def read(file: str) -> ModelSpec:
    return read_hf_config((CONFIGS / file).read_text(), file)


@pytest.mark.parametrize("row", FAMILIES, ids=lambda r: r.file)
def test_bytes_per_token_state_and_kv_per_sequence(row: Family) -> None:
    layout = kv_layout(read(row.file))
    assert layout.bytes_per_token == row.per_token
    assert layout.state_bytes == row.state
    assert (layout.kv_bytes(K8), layout.kv_bytes(K128)) == (row.kv_8k, row.kv_128k)
    assert layout.sequence_bytes(K128) == row.kv_128k + row.state


@pytest.mark.parametrize("row", FAMILIES, ids=lambda r: r.file)
def test_block_size_and_groups_vllm_would_choose(row: Family) -> None:
    layout = kv_layout(read(row.file))
    block, _ = engine_block_size(layout, 16)
    assert block == row.block
    groups, _ = kv_cache_groups(layout, block, 32_768, 8_192)
    assert tuple((g.kind, g.num_layers) for g in groups) == row.groups


def test_the_issues_failures_are_fixed() -> None:
    scout = kv_layout(read("llama-4-scout-17b-16e.json"))
    every_layer_full = 48 * 4_096 * K128  # the old reading: 25,769,803,776 B
    assert every_layer_full / scout.kv_bytes(K128) == pytest.approx(3.37, abs=0.005)
    minicpm = kv_layout(read("minicpm3-4b.json"))
    as_mla = 62 * (256 + 32) * 2  # one latent per token and layer: 35,712 B
    assert minicpm.bytes_per_token / as_mla == pytest.approx(26.67, abs=0.005)
    assert not minicpm.spec.is_mla and minicpm.spec.num_kv_heads == 40
    v32 = kv_layout(read("deepseek-v3.2.json"))
    assert v32.indexer_bytes_per_token_layer == 132
    assert kv_layout(read("deepseek-v3.2.json"), "fp8").bytes_per_token == 61 * (656 + 132)
    assert read("gpt-oss-20b.json").attention_sinks


@pytest.mark.parametrize("file, conv, ssm, dtypes", [
    ("qwen3-next-80b-a3b-thinking.json", (3, 8_192), (32, 128, 128), (2, 2)),
    ("granite-4.0-h-tiny.json", (3, 3_328), (48, 64, 128), (2, 2)),
    ("ai21-jamba-1.5-mini.json", (3, 8_192), (8_192, 16), (2, 2)),
    ("falcon-h1-7b.json", (3, 3_584), (24, 128, 256), (2, 2)),
    ("nemotron-h-56b-base-8k.json", (3, 20_480), (256, 64, 256), (2, 4)),
])
def test_state_shapes_and_dtypes_as_vllm_lays_them_out(file, conv, ssm, dtypes) -> None:
    state = read(file).state
    assert state.shapes() == (conv, ssm)
    assert (state.conv_bytes, state.ssm_bytes) == dtypes


def test_nemotron_h_keeps_its_ssm_state_in_fp32() -> None:
    # vLLM's NemotronHForCausalLMConfig (model_executor/models/config.py) sets the SSM cache
    # dtype to the config's mamba_ssm_cache_dtype, float32 when the config names none (the
    # published file does not); the conv state stays in the model's bf16.
    spec = read("nemotron-h-56b-base-8k.json")
    assert (spec.num_layers, spec.state.num_layers) == (10, 54)
    assert (spec.state.conv_bytes, spec.state.ssm_bytes) == (2, 4)
    assert spec.state.page_bytes() == 3 * 20_480 * 2 + 256 * 64 * 256 * 4
    config = json.loads((CONFIGS / "nemotron-h-56b-base-8k.json").read_text())
    config["mamba_ssm_cache_dtype"] = "bfloat16"
    bf16_state = read_hf_config(json.dumps(config)).state
    assert bf16_state.page_bytes() == (3 * 20_480 + 256 * 64 * 256) * 2


def test_tensor_parallel_splits_the_state_as_vllm_does() -> None:
    """Qwen3-Next on 4 ranks: 2 KV heads do not split 4 ways, so each rank keeps one (1,024 B
    per token and layer); the Gated DeltaNet conv dim 8,192 / 4 = 2,048 and 32 / 4 = 8 value
    heads: (3 x 2,048 + 8 x 128 x 128) x 2 = 274,432 B per layer. Block 16 x cdiv(274,432,
    16,384) = 16 x 17 = 272, page 272 x 1,024 = 278,528 B, padding 4,096 B (1.49%)."""
    layout = kv_layout(read("qwen3-next-80b-a3b-thinking.json"), tp=4)
    assert layout.spec.state.page_bytes(4) == 274_432
    hybrid = hybrid_block(layout, 16)
    assert (hybrid.block_size, hybrid.attention_page) == (272, 278_528)
    assert f"{hybrid.padding_pct:.2f}" == "1.49"
    # Granite's one B/C group is replicated on every rank before the split.
    granite = read("granite-4.0-h-tiny.json").state
    assert granite.shapes(2) == ((3, (3_072 + 2 * 2 * 128) // 2), (24, 64, 128))
    assert not granite.splits_evenly(5)
    notes = tensor_parallel_notes(kv_layout(read("granite-4.0-h-tiny.json"), tp=5))
    assert ("warning", "The Mamba2 layers' widths do not split evenly over 5 GPUs; vLLM "
            "refuses such a split.") in notes


def test_qwen3_next_capacity_on_four_h200s_as_vllm_logs_it() -> None:
    """Qwen3-Next-80B-A3B, bf16, tensor parallel 4 on H200s at 0.9, max_model_len 262,144,
    2 GiB reserve (the block and page from the test above).
      requested = ceil(150,109,945,856 x 0.9) = 135,098,951,271 B; weights 80e9 x 2 / 4 =
      40,000,000,000; available = 135,098,951,271 - 40,000,000,000 - 2,147,483,648 =
      92,951,467,623 B (86.57 GiB)
      12 attention + 36 Gated DeltaNet layers: groups of 12, 1 + 3 = 4 groups
      num_gpu_blocks = 92,951,467,623 // 278,528 // 12 = 27,810
      GPU KV cache size = 27,810 // 4 x 272 = 6,952 x 272 = 1,890,944 tokens
      one request: cdiv(262,144, 272) = 964 attention blocks + 3 x 1 state = 967 blocks;
      concurrency 27,810 / 967 = 28.76x
    """
    layout = kv_layout(read("qwen3-next-80b-a3b-thinking.json"), tp=4)
    sheet = vllm_sheet(layout, available_kv_memory=92_951_467_623, block_size=272,
                       max_model_len=262_144, max_num_batched_tokens=8_192)
    assert (sheet.page_size_bytes, sheet.group_size, len(sheet.groups)) == (278_528, 12, 4)
    assert (sheet.num_blocks, sheet.num_tokens, sheet.blocks_per_request) == (
        27_810, 1_890_944, 967)
    assert log_lines(sheet) == [
        "Setting attention block size to 272 tokens to ensure that attention page size is >= "
        "mamba page size.",
        "Padding mamba page size by 1.49% to ensure that mamba page size and attention page "
        "size are exactly equal.",
        "Available KV cache memory: 86.57 GiB", "GPU KV cache size: 1,890,944 tokens",
        "Maximum concurrency for 262,144 tokens per request: 28.76x"]
    with pytest.raises(ValueError, match="too small"):
        vllm_sheet(layout, available_kv_memory=1, block_size=16, max_model_len=16,
                   max_num_batched_tokens=16)


def test_nemotron_h_capacity_as_vllm_logs_it() -> None:
    """Nemotron-H-56B-Base-8K, bf16, 20 GiB left for the cache, max_model_len 8,192 (its own).
      page: 4,128 x 4,096 = 16,908,288 B (the 16,900,096 B state padded by 8,192 B, 0.05%)
      10 attention + 54 Mamba2 layers: groups of 10, 1 + 6 = 7 groups; 6 x 10 slots for 54
      Mamba2 layers: "Add 6 padding layers" (6 / 54 = 11.11%), logged forming the groups
      num_gpu_blocks = 21,474,836,480 // 16,908,288 // 10 = 1,270 // 10 = 127
      GPU KV cache size = 127 // 7 x 4,128 = 18 x 4,128 = 74,304 tokens
      one request: cdiv(8,192, 4,128) = 2 attention blocks + 6 x 1 state = 8 blocks;
      concurrency 127 / 8 = 15.88x
    """
    layout = kv_layout(read("nemotron-h-56b-base-8k.json"))
    sheet = vllm_sheet(layout, available_kv_memory=20 << 30, block_size=4_128,
                       max_model_len=8_192, max_num_batched_tokens=8_192)
    assert (sheet.page_size_bytes, sheet.group_size, len(sheet.groups)) == (16_908_288, 10, 7)
    assert (sheet.num_blocks, sheet.num_tokens, sheet.blocks_per_request) == (127, 74_304, 8)
    assert log_lines(sheet) == [
        "Setting attention block size to 4128 tokens to ensure that attention page size is >= "
        "mamba page size.",
        "Padding mamba page size by 0.05% to ensure that mamba page size and attention page "
        "size are exactly equal.",
        "Available KV cache memory: 20.00 GiB",
        "Add 6 padding layers, may waste at most 11.11% KV cache memory",
        "GPU KV cache size: 74,304 tokens",
        "Maximum concurrency for 8,192 tokens per request: 15.88x"]


@pytest.mark.parametrize("file, lines", [
    # Gemma-3-27B: 52 sliding layers in 6 groups of 10 slots: 8 padding, 8 / 52 = 15.38%.
    ("gemma-3-27b-it.json", ["Add 8 padding layers, may waste at most 15.38% KV cache memory"]),
    ("gpt-oss-20b.json", []),  # 12 + 12: groups of 12, nothing padded
    ("qwen3-next-80b-a3b-thinking.json", []),  # 36 = 3 x 12
    ("deepseek-v3.2.json", []),  # one type, one group
])
def test_padding_layers_are_logged_as_vllm_forms_the_groups(file: str, lines: list[str]) -> None:
    layout = kv_layout(read(file))
    block = engine_block_size(layout, 16)[0]
    sheet = vllm_sheet(layout, available_kv_memory=1 << 40, block_size=block,
                       max_model_len=8_192, max_num_batched_tokens=8_192)
    assert sheet.padding_warnings() == lines


def test_prefix_caching_changes_what_a_request_keeps() -> None:
    # Qwen3-Next keeps no state per block ("align"): two state pages per layer, block 544.
    qwen = kv_layout(read("qwen3-next-80b-a3b-thinking.json"))
    assert engine_block_size(qwen, 16, prefix_caching=True)[0] == 544
    sheet = vllm_sheet(qwen, available_kv_memory=1 << 36, block_size=544, max_model_len=8_192,
                       max_num_batched_tokens=8_192, prefix_caching=True)
    assert sheet.mode == "align" and sheet.blocks_per_request == 16 + 3 * 2  # cdiv(8,192, 544)
    # Granite caches a state per block ("all"): the block is a multiple of its 256-token
    # chunk: 256 x cdiv(cdiv(806,400, 2,048), 256) = 256 x cdiv(394, 256) = 512, and each
    # state group holds cdiv(8,192, 512) = 16 pages like the attention group.
    granite = kv_layout(read("granite-4.0-h-tiny.json"))
    assert engine_block_size(granite, 16, prefix_caching=True)[0] == 512
    sheet = vllm_sheet(granite, available_kv_memory=1 << 36, block_size=512,
                       max_model_len=8_192, max_num_batched_tokens=8_192, prefix_caching=True)
    assert sheet.mode == "all" and sheet.blocks_per_request == 10 * 16
    # Jamba names no chunk: vLLM's default 2,048, so the block is 2,048.
    jamba = kv_layout(read("ai21-jamba-1.5-mini.json"))
    assert engine_block_size(jamba, 16, prefix_caching=True)[0] == 2_048


def test_the_deepseek_v32_sheet_sums_its_two_pages() -> None:
    # One group of 61 MLA and 61 indexer layers: a block costs 61 x (64 x 1,152 + 64 x 132)
    # = 61 x 82,176 B; 10 GiB gives 10,737,418,240 // 5,012,736 = 2,142 blocks of 64 tokens.
    layout = kv_layout(read("deepseek-v3.2.json"))
    sheet = vllm_sheet(layout, available_kv_memory=10 << 30, block_size=64,
                       max_model_len=163_840, max_num_batched_tokens=8_192)
    assert (sheet.page_size_bytes, sheet.indexer_page_bytes) == (82_176, 8_448)
    assert (sheet.num_blocks, sheet.num_tokens) == (2_142, 2_142 * 64)
    fp8 = vllm_sheet(kv_layout(read("deepseek-v3.2.json"), "fp8"), available_kv_memory=1,
                     block_size=64, max_model_len=64, max_num_batched_tokens=64)
    assert log_lines(fp8)[0] == "Using custom fp8 kv-cache format for DeepSeekV3.2"


@pytest.mark.parametrize("file, words", [
    ("gpt-oss-20b.json", "attention sinks"),
    ("llama-4-scout-17b-16e.json", "chunked local layers"),
    ("qwen3-next-80b-a3b-thinking.json", "raises the block size from 16 to 544"),
    ("qwen3-next-80b-a3b-thinking.json", "Gated DeltaNet layers, which keep no KV"),
    ("gemma-3n-e4b.json", "allocate none: layers = 20"),
    ("minicpm3-4b.json", "caches K and V for all 40 heads"),
    ("deepseek-v3.2.json", "+ 61 × 132 B = 8,052 B per token"),
    ("falcon-h1-7b.json", "side by side"),
    ("ai21-jamba-1.5-mini.json", "conv state 3 × 8192 (bf16)"),
])
def test_each_family_names_the_term_it_changes(file: str, words: str) -> None:
    terms = family_terms(kv_layout(read(file)), K128)
    assert any(words in f"{t.change} {t.effect}" for t in terms), terms
    assert not family_terms(kv_layout(read("llama-3.1-8b.json")), K128)
