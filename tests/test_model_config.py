"""The config.json reader: each family's fields, field-by-field errors, hostile input, fuzzing."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.sizing.config_reader import MAX_CONFIG_BYTES, read_hf_config
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import PRESETS_PATH, ConfigError, ModelSpec, load_presets

LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "max_position_embeddings": 131072,
               "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
GEMMA_2_9B = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
              "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8,
              "head_dim": 256, "sliding_window": 4096, "max_position_embeddings": 8192,
              "vocab_size": 256000, "torch_dtype": "float32"}
GEMMA_3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "torch_dtype": "bfloat16",
              "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                              "num_hidden_layers": 34, "num_attention_heads": 8,
                              "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 1024,
                              "sliding_window_pattern": 6},
              "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27}}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
               "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
MISTRAL_7B_V01 = {"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "sliding_window": 131072,
             "use_sliding_window": False, "max_window_layers": 28}
PHI_3_MINI = {"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 4096}  # no KV-head field
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "moe_intermediate_size": 768, "intermediate_size": 6144,
             "vocab_size": 151936, "tie_word_embeddings": False}
SMOLLM2_135M = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
                "vocab_size": 49152, "tie_word_embeddings": True}


def read(config: object) -> ModelSpec:
    return read_hf_config(json.dumps(config))


def test_llama_gqa_and_derived_head_dim() -> None:
    spec = read(LLAMA_31_8B)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (32, 8, 128)
    assert spec.attention_kind == "GQA" and spec.max_position_embeddings == 131072
    assert spec.num_params == 8_030_261_248  # the published count, from the shapes
    assert spec.weight_dtype == "bf16"


def test_gemma2_explicit_head_dim_and_alternating_windows() -> None:
    spec = read(GEMMA_2_9B)
    assert spec.head_dim == 256  # not 3584 / 16 = 224
    assert (spec.num_sliding_layers, spec.sliding_window) == (21, 4096)
    assert spec.weight_dtype == "fp32"


def test_gemma2_layer_types() -> None:
    types = ["sliding_attention", "full_attention"] * 21
    spec = read({**GEMMA_2_9B, "model_type": "other", "layer_types": types})
    assert spec.num_sliding_layers == 21


def test_gemma3_text_config_and_pattern() -> None:
    spec = read(GEMMA_3_4B)
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (34, 4, 256)
    assert (spec.num_sliding_layers, spec.sliding_window) == (34 - 34 // 6, 1024)
    assert any("text_config" in note for note in spec.notes)


def test_deepseek_mla_is_one_latent() -> None:
    spec = read(DEEPSEEK_V3)
    assert spec.is_mla and (spec.kv_lora_rank, spec.qk_rope_head_dim) == (512, 64)
    assert kv_layout(spec, "fp16").bytes_per_token == 61 * 576 * 2
    assert spec.weight_dtype == "fp8"


def test_mistral_every_layer_slides_and_qwen_switch_is_respected() -> None:
    assert read(MISTRAL_7B_V01).num_sliding_layers == 32
    qwen = read(QWEN25_7B)
    assert (qwen.num_sliding_layers, qwen.sliding_window) == (0, 0)
    assert any("use_sliding_window" in note for note in qwen.notes)
    on = read({**QWEN25_7B, "use_sliding_window": True, "max_window_layers": 20})
    assert on.num_sliding_layers == 8


def test_absent_kv_heads_means_mha() -> None:
    spec = read(PHI_3_MINI)
    assert spec.num_kv_heads == 32 and spec.head_dim == 96 and spec.attention_kind == "MHA"


def test_moe_explicit_head_dim_and_params() -> None:
    spec = read(QWEN3_MOE)
    assert spec.head_dim == 128  # hidden / heads would be 64
    assert 30.0e9 < spec.num_params < 31.0e9  # published: 30.5 B
    smol = read(SMOLLM2_135M)
    assert (smol.num_layers, smol.num_attention_heads, smol.num_kv_heads, smol.head_dim) == (
        30, 9, 3, 64)
    assert 134e6 < smol.num_params < 135e6


def test_presets_agree_with_their_published_configs() -> None:
    """Each preset's geometry is what the reader gets from the config copied beside it."""
    entries = {e["name"]: e for e in json.loads(PRESETS_PATH.read_text())["models"]}
    for name, preset in load_presets().items():
        entry = entries[name]
        assert entry["source"].startswith("https://huggingface.co/")
        spec = read(entry["config"])
        for field in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
                      "kv_lora_rank", "qk_rope_head_dim", "sliding_window",
                      "num_sliding_layers", "max_position_embeddings", "weight_dtype"):
            assert getattr(spec, field) == getattr(preset, field), (name, field)
        if spec.num_params:  # estimated from the shapes unless the preset states the count
            assert abs(spec.num_params - preset.num_params) <= 0.1 * preset.num_params, name


