"""The figure view: a small custom component that keeps each plot and redraws it in place.

`st.plotly_chart` gives a chart a new element id whenever its figure changes, so on every step
the browser throws the old chart away, mounts a new one and draws it twice (once on mount, once
more when Streamlit re-applies its theme); the browser's main thread is then busy about half as
long again per step (bench/RESULTS.md). Here a figure keeps its key's plot, and a new figure is
drawn by one `Plotly.react` call. Traces and layout travel as separate JSON texts: when a step
only moves a figure's layout (the step marker of a chart over time), the view hands plotly the
traces it already has, and plotly redraws only what changed instead of recomputing every trace.

plotly.js is the installed plotly package's own copy (the version its figures are written
for). Streamlit serves the app's `./static` folder (`server.enableStaticServing` in
`.streamlit/config.toml`); this module copies the file there once per process. If it cannot,
figures fall back to `st.plotly_chart`: slower, the same pictures.
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
from functools import cache
from pathlib import Path

import plotly
import plotly.graph_objects as go
import streamlit as st
from plotly.io.json import to_json_plotly

ROOT = Path(__file__).resolve().parents[1]  # beside app.py: where Streamlit serves ./static
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
SERVED_JS = ROOT / "static" / "plotly.min.js"

_figure_view = st.components.v2.component(
    "lab_figure", js=(Path(__file__).with_name("figure_view.js")).read_text(),
    isolate_styles=False)  # plotly.js styles its toolbar and hover labels from document.head


@cache
def plotly_js_served() -> bool:
    """Put plotly.js where Streamlit serves static files (once per process); False if we can't."""
    try:
        if not SERVED_JS.exists() or not filecmp.cmp(PLOTLY_JS, SERVED_JS, shallow=False):
            SERVED_JS.parent.mkdir(exist_ok=True)
            partial = SERVED_JS.with_suffix(f".{os.getpid()}.part")
            shutil.copyfile(PLOTLY_JS, partial)
            os.replace(partial, SERVED_JS)  # atomic: another server never serves half a file
        return True
    except OSError as error:
        logging.getLogger(__name__).warning(
            "figures fall back to st.plotly_chart: cannot copy plotly.js to %s (%s)",
            SERVED_JS, error)
        return False


def draw_figure(fig: go.Figure, key: str, config: dict, main: bool = False,
                reveal: bool = False, alt: str = "") -> None:
    """Draw `fig` under `key`; a later run with a new figure under the same key redraws it in
    place. `config` is plotly's (toolbar, PNG download options); `main` marks the page's main
    figure (`data-main` on its element, which the classroom tests measure); `reveal` scrolls it
    into view once drawn (a step moved, so this is what changed); `alt` is the figure in words,
    its accessible name."""
    if not plotly_js_served():
        st.plotly_chart(fig, key=key, config=config, theme=None)
        if alt:
            st.caption(alt)  # plotly's own chart takes no accessible name: say it in text
        return
    spec = fig.to_plotly_json()
    _figure_view(key=key, data={"traces": to_json_plotly(spec["data"]),
                                "layout": to_json_plotly(spec["layout"]),
                                "config": config, "key": key, "main": main,
                                "reveal": reveal, "alt": alt})
