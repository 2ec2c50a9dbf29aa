"""The config.json reader: what transformers fills in, each family's aliases and defaults,
field-by-field errors, hostile input, fuzzing. The published files themselves are checked in
tests/test_real_configs.py; the dicts here are small synthetic configs for one rule each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.sizing.config_reader import MAX_CONFIG_BYTES, read_hf_config
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import ConfigError, ModelSpec
from lab.sizing.vllm_sheet import engine_block_size, vllm_sheet

CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
# A Llama-shaped config trimmed to the keys the reader reads (synthetic, for the error cases).
LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 131072, "vocab_size": 128256,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
GEMMA_2 = json.loads((CONFIGS / "gemma-2-9b.json").read_text())
DEEPSEEK_V3 = json.loads((CONFIGS / "deepseek-v3.json").read_text())


def read(config: object) -> ModelSpec:
    return read_hf_config(json.dumps(config))


def test_llama_gqa_and_derived_head_dim() -> None:
    spec = read(LLAMA)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (32, 8, 128)
    assert spec.attention_kind == "GQA" and spec.max_position_embeddings == 131072
    assert spec.num_params == 8_030_261_248  # the published count, from the shapes
    assert spec.weight_dtype == "bf16"


def test_absent_kv_heads_means_mha_for_families_without_a_default() -> None:
    spec = read({k: v for k, v in LLAMA.items() if k != "num_key_value_heads"})
    assert spec.num_kv_heads == 32 and spec.attention_kind == "MHA"
    assert any("multi-head attention" in note for note in spec.notes)


def test_family_defaults_fill_what_the_file_leaves_out() -> None:
    # MistralConfig's defaults: 8 KV heads and a 4,096-token window on every layer.
    mistral = read({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                    "num_attention_heads": 32})
    assert (mistral.num_kv_heads, mistral.sliding_window, mistral.num_sliding_layers) == (
        8, 4096, 32)
    # Qwen3Config: head_dim 128 whatever hidden / heads is.
    assert read({"model_type": "qwen3", "hidden_size": 2048, "num_hidden_layers": 2,
                 "num_attention_heads": 32}).head_dim == 128
    # An explicit null is kept, as in transformers: no window.
    assert read({**LLAMA, "model_type": "mistral", "sliding_window": None}).sliding_window == 0


def test_layer_types_beat_the_pattern() -> None:
    types = ["sliding_attention", "full_attention", "full_attention"] * 14
    spec = read({**GEMMA_2, "layer_types": types})
    assert spec.num_sliding_layers == 14


def test_an_explicit_pattern_beats_the_familys() -> None:
    spec = read({**GEMMA_2, "model_type": "gemma3_text", "sliding_window_pattern": 3})
    assert spec.num_sliding_layers == 42 - 42 // 3


def test_falcon_multi_query_and_the_new_architecture() -> None:
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
              "num_attention_heads": 71}
    assert read(falcon).num_kv_heads == 1  # FalconConfig's default multi_query=True
    assert read({**falcon, "multi_query": False}).num_kv_heads == 71
    new = {**falcon, "new_decoder_architecture": True, "num_kv_heads": 1}
    assert read({**new, "num_kv_heads": 8, "num_attention_heads": 64,
                 "hidden_size": 4096}).num_kv_heads == 8
    assert read({**falcon, "n_head_kv": 71, "multi_query": False}).num_kv_heads == 71


def test_other_families_names_for_the_same_keys() -> None:
    gpt2 = read({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
                 "n_positions": 1024, "vocab_size": 50257})
    assert (gpt2.num_layers, gpt2.head_dim, gpt2.max_position_embeddings) == (12, 64, 1024)
    assert gpt2.num_params == pytest.approx(124e6, rel=0.02)  # GPT-2 small, ungated MLP
    bigcode = read({"model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40, "n_head": 48})
    assert bigcode.num_kv_heads == 1  # GPTBigCodeConfig's multi_query=True (StarCoder)
    chatglm = read({"model_type": "chatglm", "num_layers": 28, "num_attention_heads": 32,
                    "hidden_size": 4096, "multi_query_attention": True,
                    "multi_query_group_num": 2, "kv_channels": 128, "seq_length": 32768})
    assert (chatglm.num_layers, chatglm.num_kv_heads, chatglm.head_dim) == (28, 2, 128)
    assert chatglm.max_position_embeddings == 32768
    mpt = read({"model_type": "mpt", "d_model": 4096, "n_layers": 32, "n_heads": 32,
                "max_seq_len": 8192, "attn_config": {"kv_n_heads": 8}})
    assert (mpt.num_kv_heads, mpt.max_position_embeddings) == (8, 8192)


def test_chunked_local_attention_is_llama_4s() -> None:
    # Policy change (issue 28): chunked local attention is now modelled. vLLM's Llama4Attention
    # gives it to the RoPE layers; without no_rope_layers, Llama4TextConfig's default makes
    # every 4th layer NoPE (full attention): 24 chunked + 8 full of 32.
    spec = read({**LLAMA, "model_type": "llama4_text", "attention_chunk_size": 8192})
    assert (spec.num_chunked_layers, spec.attention_chunk_size) == (24, 8192)
    assert kv_layout(spec).num_full_layers == 8
    flags = read({**LLAMA, "model_type": "llama4_text", "attention_chunk_size": 8192,
                  "no_rope_layers": [1, 0] * 16})
    assert flags.num_chunked_layers == 16
    # Other families' attention ignores the key, and the note says so.
    other = read({**LLAMA, "attention_chunk_size": 8192})
    assert other.num_chunked_layers == 0
    assert any("attention_chunk_size ignored" in note for note in other.notes)


def test_an_unknown_family_says_the_generic_rules_apply() -> None:
    spec = read({**LLAMA, "model_type": "brand_new"})
    assert any("not in the lab's table" in note for note in spec.notes)


@pytest.mark.parametrize(("rope", "length"), [
    ({"rope_type": "linear", "factor": 4.0}, 4 * 4096),
    ({"type": "dynamic", "factor": 2}, 2 * 4096),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
    ({"rope_type": "llama3", "factor": 8.0}, 4096),
    ({"rope_type": "longrope", "factor": 32.0}, 4096),
    ({"rope_type": "linear", "factor": "x"}, 4096),
    ({"rope_type": "linear", "factor": 1e300}, 4096),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": None}, 4096),
])
def test_max_model_len_follows_vllms_rope_scaling_rule(rope: dict, length: int) -> None:
    spec = read({**LLAMA, "max_position_embeddings": 4096, "rope_scaling": rope})
    assert spec.max_position_embeddings == length


def test_without_a_length_key_vllm_assumes_2048() -> None:
    spec = read({k: v for k, v in LLAMA.items() if k != "max_position_embeddings"}
                | {"model_type": "brand_new"})
    assert spec.max_position_embeddings == 2048


@pytest.mark.parametrize(("quant", "dtype", "group"), [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", 128),
    ({"quant_method": "fbgemm_fp8"}, "fp8", 128),
    ({"quant_method": "mxfp4"}, "mxfp4", 128),
    ({"quant_method": "awq", "bits": 4, "group_size": 64}, "int4", 64),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, "int8", 0),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bf16", 128),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 4, "type": "int", "group_size": 32}}}}, "int4", 32),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {
        "num_bits": 8, "type": "float"}}}}, "fp8", 128),
    ({"quant_method": "compressed-tensors", "config_groups": [1, 2]}, "bf16", 128),
    ({"quant_method": "bitsandbytes"}, "bf16", 128),
    ({"bits": True}, "bf16", 128),
])
def test_quantization_config_sets_the_weight_format(quant: dict, dtype: str, group: int) -> None:
    spec = read({**LLAMA, "quantization_config": quant})
    assert (spec.weight_dtype, spec.weight_group_size) == (dtype, group)


def test_float32_checkpoints_load_in_16_bits() -> None:
    spec = read({**LLAMA, "torch_dtype": "float32"})
    assert spec.weight_dtype == "bf16" and spec.weight_bytes() == 2 * spec.num_params
    assert read({**LLAMA, "dtype": "torch.float16"}).weight_dtype == "bf16"
    assert read({**LLAMA, "torch_dtype": [1]}).weight_dtype == "bf16"


def test_mla_reads_one_latent_and_counts_its_projections() -> None:
    spec = read(DEEPSEEK_V3)
    assert spec.is_mla and (spec.kv_lora_rank, spec.qk_rope_head_dim) == (512, 64)
    assert kv_layout(spec, "fp16").bytes_per_token == 61 * 576 * 2
    no_q_lora = read({**DEEPSEEK_V3, "q_lora_rank": None})
    q_lora_saves = 128 * 192 * 7168 - (7168 * 1536 + 1536 + 1536 * 128 * 192)
    assert spec.num_params - no_q_lora.num_params == -61 * q_lora_saves


@pytest.mark.parametrize(("config", "field", "words"), [
    ({**LLAMA, "num_hidden_layers": "32"}, "num_hidden_layers", "whole number"),
    ({**LLAMA, "num_hidden_layers": True}, "num_hidden_layers", "whole number"),
    ({**LLAMA, "num_hidden_layers": 32.5}, "num_hidden_layers", "whole number"),
    ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers", "between"),
    ({**LLAMA, "num_hidden_layers": -3}, "num_hidden_layers", "between"),
    ({**LLAMA, "num_hidden_layers": 10**12}, "num_hidden_layers", "between"),
    ({**LLAMA, "num_hidden_layers": 1e300}, "num_hidden_layers", "whole number"),
    # (A known family would get transformers' default; an unknown one cannot.)
    ({k: v for k, v in LLAMA.items() if k not in ("num_attention_heads", "model_type")},
     "num_attention_heads", "missing"),
    ({**LLAMA, "num_key_value_heads": 3}, "num_key_value_heads", "divide"),
    ({**LLAMA, "hidden_size": 4097}, "hidden_size", "multiple"),
    ({**GEMMA_2, "layer_types": ["full_attention"] * 3}, "layer_types", "3 entries"),
    ({**GEMMA_2, "layer_types": ["linear_attention"] * 42}, "layer_types", "cannot model"),
    ({**GEMMA_2, "layer_types": "sliding"}, "layer_types", "list of strings"),
    ({**DEEPSEEK_V3, "qk_rope_head_dim": None}, "qk_rope_head_dim", "missing"),
    ({"text_config": [1, 2]}, "text_config", "object"),
    # Errors name the key the file used: Falcon's num_kv_heads, GPT-2's n_layer.
    ({"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60,
      "num_attention_heads": 128, "new_decoder_architecture": True, "num_kv_heads": 7},
     "num_kv_heads", "divide"),
    ({"model_type": "gpt2", "n_layer": "x", "n_head": 12, "n_embd": 768}, "n_layer",
     "whole number"),
    ({"model_type": "mpt", "d_model": 64, "n_layers": 2, "n_heads": 8,
      "attn_config": {"kv_n_heads": "all"}}, "attn_config.kv_n_heads", "whole number"),
    # The families with mixed layers name what they could not read.
    ({**LLAMA, "model_type": "llama4_text", "attention_chunk_size": 8192,
      "no_rope_layers": [1, 2] * 16}, "no_rope_layers", "0 or 1"),
    ({**LLAMA, "model_type": "nemotron_h", "hybrid_override_pattern": "M*" * 8},
     "hybrid_override_pattern", "each of the 32 layers"),
    ({**LLAMA, "model_type": "nemotron_h"}, "hybrid_override_pattern", "missing"),
    ({**LLAMA, "model_type": "granitemoehybrid"}, "layer_types", "missing"),
    ({**LLAMA, "model_type": "granitemoehybrid", "layer_types": ["mamba"] * 32,
      "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16}, "num_hidden_layers",
     "no attention layer"),
    ({**LLAMA, "model_type": "qwen3_next", "layer_types": ["conv"] * 32}, "layer_types",
     "cannot model"),
    ({**LLAMA, "model_type": "qwen3_next", "linear_num_value_heads": 0},
     "linear_num_value_heads", "between"),
    ({**LLAMA, "model_type": "falcon_h1", "mamba_n_heads": 8, "mamba_d_head": "x",
      "mamba_d_state": 16}, "mamba_d_head", "whole number"),
    ({**LLAMA, "model_type": "gemma3n_text", "num_kv_shared_layers": 40,
      "layer_types": ["full_attention"] * 32}, "num_kv_shared_layers", "must hold"),
])
def test_errors_name_the_field(config: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read(config)
    assert words in caught.value.errors[field]


def test_whole_floats_are_accepted() -> None:
    assert read({**LLAMA, "num_hidden_layers": 32.0}).num_layers == 32


def test_every_bad_field_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        read({"num_hidden_layers": "x", "num_attention_heads": [], "head_dim": -1})
    assert set(caught.value.errors) == {"num_hidden_layers", "num_attention_heads", "head_dim"}


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('"just a string"', "JSON object"),
    ("[" * 200_000 + "]" * 200_000, "nested deeper"),
    ('{"a": ' * 100 + "1" + "}" * 100, "nested deeper"),
    ('{"num_hidden_layers": ' + "9" * 5000 + "}", "too large"),
    ('{"num_hidden_layers": NaN}', "NaN"),
    ('{"num_hidden_layers": -Infinity}', "Infinity"),
    (" " * (MAX_CONFIG_BYTES + 1), "limit"),
    ('{"x": "' + "a" * MAX_CONFIG_BYTES + '"}', "limit"),
])
def test_hostile_text_gives_a_clear_error(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_hf_config(text)
    assert words in str(caught.value)


def test_bytes_must_be_utf8() -> None:
    with pytest.raises(ConfigError, match="UTF-8"):
        read_hf_config(b'{"num_hidden_layers": "\xff"}')
    assert read_hf_config(json.dumps(LLAMA).encode()).num_layers == 32


KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "hidden_size", "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types",
        "sliding_window_pattern", "use_sliding_window", "max_window_layers", "model_type",
        "max_position_embeddings", "torch_dtype", "text_config", "intermediate_size",
        "vocab_size", "num_local_experts", "tie_word_embeddings", "quantization_config",
        "multi_query", "new_decoder_architecture", "num_kv_heads", "n_head_kv", "n_layer",
        "n_embd", "attn_config", "rope_scaling", "vision_config", "n_routed_experts",
        "first_k_dense_replace", "moe_layer_freq", "num_experts", "decoder_sparse_step",
        "mlp_only_layers", "q_lora_rank", "moe_intermediate_size", "n_positions",
        # the families with mixed layers (lab.sizing.layer_plan)
        "attention_chunk_size", "no_rope_layers", "num_kv_shared_layers",
        "hybrid_override_pattern", "mamba_n_heads", "mamba_d_head", "mamba_d_state",
        "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "linear_num_value_heads",
        "full_attention_interval", "attn_layer_period", "mamba_d_ssm", "index_topk",
        "index_head_dim", "qk_nope_head_dim", "mamba_ssm_cache_dtype"]
MODEL_TYPES = st.sampled_from(["llama", "falcon", "gemma3_text", "gemma2", "qwen2", "gpt2",
                               "deepseek_v3", "gpt_oss", "mpt", "cohere2", "llama4_text",
                               "gemma3n_text", "qwen3_next", "granitemoehybrid", "nemotron_h",
                               "jamba", "falcon_h1", "minicpm3", "deepseek_v32"])
scalars = (st.none() | st.booleans() | st.integers(-(10**25), 10**25)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=5),
                           max_leaves=20)
small_ints = st.integers(-2, 300)
configs = st.builds(lambda d, t: {**d, "model_type": t} if t else d,
                    st.dictionaries(st.sampled_from(KEYS), small_ints | scalars | json_values,
                                    max_size=14), st.none() | MODEL_TYPES)


def _outcome(text: str | bytes) -> None:
    try:
        spec = read_hf_config(text)
    except ConfigError as err:
        assert err.errors and all(isinstance(v, str) for v in err.errors.values())
        return
    assert isinstance(spec, ModelSpec)
    layout = kv_layout(spec, "fp16")
    layout.sequence_bytes(4096)  # a spec the formula can always use
    spec.weight_bytes()
    block, _ = engine_block_size(layout, 16)  # and vLLM's sheet
    vllm_sheet(layout, available_kv_memory=1 << 30, block_size=block, max_model_len=4096,
               max_num_batched_tokens=2048).failure()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs | st.builds(lambda c: {"text_config": c}, configs))
def test_fuzz_config_dicts_give_a_spec_or_a_config_error(config: dict) -> None:
    _outcome(json.dumps(config, allow_nan=True))


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_fuzz_any_json_gives_a_spec_or_a_config_error(value: object) -> None:
    _outcome(json.dumps(value, allow_nan=True))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_fuzz_any_text_gives_a_spec_or_a_config_error(text: str | bytes) -> None:
    _outcome(text)
