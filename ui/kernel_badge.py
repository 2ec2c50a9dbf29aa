"""The badge every attention-running page shows beside its figure: kernel vs dense attention."""

from __future__ import annotations

import streamlit as st

from kernels.reference import AttentionCheck
from lab.figures.lesson import check_line


def kernel_badge(check: AttentionCheck) -> None:
    """Green when the Triton kernel matches the float64 dense reference within the tolerance
    table of kernels/reference.py."""
    help_text = (f"The Triton paged-attention kernel read K/V through the block tables of "
                 f"{check.num_seqs} sequence(s); the dense reference gathered the same K/V into "
                 f"contiguous tensors and computed plain attention in float64. Tolerance "
                 f"({check.tolerance}). Relative error: {check.rel_error:.1e}.")
    if check.ok:
        st.badge(check_line(check), icon=":material/check_circle:", color="green",
                 help=help_text)
    else:
        st.badge(check_line(check), icon=":material/error:", color="red", help=help_text)
