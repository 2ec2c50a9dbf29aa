"""What the figures over a run's steps share: two panels side by side, the current step marked.

Used by the copy-on-write, fragmentation and prefix-cache pages' two-panel "over time" figures.
Built from plain dicts (see `lab.figures.blocks.base_figure`): these figures are redrawn on
every step, and plotly's `make_subplots` and validation cost more than the browser's drawing.
"""

from __future__ import annotations

import plotly.graph_objects as go

from lab.figures.alt_text import with_alt
from lab.figures.style import FONT_SIZE, base_figure

STEP_LINE = dict(color="#333333", dash="dot", width=1.5)  # the step the page shows


def two_panels(titles: tuple[str, str], *, widths: tuple[float, float] = (0.5, 0.5),
               spacing: float = 0.1) -> dict:
    """Layout of two panels in one row, axes x/y (left) and x2/y2 (right), each titled above.
    (The layout plotly's `make_subplots(rows=1, cols=2)` builds.)"""
    split = (1 - spacing) * widths[0] / sum(widths)
    domains = ([0.0, split], [split + spacing, 1.0])
    layout = {"xaxis": dict(anchor="y", domain=domains[0]), "yaxis": dict(anchor="x"),
              "xaxis2": dict(anchor="y2", domain=domains[1]), "yaxis2": dict(anchor="x2")}
    layout["annotations"] = [
        dict(text=title, x=(lo + hi) / 2, y=1.0, xref="paper", yref="paper", xanchor="center",
             yanchor="bottom", yshift=12, showarrow=False, font=dict(size=FONT_SIZE))
        for title, (lo, hi) in zip(titles, domains)]
    return layout


def over_time_figure(traces: list[dict], layout: dict, step: int, *, step_axes: tuple[str, ...],
                     height: int, margin: dict, legend: dict) -> go.Figure:
    """Mark `step` with a dotted line on the step axes (e.g. ("x", "x2")), title those axes,
    and apply the house layout."""
    shapes = []
    for axis in step_axes:
        layout[axis.replace("x", "xaxis")]["title"] = dict(text="step")
        shapes.append(dict(type="line", x0=step, x1=step, xref=axis, y0=0, y1=1,
                           yref=f"{axis.replace('x', 'y')} domain", line=STEP_LINE))
    layout |= dict(shapes=shapes, margin=margin, legend=legend, showlegend=True)
    panels = " and ".join(a["text"] for a in layout.get("annotations", []) if a.get("text"))
    series = ", ".join(t["name"] for t in traces if t.get("name"))
    return with_alt(base_figure(traces, layout, "", height),
                    f"{panels or 'A run'} over the steps ({series}); a dotted line marks "
                    f"step {step}.")
