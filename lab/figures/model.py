"""Figures for the real-model page: generated text cut into logical blocks, and which
implementation served each layer of a forward step."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from lab.figures.style import FONT_SIZE, PALETTE, base_figure, lighten
from lab.model.paged_cache import GATHER, KERNEL, ForwardReport


def block_marked_html(pieces: list[str], start_pos: int, block_size: int, color: str) -> str:
    """Token texts as HTML, each logical block on its own shade with an "L<i>" tag at its start.

    pieces[i] is the text of the token at position start_pos + i.
    """
    spans, current, block = [], [], start_pos // block_size
    for pos, piece in enumerate(pieces, start=start_pos):
        if pos // block_size != block and current:
            spans.append(_block_span(block, current, color))
            current, block = [], pos // block_size
        text = html.escape(piece).replace("\n", "↵<br>")
        current.append(text)
    if current:
        spans.append(_block_span(block, current, color))
    return "".join(spans)


def _block_span(block: int, texts: list[str], color: str) -> str:
    shade = lighten(color, 0.75 if block % 2 else 0.55)
    tag = (f"<sup style='color:{color};font-weight:700;margin-right:2px'>L{block}</sup>")
    return (f"<span style='background:{shade};border-left:3px solid {color};padding:2px 3px;"
            f"border-radius:3px;line-height:2'>{tag}{''.join(texts)}</span>")


def layer_service_figure(report: ForwardReport,
                         title: str = "Which implementation served each layer") -> go.Figure:
    """One cell per layer: the Triton kernel (read through block tables) or the torch gather."""
    layers = sorted(report.kernel_layers + report.gather_layers)
    kernel = set(report.kernel_layers)
    z = [[1 if layer in kernel else 0 for layer in layers]]
    text = [["K" if layer in kernel else "" for layer in layers]]
    hover = [[f"layer {layer}: {KERNEL if layer in kernel else GATHER}"
              + (" (checked against float64 dense attention)"
                 if layer == report.checked_layer else "") for layer in layers]]
    gather_color, kernel_color = lighten(PALETTE[0], 0.6), PALETTE[5]
    trace = dict(type="heatmap", z=z, x=layers, y=["layer"], zmin=0, zmax=1, showscale=False,
                 colorscale=[[0, gather_color], [0.5, gather_color], [0.5, kernel_color],
                             [1, kernel_color]],
                 xgap=2, text=text, texttemplate="%{text}",
                 textfont=dict(size=FONT_SIZE, color="#FFFFFF"), hovertext=hover,
                 hoverinfo="text")
    layout = dict(xaxis=dict(title="layer", dtick=1 if len(layers) <= 32 else None,
                             showgrid=False, zeroline=False),
                  yaxis=dict(visible=False), margin=dict(l=20, r=20, t=56, b=50))
    return base_figure([trace], layout, title, 170)
