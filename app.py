"""PagedAttention Lab: the entry point. The pages are listed in the guide's order
(ui/chapters.py)."""

import streamlit as st

import kernels.backend  # noqa: F401  (decides the device before Triton loads)
from ui.chapters import pages
from ui.guard import run_guarded
from ui.state import CURRENT_PAGE, is_classroom

# The first run of a session reads classroom mode from the link; later ones from the state.
classroom = is_classroom() or st.query_params.get("classroom") in ("1", "true")
st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide",
                   initial_sidebar_state="collapsed" if classroom else "auto")
page = st.navigation(pages())
st.session_state[CURRENT_PAGE] = page.url_path  # lets shared widgets notice a page switch
run_guarded(page.run)  # an unforeseen exception: a short message, the traceback in the log
