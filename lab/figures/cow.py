"""Figures of the copy-on-write page: memory with sharing against a private copy per branch.

The pool itself is drawn with `lab.figures.blocks.pool_grid` (ref counts on shared tiles, the
blocks copied this step outlined); this module adds the memory comparison.
"""

from __future__ import annotations

import plotly.graph_objects as go

from lab.figures.common import over_time_figure, two_panels
from lab.figures.style import FONT_SIZE, SHARED_COLOR, label_margin
from lab.scenarios.copy_on_write import BranchFrame

NAIVE_COLOR = "#D55E00"


def memory_figure(frames: list[BranchFrame], step: int) -> go.Figure:
    """Left: blocks now, shared vs naive. Right: both over every step, the current one marked."""
    frame = frames[step]
    layout = two_panels((f"Blocks at step {step}", "Blocks over the run"), widths=(0.42, 0.58),
                        spacing=0.12)
    labels = ["copy per branch", "shared + CoW"]
    values = [frame.naive_blocks, frame.blocks_used]
    now = dict(type="bar", y=labels, x=values, orientation="h",
               marker=dict(color=[NAIVE_COLOR, SHARED_COLOR]),
               text=[f"{v} blocks" for v in values], textposition="inside",
               insidetextanchor="middle", textangle=0,
               textfont=dict(size=FONT_SIZE, color="white"), showlegend=False,
               hovertemplate="%{y}: %{x} blocks<extra></extra>")
    steps = [f.step for f in frames]
    naive = dict(type="scatter", x=steps, y=[f.naive_blocks for f in frames], xaxis="x2",
                 yaxis="y2", name="copy per branch",
                 line=dict(color=NAIVE_COLOR, width=3, shape="hv"))
    shared = dict(type="scatter", x=steps, y=[f.blocks_used for f in frames], xaxis="x2",
                  yaxis="y2", name="shared + copy-on-write",
                  line=dict(color=SHARED_COLOR, width=3, shape="hv"))
    top = max(max(f.naive_blocks for f in frames), 1)
    layout["xaxis"] |= dict(title=dict(text="blocks"), range=[0, top * 1.15])
    layout["yaxis2"] |= dict(title=dict(text="blocks in use"), rangemode="tozero")
    return over_time_figure([now, naive, shared], layout, step, step_axes=("x2",), height=340,
                            margin=dict(l=label_margin(labels), r=20, t=60, b=20),
                            legend=dict(orientation="h", yanchor="top", y=-0.32, x=0.45))
