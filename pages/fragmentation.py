"""Fragmentation: one seeded workload, contiguous reservations vs the paged pool."""

import pandas as pd
import streamlit as st

from lab.figures.fragmentation import memory_maps, sweep_figure, timeline
from lab.figures.lesson import StepView
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import (
    DOUBLING,
    FragConfig,
    FragmentationStory,
    MemoryStats,
    block_size_sweep,
    comparable,
    doubling_effect,
    event_steps,
    finish_steps,
    finish_verdict,
    run_waste,
)
from ui.chapters import chapter_strip, next_page
from ui.layout import explain, page_parts, settings, show_figure, step_caption, step_parts
from ui.predict import Question, hatched
from ui.scenario import export_lesson, export_trace, frames, lesson_question, live_badge, or_stop
from ui.sidebar import sidebar
from ui.state import choice_param, int_param, seed
from ui.step_controls import step_controls

sidebar()
chapter_strip()
st.title("Fragmentation")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "The server knows a request's prompt length but not how long its answer will be. A "
        "**contiguous** allocator must reserve prompt + the maximum output in one piece up front: "
        "what the request never uses is **internal fragmentation**, and free space split into "
        "holes too small for the next reservation is **external fragmentation**. The **paged** "
        "pool below has exactly the same bytes but takes a block only when the last one is full, "
        "so its only waste is the unused tail of each sequence's last block. Both serve the same "
        "requests, first come, first served."
    )

    with settings(folded=True):
        left, middle, right = st.columns(3)
        block_size = choice_param("Block size (tokens per block)", "block_size",
                                  [1, 2, 4, 8, 16, 32, 64], default=16, container=left)
        pool_slots = int_param("Pool size (token slots, both systems)", "pool_slots", default=768,
                               min_value=128, max_value=4096, widget="number", container=left)
        num_requests = int_param("Requests", "requests", default=12, min_value=2, max_value=40,
                                 container=middle)
        max_output = int_param("Maximum output (what contiguous reserves)", "max_output",
                               default=160, min_value=8, max_value=1024, widget="number",
                               container=middle)
        mean_output = int_param("Typical output length (tokens)", "mean_output", default=48,
                                min_value=1, max_value=1024, widget="number", container=right,
                                help="Output lengths are drawn around this, most short and a few "
                                     "long; the server learns each one only when the request "
                                     "stops.")
        right.caption("Prompts are 16-96 tokens. The same seed gives the same requests.")

