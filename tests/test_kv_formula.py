"""The KV formula against values computed by hand from the published config numbers."""

from __future__ import annotations

import pytest

from lab.sizing.kv_formula import KV_DTYPES, batch_latex, format_bytes, kv_layout, per_token_latex
from lab.sizing.model_spec import ModelSpec, load_presets

# bytes per token in fp16/bf16 = 2 (K, V) x layers x KV heads x head_dim x 2 bytes,
# written from each model's config.json; MLA: 1 x layers x (kv_lora_rank + rope dim) x 2 bytes.
GOLDEN_BYTES_PER_TOKEN = {
    "Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,  # 131,072
    "Llama-3.1-70B": 2 * 80 * 8 * 128 * 2,  # 327,680
    "Llama-3.1-405B": 2 * 126 * 8 * 128 * 2,  # 516,096
    "Llama-3.2-3B": 2 * 28 * 8 * 128 * 2,
    "Mistral-7B-v0.1": 2 * 32 * 8 * 128 * 2,
    "Mistral-7B-v0.3": 2 * 32 * 8 * 128 * 2,
    "Mixtral-8x7B-v0.1": 2 * 32 * 8 * 128 * 2,  # experts do not add KV
    "Qwen2.5-7B": 2 * 28 * 4 * 128 * 2,  # 57,344
    "Qwen2.5-72B": 2 * 80 * 8 * 128 * 2,
    "Qwen3-8B": 2 * 36 * 8 * 128 * 2,
    "Qwen3-30B-A3B": 2 * 48 * 4 * 128 * 2,  # explicit head_dim 128 (hidden / heads = 64)
    "Gemma-2-9B": 2 * 42 * 8 * 256 * 2,  # explicit head_dim 256 (hidden / heads = 224)
    "Gemma-3-4B": 2 * 34 * 4 * 256 * 2,
    "Gemma-3-27B": 2 * 62 * 16 * 128 * 2,  # 507,904
    "Phi-3-mini-4k": 2 * 32 * 32 * 96 * 2,  # MHA, head_dim 96
    "Falcon-7B": 2 * 32 * 1 * 64 * 2,  # 8,192: multi_query, one KV head
    "Falcon-40B": 2 * 60 * 8 * 64 * 2,  # 122,880
    "Command-R7B": 2 * 32 * 8 * 128 * 2,
    "GPT-OSS-20B": 2 * 24 * 8 * 64 * 2,  # 49,152
    "GPT-OSS-120B": 2 * 36 * 8 * 64 * 2,  # 73,728
    "DeepSeek-V2-Lite": 27 * (512 + 64) * 2,  # 31,104
    "DeepSeek-V3": 61 * (512 + 64) * 2,  # 70,272: one latent, no factor 2
    "SmolLM2-135M": 2 * 30 * 3 * 64 * 2,  # 23,040
    # The families with mixed layers (tests/test_family_sizing.py derives them in full):
    # "layers" is the layers that hold KV.
    "Llama-4-Scout": 2 * 48 * 8 * 128 * 2,  # 196,608 (36 of them chunked)
    "Qwen3-Next-80B-A3B": 2 * 12 * 2 * 256 * 2,  # 24,576: 12 of 48 layers attend
    "Granite-4.0-H-Tiny": 2 * 4 * 4 * 128 * 2,  # 8,192: 4 of 40 layers attend
    "Jamba-1.5-Mini": 2 * 4 * 8 * 128 * 2,  # 16,384: 4 of 32 layers attend
    "Falcon-H1-7B": 2 * 44 * 2 * 128 * 2,  # 45,056 (and a Mamba2 state per layer)
    "Gemma-3n-E4B": 2 * 20 * 2 * 256 * 2,  # 40,960: 15 of 35 layers share KV
    "MiniCPM3-4B": 2 * 62 * 40 * 96 * 2,  # 952,320: K and V per head, not a latent
    "DeepSeek-V3.2": 61 * ((512 + 64) * 2 + 132),  # 78,324: latent and indexer key
}
# (sliding-window layers, window) for the presets that have them.
GOLDEN_SLIDING = {"Mistral-7B-v0.1": (32, 4096), "Gemma-2-9B": (21, 4096),
                  "Gemma-3-4B": (29, 1024), "Gemma-3-27B": (52, 1024),
                  "Phi-3-mini-4k": (32, 2047), "Command-R7B": (24, 4096),
                  "GPT-OSS-20B": (12, 128), "GPT-OSS-120B": (18, 128),
                  "Gemma-3n-E4B": (16, 512)}


