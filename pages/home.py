"""The landing page: what PagedAttention is, the map of the lab, where to start."""

import streamlit as st

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
_MAP = [  # (page file, "title — what it shows"), in app.py's order
    ("pages/block_tables.py", "Block tables — one request walked through the allocator: "
     "logical blocks, block table, physical blocks, the unused tail."),
    ("pages/attention.py", "Attention over blocks — the kernel reads K/V block by block through "
     "the table; shuffle the physical placement and the output does not change."),
    ("pages/fragmentation.py", "Fragmentation — contiguous reservations vs paged blocks on "
     "the same workload; the block-size trade-off."),
    ("pages/copy_on_write.py", "Copy-on-write — parallel sampling and beam search share "
     "prompt blocks; only a written shared block is copied."),
    ("pages/prefix_cache.py", "Prefix cache — requests with a common system prompt reuse "
     "full blocks found by a hash chain; LRU eviction."),
    ("pages/scheduler.py", "Admission control — a batch scheduler on the block pool: "
     "queueing, preemption, and why free blocks become a larger batch."),
    ("pages/serving_metrics.py", "Inspect a real engine — a vLLM server's metrics and log "
     "next to the lab's own numbers: KV utilization, running and waiting, preemptions."),
    ("pages/calculator.py", "KV-size calculator — bytes per token for real model configs."),
    ("pages/model.py", "Real model — a small LLM generating with its KV cache in the pool."),
]
for path, text in _MAP:
    title, what = text.split(" — ", 1)
    link, caption = st.columns([1, 3], vertical_alignment="center")
    link.page_link(path, label=f"**{title}**")
    caption.markdown(what)

st.subheader("Where to start")
st.markdown(
    "Start with **Block tables** and press **Step ▶** (or the Right arrow key) to watch each "
    "token land in its slot. Every page has the same controls: Reset, Back, Step, Play and a "
    "slider to jump to any step. The **Copy link** box in the sidebar reopens exactly what you "
    "see, in any browser; **Classroom mode** makes everything large for a projector."
)