cfg = or_stop(lambda: FragConfig(
    PoolConfig(num_blocks=max(1, pool_slots // block_size), block_size=block_size),
    num_requests=num_requests, max_output=max_output, mean_output=mean_output))
story = FragmentationStory(cfg, seed())
all_frames = frames(story, spinner="Running the workload on both allocators…")
requests = story.requests()
total = len(requests)
finished_at = finish_steps(all_frames, total)
bytes_per_token = cfg.pool.bytes_per_token


def _row(name: str, s: MemoryStats) -> dict:
    def kib(slots: int) -> str:
        return f"{slots * bytes_per_token / 1024:,.0f} KiB ({100 * slots / s.capacity:.0f}%)"
    return {"allocator": name, "running": str(s.running), "waiting": str(s.waiting),
            "done": str(s.finished),
            "tokens stored": kib(s.used), "internal frag.": kib(s.internal),
            "external frag.": kib(s.external), "free": kib(s.free)}


PEAK = Question(
    "frag_peak", f"Each contiguous reservation is prompt (16-96) + {max_output} slots, in a pool "
    f"of {cfg.capacity} slots. What is the most requests the contiguous server ever runs at once "
    "in this workload?",
    answer=max(f.contiguous.running for f in all_frames),
    explanation=f"The paged pool, with the same bytes, runs up to "
                f"{max(f.paged.running for f in all_frames)} at once: it stores only tokens "
                "that exist, plus less than one block of tail per sequence.", context=story)
sweep = block_size_sweep(requests)
low = max(block_size, 2)  # a block of 1 has no empty tail to double
effect, low_row, high_row = doubling_effect(sweep, low)
TRADEOFF = Question(
    "frag_doubling", f"Every sequence here holds its prompt (16-96 tokens) and then one "
    f"to {max_output} output tokens, one block-table entry per {low}-token block, and its last "
    f"block is partly empty. If the block size doubles from {low} to {2 * low}, what happens, "
    "on average over this workload, to the block-table entries per sequence and to the empty "
    "tail of the last block?",
    choices=list(DOUBLING), answer=effect,
    explanation=f"A sequence of n tokens needs about n / {low} entries, and its last block is "
                f"on average about half empty. Measured here: {low_row.table_entries:.1f} → "
                f"{high_row.table_entries:.1f} entries, {low_row.tail_slots:.1f} → "
                f"{high_row.tail_slots:.1f} empty tail slots per sequence. Which size is right "
                "is not settled by this: the guide says there is no universal block size; it "
                "depends on the kernel, the model, the hardware and the lengths served, and comes "
                "from replaying the workload.", context=story)
WASTE = {name: run_waste(all_frames, name) for name in ("contiguous", "paged")}


def wasted(name: str, s: MemoryStats, step: int) -> str:
    """A system's waste at this step while it holds requests; once it has finished them all,
    its waste over the run (an empty pool's 0% says nothing)."""
    at = finished_at[name]
    if at is not None and at <= step:
        return f"{round(WASTE[name])}% avg"
    return f"{round(s.wasted_pct)}%" if s.running else "idle"


IDLE = ("The paged server runs no request at this step (it has finished them all, or none "
        "has arrived): no attention to check on its pool.")


def step_view(step: int) -> StepView:
    """What a step shows: on this page and in its lesson."""
    frame = all_frames[step]
    c, p = frame.contiguous, frame.paged
    return StepView(
        {"memory_maps": memory_maps(frame, cfg.capacity, block_size, finished_at),
         "timeline": timeline(all_frames, step)},
        story.caption(frame) or ["Every running request decodes one token; nobody is "
                                 "admitted or finishes."],
        {"Finished: contiguous": f"{c.finished} / {total}",
         "Finished: paged": f"{p.finished} / {total}",
         "Wasted: contiguous": wasted("contiguous", c, step),
         "Wasted: paged": wasted("paged", p, step)})


def show_step(step: int) -> None:
    frame, view = all_frames[step], step_view(step)
    last = len(all_frames) - 1
    parts = step_parts()
    with parts.caption:
        step_caption(step, list(view.caption))
    c, p = frame.contiguous, frame.paged
    both_done = all(at is not None and at <= step for at in finished_at.values())
    with parts.before:
        m1, m2, m3, m4 = st.columns(4)
        m1.metric("Finished: contiguous", view.counters["Finished: contiguous"],
                  help=f"Requests done by this step ({c.running} running, {c.waiting} waiting).")
        m2.metric("Finished: paged", view.counters["Finished: paged"],
                  delta=f"{p.finished - c.finished:+d} vs contiguous",
                  delta_color="normal" if p.finished != c.finished else "off",
                  help=f"Requests done by this step ({p.running} running, {p.waiting} waiting).")
        avg = ("Once a system has finished its requests: its waste averaged over the steps "
               "it held any (avg).")
        m3.metric("Wasted: contiguous", view.counters["Wasted: contiguous"],
                  help=f"Internal + external fragmentation, as a share of the pool. {avg}")
        if both_done:
            points = round(WASTE["paged"]) - round(WASTE["contiguous"])
            delta = f"{points:+d} points over the run"
        else:
            points = round(p.wasted_pct) - round(c.wasted_pct)
            delta = f"{points:+d} points" if comparable(c, p) else None
        m4.metric("Wasted: paged", view.counters["Wasted: paged"], delta=delta,
                  delta_color="inverse" if delta and points else "off",
                  help="Compared with contiguous while both hold requests, and at the end over "
                       f"the whole run: an empty pool wastes nothing. {avg}")
        verdict = finish_verdict(step, finished_at, total)
        if verdict:
            st.caption(f":material/flag: {verdict}")
        live_badge(story, step, last, idle=IDLE)
    with parts.main:
        show_figure(view.figures["memory_maps"], key="frag_map", file_name="memory_maps",
                    main=True)
        need = (f"{frame.next_reservation} slots" if frame.next_reservation else
                "none now: nobody waits")
        st.caption("Solid: slots holding a token's K/V. Pale: reserved or allocated but empty "
                   "(internal fragmentation). Violet and hatched (\"hole\"): free holes too small "
                   f"for the next reservation ({need}; external fragmentation). White: free. "
                   "Each request (R0, R1, ...) has its own colour, "
                   "the same in both rows (from R8 on, the colours again with stripes); a red "
                   "outline marks a request admitted at this step.")
    with parts.after:
        # A static table: st.dataframe's interactive grid costs more to draw on every step.
        st.table(pd.DataFrame([_row("Contiguous", c), _row("Paged", p)])
                 .set_index("allocator").T)  # a row per quantity: it fits a phone
        with hatched(PEAK.answered, "the run over time", key="frag_timeline"):
            show_figure(view.figures["timeline"], key="frag_timeline",
                        file_name="fragmentation_timeline")
        if frame.preemptions:
            st.caption(f"The paged server ran out of free blocks {frame.preemptions} time(s) "
                       "while decoding and preempted its youngest request (recompute): "
                       "admission control is still needed, as the guide says.")
        export_trace(story, step)
        export_lesson(story, step_view, last, idle=IDLE,
                      extras=lambda: {"block_size_sweep": sweep_figure(sweep, block_size)},
                      questions=lambda: [lesson_question(PEAK, 0, holds=["timeline"]),
                                         lesson_question(TRADEOFF, 0,
                                                         holds=["block_size_sweep"])])
        next_page(step == last)


with stage:
    show_step(step_controls(len(all_frames) - 1, events=event_steps(all_frames)))
st.subheader("The block size is a tradeoff")
explain(
    "Smaller blocks leave a smaller empty tail in each sequence's last block, but every "
    "sequence needs more block-table entries (and the allocator tracks more blocks). Larger "
    "blocks need fewer entries but waste more. The chart averages every request of this "
    "workload over every length it passes through; the block size in use has the ink outline.",
    title="Why the block size matters")
with hatched(TRADEOFF.answered, "the block-size sweep", key="frag_sweep"):
    show_figure(sweep_figure(sweep, block_size), key="frag_sweep", file_name="block_size_sweep")
TRADEOFF.ask()

PEAK.ask()
