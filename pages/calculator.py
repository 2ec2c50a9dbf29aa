"""KV-size calculator: the guide's tensor formula for a real model, and two capacity sheets,
the guide's plain one and vLLM's own computation as the engine will log it."""

from __future__ import annotations

from dataclasses import replace

import streamlit as st

from lab.figures.calculator import kv_dtype_figure, kv_vs_context_figure, memory_split_figure
from lab.sizing.capacity import (
    GIB,
    LAB_MAX_BLOCK_SIZE,
    LAB_MAX_BLOCKS,
    LAB_MIN_BLOCKS,
    capacity_sheet,
    fitting_tp,
    lab_pool,
    load_gpus,
)
from lab.sizing.config_reader import MAX_CONFIG_BYTES, read_hf_config
from lab.sizing.family_terms import (
    family_terms,
    question_explanation,
    question_shape,
    tensor_parallel_notes,
    terms_markdown,
)
from lab.sizing.kv_formula import KV_DTYPES, batch_latex, format_bytes, kv_layout, per_token_latex
from lab.sizing.model_spec import LIMITS, ConfigError, ModelSpec, load_presets
from lab.sizing.sheet_differences import differences
from lab.sizing.vllm_sheet import (
    default_max_num_batched_tokens,
    default_max_num_seqs,
    engine_block_size,
    log_lines,
    sheet_lines,
    vllm_sheet_from_gpu,
)
from lab.sizing.weights import WEIGHT_DTYPES, WEIGHT_FORMATS
from ui.chapters import chapter_strip
from ui.layout import bullets, explain, settings, show_figure
from ui.predict import Question, hatched
from ui.sidebar import sidebar
from ui.state import bool_param, choice_param, float_param, int_param

sidebar()
chapter_strip()

PRESETS = load_presets()
DEFAULT_PRESET = "Llama-3.1-8B"
CUSTOM = "Custom"
LAST_PRESET = "_calc_last_preset"  # session_state: the preset whose values fill the fields
CONFIG_NOTES, CONFIG_ERRORS = "_calc_config_notes", "_calc_config_errors"
CONFIG_SPEC = "_calc_config_spec"  # the last config.json read: the Custom model's weights
MAX_LEN_KEY, DEFAULT_MAX_LEN = "max_model_len", 8192
TP_CHOICES = [1, 2, 4, 8, 16, 32, 64]
# Model fields: (widget key = link parameter, ModelSpec field, label).
FIELDS = [
    ("layers", "num_layers", "Attention layers"),
    ("heads", "num_attention_heads", "Attention heads"),
    ("kv_heads", "num_kv_heads", "KV heads"),
    ("head_dim", "head_dim", "Head dim"),
    ("kv_lora_rank", "kv_lora_rank", "MLA latent rank (0 = no MLA)"),
    ("rope_dim", "qk_rope_head_dim", "MLA RoPE key dim"),
    ("window", "sliding_window", "Sliding window (tokens)"),
    ("sliding_layers", "num_sliding_layers", "Sliding-window layers"),
    ("max_pos", "max_position_embeddings", "Max context (0 = unknown)"),
]
PARAMS_KEY, WEIGHT_KEY, PREFIX_KEY = "params_b", "weight_dtype", "prefix"
QUIZZED = "_calc_quizzed"  # session_state: the bytes question was answered in this visit


