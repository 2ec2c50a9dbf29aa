"""Attention over blocks: the kernel reads K/V through the block table, in order."""

import streamlit as st

from lab.figures.blocks import legend_markdown, pool_grid
from lab.figures.lesson import StepView
from lab.scenarios.attention import MAX_PLACEMENTS, AttentionConfig, AttentionStory, event_steps
from lab.scenarios.block_tables import request_name
from ui.chapters import chapter_strip, next_page
from ui.kernel_badge import kernel_badge
from ui.layout import explain, page_parts, settings, show_figure, step_caption, step_parts
from ui.predict import Question, hatched
from ui.scenario import export_lesson, export_trace, frames, lesson_question, or_stop
from ui.sidebar import sidebar
from ui.state import choice_param, int_param, register, seed
from ui.step_controls import step_controls
from ui.walk_settings import check_walk, walk_settings

sidebar()
chapter_strip()
st.title("Attention over blocks")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "Attention itself does not change: the newest token's query is compared with every cached "
        "key, and the values are averaged with the softmax weights. What changes is **where the "
        "kernel finds the keys and values**: it walks the sequence's **block table** in logical "
        "order and loads each block from whichever physical block holds it. Step through the "
        "blocks to watch the kernel's running softmax bookkeeping, then **shuffle the physical "
        "placement**: the blocks are copied elsewhere in the pool, the table is updated, and "
        "the kernel runs again. What happens to its output? Predict first."
    )

    with settings(folded=True):
        params = walk_settings(output_len=20, help={
            "block_size": "Tokens per block.",
            "requests": "Other requests interleave their blocks with the chosen one's."})
        left, right = st.columns(2)
        request = choice_param("Sequence", "seq",
                               [request_name(i) for i in range(params.num_requests)],
                               default="A", widget="segmented", container=left,
                               help="Whose attention to follow, at the end of all requests' "
                                    "decoding.")
        head = choice_param("Head shown in the bookkeeping", "head", [0, 1], default=0,
                            widget="segmented", container=right)

check_walk(params, seed())


def _shuffle() -> None:
    st.session_state["placement"] = min(int(st.session_state.get("placement") or 0) + 1,
                                        MAX_PLACEMENTS)


movable = AttentionStory(AttentionConfig(params, request, 0, head), seed()).can_relocate()
SHIFT = Question(
    "att_shift", "If we shuffle where this sequence's blocks live in the pool, what happens to "
    "the attention output?",
    choices=["It changes a little (rounding)", "It is bit-for-bit identical",
             "It changes completely"],
    answer=lambda: ("It is bit-for-bit identical"
                    if frames(AttentionStory(AttentionConfig(params, request,
                                                             1 if movable else 0, head),
                                             seed()))[0].output_shift == 0
                    else "It changes a little (rounding)"),
    explanation="The kernel reads the same K/V in the same logical order, only from other "
                "addresses, so every floating-point operation is the same.",
    context=(params, request, head, seed()))
with stage:
    shuffle_col, placement_col = st.columns(2, vertical_alignment="bottom")
    shuffle_col.button("Shuffle placement", key="shuffle", icon=":material/shuffle:",
                       on_click=_shuffle, disabled=not movable,
                       help="Copy this sequence's blocks to other physical blocks (real copies "
                            "in the pool) and update its block table.")
    placement = int_param("Placement (shuffles so far; 0 = as allocated)", "placement",
                          default=0, min_value=0, max_value=MAX_PLACEMENTS, widget="number",
                          container=placement_col)
    if not movable:
        st.info("The pool has no room for a copy of this sequence's blocks: enlarge the pool "
                "to shuffle.")
        placement = 0
        register("placement", "0", "0")

story = or_stop(lambda: AttentionStory(AttentionConfig(params, request, placement, head),
                                        seed()))
all_frames = frames(story, spinner="Reading the blocks through the kernel…")
num_logical = len(all_frames) - 1


def step_view(step: int) -> StepView:
    """What a step shows: on this page and in its lesson."""
    frame = all_frames[step]
    labels = {p: f"L{i}" for i, p in enumerate(frame.block_table)}
    table = ", ".join(f"L{i} → {p}" for i, p in enumerate(frame.block_table))
    return StepView(
        {"pool": pool_grid(frame.snapshot, frame.seq_names, highlight=frame.read,
                           highlight_labels=labels,
                           title=f"Physical KV pool: {request}'s blocks read so far in red "
                                 f"({step} of {num_logical})")},
        story.caption(frame),
        {f"Block table of {request}": table, "Output change": f"{frame.output_shift:.1e}"})


def show_step(step: int) -> None:
    frame, view = all_frames[step], step_view(step)
    parts = step_parts()
    with parts.caption:
        SHIFT.ask()  # beside the figure it is about, under the step controls
        step_caption(step, list(view.caption))
    with parts.before:
        st.markdown(f"**Block table of {request}** ({frame.num_tokens} tokens): logical "
                    + ", ".join(f"L{i} → **{p}**" for i, p in enumerate(frame.block_table))
                    + (f" &nbsp; (as allocated: {', '.join(map(str, frame.first_table))})"
                       if placement else ""))
        badge_col, shift_col = st.columns([2, 1])
        with badge_col:
            kernel_badge(frame.check)
        with shift_col, hatched(SHIFT.answered, "the output change", key="att_shift"):
            st.metric("Output change", view.counters["Output change"],
                      help="Largest difference between the kernel's output now and at "
                           "placement 0 (before any shuffle): the block table hides where "
                           "blocks live.")
        if SHIFT.answered:  # the second half would answer the question
            st.caption("Two different comparisons. The badge: the float32 kernel against a "
                       "float64 dense reference, so a small error is float32 rounding. "
                       "**Output change**: the kernel's output now against its own output "
                       "before any shuffle, the same float32 arithmetic in the same order.")
    with parts.main:
        show_figure(view.figures["pool"], key="attention_pool", file_name="attention_pool",
                    main=True)
    with parts.after:
        st.markdown(legend_markdown(frame.snapshot, frame.seq_names), unsafe_allow_html=True)
        st.subheader(f"Online softmax, head {head}, block by block")
        explain("For each block the kernel computes the scores q·k of its tokens, updates the "
                "**running max** m (for numerical safety), rescales what it has summed so far "
                "by exp(m_old − m_new), and adds the block's exp(score − m) to the **running "
                "sum** and the weighted values to the output. After the last block the output "
                "is exact: the last column reaches zero.", title="How the bookkeeping works")
        final = frame.softmax[-1].output
        rows = [{"logical block": s.block, "physical block": frame.block_table[s.block],
                 "running max m": round(s.running_max, 4),
                 "running sum ℓ": round(s.running_sum, 4),
                 "max |output so far − final|": f"{(s.output - final).abs().max().item():.2e}"}
                for s in frame.softmax[:step]]
        if rows:
            st.table(rows)
        else:
            st.caption("Press Step to let the kernel read the first block.")
        next_page(step == num_logical)


with stage:
    show_step(step_controls(num_logical, events=event_steps(all_frames)))
export_trace(story, num_logical)
export_lesson(story, step_view, num_logical, checks=lambda step: all_frames[step].check,
              questions=lambda: [lesson_question(SHIFT, 0, holds=["Output change"])])
