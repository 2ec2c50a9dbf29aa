"""The lab's pages in the guide's order: one list for the navigation, the map and the chapter strip.

Each page illustrates one or more sections of the guide (named by their titles); the chapter
strip at the top of a page says where the learner is, and at the end of a page's story it leads
to the next page.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from ui.state import current_page, is_classroom, is_hidden


@dataclass(frozen=True)
class Chapter:
    path: str  # the page's file, e.g. "pages/block_tables.py"
    title: str
    icon: str
    sections: tuple[str, ...]  # the guide's sections this page shows
    summary: str  # what the learner does there, for the map

    @property
    def url_path(self) -> str:
        return self.path.removeprefix("pages/").removesuffix(".py")


CHAPTERS = (
    Chapter("pages/home.py", "Start here", ":material/home:", (),
            "what PagedAttention is, and the map of the lab"),
    Chapter("pages/unknown_ending.py", "The unknown ending", ":material/help:",
            ("The problem is a cache with an unknown ending",),
            "a contiguous server must guess each output's length: guess low and long requests "
            "are moved (their K/V copied), guess high and the room sits empty while others "
            "wait; paging needs no guess"),
    Chapter("pages/block_tables.py", "Block tables", ":material/grid_view:",
            ("Logical blocks separate a sequence from physical memory",
             "Walk one request through the allocator"),
            "one request walked through the allocator: logical blocks, block table, physical "
            "blocks, the unused tail"),
    Chapter("pages/attention.py", "Attention over blocks", ":material/visibility:",
            ("PagedAttention changes addressing inside attention",),
            "the kernel reads K/V block by block through the table; shuffle the physical "
            "placement and the output does not change"),
    Chapter("pages/fragmentation.py", "Fragmentation", ":material/view_week:",
            ("Contiguous allocation wastes memory in two ways",
             "The block size is a real tradeoff"),
            "contiguous reservations vs paged blocks on the same workload; the block-size "
            "trade-off"),
    Chapter("pages/copy_on_write.py", "Copy-on-write", ":material/call_split:",
            ("Copy-on-write makes shared prefixes practical",),
            "parallel sampling and beam search share prompt blocks; only a written shared "
            "block is copied"),
    Chapter("pages/prefix_cache.py", "Prefix cache", ":material/cached:",
            ("Copy-on-write makes shared prefixes practical",),
            "requests with a common system prompt reuse full blocks found by a hash chain; "
            "eviction of cached free blocks"),
    Chapter("pages/mixed_attention.py", "Mixed attention", ":material/view_agenda:",
            ("Logical blocks separate a sequence from physical memory",),
            "a gpt-oss-like model: a block table per KV cache group over one pool, blocks "
            "leaving the sliding window become the null block, a prefix hit every group serves"),
    Chapter("pages/scheduler.py", "Admission control", ":material/traffic:",
            ("Better memory use creates room for a larger batch",
             "PagedAttention does not solve admission control"),
            "a batch scheduler on the block pool: queueing, preemption, and why free blocks "
            "become a larger batch"),
    Chapter("pages/serving_metrics.py", "Inspect a real engine", ":material/monitoring:",
            ("What to inspect in a real serving engine",),
            "a vLLM server's metrics and log next to the lab's own numbers"),
    Chapter("pages/calculator.py", "KV-size calculator", ":material/calculate:",
            ("Keep the tensor formula beside the allocator model",),
            "bytes per token for real model configs, and a capacity sheet"),
    Chapter("pages/model.py", "A real model", ":material/smart_toy:", (),
            "a small LLM generating with its KV cache in the pool"),
)


def pages() -> list:
    """The st.Page list for app.py's navigation."""
    return [st.Page(c.path, title=c.title, icon=c.icon, default=i == 0)
            for i, c in enumerate(CHAPTERS)]


def _index() -> int:
    return next((i for i, c in enumerate(CHAPTERS) if c.url_path == current_page()), 0)


def chapter_strip() -> None:
    """Where this page sits in the guide (a line above the title)."""
    i = _index()
    chapter = CHAPTERS[i]
    if not chapter.sections or is_classroom():
        return
    st.caption(f"Page {i} of {len(CHAPTERS) - 1} · the guide: "
               + " · ".join(f"*{s}*" for s in chapter.sections))


def next_page(at_end: bool) -> None:
    """At the end of the page's story, the way to the next page."""
    i = _index()
    if not at_end or i + 1 >= len(CHAPTERS) or is_hidden("sidebar"):
        return
    following = CHAPTERS[i + 1]
    st.page_link(following.path, label=f"Next: {following.title} — {following.summary}",
                 icon=":material/arrow_forward:")
