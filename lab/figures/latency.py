"""The latencies a serving run promises (plotly in, go.Figure out): time to first token over
requests and inter-token latency over token gaps, one distribution per run, side by side."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.figures.scheduler import _layout
from lab.figures.style import PALETTE
from lab.serving.runs import PERCENTS, Latencies

MARKED = (50, 90, 99)  # the percentiles marked on each curve


def latency_figure(runs: Mapping[str, Latencies], colors: Mapping[str, str] | None = None,
                   title: str = "Latency: TTFT over requests, ITL over token gaps"
                   ) -> go.Figure:
    """Each run's TTFT (s) and ITL (ms) as cumulative distributions: the share of requests
    (or of gaps) at or under each latency, p50 / p90 / p99 marked on dotted levels."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=[
        "TTFT: arrival to first token (s)", "ITL: between two tokens of a request (ms)"])
    for i, (name, lat) in enumerate(runs.items()):
        color = (colors or {}).get(name, PALETTE[i % len(PALETTE)])
        for col, values, scale, unit, what in ((1, lat.ttft_s, 1.0, "s", "requests"),
                                              (2, lat.itl_s, 1e3, "ms", "token gaps")):
            if not len(values):
                continue
            x = values * scale
            fig.add_scatter(x=x, y=PERCENTS, mode="lines", name=name, legendgroup=name,
                            showlegend=col == 1, line=dict(color=color, width=2), row=1, col=col,
                            hovertemplate=f"{name}: %{{y:.1f}}% of {what} at or under "
                                          f"%{{x:.3g}} {unit}<extra></extra>")
            marked = [int(p * 2) for p in MARKED]  # PERCENTS is every half percent
            fig.add_scatter(x=x[marked], y=PERCENTS[marked], mode="markers",
                            marker=dict(color=color, size=8), legendgroup=name,
                            showlegend=False, row=1, col=col,
                            hovertemplate=f"{name}: p%{{y:.0f}} %{{x:.3g}} {unit}<extra></extra>")
    for p in MARKED:  # the percentiles' levels, named once at the left of each panel
        fig.add_hline(y=p, line=dict(color="#999", width=1, dash="dot"), row="all", col="all",
                      annotation_text=f"p{p}", annotation_position="top left",
                      annotation_font=dict(size=12, color="#666"))
    fig.update_yaxes(title_text="share at or under (%)", range=[0, 103], row=1, col=1)
    fig.update_yaxes(range=[0, 103], row=1, col=2)
    fig.update_xaxes(title_text="seconds (simulated)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="milliseconds (simulated)", rangemode="tozero", row=1, col=2)
    return _layout(fig, title, 400)
