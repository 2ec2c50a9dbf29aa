"""The sidebar every page shows first: backend, seed, classroom mode and the "copy link" box.

Call `sidebar()` at the top of every page, before any other widget: it starts the per-run
registry of link parameters (see ui/state.py) and loads the page styles.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import streamlit as st

from kernels.backend import backend
from ui.navigation import ensure_app_navigation
from ui.state import CLASSROOM_KEY, begin_run, is_classroom, register, set_link_slot

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MAX_SEED = 2**31 - 1


@cache
def _css(name: str) -> str:
    return (ASSETS / name).read_text()


def _sync_classroom_param() -> None:
    if st.session_state[CLASSROOM_KEY]:
        st.query_params["classroom"] = "1"
    else:
        st.query_params.pop("classroom", None)


def sidebar() -> None:
    ensure_app_navigation()
    begin_run()
    if CLASSROOM_KEY not in st.session_state:
        st.session_state[CLASSROOM_KEY] = is_classroom()  # first run: from ?classroom=1
    classroom = bool(st.session_state[CLASSROOM_KEY])
    styles = _css("lab.css") + (_css("classroom.css") if classroom else "")
    st.html(f"<style>{styles}</style>")

    side = st.sidebar
    side.markdown(f"**Compute backend**  \n{backend().label}")
    side.number_input("Random seed", min_value=0, max_value=MAX_SEED, value=0, step=1,
                      key="seed", bind="query-params",
                      help="Every random choice on a page (token ids, K/V values, queries, "
                           "request lengths) derives from this seed.")
    side.toggle("Classroom mode", key=CLASSROOM_KEY, on_change=_sync_classroom_param,
                help="Large type and figures for a projector; explanations collapse and only "
                     "the step controls stay in view. Same as adding ?classroom=1 to the link.")
    side.markdown("**Copy link** — reopens this exact state in a fresh browser:")
    set_link_slot(side.empty())  # every register() from here on redraws the link
    register("seed", int(st.session_state.get("seed", 0)))
    if classroom:
        register("classroom", True)
