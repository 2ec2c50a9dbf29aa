"""Block tables: the guide's allocator walk, several requests at once, step by step."""

import streamlit as st

from lab.figures.blocks import block_table_figure, legend_markdown, pool_grid, token_strip
from lab.figures.lesson import StepView
from lab.memory.block_table import blocks_for
from lab.scenarios.block_tables import BlockTablesStory, event_steps
from ui.chapters import chapter_strip, next_page
from ui.layout import explain, page_parts, settings, show_figure, step_caption, step_parts
from ui.predict import Question, gate, hatched
from ui.scenario import export_lesson, export_trace, frames, lesson_question, live_badge
from ui.sidebar import sidebar
from ui.state import seed
from ui.step_controls import step_controls
from ui.walk_settings import check_walk, walk_settings

sidebar()
chapter_strip()
st.title("Block tables")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "PagedAttention cuts each sequence's KV cache into fixed-size **logical blocks** of "
        "*block size* tokens. A **block table** maps logical block 0, 1, 2, ... to **physical "
        "blocks** anywhere in the **KV pool**, and a block is taken only when the last one is "
        "full. Here request **A** is the guide's example (a 30-token prompt, block size 16: two "
        "blocks, the second with 14 tokens); requests B and C arrive one step later each, so "
        "their blocks interleave with A's in the pool. Step 1 prefills A's prompt; after that "
        "each step decodes one token for every request in the pool. A request that has all "
        "its tokens leaves at the next step, and its blocks go back to the free queue.")
    with settings(folded=True):
        params = walk_settings(output_len=4, help={
            "block_size": "Tokens per block (slots per block).",
            "prompt_len": "Prompt tokens of request A.",
            "output_len": "Tokens A generates. The server does not know this in advance: it "
                          "only sees the request stop. Requests B, C, ... get seeded lengths "
                          "around A's.",
            "requests": "Requests arrive one step apart.",
            "num_blocks": "Physical blocks in the KV pool."})
        st.caption("K/V values are seeded random numbers per (token id, position), not a "
                   "model's: the allocator and the attention kernel do not care where they "
                   "come from.")

check_walk(params, seed())
story = BlockTablesStory(params, seed())
block_size, num_blocks = params.pool.block_size, params.pool.num_blocks
all_frames = frames(story)
last = len(all_frames) - 1


first = story.requests[0]
target = min(first.total_len, first.prompt_len + 3)
# Each question with the first step that shows its answer (A arrives at step 1 with its prompt).
QUESTIONS = [
    (Question("bt_blocks",
              f"Request A has a {first.prompt_len}-token prompt and the block size is "
              f"{block_size}. How many physical blocks does A hold once it has {target} tokens?",
              answer=story.blocks_held(all_frames, target),
              explanation=f"Blocks are taken one at a time, only when the last is full: "
                          f"⌈{target} / {block_size}⌉ blocks.", context=story),
     1 + target - first.prompt_len),
    (Question("bt_tail", f"A stops after {first.total_len} tokens. How many slots of its last "
                         "block stay unused?",
              answer=story.tail_slots(all_frames, 0),
              explanation="The only waste of paging is the unused tail of the last block: "
                          "always fewer than one block per sequence, whatever the output "
                          "length.", context=story),
     1 + first.output_len),
]


IDLE = "The pool is empty: no attention to check yet."


def step_view(step: int) -> StepView:
    """What a step shows: on this page and in its lesson."""
    frame = all_frames[step]
    usage, names = frame.snapshot.usage, frame.seq_names
    live = len(frame.snapshot.sequences)
    taken = [e.block_id for e in frame.events if e.kind == "allocate"]  # what changed
    return StepView(
        {"pool": pool_grid(frame.snapshot, names, highlight=taken,
                           title="KV pool (red outline: taken at this step)"),
         "strip": token_strip(frame.snapshot, names),
         "table": block_table_figure(frame.snapshot, names)},
        story.caption(frame),
        {"Blocks in use": f"{usage.blocks_used} / {num_blocks}",
         "Filled slots": str(usage.slots_filled), "Unused tail slots": str(usage.tail_slots),
         "Tail bound": f"< {live * block_size}" if live else "—"})


def show_step(step: int) -> None:
    frame, view = all_frames[step], step_view(step)
    parts = step_parts()
    questions = gate(QUESTIONS, step)
    hidden = questions.hatch
    with parts.caption:
        for question in questions.due:  # asked right here, before the step that answers it
            question.ask()
        with hatched(not hidden, "what this step did", key="bt_caption"):
            step_caption(step, list(view.caption), hatched=hidden)
    live = len(frame.snapshot.sequences)
    tips = {"Unused tail slots": "Allocated slots with no token yet: only the last block of "
                                 "each sequence can have them, so there are fewer than one "
                                 "block per sequence.",
            "Tail bound": f"Unused tail slots stay below one block per sequence: {live} "
                          f"sequence(s) × {block_size} slots."}
    with parts.before, hatched(not hidden, "the counters", key="bt_counters"):
        for column, (label, value) in zip(st.columns(4), view.counters.items(), strict=True):
            column.metric(label, value, help=tips.get(label))
        live_badge(story, step, last, idle=IDLE)

    names = frame.seq_names
    # The longest block table the walk will reach decides the layout, so it holds for every
    # step. Short tables sit beside the pool, in view with it under the controls (at 1400x900
    # a third request's row fell below the fold when they came after the logical view).
    widest = max(blocks_for(r.total_len, block_size) for r in frame.requests)
    tables_beside_pool = widest <= 6
    with parts.main, hatched(not hidden, "the pool", key="bt_pool"):
        pool_col, table_col = (st.columns([5, 2], vertical_alignment="top")
                               if tables_beside_pool else (st.container(), None))
        with pool_col:
            show_figure(view.figures["pool"], key="pool", file_name="kv_pool", main=True)
        if table_col is not None:
            with table_col:
                show_figure(view.figures["table"], key="table", file_name="block_table")
    with parts.after:
        with hatched(not hidden, "the block tables", key="bt_tables"):
            st.markdown(legend_markdown(frame.snapshot, names), unsafe_allow_html=True)
            show_figure(view.figures["strip"], key="strip", file_name="token_strip")
            if not tables_beside_pool:  # long tables: below the logical view, full width
                show_figure(view.figures["table"], key="table", file_name="block_table")
        explain("How to read it: **L0, L1, ...** are logical blocks; the number in each "
                "block-table cell is the physical block that holds it; on the pool, each tile "
                "is a physical block and its bar shows how many of its slots hold tokens. "
                "Hover any cell for its slot.", title="How to read the figures")
        export_trace(story, step)
        export_lesson(story, step_view, last, idle=IDLE, questions=lambda: [
            lesson_question(question, reveal, until=reveal) for question, reveal in QUESTIONS])
        for question in questions.later:  # the others wait at the end of the page
            question.ask()
        next_page(step == last)


with stage:
    show_step(step_controls(last, events=event_steps(all_frames)))
