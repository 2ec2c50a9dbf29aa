"""KV-size calculator: the guide's tensor formula for a real model, and a capacity sheet."""

from __future__ import annotations

import streamlit as st

from lab.figures.calculator import kv_dtype_figure, kv_vs_context_figure, memory_split_figure
from lab.sizing.capacity import (
    GIB,
    LAB_MAX_BLOCK_SIZE,
    LAB_MAX_BLOCKS,
    LAB_MIN_BLOCKS,
    capacity_sheet,
    lab_pool,
    load_gpus,
    weight_bytes_per_gpu,
)
from lab.sizing.config_reader import MAX_CONFIG_BYTES, read_hf_config
from lab.sizing.kv_formula import KV_DTYPES, batch_latex, format_bytes, kv_layout, per_token_latex
from lab.sizing.model_spec import LIMITS, WEIGHT_DTYPES, ConfigError, ModelSpec, load_presets
from ui.layout import explain, settings, show_figure
from ui.sidebar import sidebar
from ui.state import choice_param, float_param, int_param

sidebar()

PRESETS = load_presets()
DEFAULT_PRESET = "Llama-3.1-8B"
CUSTOM = "Custom"
LAST_PRESET = "_calc_last_preset"  # session_state: the preset whose values fill the fields
CONFIG_NOTES, CONFIG_ERRORS = "_calc_config_notes", "_calc_config_errors"
# Model fields: (widget key = link parameter, ModelSpec field, label).
FIELDS = [
    ("layers", "num_layers", "Layers"),
    ("heads", "num_attention_heads", "Attention heads"),
    ("kv_heads", "num_kv_heads", "KV heads"),
    ("head_dim", "head_dim", "Head dim"),
    ("kv_lora_rank", "kv_lora_rank", "MLA latent rank (0 = no MLA)"),
    ("rope_dim", "qk_rope_head_dim", "MLA RoPE key dim"),
    ("window", "sliding_window", "Sliding window (tokens)"),
    ("sliding_layers", "num_sliding_layers", "Sliding-window layers"),
    ("max_pos", "max_position_embeddings", "Max context (0 = unknown)"),
]
PARAMS_KEY, WEIGHT_KEY = "params_b", "weight_dtype"


def _fill(spec: ModelSpec) -> None:
    """Put a spec's values into the field widgets (before they are drawn this run)."""
    for key, name, _ in FIELDS:
        st.session_state[key] = getattr(spec, name)
    st.session_state[PARAMS_KEY] = round(spec.num_params / 1e9, 3)
    st.session_state[WEIGHT_KEY] = spec.weight_dtype


def _load_config(data: str | bytes, name: str) -> None:
    """Callback: read a config.json into the fields, or keep its errors for display."""
    try:
        spec = read_hf_config(data, name)
    except ConfigError as err:
        st.session_state[CONFIG_ERRORS], st.session_state[CONFIG_NOTES] = err.errors, []
        return
    _fill(spec)
    st.session_state["model"] = st.session_state[LAST_PRESET] = CUSTOM
    st.session_state[CONFIG_ERRORS], st.session_state[CONFIG_NOTES] = {}, list(spec.notes)


def _on_paste() -> None:
    _load_config(st.session_state.get("config_text", ""), "pasted config.json")


def _on_upload() -> None:
    upload = st.session_state.get("config_file")
    if upload is not None:
        _load_config(upload.getvalue()[: MAX_CONFIG_BYTES + 1], upload.name)


st.title("KV-size calculator")
explain(
    "How much KV cache does a token create? The guide's formula, "
    "**2 × layers × KV heads × head dim × tokens × batch × bytes per element**, done right for "
    "grouped-query attention (the KV-head term is the number of *KV* heads), explicit head "
    "dimensions, DeepSeek's MLA (one latent per token, no factor 2) and sliding-window layers "
    "(which keep at most `window` tokens). Paging does not change these bytes; it changes how "
    "well the pool packs them. Pick a preset, paste a `config.json`, or type every field."
)

