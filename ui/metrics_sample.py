"""'Try a sample' on the Inspect a real engine page: the lab's own scheduler replay, written as a
vLLM v1 server's /metrics text and startup log (lab.vllm.replay_export), put into the page's
two text areas, with a label saying what it is while it is shown."""

from __future__ import annotations

import streamlit as st

from lab.sizing.vllm_sheet import gib
from lab.vllm.replay_export import EngineSample, engine_sample
from ui.memo import shared

METRICS_KEY, LOG_KEY = "vllm_metrics_text", "vllm_log_text"  # the page's text areas
_LOADED = "_vllm_sample_loaded"
SAMPLE_NOTE = "Sample from the lab's own simulation, not a vLLM server"

_sample = shared(engine_sample, spinner="Replaying the lab's scheduler…")


def _load() -> None:
    """on_click: set the text areas' state before they are drawn (Streamlit allows it here)."""
    sample = _sample()
    st.session_state[METRICS_KEY], st.session_state[LOG_KEY] = sample.metrics, sample.log
    st.session_state[_LOADED] = True


def sample_button(container=st) -> None:
    container.button(
        "Try a sample", key="vllm_sample", icon=":material/science:", on_click=_load,
        help="No vLLM server at hand? Fill both boxes with the lab's own scheduler replay "
             "(ShareGPT-like requests on Llama-3.1-8B's cost model, a 256-block pool), written "
             "in vLLM's metric names and log lines. A simulation, labelled as one; the same "
             "readers read a real server's text.")


def _shown(key: str) -> EngineSample | None:
    """The sample, when the text area under `key` holds it unchanged."""
    if not st.session_state.get(_LOADED):
        return None
    sample = _sample()
    text = sample.metrics if key == METRICS_KEY else sample.log
    return sample if st.session_state.get(key) == text else None


def sample_note(key: str) -> None:
    """The label, while the text area under `key` holds the sample."""
    sample = _shown(key)
    if sample is None:
        return
    if key == METRICS_KEY:
        detail = (f"its scheduler replay at its busiest iteration ({sample.stats.iteration:,}), "
                  "in simulated seconds")
    else:
        sheet = sample.sheet
        detail = (f"a pool of {sheet.num_blocks} blocks ({gib(sheet.available_kv_memory)} of "
                  f"KV), small "
                  "so that a short replay fills it: the card's column (a whole GPU) and its "
                  "reasons do not apply")
    st.info(f"**{SAMPLE_NOTE}**: {detail}.", icon=":material/science:")
