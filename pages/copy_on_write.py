"""Copy-on-write: parallel sampling and beam search share one prompt's blocks."""

import streamlit as st

from lab.figures.blocks import block_table_figure, legend_markdown, pool_grid
from lab.figures.cow import memory_figure
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory, branch_name
from ui.chapters import chapter_strip, next_page
from ui.layout import explain, page_parts, settings, show_figure, step_caption, step_parts
from ui.predict import Question, gate, held_back
from ui.scenario import export_trace, frames, live_badge, or_stop
from ui.sidebar import sidebar
from ui.state import choice_param, int_param, seed
from ui.step_controls import step_controls

MODES = {"Parallel sampling": "parallel", "Beam search": "beam"}  # label (in the link) -> mode

sidebar()
chapter_strip()
st.title("Copy-on-write")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "Parallel sampling and beam search grow several sequences from **one prompt**. Instead of "
        "copying the prompt's KV cache for every branch, each branch's block table points at the "
        "same physical blocks, and a **ref count** says how many tables hold each one. Only when a "
        "branch must write into a shared block that is partly filled does the manager copy **that "
        "one block** (copy-on-write); full shared blocks stay shared. When a branch ends, its "
        "blocks lose one reference and return to the free queue at zero."
    )

    with settings(folded=True):
        left, middle, right = st.columns(3)
        mode = MODES[choice_param("Scenario", "mode", list(MODES), default="Parallel sampling",
                                  widget="segmented", container=left)]
        num_branches = int_param("Branches (n, or beam width)", "branches", default=4, min_value=2,
                                 max_value=8, container=left)
        prompt_len = int_param("Prompt length (tokens)", "prompt_len", default=30, min_value=1,
                               max_value=128, container=middle)
        new_tokens = int_param("New tokens per branch (at most)", "new_tokens", default=12,
                               min_value=1, max_value=48, container=middle)
        block_size = choice_param("Block size (tokens per block)", "block_size", [4, 8, 16, 32],
                                  default=16, container=right)
        num_blocks = int_param("Pool size (physical blocks)", "num_blocks", default=32, min_value=4,
                               max_value=128, widget="number", container=right)

cfg = or_stop(lambda: BranchConfig(
    PoolConfig(num_blocks=num_blocks, block_size=block_size), mode=mode,
    num_branches=num_branches, prompt_len=prompt_len, max_new_tokens=new_tokens))
story = CopyOnWriteStory(cfg, seed())
all_frames = frames(story)


first_copies = all_frames[1].copies if len(all_frames) > 1 else 0
partial = prompt_len % block_size
COPIES = Question(
    "cow_copies",
    f"The {prompt_len}-token prompt fills {prompt_len // block_size} full block(s) "
    f"{'plus one partial block' if partial else 'exactly'}. When the "
    f"{num_branches} branches write their first new token, how many blocks are copied?",
    answer=first_copies,
    explanation=("Only the shared, partly filled last block is copied, once for each branch "
                 "but the last writer, which finds ref count 1 and writes in place."
                 if partial else "The last shared block is full, so each branch simply "
                 "takes a fresh block: nothing is copied."), context=story)
QUESTIONS = [(COPIES, 1)]  # step 1: the branches write their first token


def show_step(step: int) -> None:
    frame = all_frames[step]
    last = len(all_frames) - 1
    names = {s.seq_id: branch_name(s.seq_id) for s in frame.snapshot.sequences}
    parts = step_parts()
    questions = gate(QUESTIONS, step)
    with parts.caption:
        for question in questions.due:
            question.ask()
        with held_back(not questions.hold, "what this step did", key="cow_caption"):
            step_caption(step, story.caption(frame) or [
                "Nothing is allocated, copied or freed at this step: every branch writes into "
                "its own block."], held=questions.hold)
    shared = sum(b.ref_count > 1 for b in frame.snapshot.blocks)
    with parts.before, held_back(not questions.hold, "the counters", key="cow_counters"):
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("Live branches", len(frame.live))
        m2.metric("Blocks in use", frame.blocks_used,
                  delta=f"{frame.blocks_used - frame.naive_blocks:+d} vs copies",
                  help="The delta compares with giving every branch its own copy of every "
                       "block.",
                  delta_color="inverse" if frame.naive_blocks != frame.blocks_used else "off")
        m3.metric("Shared blocks", shared, help="Physical blocks with ref count > 1: several "
                  "branches' block tables point at them.")
        m4.metric("Block copies so far", frame.copies,
                  help="Copy-on-write copies: one block each time a branch wrote into a shared, "
                       "partly filled block.")
        live_badge(story, step, last, idle="Every branch has ended: no attention to check.")
    copied = sorted({b for e in frame.events if e.kind == "copy"
                     for b in (e.detail["src"], e.detail["dst"])})
    with parts.main, held_back(not questions.hold, "the pool", key="cow_pool"):
        table_col, pool_col = st.columns([1, 2])
        with table_col:
            if frame.snapshot.sequences:
                show_figure(block_table_figure(frame.snapshot, names, title="Block tables"),
                            key="cow_tables", file_name="block_tables")
            else:
                st.info("No live branch: every block table is gone.")
        with pool_col:
            show_figure(pool_grid(frame.snapshot, names, highlight=copied, columns=8,
                                  title="KV pool (×n: shared by n branches)"),
                        key="cow_pool", file_name="kv_pool", main=True)
    with parts.after:
        st.markdown(legend_markdown(frame.snapshot, names) + " &nbsp; red outline: a copy at "
                    "this step (the shared source and its new copy)", unsafe_allow_html=True)
        show_figure(memory_figure(all_frames, step), key="cow_memory", file_name="cow_memory")
        export_trace(story, step)
        for question in questions.later:
            question.ask()
        next_page(step == last)


with stage:
    show_step(step_controls(len(all_frames) - 1))
