"""What the figures over a run's steps share: the current step marked, the house layout.

Used by the copy-on-write, fragmentation and prefix-cache pages' two-panel "over time" figures.
"""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go

from lab.figures.blocks import FONT_SIZE

STEP_LINE = dict(color="#333333", dash="dot", width=1.5)  # the step the page shows


def finish_over_time(fig: go.Figure, step: int, *, step_cols: Iterable[int], height: int,
                     margin: dict, legend: dict, **layout) -> go.Figure:
    """Mark `step` with a dotted line on the step axes (row 1, `step_cols`), title those axes,
    and apply the house layout; subplot titles get the figure's font size."""
    for col in step_cols:
        fig.add_vline(x=step, line=STEP_LINE, row=1, col=col)
        fig.update_xaxes(title_text="step", row=1, col=col)
    fig.update_layout(height=height, template="plotly_white", font=dict(size=FONT_SIZE),
                      margin=margin, hoverlabel=dict(font_size=FONT_SIZE), legend=legend,
                      **layout)
    fig.update_annotations(font_size=FONT_SIZE, yshift=12)
    return fig
