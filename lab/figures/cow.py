"""Figures of the copy-on-write page: memory with sharing against a private copy per branch.

The pool itself is drawn with `lab.figures.blocks.pool_grid` (ref counts on shared tiles, the
blocks copied this step outlined); this module adds the memory comparison.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lab.beams import BranchFrame
from lab.figures.blocks import FONT_SIZE, SHARED_COLOR
from lab.figures.common import finish_over_time

NAIVE_COLOR = "#D55E00"


def memory_figure(frames: list[BranchFrame], step: int) -> go.Figure:
    """Left: blocks now, shared vs naive. Right: both over every step, the current one marked."""
    frame = frames[step]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.42, 0.58], horizontal_spacing=0.12,
                        subplot_titles=(f"Blocks at step {step}", "Blocks over the run"))
    labels = ["copy per branch", "shared + CoW"]
    values = [frame.naive_blocks, frame.blocks_used]
    fig.add_trace(go.Bar(y=labels, x=values, orientation="h", marker_color=[NAIVE_COLOR,
                                                                            SHARED_COLOR],
                         text=[f"{v} blocks" for v in values], textposition="inside",
                         insidetextanchor="middle", textangle=0,
                         textfont=dict(size=FONT_SIZE, color="white"), showlegend=False,
                         hovertemplate="%{y}: %{x} blocks<extra></extra>"), row=1, col=1)
    steps = [f.step for f in frames]
    fig.add_trace(go.Scatter(x=steps, y=[f.naive_blocks for f in frames], name="copy per branch",
                             line=dict(color=NAIVE_COLOR, width=3, shape="hv")), row=1, col=2)
    fig.add_trace(go.Scatter(x=steps, y=[f.blocks_used for f in frames],
                             name="shared + copy-on-write", line=dict(color=SHARED_COLOR, width=3,
                                                                      shape="hv")), row=1, col=2)
    top = max(max(f.naive_blocks for f in frames), 1)
    fig.update_xaxes(title_text="blocks", range=[0, top * 1.15], row=1, col=1)
    fig.update_yaxes(title_text="blocks in use", rangemode="tozero", row=1, col=2)
    return finish_over_time(fig, step, step_cols=(2,), height=340,
                            margin=dict(l=20, r=20, t=60, b=20),
                            legend=dict(orientation="h", yanchor="top", y=-0.32, x=0.45))
