"""PagedAttention Lab: the entry point. Pages are listed in the guide's order."""

import streamlit as st

import lab.backend  # noqa: F401  (decides the device before Triton loads)

st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide")

PAGES = [
    st.Page("pages/home.py", title="Start here", icon="🏠", default=True),
]

st.navigation(PAGES).run()
