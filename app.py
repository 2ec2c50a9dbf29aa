"""PagedAttention Lab: the entry point. Pages are listed in the guide's order.

Intended order (pages are added here as they land): home, block tables, attention over
blocks, fragmentation, copy-on-write, prefix cache, batch / scheduler (admission control),
KV-size calculator, real model.
"""

import streamlit as st

import kernels.backend  # noqa: F401  (decides the device before Triton loads)
from ui.state import CURRENT_PAGE

st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide")

PAGES = [
    st.Page("pages/home.py", title="Start here", icon=":material/home:", default=True),
    st.Page("pages/block_tables.py", title="Block tables", icon=":material/grid_view:"),
    st.Page("pages/attention.py", title="Attention over blocks", icon=":material/visibility:"),
    st.Page("pages/fragmentation.py", title="Fragmentation", icon=":material/view_week:"),
    st.Page("pages/copy_on_write.py", title="Copy-on-write", icon=":material/call_split:"),
    st.Page("pages/prefix_cache.py", title="Prefix cache", icon=":material/cached:"),
    st.Page("pages/scheduler.py", title="Admission control", icon=":material/traffic:"),
    st.Page("pages/serving_metrics.py", title="Inspect a real engine",
            icon=":material/monitoring:"),
    st.Page("pages/calculator.py", title="KV-size calculator", icon=":material/calculate:"),
    st.Page("pages/model.py", title="A real model", icon=":material/smart_toy:"),
]

page = st.navigation(PAGES)
st.session_state[CURRENT_PAGE] = page.url_path  # lets shared widgets notice a page switch
page.run()
