"""The landing page: what PagedAttention is, the map of the lab, where to start."""

import streamlit as st

from ui.chapters import CHAPTERS
from ui.layout import explain
from ui.sidebar import sidebar

sidebar()
st.title("PagedAttention Lab")
st.markdown(
    "A language model keeps the keys and values (the **KV cache**) of every earlier token of "
    "every live request. **PagedAttention** stores that cache in fixed-size **blocks** "
    "scattered anywhere in one big **KV pool**, and gives each request a **block table** that "
    "maps its logical blocks, in order, to physical blocks — so memory grows a block at a time "
    "with each sequence instead of being reserved up front. The attention kernel reads the "
    "keys and values through the block table, and computes exactly what ordinary attention "
    "would over the same tokens laid out contiguously."
)
explain(
    "Everything you see here is real: each step runs the lab's allocator over a real tensor "
    "pool, and every attention step runs a Triton paged-attention kernel that is checked "
    "against dense attention (the green badge). Every page follows a section of the guide "
    "*PagedAttention: how vLLM manages the KV cache*, in its order.",
    title="What is real here",
)

st.subheader("The map")
for chapter in CHAPTERS[1:]:
    link, caption = st.columns([1, 3], vertical_alignment="center")
    link.page_link(chapter.path, label=f"**{chapter.title}**")
    caption.markdown(chapter.summary[0].upper() + chapter.summary[1:] + ".")

st.subheader("Where to start")
st.markdown(
    "Start with **The unknown ending**: pick a guess and press **Step ▶** (or the Right arrow "
    "key) to watch a contiguous server move its requests or make them wait, beside paging. "
    "Every page has the same controls: Reset, Back, Step, Play and a "
    "slider to jump to any step. The **Copy link** box in the sidebar reopens exactly what you "
    "see, in any browser; **Classroom mode** makes everything large for a projector."
)
