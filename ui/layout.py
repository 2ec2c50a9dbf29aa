"""Layout helpers that adapt a page to classroom mode and to a teacher link.

* `page_parts()`: where a page draws its settings and its stage (step controls, caption,
  figures): settings first normally; in classroom mode the stage first, settings folded below.
* `step_parts()`: the parts of a step (its questions and caption, the main figure, details,
  what follows), each a keyed container (`.st-key-lab_step_caption`, ...): the caption and
  its question, then the figure, right under the step controls, which stick under the header
  so the three are seen together after a Step; in classroom mode the main figure comes
  first (a class's questions are folded one line each under it).
* `explain(md)`: explanatory text; shown normally, one click away in classroom mode.
* `bullets(lines)`: a list of what happened, as one element; `step_caption(step, lines)`
  also announces a step's list to a screen reader.
* `settings()`: a container for a page's parameter widgets, with "Back to the guide's
  example"; folded in classroom mode; hidden (still working) when a teacher link hides it.
* `show_figure(fig, key)`: draws a plotly figure (through `ui.figure_view`, which redraws a
  key's plot in place), larger in classroom mode, with the toolbar's "download as PNG" button.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from lab.figures.alt_text import alt_text
from ui.figure_view import draw_figure
from ui.state import is_classroom, is_hidden, is_locked, reset_page
from ui.step_controls import STEP_MOVED, announce

CLASSROOM_FONT_SCALE = 1.45
CLASSROOM_HEIGHT_SCALE = 1.35
# A projector at 1280x720 keeps ~580 px under the header strip and the step controls: the main
# figure, a title over it and the step's question folded to one line fit together.
CLASSROOM_MAIN_HEIGHT = 380


def page_parts() -> tuple[Any, Any]:
    """(settings area, stage): containers in the order this mode shows them."""
    if is_classroom():
        stage = st.container()
        return st.container(), stage
    area = st.container()
    return area, st.container()


@dataclass(frozen=True)
class StepParts:
    caption: Any  # what happened at this step
    before: Any  # counters and the kernel badge
    main: Any  # the page's main figure
    after: Any  # legends, secondary figures, downloads


STEP_PARTS = ("caption", "main", "before", "after")  # in the order a laptop shows them


def step_parts() -> StepParts:
    """The parts, in this mode's order, under the step controls (which stick under the header,
    assets/lab.css): what a step changed is scrolled in under them (ui/figure_view.js)."""
    order = ("main", "caption", "before", "after") if is_classroom() else STEP_PARTS
    parts = {name: st.container(key=f"lab_step_{name}") for name in order}
    return StepParts(**parts)


def explain(md: str, *, title: str = "Explanation") -> None:
    """Teaching text: visible normally, one click away in classroom mode."""
    if is_hidden("explanations"):
        return
    if is_classroom():
        with st.expander(title, expanded=False):
            st.markdown(md)
    else:
        st.markdown(md)


def step_caption(step: int, lines: list[str], *, hatched: bool = False) -> None:
    """What this step did: a bulleted list, also announced to a screen reader (unless it is
    held back until a question is answered)."""
    bullets(lines)
    sentences = " ".join(line if line.endswith((".", "!", "?")) else f"{line}." for line in lines)
    announce(step, sentences if not hatched else
             "what it did is held back until you answer the question on the page.")


def bullets(lines: list[str]) -> None:
    """A bulleted list in one markdown element. A step's list grows and shrinks; as one element
    it keeps the page's later elements where they were, so the browser updates them in place
    (Streamlit remounts a block, e.g. columns, whose position in the page moved)."""
    st.markdown("\n".join(f"- {line}" for line in lines))


def settings(title: str = "Settings", *, folded: bool = False) -> Any:
    """Where a page puts its parameter widgets: `with settings(): ...`. An animated page folds
    them (`folded`), so its step controls and the figure they move come first on a laptop or a
    phone; classroom mode folds every page's."""
    if is_hidden("settings"):  # a teacher link: the widgets still run, out of sight
        return st.container(key=f"lab_hidden_{title.lower().replace(' ', '_')}")
    if folded or is_classroom():
        box = st.expander(title, expanded=False, icon=":material/tune:")
    else:
        box = st.container(border=True)
    if not is_locked():
        box.button("Back to the guide's example", key=f"lab_reset_{title.lower()}",
                   icon=":material/restart_alt:", type="tertiary", on_click=reset_page,
                   help="Every setting of this page back to its default: the guide's "
                        "numbers where the guide gives them.")
    return box


def show_figure(fig: go.Figure, key: str, *, file_name: str | None = None,
                main: bool = False) -> None:
    """Draw a figure; in classroom mode scale its fonts and height for a projector (the page's
    main figure no taller than fits under the step controls)."""
    if is_classroom():
        fig = _scaled(fig, CLASSROOM_FONT_SCALE, CLASSROOM_HEIGHT_SCALE,
                      CLASSROOM_MAIN_HEIGHT if main else None)
    config = {"displaylogo": False, "showSendToCloud": False,  # nothing leaves the lab
              "modeBarButtonsToRemove": ["select2d", "lasso2d"],  # the figures select nothing
              "toImageButtonOptions": {"format": "png", "filename": file_name or key, "scale": 2}}
    reveal = main and bool(st.session_state.get(STEP_MOVED))
    draw_figure(fig, key, config, main, reveal, alt_text(fig))


def _scaled(fig: go.Figure, font_scale: float, height_scale: float,
            max_height: int | None = None) -> go.Figure:
    """A copy of `fig` with every font size and margin, and the height, multiplied (as dicts:
    rebuilding a validated figure would cost more than drawing it). A figure capped at
    `max_height` grows its fonts less, so its labels still fit their tiles."""
    spec = fig.to_dict()  # a deep copy: the caller's figure stays as it was
    layout = spec.setdefault("layout", {})
    if layout.get("height"):
        height = int(layout["height"] * height_scale)
        if max_height is not None and height > max_height:
            font_scale = max(1.0, font_scale * max_height / height)
            height = max_height
        layout["height"] = height
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
    margin = layout.setdefault("margin", {})  # sized to the labels' fonts by the figures
    for side in set(margin) & {"l", "r", "t", "b"}:
        margin[side] *= font_scale
    return go.Figure(spec, _validate=False)
