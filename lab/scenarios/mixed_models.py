"""A real model's KV cache groups, as vLLM 0.33 forms them, beside the mixed-attention walk.

lab/sizing reads the published configs: which layers are full attention, sliding window,
chunked local or recurrent, how vLLM cuts them into groups of an equal number of layers, the
block size it picks (raised for a Mamba-style hybrid until an attention page holds a state
page) and the pages a request can take per group. This module only gathers what the page
shows for one model, at one max_model_len.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.sizing.kv_cache_groups import kv_cache_groups, mamba_cache_mode
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import load_presets
from lab.sizing.vllm_sheet import engine_block_size

MODELS = ("GPT-OSS-20B", "Gemma-3-27B", "Llama-4-Scout", "Qwen3-Next-80B-A3B")
ASKED_BLOCK_SIZE = 16  # vLLM's block size on CUDA when none is asked for
MAX_MODEL_LEN = 32_768
MAX_BATCHED_TOKENS = 8_192
KV_DTYPE = "fp16"  # 2 bytes per value, the configs' bf16


@dataclass(frozen=True)
class GroupRow:
    kind: str  # "full attention", "sliding window", "chunked local" or a state's name
    num_layers: int
    limit: int  # the window or chunk in tokens, 0 for none
    pages_per_request: int  # at MAX_MODEL_LEN


@dataclass(frozen=True)
class ModelGroups:
    name: str
    block_size: int  # the one vLLM picks
    why: str  # why it differs from ASKED_BLOCK_SIZE ("" when it does not)
    page_bytes: int  # one block of one layer
    group_size: int  # layers per group: a block id names a page in each of them
    groups: tuple[GroupRow, ...]


def available_models() -> tuple[str, ...]:
    """The models of MODELS the presets hold."""
    presets = load_presets()
    return tuple(name for name in MODELS if name in presets)


def model_groups(name: str) -> ModelGroups:
    """The groups, block size and page size of a preset, one GPU, KV cache in fp16."""
    if name not in available_models():
        raise ValueError(f"no KV cache groups for {name!r}: choose one of "
                         f"{', '.join(available_models())}")
    layout = kv_layout(load_presets()[name], KV_DTYPE, 1)
    block_size, why = engine_block_size(layout, ASKED_BLOCK_SIZE)
    groups, group_size = kv_cache_groups(layout, block_size, MAX_MODEL_LEN, MAX_BATCHED_TOKENS,
                                         mamba_cache_mode(layout, False))
    rows = tuple(GroupRow(g.kind, g.num_layers, g.limit, g.pages_per_request) for g in groups)
    return ModelGroups(name, block_size, why, layout.bytes_per_token_layer * block_size,
                       group_size, rows)