def _fill(spec: ModelSpec) -> None:
    """Put a spec's values into the field widgets (before they are drawn this run)."""
    for key, name, _ in FIELDS:
        st.session_state[key] = getattr(spec, name)
    st.session_state[PARAMS_KEY] = round(spec.num_params / 1e9, 3)
    st.session_state[WEIGHT_KEY] = spec.weight_dtype
    st.session_state[MAX_LEN_KEY] = spec.max_position_embeddings or DEFAULT_MAX_LEN


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
    st.session_state[CONFIG_SPEC] = spec


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
    "dimensions, DeepSeek's MLA (one latent per token, no factor 2), sliding-window and "
    "chunked local layers (which keep at most a window or a chunk), layers that read another "
    "layer's KV, and the Mamba or Gated DeltaNet layers of hybrids, which keep a state per "
    "sequence instead; the table under the sizes says which term each family changes. "
    "Paging does not change these bytes; it changes how "
    "well the pool packs them. Pick a preset, paste a `config.json` exactly as published (the "
    "keys it leaves out get the values transformers fills in, as vLLM sees them), or type "
    "every field. The capacity sheet then works the guide's formula beside vLLM's own "
    "computation, line by line as the engine logs it."
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
    # Defaults of the fields (and the link), and the weights the fields do not show.
    base = PRESETS.get(preset) or st.session_state.get(CONFIG_SPEC) or PRESETS[DEFAULT_PRESET]
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
        # The field shows billions to 3 decimals; unless it was edited, keep the exact count.
        unedited = params_b == round(base.num_params / 1e9, 3)
        params = base.num_params if unedited else int(params_b * 1e9)
        shares = (base.unquantized_params, base.expert_params) if base.num_params else (0, 0)
        if params != base.num_params and base.num_params:  # keep the parts' proportions
            shares = tuple(params * n // base.num_params for n in shares)
        spec = replace(base, name=preset, num_params=params, unquantized_params=shares[0],
                       expert_params=shares[1], notes=(), **values)
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
        prefix_caching = bool_param(
            "Prefix caching", PREFIX_KEY, default=False,
            help="Matters for Mamba hybrids, where vLLM keeps it opt-in (off unless "
                 "--enable-prefix-caching; read in vLLM 0.27): on, a request keeps two "
                 "states per layer, or one per block.")
    with cols[4]:
        tp = choice_param("Tensor-parallel GPUs", "tp", TP_CHOICES, default=1)
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
st.latex(r"\text{bytes per token} = 2 \times L \times H_{kv} \times d_{head} \times b"
         r"\qquad\text{(the guide's formula)}")
if spec.is_mla:
    st.latex(r"\text{bytes per token} = 1 \times L \times (r_{kv} + d_{rope}) \times b"
             r"\qquad\text{(MLA: one latent, no separate K and V)}")
BYTES = Question(
    "calc_bytes", f"{spec.name}: {question_shape(layout)}, KV dtype "
    f"{KV_DTYPES[dtype_key].label}. How many bytes of KV cache does one token take, over all "
    "layers?", answer=layout.bytes_per_token, explanation=question_explanation(layout),
    context=(spec, dtype_key, tp))
# Asked once per visit: until it is answered, what gives its answer away is held back; then
# its verdict stays for its own settings, and a new setting asks nothing and holds nothing.
st.session_state[QUIZZED] = shown = BYTES.answered or st.session_state.get(QUIZZED, False)
if not shown or BYTES.answered:
    BYTES.ask()
with hatched(shown, "the sizes", key="calc_sizes"):
    st.latex(per_token_latex(layout))
    st.latex(batch_latex(layout, context, batch))
    if terms := family_terms(layout, context, block_size, prefix_caching):
        st.markdown("**What this model's family changes in the guide's formula**")
        st.markdown(terms_markdown(terms))
for kind, text in tensor_parallel_notes(layout):
    (st.warning if kind == "warning" else st.info)(text)
rows = [
    ("per token, one layer", layout.bytes_per_token_layer),
    ("per token, all layers", layout.bytes_per_token),
    (f"per block ({block_size} slots, all layers)", layout.block_bytes(block_size)),
    *([("recurrent state per sequence (any length)", layout.state_bytes)]
      if spec.state else []),
    (f"per sequence ({context:,} tokens)", seq_bytes),
    (f"batch of {batch:,} sequences", seq_bytes * batch),
]
with hatched(shown, "the sizes", key="calc_table"):
    st.table({"quantity": [r[0] for r in rows], "bytes": [f"{r[1]:,}" for r in rows],
              "size (GiB = 2³⁰ B; GB = 10⁹ B)": [format_bytes(r[1]) for r in rows]})
    parts = [(f"{layout.num_full_layers} full-attention layers keep {context:,} tokens",
              layout.full_bytes(context))]
    if spec.num_sliding_layers:
        parts.append((f"{spec.num_sliding_layers} sliding layers keep "
                      f"{layout.window_tokens(context):,} tokens (window {spec.sliding_window:,})",
                      layout.sliding_bytes(context)))
    if spec.num_chunked_layers:
        parts.append((f"{spec.num_chunked_layers} chunked layers keep "
                      f"{layout.chunk_tokens(context):,} tokens (chunk "
                      f"{spec.attention_chunk_size:,})", layout.chunked_bytes(context)))
    if spec.state:
        parts.append((f"{spec.state.num_layers} {spec.state.label} layers keep a state",
                      layout.state_bytes))
    if len(parts) > 1:
        for col, (label, size) in zip(st.columns(len(parts)), parts, strict=True):
            col.metric(label, format_bytes(size * batch).split(" (")[0])

# -- capacity sheets -------------------------------------------------------------------------
st.header("Capacity sheet")
gpus = load_gpus()
with settings("GPU and engine"):
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
        reserve_gib = float_param("Non-KV reserve (GiB)", "reserve_gib", default=2.0,
                                  min_value=0.0, max_value=1024.0, step=0.5, widget="number",
                                  help="Activations, non-torch memory and CUDA graphs: what "
                                       "vLLM's profile run measures beside the weights.")
    with cols[4]:
        weight_dtype = choice_param("Weight dtype", WEIGHT_KEY, list(WEIGHT_DTYPES),
                                    default=base.weight_dtype,
                                    help="As vLLM loads them: a float32 checkpoint loads in "
                                         "bf16; quantized ones keep their format.")
    cols = st.columns(3)
    with cols[0]:
        max_model_len = int_param("max_model_len", MAX_LEN_KEY,
                                  default=spec.max_position_embeddings or DEFAULT_MAX_LEN,
                                  min_value=1, max_value=LIMITS["max_position_embeddings"][1],
                                  widget="number", help="vLLM logs its concurrency for "
                                  "requests this long; by default the model's context.")
    with cols[1]:
        batched = int_param("max_num_batched_tokens (0 = vllm serve's default)", "batched",
                            default=0, min_value=0, max_value=1 << 20, widget="number",
                            help="The token budget of one step; a sliding-window layer "
                                 "keeps room for one such prefill chunk.")

custom_gpu = gpu_name == CUSTOM
driver_bytes = int(gpu_gib * GIB) if custom_gpu else gpus[gpu_name].memory_bytes
cuda_bytes = driver_bytes if custom_gpu else gpus[gpu_name].cuda_bytes
batched = batched or default_max_num_batched_tokens(gpu_name, cuda_bytes)
weights = spec.weight_bytes(tp, weight_dtype)
reserve = int(reserve_gib * GIB)
plain = capacity_sheet(layout, gpu_bytes=driver_bytes, utilization=utilization,
                       weight_bytes=weights, reserve_bytes=reserve, block_size=block_size,
                       context=context)
engine_block, block_note = engine_block_size(layout, block_size, prefix_caching)
sheet = vllm_sheet_from_gpu(layout, total_memory=cuda_bytes, utilization=utilization,
                            weights_memory=weights, other_memory=reserve,
                            block_size=engine_block, max_model_len=max_model_len,
                            max_num_batched_tokens=batched, prefix_caching=prefix_caching)
if custom_gpu:
    st.caption("A custom card: both sheets start from the memory you typed.")
else:
    g = gpus[gpu_name]
    st.caption(f"{gpu_name}: {g.marketed}. The driver lists {g.memory_gib:g} GiB ({g.source}); "
               f"CUDA reports {g.cuda_total_mib:,} MiB ({g.cuda_source}).")
fmt = WEIGHT_FORMATS[weight_dtype]
st.caption(f"Weights {fmt.label}: {spec.num_params / 1e9:,.2f} B parameters"
           + (f", {spec.unquantized_params / 1e9:,.2f} B of them kept in 16 bits"
              if fmt.bits < 16 else "") + (f"; {fmt.note}" if fmt.note else "")
           + (f"; {spec.weight_group_size} weights per scale" if fmt.grouped else "") + ".")
if dtype_key not in ("fp16", "fp8"):
    st.caption(f"vLLM's kv_cache_dtype has no {KV_DTYPES[dtype_key].label} (auto is the "
               "model's 16-bit dtype, or fp8): its sheet below uses the lab's bytes for it.")

with hatched(shown, "the capacity sheets", key="calc_sheets"):
    left, right = st.columns([2, 3])
    with left:
        st.subheader("The guide's formula")
        plain_rows = [
            ("card memory (the driver's total)", format_bytes(plain.gpu_bytes)),
            (f"× gpu_memory_utilization {utilization:g}", format_bytes(plain.usable_bytes)),
            (f"− weights ({weight_dtype}, / tp {tp})", format_bytes(plain.weight_bytes)),
            ("− non-KV reserve", format_bytes(plain.reserve_bytes)),
            ("= KV budget", format_bytes(max(plain.kv_budget_bytes, 0))),
            (f"÷ block bytes ({block_size} slots × all layers)", format_bytes(plain.block_bytes)),
            ("= KV blocks in the pool", f"{plain.num_blocks:,}"),
            ("= tokens the pool holds", f"{plain.num_tokens:,}"),
            (f"blocks one {context:,}-token sequence needs", f"{plain.seq_blocks:,.1f}"),
            (f"maximum concurrency for {context:,} tokens", f"{plain.max_concurrency:,.2f}x"),
        ]
        st.table({"step": [r[0] for r in plain_rows], "value": [r[1] for r in plain_rows]})
    with right:
        st.subheader("Where vLLM's computation parts from it")
        bullets(differences(layout, plain, sheet, block_size,
                            default_max_num_seqs(gpu_name, cuda_bytes)))
    st.subheader("As vLLM will log it")
    lines = sheet_lines(sheet)
    st.table({"step": [x.step for x in lines], "value": [x.value for x in lines],
              "vLLM source": [x.source for x in lines]})
    if block_note:
        st.caption(block_note + ".")
    if failure := sheet.failure():
        st.error(f"vLLM would stop here: {failure}", icon=":material/block:")
    st.markdown("The start-up lines vLLM prints for these settings (compare them with a real log "
                "on the *Inspect a real engine* page):")
    st.code("\n".join(log_lines(sheet)), language="text")

if plain.kv_budget_bytes <= 0:
    enough = fitting_tp(spec, weight_dtype, plain.usable_bytes, reserve, TP_CHOICES)
    st.error(f"The weights and the reserve need {format_bytes(-plain.kv_budget_bytes)} more "
             "than the engine may use: no room for any KV block. "
             + (f"Tensor parallel {enough} would leave room "
                f"({format_bytes(spec.weight_bytes(enough, weight_dtype))} of weights per "
                "GPU); " if enough else "") + "a smaller weight dtype or a larger card helps "
             "too.")
elif plain.num_blocks >= LAB_MIN_BLOCKS:
    lab_blocks, scale = lab_pool(plain.num_blocks)
    lab_block_size = min(block_size, LAB_MAX_BLOCK_SIZE)
    st.link_button("Open the block-table walkthrough with a pool of this size",
                   f"block_tables?num_blocks={lab_blocks}&block_size={lab_block_size}")
    st.caption(f"The walkthrough animates at most {LAB_MAX_BLOCKS} blocks, so it gets "
               f"{lab_blocks} blocks of {lab_block_size} slots, each standing for {scale:,} of "
               f"the plain sheet's {plain.num_blocks:,} blocks (scale 1:{scale:,})."
               + (f" Block size {block_size} is above its largest, {LAB_MAX_BLOCK_SIZE}."
                  if lab_block_size != block_size else ""))
else:
    st.warning(f"Only {plain.num_blocks} KV block(s) fit: too few to serve, or to animate.")

# A chart chosen by a link parameter (st.tabs keeps no state a link could restore).
chart = choice_param("Chart", "chart", ["KV memory vs context", "Weights vs KV cache",
                                         "KV dtype"], default="KV memory vs context",
                     widget="segmented")
with hatched(shown, "the chart", key="calc_chart"):
    if chart == "KV memory vs context":
        show_figure(kv_vs_context_figure(layout, batch, context, plain.kv_budget_bytes), "calc_ctx")
    elif chart == "Weights vs KV cache":
        show_figure(memory_split_figure(plain, seq_bytes * batch), "calc_split")
    else:
        show_figure(kv_dtype_figure(layout, context, batch), "calc_dtype")
