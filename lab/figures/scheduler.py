"""Figures of the scheduler lab (plotly in, go.Figure out): the contiguous region map, serving
time series, length distributions, the batch chain and the sweeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.figures.style import PALETTE, apply_template
from lab.memory.contiguous import Region
from lab.serving.chain import ChainRow
from lab.serving.runs import SweepPoint
from lab.serving.workloads import RequestSpec

COLORS = {"contiguous": PALETTE[5], "paged": PALETTE[0]}
FONT = dict(size=15)


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    apply_template(fig).update_layout(
        title=dict(text=title, x=0, xanchor="left"), height=height, font=FONT,
        margin=dict(l=60, r=20, t=90, b=40),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.08, yanchor="bottom"))
    return fig


def region_map(regions: Sequence[Region], capacity: int) -> go.Figure:
    """The contiguous baseline's address space: each request's reservation (pale) and the part
    holding tokens (solid); the gaps are free holes."""
    fig = go.Figure()
    for region in regions:
        req, start, reserved, held = region.req_id, region.start, region.reserved, region.used
        color = PALETTE[req % len(PALETTE)]
        fig.add_bar(y=[""], x=[reserved], base=[start], orientation="h", marker_color=color,
                    opacity=0.3, hovertext=f"R{req}: reserved {reserved} slots from {start}",
                    hoverinfo="text", showlegend=False)
        fig.add_bar(y=[""], x=[min(held, reserved)], base=[start], orientation="h",
                    marker_color=color, text=f"R{req}", textposition="inside",
                    hovertext=f"R{req}: {held} slots hold tokens", hoverinfo="text",
                    showlegend=False)
    fig.update_layout(barmode="overlay", xaxis=dict(range=[0, capacity], title="token slots"))
    return _layout(fig, "Contiguous region: reservations (pale) and tokens held (solid)", 220)


def serving_timeseries(series: Mapping[str, Mapping[str, np.ndarray]]) -> go.Figure:
    """KV-cache usage, running and waiting, batch tokens, preemptions: one line per allocator."""
    panels = [("kv_usage", "KV-cache usage"), ("running", "running sequences"),
              ("waiting", "waiting requests"), ("batch_tokens", "tokens per iteration"),
              ("preemptions", "preemptions (cumulative)"), ("waste_slots", "wasted KV slots")]
    fig = make_subplots(rows=3, cols=2, subplot_titles=[t for _, t in panels],
                        vertical_spacing=0.1, horizontal_spacing=0.08)
    for name, cols in series.items():
        step = max(1, len(cols["time_s"]) // 1500)  # enough points for the eye
        for i, (key, _) in enumerate(panels):
            fig.add_scatter(x=cols["time_s"][::step], y=cols[key][::step], mode="lines",
                            name=name, legendgroup=name, showlegend=i == 0,
                            line=dict(color=COLORS.get(name), width=2), row=i // 2 + 1,
                            col=i % 2 + 1)
    fig.update_xaxes(title_text="simulated time (s)", row=3)
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    return _layout(fig, "What a healthy server watches, over the run", 760)


def length_histograms(requests: Sequence[RequestSpec]) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=["prompt length", "output length"])
    fig.add_histogram(x=[r.prompt_len for r in requests], marker_color=PALETTE[4], row=1, col=1,
                      showlegend=False, nbinsx=40)
    fig.add_histogram(x=[r.output_len for r in requests], marker_color=PALETTE[2], row=1, col=2,
                      showlegend=False, nbinsx=40)
    fig.update_xaxes(title_text="tokens")
    fig.update_yaxes(title_text="requests", col=1)
    return _layout(fig, "The workload's length distributions", 320)


def chain_figure(rows: Sequence[ChainRow], itl_target_ms: float) -> go.Figure:
    """The guide's chain as four linked bar charts, contiguous vs paged."""
    titles = ["1. wasted KV", "2. live sequences", "3. batch (tokens out/iteration)",
              f"4. tok/s, ITL p90 ≤ {itl_target_ms:g} ms"]
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles, horizontal_spacing=0.07)
    for i, key in enumerate(("waste_share", "live_seqs", "batch_seqs", "throughput")):
        values = [getattr(r, key) for r in rows]
        text = [f"{v:.0%}" if key == "waste_share" else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"
                for v in values]
        fig.add_bar(x=[r.allocator for r in rows], y=values, text=text, textposition="auto",
                    marker_color=[COLORS[r.allocator] for r in rows], showlegend=False,
                    row=1, col=i + 1)
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_annotations(font_size=14)
    title = "Less waste → more live sequences → bigger batches → throughput?"
    return _layout(fig, title, 380)


def sweep_figure(points: Sequence[SweepPoint], x_title: str, log_x: bool = True) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=["throughput (output tok/s)",
                                                        "wasted KV (share of pool)",
                                                        "preemptions"])
    for i, series in enumerate(dict.fromkeys(p.series for p in points)):
        pts = [p for p in points if p.series == series]
        line = dict(color=COLORS[pts[0].allocator], dash="dot" if i >= 2 else None)
        for col, key in enumerate(("throughput", "waste_share", "preemptions"), start=1):
            fig.add_scatter(x=[p.x for p in pts], y=[getattr(p, key) for p in pts],
                            mode="lines+markers", name=series, legendgroup=series,
                            showlegend=col == 1, line=line, row=1, col=col)
    ticks = sorted({p.x for p in points})
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "linear", tickvals=ticks,
                     ticktext=[f"{t:,}" for t in ticks])
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    return _layout(fig, f"Sweep over {x_title}", 380)


def bucket_figure(histograms: Mapping[str, object], unit_scale: float = 1e3) -> go.Figure:
    """Prometheus histograms (cumulative buckets) as per-bucket bars, one panel each; x in ms."""
    names = [n for n, h in histograms.items() if h is not None]
    fig = make_subplots(rows=1, cols=max(1, len(names)), subplot_titles=names)
    for col, name in enumerate(names, start=1):
        h = histograms[name]
        labels, counts, below = [], [], 0.0
        for upper, cumulative in h.buckets:
            labels.append("≤ ∞" if np.isinf(upper) else f"≤ {upper * unit_scale:g}")
            counts.append(cumulative - below)
            below = cumulative
        fig.add_bar(x=labels, y=counts, marker_color=PALETTE[0], showlegend=False, row=1,
                    col=col)
    # Bucket bounds are long labels: tilted, with room below them; the unit goes in the title,
    # since one axis title per panel collides with its neighbour's on a phone.
    fig.update_xaxes(type="category", tickangle=-45, automargin=True)
    fig.update_yaxes(title_text="observations", col=1)
    fig = _layout(fig, "The engine's latency histograms<br><sup>bucket upper bounds, ms</sup>", 360)
    fig.update_layout(margin=dict(b=80))
    return fig