def test_every_preset_has_a_golden_value() -> None:
    assert set(load_presets()) == set(GOLDEN_BYTES_PER_TOKEN)


@pytest.mark.parametrize("name", sorted(GOLDEN_BYTES_PER_TOKEN))
def test_bytes_per_token_matches_the_hand_computed_value(name: str) -> None:
    layout = kv_layout(load_presets()[name], "fp16")
    assert layout.bytes_per_token == GOLDEN_BYTES_PER_TOKEN[name]
    assert layout.block_bytes(16) == 16 * GOLDEN_BYTES_PER_TOKEN[name]


@pytest.mark.parametrize("name", sorted(GOLDEN_BYTES_PER_TOKEN))
def test_sliding_window_layers_of_each_preset(name: str) -> None:
    spec = load_presets()[name]
    assert (spec.num_sliding_layers, spec.sliding_window) == GOLDEN_SLIDING.get(name, (0, 0))


def test_issue_examples() -> None:
    presets = load_presets()
    assert kv_layout(presets["Llama-3.1-70B"], "fp16").bytes_per_token == 327_680
    assert kv_layout(presets["DeepSeek-V3"], "fp16").bytes_per_token == 70_272


def test_dtypes_scale_the_bytes_and_count_their_scales() -> None:
    spec = load_presets()["Llama-3.1-8B"]  # 32 layers, 8 KV heads, head_dim 128
    assert kv_layout(spec, "fp32").bytes_per_token == 2 * 32 * 8 * 128 * 4
    assert kv_layout(spec, "fp8").bytes_per_token == 2 * 32 * 8 * 128 * 1
    # int8: 128 bytes + 2 groups of 64 x one 2-byte scale; int4: 64 bytes + 2 x (scale + zero).
    assert kv_layout(spec, "int8").bytes_per_token == 2 * 32 * 8 * (128 + 2 * 2)
    assert kv_layout(spec, "int4").bytes_per_token == 2 * 32 * 8 * (64 + 2 * 4)
    assert all(d.assumption for d in KV_DTYPES.values())


def test_scales_round_up_to_whole_groups() -> None:
    phi = load_presets()["Phi-3-mini-4k"]  # head_dim 96: two groups of 64 (the last one partial)
    assert KV_DTYPES["int8"].vector_bytes(96) == 96 + 2 * 2
    assert kv_layout(phi, "int8").bytes_per_token == 2 * 32 * 32 * (96 + 4)


def test_tensor_parallel_splits_kv_heads_and_replicates_past_them() -> None:
    presets = load_presets()
    llama = presets["Llama-3.1-70B"]  # 8 KV heads
    assert kv_layout(llama, "fp16", tp=2).heads_per_gpu == 4
    assert kv_layout(llama, "fp16", tp=8).bytes_per_token == 327_680 // 8
    assert kv_layout(llama, "fp16", tp=16).heads_per_gpu == 1  # replicated, not 0.5
    deepseek = presets["DeepSeek-V3"]  # the latent is replicated on every rank
    assert kv_layout(deepseek, "fp16", tp=8).bytes_per_token == 70_272
    with pytest.raises(ValueError):
        kv_layout(llama, "fp16", tp=0)