# -- model -----------------------------------------------------------------------------------
with settings("Model"):
    top = st.columns([2, 3])
    with top[0]:
        preset = choice_param("Model preset", "model", [*PRESETS, CUSTOM], default=DEFAULT_PRESET,
                              help="Every field below stays editable after a preset fills it.")
    last = st.session_state.get(LAST_PRESET)
    if last is not None and preset != last and preset != CUSTOM:
        _fill(PRESETS[preset])  # the user picked another preset: its values replace the fields
    st.session_state[LAST_PRESET] = preset
    base = PRESETS.get(preset, PRESETS[DEFAULT_PRESET])  # defaults of the fields (and the link)
    with top[1]:
        with st.expander("Read a Hugging Face config.json (paste or upload)"):
            st.text_area("Paste config.json", key="config_text", height=140,
                         max_chars=MAX_CONFIG_BYTES)
            st.button("Read pasted config", key="config_read", on_click=_on_paste)
            st.file_uploader("…or upload it (JSON only, at most 1 MB)", type=["json"],
                             key="config_file", on_change=_on_upload, max_upload_size=1)
        for field, why in st.session_state.get(CONFIG_ERRORS, {}).items():
            st.error(f"config.json `{field}`: {why}")
        for note in st.session_state.get(CONFIG_NOTES, []):
            st.caption(f"ℹ️ {note}")
    values, slots = {}, {}
    rows = [st.columns(5), st.columns(5)]  # two aligned rows of five fields
    for i, (key, name, label) in enumerate(FIELDS):
        with rows[i // 5][i % 5]:
            low, high = LIMITS[name]
            values[name] = int_param(label, key, default=getattr(base, name), min_value=low,
                                     max_value=high, widget="number")
            slots[name] = st.empty()  # room for a message about this field
    with rows[1][4]:
        params_b = float_param("Parameters (billions)", PARAMS_KEY,
                               default=round(base.num_params / 1e9, 3), min_value=0.0,
                               max_value=LIMITS["num_params"][1] / 1e9, step=0.1,
                               widget="number")
    spec: ModelSpec | None = None
    try:
        spec = ModelSpec(name=preset, num_params=int(params_b * 1e9), **values,
                         weight_dtype=base.weight_dtype, source=base.source)
    except ConfigError as err:
        for name, why in err.errors.items():
            (slots.get(name) or st).error(why)
    if spec is not None and preset != CUSTOM:
        edited = [label for _, name, label in FIELDS
                  if getattr(spec, name) != getattr(base, name)]
        note = f"edited: {', '.join(edited)}" if edited else "as published"
        st.caption(" · ".join([spec.attention_kind, note, f"source: {base.source}", *base.notes]))

# -- workload --------------------------------------------------------------------------------
with settings("Workload"):
    cols = st.columns(5)
    with cols[0]:
        dtype_key = choice_param("KV dtype", "kv_dtype", list(KV_DTYPES), default="fp16",
                                 help="fp16 stands for bf16 too: both take 2 bytes.")
    with cols[1]:
        context = int_param("Tokens per sequence", "context", default=8192, min_value=1,
                            max_value=10_000_000, widget="number")
    with cols[2]:
        batch = int_param("Batch (sequences)", "batch", default=1, min_value=1,
                          max_value=1_000_000, widget="number")
    with cols[3]:
        block_size = choice_param("Block size", "block", [8, 16, 32, 64, 128], default=16)
    with cols[4]:
        tp = choice_param("Tensor-parallel GPUs", "tp", [1, 2, 4, 8, 16, 32, 64], default=1)
    st.caption(f"KV dtype {KV_DTYPES[dtype_key].label}: {KV_DTYPES[dtype_key].assumption}")
    if spec is None:
        st.stop()  # the model fields above say what to fix
    if spec.max_position_embeddings and context > spec.max_position_embeddings:
        st.warning(f"{context:,} tokens is beyond this model's max_position_embeddings "
                   f"({spec.max_position_embeddings:,}); the numbers below still follow "
                   "the formula.")

layout = kv_layout(spec, dtype_key, tp)
seq_bytes = layout.sequence_bytes(context)

# -- KV cache size ---------------------------------------------------------------------------
st.header("KV cache size")
if spec.is_mla:
    st.latex(r"\text{bytes per token} = 1 \times L \times (r_{kv} + d_{rope}) \times b"
             r"\qquad\text{(MLA: one latent, no separate K and V)}")
else:
    st.latex(r"\text{bytes per token} = 2 \times L \times H_{kv} \times d_{head} \times b")
st.latex(per_token_latex(layout))
st.latex(batch_latex(layout, context, batch))
if tp > 1:
    if spec.is_mla:
        st.info(f"Tensor parallel {tp}: MLA's latent is replicated, so every GPU holds all of it.")
    elif tp > spec.num_kv_heads:
        st.info(f"Tensor parallel {tp} > {spec.num_kv_heads} KV heads: each GPU holds "
                f"max(1, {spec.num_kv_heads} // {tp}) = 1 KV head; heads are replicated.")
    else:
        st.info(f"Tensor parallel {tp}: each GPU holds {spec.num_kv_heads} // {tp} = "
                f"{layout.heads_per_gpu} KV heads. All sizes below are per GPU.")
    if not spec.is_mla and max(tp, spec.num_kv_heads) % min(tp, spec.num_kv_heads):
        st.warning(f"{spec.num_kv_heads} KV heads do not split evenly over {tp} GPUs; "
                   "vLLM refuses such a split.")
rows = [
    ("per token, one layer", layout.bytes_per_token_layer),
    ("per token, all layers", layout.bytes_per_token),
    (f"per block ({block_size} slots, all layers)", layout.block_bytes(block_size)),
    (f"per sequence ({context:,} tokens)", seq_bytes),
    (f"batch of {batch:,} sequences", seq_bytes * batch),
]
st.table({"quantity": [r[0] for r in rows], "bytes": [f"{r[1]:,}" for r in rows],
          "size (GiB = 2³⁰ B; GB = 10⁹ B)": [format_bytes(r[1]) for r in rows]})
if spec.num_sliding_layers:
    part = st.columns(2)
    part[0].metric(f"{layout.num_full_layers} full-attention layers keep {context:,} tokens",
                   format_bytes(layout.full_bytes(context) * batch).split(" (")[0])
    part[1].metric(f"{spec.num_sliding_layers} sliding layers keep "
                   f"{layout.window_tokens(context):,} tokens (window {spec.sliding_window:,})",
                   format_bytes(layout.sliding_bytes(context) * batch).split(" (")[0])

# -- capacity sheet --------------------------------------------------------------------------
st.header("Capacity sheet")
gpus = load_gpus()
with settings("GPU"):
    cols = st.columns(5)
    with cols[0]:
        gpu_name = choice_param("GPU", "gpu", [*gpus, CUSTOM], default="H100 80 GB")
    with cols[1]:
        gpu_gib = float_param("Custom card memory (GiB)", "gpu_gib", default=80.0, min_value=1.0,
                              max_value=4096.0, step=1.0, widget="number",
                              disabled=gpu_name != CUSTOM, help="Used when the GPU is Custom.")
    with cols[2]:
        utilization = float_param("GPU memory utilization", "util", default=0.9, min_value=0.05,
                                  max_value=1.0, step=0.01, widget="number",
                                  help="vLLM's gpu_memory_utilization: the fraction of the "
                                       "whole card the engine may use, not a fraction of "
                                       "what is free.")
    with cols[3]:
        reserve_gib = float_param("Activations + runtime reserve (GiB)", "reserve_gib",
                                  default=2.0, min_value=0.0, max_value=1024.0, step=0.5,
                                  widget="number")
    with cols[4]:
        weight_dtype = choice_param("Weight dtype", WEIGHT_KEY, list(WEIGHT_DTYPES),
                                    default=base.weight_dtype)
gpu_bytes = int(gpu_gib * GIB) if gpu_name == CUSTOM else gpus[gpu_name].memory_bytes
sheet = capacity_sheet(layout, gpu_bytes=gpu_bytes, utilization=utilization,
                       weight_bytes=weight_bytes_per_gpu(spec.num_params, weight_dtype, tp),
                       reserve_bytes=int(reserve_gib * GIB), block_size=block_size,
                       context=context)
if gpu_name != CUSTOM:
    st.caption(f"{gpu_name}: {gpus[gpu_name].marketed}; {gpus[gpu_name].source}.")
sheet_rows = [
    ("card memory", format_bytes(sheet.gpu_bytes)),
    (f"× gpu_memory_utilization {utilization:g}", format_bytes(sheet.usable_bytes)),
    (f"− weights: {spec.num_params / 1e9:,.2f} B params × {weight_dtype} / tp {tp}",
     format_bytes(sheet.weight_bytes)),
    ("− activations + runtime reserve", format_bytes(sheet.reserve_bytes)),
    ("= KV budget", format_bytes(max(sheet.kv_budget_bytes, 0))),
    (f"÷ block bytes ({block_size} slots × all layers)", format_bytes(sheet.block_bytes)),
    ("= KV blocks in the pool", f"{sheet.num_blocks:,}"),
    ("= tokens the pool holds", f"{sheet.num_tokens:,}"),
    (f"blocks one {context:,}-token sequence needs", f"{sheet.seq_blocks:,.1f}"),
    (f"maximum concurrency for {context:,} tokens", f"{sheet.max_concurrency:,.2f}x"),
]
st.table({"step": [r[0] for r in sheet_rows], "value": [r[1] for r in sheet_rows]})
if sheet.kv_budget_bytes <= 0:
    st.error(f"The weights and the reserve need {format_bytes(-sheet.kv_budget_bytes)} more "
             "than the engine may use: no room for any KV block. Use more GPUs (tensor "
             "parallel), a smaller weight dtype, or a larger card.")
elif sheet.num_blocks >= LAB_MIN_BLOCKS:
    lab_blocks, scale = lab_pool(sheet.num_blocks)
    lab_block_size = min(block_size, LAB_MAX_BLOCK_SIZE)
    st.link_button("Open the block-table walkthrough with a pool of this size",
                   f"block_tables?num_blocks={lab_blocks}&block_size={lab_block_size}")
    st.caption(f"The walkthrough animates at most {LAB_MAX_BLOCKS} blocks, so it gets "
               f"{lab_blocks} blocks of {lab_block_size} slots, each standing for {scale:,} of "
               f"this card's {sheet.num_blocks:,} blocks (scale 1:{scale:,})."
               + (f" Block size {block_size} is above its largest, {LAB_MAX_BLOCK_SIZE}."
                  if lab_block_size != block_size else ""))
else:
    st.warning(f"Only {sheet.num_blocks} KV block(s) fit: too few to serve, or to animate.")

tabs = st.tabs(["KV memory vs context", "Weights vs KV cache", "KV dtype"])
with tabs[0]:
    show_figure(kv_vs_context_figure(layout, batch, context, sheet.kv_budget_bytes), "calc_ctx")
with tabs[1]:
    show_figure(memory_split_figure(sheet, seq_bytes * batch), "calc_split")
with tabs[2]:
    show_figure(kv_dtype_figure(layout, context, batch), "calc_dtype")
