"""The sidebar every page shows: the compute backend."""

import streamlit as st

from lab.backend import backend


def sidebar() -> None:
    st.sidebar.markdown(f"**Compute backend**  \n{backend().describe()}")