def test_sliding_layers_keep_at_most_the_window() -> None:
    gemma = kv_layout(load_presets()["Gemma-2-9B"], "fp16")  # 21 of 42 layers slide, window 4096
    per_layer = 2 * 8 * 256 * 2
    assert gemma.full_bytes(8192) == 21 * per_layer * 8192
    assert gemma.sliding_bytes(8192) == 21 * per_layer * 4096
    assert gemma.sequence_bytes(1000) == 42 * per_layer * 1000  # inside the window: no saving
    mistral = kv_layout(load_presets()["Mistral-7B-v0.1"], "fp16")  # every layer slides
    assert mistral.sequence_bytes(32_768) == 131_072 * 4096
    assert mistral.sequence_bytes(100) == 131_072 * 100


def test_layer_blocks_of_a_window_that_straddles_block_boundaries() -> None:
    gemma = kv_layout(load_presets()["Gemma-2-9B"], "fp16")
    # full layers: 8192 / 16 = 512 blocks; sliding: 4096 / 16 + 1 (unaligned window) = 257.
    assert gemma.layer_blocks(8192, 16) == 21 * 512 + 21 * 257
    assert gemma.layer_blocks(100, 16) == 42 * 7  # ceil(100 / 16) everywhere


def test_mha_when_kv_heads_equal_heads() -> None:
    spec = ModelSpec("mha", num_layers=2, num_attention_heads=4, num_kv_heads=4, head_dim=8)
    assert spec.attention_kind == "MHA"
    assert kv_layout(spec, "fp32").bytes_per_token == 2 * 2 * 4 * 8 * 4


def test_format_bytes_says_binary_and_decimal() -> None:
    assert format_bytes(999) == "999 B"
    assert format_bytes(2**30) == "1.00 GiB (1.07 GB)"
    assert format_bytes(11.12 * 2**30) == "11.12 GiB (11.94 GB)"
    assert format_bytes(2**70).endswith("PB)")


def test_latex_substitutes_the_numbers() -> None:
    presets = load_presets()
    text = per_token_latex(kv_layout(presets["Llama-3.1-70B"], "fp16"))
    assert "80" in text and "128" in text and "327{,}680" in text
    mla = per_token_latex(kv_layout(presets["DeepSeek-V3"], "fp16"))
    assert "latent" in mla and "70{,}272" in mla and "512 + 64" in mla
    sliding = batch_latex(kv_layout(presets["Gemma-2-9B"], "fp16"), 8192, 2)
    assert r"\min(8{,}192, 4{,}096)" in sliding
    total = 2 * (21 * 8192 + 21 * 4096) * 2 * 8 * 256 * 2
    assert f"{total:,}".replace(",", "{,}") in sliding


def test_chunked_layers_keep_one_chunk_and_the_blocks_from_its_start() -> None:
    scout = kv_layout(load_presets()["Llama-4-Scout"], "fp16")  # 12 full, 36 chunked of 8,192
    per_layer = 2 * 8 * 128 * 2
    assert scout.chunked_bytes(10_000) == 36 * per_layer * 8_192
    assert scout.chunked_bytes(5_000) == 36 * per_layer * 5_000
    # At 10,000 tokens the current chunk starts at token 8,192 = block 512: a chunked layer
    # spans blocks 512..624, 113 of them; a full one all cdiv(10,000, 16) = 625.
    assert scout.layer_blocks(10_000, 16) == 12 * 625 + 36 * 113


def test_latex_shows_what_each_family_adds() -> None:
    presets = load_presets()
    qwen = batch_latex(kv_layout(presets["Qwen3-Next-80B-A3B"], "fp16"), 8192, 1)
    assert r"\text{Gated DeltaNet state}" in qwen and r"36 \times 1{,}097{,}728" in qwen
    scout = batch_latex(kv_layout(presets["Llama-4-Scout"], "fp16"), 8192, 1)
    assert r"36 \times 4{,}096 \times \min(8{,}192, 8{,}192)" in scout
    v32 = per_token_latex(kv_layout(presets["DeepSeek-V3.2"], "fp8"))
    assert "indexer" in v32 and "fp8_ds_mla" in v32 and "48{,}068" in v32
    shared = per_token_latex(kv_layout(presets["Gemma-3n-E4B"], "fp16"))
    assert r"\underbrace{20}_{\text{layers}}" in shared
