"""The sidebar every page shows first: backend, seed, classroom mode, copy link, class link
and lesson path (ui/lesson_path.py).

Call `sidebar()` at the top of every page, before any other widget: it starts the run's link
state (ui/state.py), loads the page styles (classroom mode, a teacher link's hidden controls)
and keeps app.py's navigation in charge (ui/navigation.py).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import streamlit as st

from kernels.backend import backend
from ui.lesson_path import lesson_maker, lesson_stop
from ui.navigation import ensure_app_navigation
from ui.state import (
    GLOBAL,
    HIDEABLE,
    begin_run,
    bool_param,
    int_param,
    is_classroom,
    is_hidden,
    is_locked,
    set_link_slot,
    share_url,
    teacher_settings,
)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MAX_SEED = 2**31 - 1
HIDE_CSS = {  # what a teacher link hides that is not drawn by a helper of ours
    "sidebar": '[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"], '
               '[data-testid="stExpandSidebarButton"] { display: none !important; }',
    "scrubber": '.st-key-step, .st-key-sched_step { display: none !important; }',
    "speed": '[class*="_speed"][class*="st-key-"] { display: none !important; }',
}


@cache
def _css(name: str) -> str:
    return (ASSETS / name).read_text()


def sidebar() -> None:
    ensure_app_navigation()
    begin_run(warn_slot=st.empty())  # refused link values are listed at the top of the page
    side = st.sidebar
    side.markdown(f"**Compute backend**  \n{backend().label}")
    teacher_settings()  # first: a locked link locks the seed too
    lesson_stop()  # a lesson path's stop: its note and the way on, above the page's title
    int_param("Random seed", "seed", default=0, min_value=0, max_value=MAX_SEED,
              widget="number", container=side, page=GLOBAL,
              help="Every random choice on a page (token ids, K/V values, queries, request "
                   "lengths) derives from this seed.")
    bool_param("Classroom mode", "classroom", default=False, container=side, page=GLOBAL,
               help="Large type and the figure first, for a projector; explanations and "
                    "settings fold away below. It stays on from page to page until turned "
                    "off. Same as adding ?classroom=1 to the link.")
    styles = [_css("lab.css")]
    if is_classroom():
        styles.append(_css("classroom.css"))
    styles += [css for control, css in HIDE_CSS.items() if is_hidden(control)]
    st.html(f"<style>{''.join(styles)}</style>")
    side.markdown("**Copy link** — reopens this exact state in a fresh browser:")
    set_link_slot(side.container(key="copy_link").empty())
    if is_locked():  # the class keeps the teacher's example: no link maker, no unlock
        side.caption(":material/lock: This class link is locked: the example and its seed "
                     "stay as the teacher set them.")
        return
    with side.expander("Make a class link"):
        st.caption("For a class: the same example, with the controls you pick hidden, "
                   "classroom mode on, and (if locked) no setting the class can change.")
        hide = st.multiselect("Hide", list(HIDEABLE), format_func=HIDEABLE.get,
                              default=["settings", "questions", "downloads"],
                              key="_class_link_hide")
        lock = st.toggle("Lock the settings", value=True, key="_class_link_lock")
        st.code(share_url({"classroom": "1", "hide": ",".join(hide),
                           "lock": "1" if lock else "0"}), language=None, wrap_lines=True)
        st.divider()
        lesson_maker(hide, lock)
