"""Layout helpers that adapt a page to classroom mode.

* `explain(md)`: explanatory text; shown normally, collapsed into an expander in classroom mode.
* `bullets(lines)`: a step's list of what happened, as one element.
* `settings()`: a container for a page's parameter widgets; collapsed in classroom mode so only
  the step controls stay in view.
* `show_figure(fig, key)`: draws a plotly figure (through `ui.figure_view`, which redraws a
  key's plot in place), larger in classroom mode, with the toolbar's "download as PNG" button.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import streamlit as st

from ui.figure_view import draw_figure
from ui.state import is_classroom

CLASSROOM_FONT_SCALE = 1.45
CLASSROOM_HEIGHT_SCALE = 1.35


def explain(md: str, *, title: str = "Explanation") -> None:
    """Teaching text: visible normally, one click away in classroom mode."""
    if is_classroom():
        with st.expander(title, expanded=False):
            st.markdown(md)
    else:
        st.markdown(md)


def bullets(lines: list[str]) -> None:
    """A bulleted list in one markdown element. A step's list grows and shrinks; as one element
    it keeps the page's later elements where they were, so the browser updates them in place
    (Streamlit remounts a block, e.g. columns, whose position in the page moved)."""
    st.markdown("\n".join(f"- {line}" for line in lines))


def settings(title: str = "Settings") -> Any:
    """Where a page puts its parameter widgets: `with settings(): ...`."""
    if is_classroom():
        return st.expander(title, expanded=False)
    return st.container(border=True)


def show_figure(fig: go.Figure, key: str, *, file_name: str | None = None) -> None:
    """Draw a figure; in classroom mode scale its fonts and height for a projector."""
    if is_classroom():
        fig = _scaled(fig, CLASSROOM_FONT_SCALE, CLASSROOM_HEIGHT_SCALE)
    config = {"displaylogo": False, "showSendToCloud": False,  # nothing leaves the lab
              "modeBarButtonsToRemove": ["select2d", "lasso2d"],  # the figures select nothing
              "toImageButtonOptions": {"format": "png", "filename": file_name or key, "scale": 2}}
    draw_figure(fig, key, config)


def _scaled(fig: go.Figure, font_scale: float, height_scale: float) -> go.Figure:
    """A copy of `fig` with every font size and margin, and the height, multiplied (as dicts:
    rebuilding a validated figure would cost more than drawing it)."""
    spec = fig.to_dict()  # a deep copy: the caller's figure stays as it was
    layout = spec.setdefault("layout", {})
    base = layout.get("font", {}).get("size", 14)
    layout.setdefault("font", {})["size"] = base * font_scale
    for annotation in layout.get("annotations", []):
        font = annotation.setdefault("font", {})
        font["size"] = font.get("size", base) * font_scale
    for trace in spec.get("data", []):
        size = trace.get("textfont", {}).get("size")
        if isinstance(size, (list, tuple)):
            trace["textfont"]["size"] = [v * font_scale for v in size]
        elif size is not None:
            trace["textfont"]["size"] = size * font_scale
    if layout.get("height"):
        layout["height"] = int(layout["height"] * height_scale)
    margin = layout.setdefault("margin", {})  # sized to the labels' fonts by the figures
    for side in set(margin) & {"l", "r", "t", "b"}:
        margin[side] *= font_scale
    return go.Figure(spec, _validate=False)
