"""Export the current run: its event trace as JSON (figures export as PNG from plotly's toolbar)."""

from __future__ import annotations

import streamlit as st


def export_trace(trace_json: str, *, key: str, file_name: str) -> None:
    """A download button for an event trace (e.g. `EventLog.to_json(...)`)."""
    st.download_button("Download event trace (JSON)", trace_json, file_name=file_name,
                       mime="application/json", key=key, icon=":material/download:",
                       on_click="ignore",
                       help="Every allocate / append / share / copy / free event of this run up "
                            "to the current step, with the parameters and seed that replay it. "
                            "Figures download as PNG from the camera icon above each chart.")