@pytest.mark.parametrize(("config", "field", "words"), [
    ({**LLAMA_31_8B, "num_hidden_layers": "32"}, "num_hidden_layers", "whole number"),
    ({**LLAMA_31_8B, "num_hidden_layers": True}, "num_hidden_layers", "whole number"),
    ({**LLAMA_31_8B, "num_hidden_layers": 32.5}, "num_hidden_layers", "whole number"),
    ({**LLAMA_31_8B, "num_hidden_layers": 0}, "num_hidden_layers", "between"),
    ({**LLAMA_31_8B, "num_hidden_layers": -3}, "num_hidden_layers", "between"),
    ({**LLAMA_31_8B, "num_hidden_layers": 10**12}, "num_hidden_layers", "between"),
    ({**LLAMA_31_8B, "num_hidden_layers": 1e300}, "num_hidden_layers", "whole number"),
    ({k: v for k, v in LLAMA_31_8B.items() if k != "num_attention_heads"},
     "num_attention_heads", "missing"),
    ({**LLAMA_31_8B, "num_key_value_heads": 3}, "num_key_value_heads", "divide"),
    ({**LLAMA_31_8B, "hidden_size": 4097}, "hidden_size", "multiple"),
    ({**GEMMA_2_9B, "layer_types": ["full_attention"] * 3}, "layer_types", "3 entries"),
    ({**GEMMA_2_9B, "layer_types": ["linear_attention"] * 42}, "layer_types", "cannot model"),
    ({**GEMMA_2_9B, "layer_types": "sliding"}, "layer_types", "list of strings"),
    ({**DEEPSEEK_V3, "qk_rope_head_dim": None}, "qk_rope_head_dim", "missing"),
    ({"text_config": [1, 2]}, "text_config", "object"),
])
def test_errors_name_the_field(config: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read(config)
    assert words in caught.value.errors[field]


def test_whole_floats_are_accepted() -> None:
    assert read({**LLAMA_31_8B, "num_hidden_layers": 32.0}).num_layers == 32


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
    assert read_hf_config(json.dumps(LLAMA_31_8B).encode()).num_layers == 32


KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "hidden_size", "kv_lora_rank", "qk_rope_head_dim", "sliding_window", "layer_types",
        "sliding_window_pattern", "use_sliding_window", "max_window_layers", "model_type",
        "max_position_embeddings", "torch_dtype", "text_config", "intermediate_size",
        "vocab_size", "num_local_experts", "tie_word_embeddings", "quantization_config"]
scalars = (st.none() | st.booleans() | st.integers(-(10**25), 10**25)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=5),
                           max_leaves=20)
small_ints = st.integers(-2, 300)
configs = st.dictionaries(st.sampled_from(KEYS), small_ints | scalars | json_values, max_size=12)


def _outcome(text: str | bytes) -> None:
    try:
        spec = read_hf_config(text)
    except ConfigError as err:
        assert err.errors and all(isinstance(v, str) for v in err.errors.values())
        return
    assert isinstance(spec, ModelSpec)
    kv_layout(spec, "fp16").sequence_bytes(4096)  # a spec the formula can always use


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
