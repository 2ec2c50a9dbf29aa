"""What transformers fills in when a config.json leaves a key out, family by family.

A published config.json is not the whole config: transformers builds a config class per
`model_type` (configuration_<type>.py) whose __init__ defaults stand in for every key the file
omits, and vLLM reads that object, not the file. Gemma-3-27B's file has neither `layer_types`
nor `sliding_window_pattern`, so Gemma3TextConfig's pattern 6 decides which layers slide;
Falcon-7B's file has no KV-head count at all, and FalconConfig's `multi_query=True` makes it one.
`resolve` merges the file with those defaults (and the families' other names for the same keys)
so the reader sees what vLLM sees; each filled-in value leaves a note saying so.

The tables hold only the keys the KV formula and the parameter count read. Values are the
defaults in transformers' configuration_<type>.py files (v4.5x), quoted by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# model_type -> {key: default}. None means "absent: derived" (KV heads = heads, head_dim =
# hidden / heads), which is also what an unknown model_type gets for every key.
TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    # LlamaConfig: num_key_value_heads None -> num_attention_heads; head_dim None -> h / H.
    "llama": {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096,
              "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 2048,
              "tie_word_embeddings": False},
    # MistralConfig: 8 KV heads and a 4,096-token window on every layer unless the file says.
    "mistral": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 32000,
                "max_position_embeddings": 4096 * 32, "sliding_window": 4096,
                "tie_word_embeddings": False},
    "mixtral": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 32000,
                "max_position_embeddings": 4096 * 32, "num_local_experts": 8,
                "tie_word_embeddings": False},
    # Qwen2Config / Qwen3Config: the window is off unless use_sliding_window is true.
    "qwen2": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "hidden_size": 4096, "intermediate_size": 22016, "vocab_size": 151936,
              "max_position_embeddings": 32768, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28, "tie_word_embeddings": False},
    "qwen3": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "head_dim": 128, "hidden_size": 4096, "intermediate_size": 22016,
              "vocab_size": 151936, "max_position_embeddings": 32768,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
              "tie_word_embeddings": False},
    "qwen2_moe": {"num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                  "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632, "num_experts": 60,
                  "decoder_sparse_step": 1, "vocab_size": 151936,
                  "max_position_embeddings": 32768, "use_sliding_window": False,
                  "tie_word_embeddings": False},
    "qwen3_moe": {"num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144,
                  "moe_intermediate_size": 768, "num_experts": 128, "decoder_sparse_step": 1,
                  "vocab_size": 151936, "max_position_embeddings": 32768,
                  "use_sliding_window": False, "tie_word_embeddings": False},
    "gemma": {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
              "head_dim": 256, "hidden_size": 3072, "intermediate_size": 24576,
              "vocab_size": 256000, "max_position_embeddings": 8192,
              "tie_word_embeddings": True},
    # Gemma2Config: layer_types default alternates, sliding first (pattern 2).
    "gemma2": {"num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "hidden_size": 2304, "intermediate_size": 9216,
               "vocab_size": 256000, "max_position_embeddings": 8192, "sliding_window": 4096,
               "sliding_window_pattern": 2, "tie_word_embeddings": True},
    # Gemma3TextConfig: every 6th layer is full attention unless layer_types says otherwise.
    "gemma3_text": {"num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "hidden_size": 2304, "intermediate_size": 9216,
                    "vocab_size": 262208, "max_position_embeddings": 131072,
                    "sliding_window": 4096, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True},
    "cohere": {"num_hidden_layers": 40, "num_attention_heads": 64, "hidden_size": 8192,
               "intermediate_size": 22528, "vocab_size": 256000,
               "max_position_embeddings": 8192, "tie_word_embeddings": True},
    # Cohere2Config: three sliding layers, then one full (pattern 4).
    "cohere2": {"num_hidden_layers": 40, "num_attention_heads": 64, "hidden_size": 8192,
                "intermediate_size": 22528, "vocab_size": 256000,
                "max_position_embeddings": 8192, "sliding_window": 4096,
                "sliding_window_pattern": 4, "tie_word_embeddings": True},
    "phi3": {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 3072,
             "intermediate_size": 8192, "vocab_size": 32064, "max_position_embeddings": 4096,
             "tie_word_embeddings": False},
    # FalconConfig: multi_query=True and new_decoder_architecture=False by default, so a file
    # that names neither has one KV head; ffn_hidden_size None -> 4 x hidden (no gate).
    "falcon": {"num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544,
               "vocab_size": 65024, "max_position_embeddings": 2048, "multi_query": True,
               "new_decoder_architecture": False, "tie_word_embeddings": True},
    # GptOssConfig: layer_types default alternates, sliding first; 128-token window.
    "gpt_oss": {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
                "head_dim": 64, "hidden_size": 2880, "intermediate_size": 2880,
                "num_local_experts": 128, "vocab_size": 201088,
                "max_position_embeddings": 131072, "sliding_window": 128,
                "sliding_window_pattern": 2, "tie_word_embeddings": False},
    "deepseek_v2": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "q_lora_rank": 1536, "first_k_dense_replace": 0,
                    "moe_layer_freq": 1, "tie_word_embeddings": False},
    "deepseek_v3": {"num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
                    "intermediate_size": 18432, "moe_intermediate_size": 2048,
                    "n_routed_experts": 256, "n_shared_experts": 1, "first_k_dense_replace": 3,
                    "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
                    "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "vocab_size": 129280, "max_position_embeddings": 4096,
                    "tie_word_embeddings": False},
    # GPTBigCodeConfig (StarCoder): multi_query=True, so one KV head.
    "gpt_bigcode": {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
                    "n_positions": 1024, "vocab_size": 50257, "multi_query": True,
                    "tie_word_embeddings": True},
    "gpt2": {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768,
             "n_positions": 1024, "vocab_size": 50257, "tie_word_embeddings": True},
    "gpt_neox": {"num_hidden_layers": 44, "num_attention_heads": 64, "hidden_size": 6144,
                 "intermediate_size": 24576, "vocab_size": 50432,
                 "max_position_embeddings": 2048, "tie_word_embeddings": False},
}
# A multimodal config's outer model_type -> the type of its text_config, when that one does
# not say (Gemma3Config builds a Gemma3TextConfig; LLaVA's default text model is Llama).
TEXT_CONFIG_TYPES = {"gemma3": "gemma3_text", "llava": "llama", "llava_next": "llama",
                     "mistral3": "mistral", "paligemma": "gemma", "llama4": "llama4_text",
                     "gemma3n": "gemma3n_text"}
# Families whose MLP is up-projection, activation, down-projection (two matrices, no gate).
UNGATED_MLP_TYPES = frozenset({"falcon", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt",
                               "bloom", "phi", "starcoder2", "mpt"})
FALCON_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel"})

# The name a family uses -> the name the reader reads (first alias present wins). Falcon's
# n_head_kv / num_kv_heads and ChatGLM's multi_query_group_num are the KV-head aliases vLLM's
# ModelConfig.get_total_num_kv_heads tries; ChatGLM's kv_channels is its head_dim.
ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
    "num_attention_heads": ("n_head", "n_heads", "num_heads"),
    "hidden_size": ("n_embd", "d_model"),
    "num_key_value_heads": ("n_head_kv", "num_kv_heads", "multi_query_group_num"),
    "head_dim": ("kv_channels", "hidden_size_per_head"),
    "intermediate_size": ("ffn_hidden_size", "n_inner", "ffn_dim"),
    "vocab_size": ("padded_vocab_size",),
}
# vLLM's _get_and_verify_max_len takes the smallest of these that the config has.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_sequence_length", "max_seq_length", "seq_len")


@dataclass
class Resolved:
    """A config as vLLM sees it: the text model's keys, transformers' defaults filled in."""

    values: dict[str, Any]
    model_type: str
    keys: dict[str, str] = field(default_factory=dict)  # canonical key -> the file's name
    notes: list[str] = field(default_factory=list)

    def key(self, name: str) -> str:
        """The name the file used for `name` (for messages in the file's own words)."""
        return self.keys.get(name, name)


def resolve(config: dict[str, Any], text: dict[str, Any] | None) -> Resolved:
    """Merge the text config over the outer one, rename aliases, fill in the type's defaults."""
    outer_type = config.get("model_type")
    values = {k: v for k, v in config.items() if k != "text_config"}
    if text is not None:
        values.update(text)
    model_type = values.get("model_type") if text is None else text.get("model_type")
    if not isinstance(model_type, str):
        model_type = TEXT_CONFIG_TYPES.get(outer_type, outer_type) if text is not None \
            else outer_type
    model_type = model_type if isinstance(model_type, str) else ""
    resolved = Resolved(values, model_type)
    if text is not None:
        resolved.notes.append(f"read the language model's fields from text_config "
                              f"({model_type or 'model_type not given'})")
    _rename_aliases(resolved)
    _fill_defaults(resolved)
    _multi_query(resolved)
    return resolved


def _rename_aliases(resolved: Resolved) -> None:
    values = resolved.values
    attn = values.get("attn_config")
    if isinstance(attn, dict) and attn.get("kv_n_heads") is not None:  # MPT, DBRX
        values.setdefault("num_key_value_heads", attn["kv_n_heads"])
        resolved.keys["num_key_value_heads"] = "attn_config.kv_n_heads"
    for name, aliases in ALIASES.items():
        if values.get(name) is not None:
            continue
        alias = next((a for a in aliases if values.get(a) is not None), None)
        if alias is not None:
            values[name] = values[alias]
            resolved.keys[name] = alias


def _fill_defaults(resolved: Resolved) -> None:
    defaults = TYPE_DEFAULTS.get(resolved.model_type)
    if defaults is None:
        if resolved.model_type:
            resolved.notes.append(f"model_type {resolved.model_type!r} is not in the lab's "
                                  "table of transformers defaults: omitted keys follow the "
                                  "generic rules (KV heads = heads, head_dim = hidden / heads)")
        return
    values = resolved.values
    for key, default in defaults.items():
        if key not in values:  # an explicit null stays null, as in transformers
            values[key] = default
            if key in _NOTED:
                resolved.notes.append(f"{key} absent: {resolved.model_type}'s default "
                                      f"{default!r} (transformers fills it in)")


# Defaults worth a note: they change the KV cache or the layer pattern.
_NOTED = {"num_key_value_heads", "head_dim", "sliding_window", "sliding_window_pattern",
          "num_attention_heads", "num_hidden_layers", "multi_query",
          "new_decoder_architecture", "kv_lora_rank", "qk_rope_head_dim",
          "max_position_embeddings"}


def _multi_query(resolved: Resolved) -> None:
    """One KV head for multi-query models, as vLLM's ModelConfig.get_total_num_kv_heads reads
    them: `multi_query` wins unless a Falcon sets new_decoder_architecture (Falcon-40B/180B,
    whose num_kv_heads counts the KV heads)."""
    values = resolved.values
    new_falcon = resolved.model_type in FALCON_TYPES and values.get("new_decoder_architecture")
    if values.get("multi_query") is True and not new_falcon:
        values["num_key_value_heads"] = 1
        resolved.keys["num_key_value_heads"] = "multi_query"
        resolved.notes.append("multi_query: true (and no new_decoder_architecture): one KV "
                              "head shared by every attention head")
    elif values.get("multi_query_attention") is False:  # ChatGLM with MQA switched off
        values["num_key_value_heads"] = values.get("num_attention_heads")
