import streamlit as st

from ui.sidebar import sidebar

sidebar()
st.title("PagedAttention Lab")
st.write(
    "PagedAttention stores a language model's KV cache in fixed-size blocks, found through a "
    "block table, so memory grows with each sequence instead of being reserved up front."
)
