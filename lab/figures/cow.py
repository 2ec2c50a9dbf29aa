"""Figures of the copy-on-write page: memory and compute of vLLM V0 against vLLM V1 (0.33).

The pools themselves are drawn with `lab.figures.blocks.pool_grid` (ref counts on shared tiles,
the blocks copied this step outlined); this module adds the comparison over the run.
"""

from __future__ import annotations

import plotly.graph_objects as go

from lab.figures.common import over_time_figure, two_panels
from lab.figures.style import SHARED_COLOR
from lab.scenarios.copy_on_write import BranchFrame

NAIVE_COLOR = "#D55E00"
V1_COLOR = "#0072B2"
V0_NAME = "V0: fork + copy-on-write"
V1_NAME = "V1 (0.33): requests + prefix cache"


def _line(steps: list[int], values: list[int], name: str, color: str, axes: str,
          dash: str = "solid", legend: bool = True) -> dict:
    return dict(type="scatter", x=steps, y=values, xaxis=f"x{axes}", yaxis=f"y{axes}",
                name=name, legendgroup=name, showlegend=legend,
                line=dict(color=color, width=3, shape="hv", dash=dash),
                hovertemplate=f"{name}<br>step %{{x}}: %{{y}}<extra></extra>")


def memory_figure(frames: list[BranchFrame], step: int) -> go.Figure:
    """Left: blocks held at every step (V0, V1, and a private copy per branch). Right: tokens
    computed so far (V1's extra is what its requests recomputed). The current step marked."""
    layout = two_panels(("Memory: blocks held", "Compute: tokens computed so far"),
                        spacing=0.12)
    steps = [f.step for f in frames]
    traces = [
        _line(steps, [f.naive_blocks for f in frames], "a private copy per branch",
              NAIVE_COLOR, "", dash="dot"),
        _line(steps, [f.v0.blocks_used for f in frames], V0_NAME, SHARED_COLOR, ""),
        _line(steps, [f.v1.blocks_used for f in frames], V1_NAME, V1_COLOR, "", dash="dash"),
        _line(steps, [f.v0.total_computed for f in frames], V0_NAME, SHARED_COLOR, "2",
              legend=False),
        _line(steps, [f.v1.total_computed for f in frames], V1_NAME, V1_COLOR, "2",
              dash="dash", legend=False),
    ]
    layout["yaxis"] |= dict(title=dict(text="blocks"), rangemode="tozero")
    layout["yaxis2"] |= dict(title=dict(text="tokens"), rangemode="tozero")
    return over_time_figure(traces, layout, step, step_axes=("x", "x2"), height=300,
                            margin=dict(l=60, r=20, t=50, b=20),
                            legend=dict(orientation="h", yanchor="top", y=-0.3, x=0.0))
