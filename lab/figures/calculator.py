"""Figures for the KV-size calculator: KV memory against context, the card's memory split,
and the effect of the KV dtype. Plotly in, go.Figure out; sizes in GiB (2**30 bytes)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from lab.figures.style import CACHED_COLOR, HIGHLIGHT_COLOR, PALE, PALETTE, apply_template, lighten
from lab.sizing.capacity import GIB, CapacitySheet
from lab.sizing.kv_formula import KV_DTYPES, KVLayout, kv_layout

FULL_COLOR = PALETTE[0]
SLIDING_COLOR = PALETTE[4]
CHUNKED_COLOR = PALETTE[2]
STATE_COLOR = PALETTE[5]
NEVER_FILLS = 10**10  # tokens: a cache that still fits here never fills the budget
BUDGET_COLOR = HIGHLIGHT_COLOR
POINTS = 200


def _base(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    apply_template(fig).update_layout(
        title=title, height=height, margin=dict(l=70, r=30, t=90, b=60), font_size=14,
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0))
    return fig


def kv_vs_context_figure(layout: KVLayout, batch: int, context: int,
                         kv_budget_bytes: int | None = None) -> go.Figure:
    """The batch's cache against context length, stacked by layer kind: full-attention,
    sliding-window and chunked local layers, and a recurrent state that does not grow."""
    spec = layout.spec
    limits = [spec.sliding_window if spec.num_sliding_layers else 0,
              spec.attention_chunk_size if spec.num_chunked_layers else 0]
    top = max(2 * context, *(2 * limit for limit in limits))
    fill = _context_at_budget(layout, batch, kv_budget_bytes)
    if fill is not None and top < fill <= 64 * context:
        top = int(fill * 1.15)  # show where the batch runs out of KV budget
    contexts = np.unique(np.linspace(1, top, POINTS).astype(np.int64))  # [points]
    kinds = [("full-attention layers", layout.full_bytes, FULL_COLOR, layout.num_full_layers),
             ("sliding-window layers", layout.sliding_bytes, SLIDING_COLOR,
              spec.num_sliding_layers),
             ("chunked local layers", layout.chunked_bytes, CHUNKED_COLOR,
              spec.num_chunked_layers),
             (f"{spec.state.label} state" if spec.state else "", lambda _: layout.state_bytes,
              STATE_COLOR, spec.state.num_layers if spec.state else 0)]
    fig = go.Figure()
    for name, size, color, layers in kinds:
        if layers or name == "full-attention layers":
            gib = np.array([size(int(t)) for t in contexts]) * batch / GIB  # [points]
            fig.add_scatter(x=contexts, y=gib, name=name, stackgroup="kv", line_color=color)
    if kv_budget_bytes is not None and kv_budget_bytes > 0:
        fig.add_hline(y=kv_budget_bytes / GIB, line_color=BUDGET_COLOR, line_dash="dash",
                      annotation_text=f"KV budget of the card: {kv_budget_bytes / GIB:,.1f} GiB",
                      annotation_position="bottom right")
    fig.add_vline(x=context, line_color="gray", line_dash="dot",
                  annotation_text=f"{context:,} tokens", annotation_position="bottom right")
    if fill is not None and fill <= top:
        # Labels apart: this one at the top, the context line's at the bottom (the two lines may
        # be close), the budget's under its line at the right.
        fig.add_vline(x=fill, line_color=BUDGET_COLOR, line_dash="dot",
                      annotation_text=f"budget full at {fill:,} tokens",
                      annotation_position="top left")
    # A fixed range: plotly would widen its autorange to make room for the labels.
    fig.update_xaxes(title="context length (tokens per sequence)", range=[0, top])
    what = "KV cache and state" if spec.state else "KV cache"
    fig.update_yaxes(title=f"{what} for batch {batch:,} (GiB)", rangemode="tozero")
    fig = _base(fig, f"{what} against context length", height=420)
    # The legend goes under the plot: on a narrow screen it would cover the title.
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0),
                      margin=dict(l=70, r=30, t=60, b=110))
    return fig


def _context_at_budget(layout: KVLayout, batch: int, kv_budget_bytes: int | None) -> int | None:
    """Largest context whose batch fits the budget (None: no budget, or it never fills, as
    when every layer keeps a window): a binary search, the cache growing with the context."""
    if not kv_budget_bytes or kv_budget_bytes <= 0:
        return None
    def fits(tokens: int) -> bool:
        return layout.sequence_bytes(tokens) * batch <= kv_budget_bytes

    if fits(NEVER_FILLS):
        return None
    low, high = 0, NEVER_FILLS  # fits(low), not fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def memory_split_figure(sheet: CapacitySheet, batch_kv_bytes: int) -> go.Figure:
    """One bar for the card: weights, reserve, the batch's KV, free KV blocks, unused memory."""
    budget = max(sheet.kv_budget_bytes, 0)
    used = min(batch_kv_bytes, budget)
    parts = [
        ("weights (this GPU's shard)", sheet.weight_bytes, PALETTE[1]),
        ("activations / runtime reserve", sheet.reserve_bytes, PALETTE[3]),
        ("KV cache of the batch", used, FULL_COLOR),
        ("KV pool still free", budget - used, lighten(FULL_COLOR, PALE)),
        ("kept free (1 - gpu_memory_utilization)", sheet.gpu_bytes - sheet.usable_bytes,
         CACHED_COLOR),
    ]
    if batch_kv_bytes > budget:
        parts.append(("KV that does not fit", batch_kv_bytes - budget, BUDGET_COLOR))
    fig = go.Figure()
    for name, size, color in parts:
        wide = size >= 0.06 * sheet.gpu_bytes  # label only segments wide enough to read
        fig.add_bar(y=["card"], x=[size / GIB], name=name, orientation="h", marker_color=color,
                    text=f"{size / GIB:,.1f}" if wide else "", textposition="inside",
                    insidetextanchor="middle", textangle=0,
                    hovertemplate=f"{name}: %{{x:,.2f}} GiB<extra></extra>")
    fig.add_vline(x=sheet.gpu_bytes / GIB, line_color="black")
    fig.add_annotation(x=sheet.gpu_bytes / GIB, y=1.0, yref="paper", yanchor="bottom",
                       xanchor="right", showarrow=False,
                       text=f"card: {sheet.gpu_bytes / GIB:,.1f} GiB")
    fig.update_layout(barmode="stack", showlegend=True, legend_traceorder="normal")
    fig.update_xaxes(title="GiB")
    fig.update_yaxes(visible=False)
    fig = _base(fig, "Weights against KV cache on one GPU", height=300)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.35, x=0),
                      margin=dict(l=30, r=30, t=60, b=110))
    return fig


def kv_dtype_figure(layout: KVLayout, context: int, batch: int) -> go.Figure:
    """The batch's KV cache in every KV dtype (scales included), the chosen one highlighted."""
    names, sizes, colors = [], [], []
    for dtype in KV_DTYPES.values():
        other = kv_layout(layout.spec, dtype, layout.tp)
        names.append(dtype.label)
        sizes.append(other.sequence_bytes(context) * batch / GIB)
        colors.append(FULL_COLOR if dtype.key == layout.dtype.key else lighten(FULL_COLOR, PALE))
    fig = go.Figure(go.Bar(x=names, y=sizes, marker_color=colors,
                           text=[f"{s:,.2f} GiB" for s in sizes], textposition="outside",
                           cliponaxis=False))
    fig.update_yaxes(title=f"KV cache, {batch:,} x {context:,} tokens (GiB)", rangemode="tozero")
    return _base(fig, "Effect of the KV dtype")
