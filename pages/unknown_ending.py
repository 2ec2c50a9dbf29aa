"""The unknown ending: a contiguous server must guess each output; paging need not."""

import pandas as pd
import streamlit as st

from lab.figures.lesson import StepView
from lab.figures.unknown_ending import address_map, over_time
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.ending_stepper import SystemStats
from lab.scenarios.unknown_ending import (
    GUESS_LOW,
    MAX_REQUESTS,
    EndingConfig,
    UnknownEndingStory,
    event_steps,
)
from lab.sizing.kv_formula import format_bytes, kv_layout
from lab.sizing.model_spec import load_presets
from ui.chapters import chapter_strip, next_page
from ui.layout import bullets, explain, page_parts, settings, show_figure, step_parts
from ui.memo import shared
from ui.predict import Question, gate, hatched
from ui.scenario import (
    export_lesson,
    export_trace,
    frames,
    lesson_question,
    live_badge,
    live_measured,
    or_stop,
)
from ui.sidebar import sidebar
from ui.state import int_param, is_hidden, is_locked, seed, set_param
from ui.step_controls import step_controls

BLOCK_SIZE = 16
SCALE_MODEL = "Llama-3.1-8B"  # what the copies would weigh in a real model
DEFAULTS = EndingConfig()

sidebar()
chapter_strip()
st.title("The unknown ending")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "The server knows a request's prompt, but not how long its answer will be: it learns "
        "that only when the request stops. A **contiguous** allocator keeps each request's "
        "KV cache in one region, so it must **reserve** room for the output up front, by "
        "guessing. **Guess low**, and a long request fills its reservation while it is still "
        "writing: the region must grow, and when the slots after it are taken, its keys and "
        "values are **copied** to a bigger region elsewhere (here for real, on a K/V tensor, "
        "counted and timed). **Guess high**, and the reservations sit mostly empty while the "
        "requests behind them **wait** for room. The **paged** pool below has the same bytes "
        "and takes a block only when a sequence's last block is full: nothing to guess, "
        "nothing to move.")
    guess_box = st.container(key="lab_hidden_guess" if is_hidden("settings") else "ue_guess")
    with guess_box:
        slider, low, high = st.columns([4, 1.2, 1.2], vertical_alignment="bottom")
        guess = int_param("The contiguous server's guess: output tokens reserved per request",
                          "guess", default=DEFAULTS.guess, min_value=1, max_value=400,
                          container=slider,
                          help="Each request reserves prompt + this many slots when admitted. "
                               "A request that fills them grows: its output reservation "
                               "doubles, in place if the slots after it are free, else by "
                               "moving (copying its K/V) to a new region.")
        low.button(f"Guess low ({GUESS_LOW})", key="ue_guess_low", icon=":material/south:",
                   on_click=set_param, args=("guess", GUESS_LOW), disabled=is_locked(),
                   use_container_width=True)
        high.button(f"Guess high ({DEFAULTS.guess_high})", key="ue_guess_high",
                    icon=":material/north:", on_click=set_param,
                    args=("guess", DEFAULTS.guess_high), disabled=is_locked(),
                    use_container_width=True,
                    help="The longest output any request here may give: nothing ever grows.")
    with settings(folded=True):
        left, right = st.columns(2)
        num_requests = int_param("Requests", "requests", default=DEFAULTS.num_requests,
                                 min_value=2, max_value=MAX_REQUESTS, container=left,
                                 help="A third of them (at least one) write long outputs, "
                                      f"up to {DEFAULTS.max_output} tokens; the rest stop "
                                      "after a few tokens. Arrivals are 2-10 steps apart.")
        pool_slots = int_param("Pool size (token slots, both allocators)", "pool_slots",
                               default=DEFAULTS.capacity, min_value=256, max_value=2048,
                               widget="number", container=right,
                               help=f"The paged pool has this many slots in blocks of "
                                    f"{BLOCK_SIZE}; the contiguous tensor the same bytes.")
        st.caption(f"Prompts are {DEFAULTS.prompt_min}-{DEFAULTS.prompt_max} tokens. K/V "
                   "values are seeded random numbers per (token id, position); the same "
                   "seed gives the same requests.")

cfg = or_stop(lambda: EndingConfig(
    PoolConfig(num_blocks=pool_slots // BLOCK_SIZE, block_size=BLOCK_SIZE, num_kv_heads=2,
               head_dim=32), guess=guess, num_requests=num_requests))
story = UnknownEndingStory(cfg, seed())
all_frames = frames(story, spinner="Serving the requests on both allocators…")
last = len(all_frames) - 1
bytes_per_token = cfg.pool.bytes_per_token

longest = story.longest()
moves = story.moves_of(all_frames, longest.req_id)
growths = story.growths_of(all_frames, longest.req_id)
grown = len(moves) + len(growths)
# How often it grows is certain (its output reservation doubles until the output fits); where
# it grows, in place or by moving, depends on its neighbours at that moment. Asked before its
# first growth, held back there; the verdict then names every growth to come.
QUESTIONS = [(Question(
    "ue_growths",
    f"**R{longest.req_id}** has a {longest.prompt_len}-token prompt and will write "
    f"{longest.output_len} tokens (the server does not know that). The contiguous allocator "
    f"reserves prompt + {guess} output slots, and each time the request fills its "
    f"reservation, its output part doubles ({guess}, {2 * guess}, {4 * guess}, …), in place "
    f"or by moving. How many times will R{longest.req_id}'s reservation **grow** in all?",
    answer=grown,
    explanation=f"R{longest.req_id} grew {grown} time(s): {len(moves)} by moving "
                f"({sum(m.nbytes for m in moves):,} bytes copied) and {len(growths)} in place, "
                "where the slots after it happened to be free. Each growth doubles its output "
                "reservation, so a long request grows a few times, not once per token (a "
                "preemption starts its reservation over). The paged server never moves it: it "
                f"takes one more block every {BLOCK_SIZE} tokens.", context=story),
    story.first_growth(all_frames, longest.req_id))]
EVENTS = event_steps(all_frames)


def kib(n_bytes: int) -> str:
    return f"{n_bytes / 1024:,.1f} KiB"


def duration(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:,.2f} ms"


def _row(name: str, s: SystemStats) -> dict:
    row = {"running": s.running, "waiting": s.waiting, "done": s.finished,
           "tokens stored": f"{s.used} slots",
           "reserved, unused": f"{s.unused} slots ({s.unused_pct:.0f}% of pool)",
           "moves (K/V copied)": f"{s.moves} ({kib(s.copied_bytes)})",
           "grown in place": s.growths, "preempted": s.preemptions,
           "tokens recomputed": s.recomputed}
    return {"allocator": name} | {k: str(v) for k, v in row.items()}  # one type per column


def caption_lines(frame) -> list[str]:
    return story.caption(frame) or [
        "Every running request decodes one token, into its reservation (contiguous) or its last "
        "block (paged): nothing moves, nobody is admitted or finishes."]


def step_view(step: int) -> StepView:
    """What the lesson shows at a step: the address space, what the step did, the counters."""
    frame = all_frames[step]
    c, p = frame.contiguous, frame.paged
    return StepView(
        {"map": address_map(frame, cfg.capacity, guess)}, caption_lines(frame),
        {"Moves (contiguous; paged: 0)": str(c.moves), "K/V copied": kib(c.copied_bytes),
         "Reserved, unused": f"{c.unused_pct:.0f}% (paged {p.unused_pct:.0f}%)",
         "Waiting": f"{c.waiting} (paged {p.waiting})"})


def show_step(step: int) -> None:
    frame = all_frames[step]
    parts = step_parts()
    questions = gate(QUESTIONS, step)
    hidden = questions.hatch
    c, p = frame.contiguous, frame.paged
    with parts.caption:
        for question in questions.due:  # asked right here, before the step that answers it
            question.ask()
        with hatched(not hidden, "what this step did", key="ue_caption"):
            bullets(caption_lines(frame))
    with parts.before, hatched(not hidden, "the counters", key="ue_counters"):
        m1, m2, m3, m4, m5 = st.columns(5)
        m1.metric("Moves: contiguous", c.moves, delta="paged: 0", delta_color="off",
                  delta_arrow="off",
                  help="Regions copied elsewhere because a request outgrew its reservation "
                       f"and the slots after it were taken ({c.growths} more grew in place). "
                       "The paged server never moves a sequence.")
        m2.metric("K/V copied", kib(c.copied_bytes), delta="paged: 0 KiB", delta_color="off",
                  delta_arrow="off", help=f"{c.copied_bytes:,} bytes: {c.copied_tokens} "
                                          f"tokens × {bytes_per_token} bytes (K and V).")
        m4.metric("Reserved, unused", f"{c.unused_pct:.0f}%",
                  delta=f"paged: {p.unused_pct:.0f}%", delta_color="off", delta_arrow="off",
                  help="Slots reserved (contiguous) or allocated (paged: the empty tail of "
                       "each last block) that hold no token, as a share of the pool.")
        m5.metric("Waiting", c.waiting, delta=f"paged: {p.waiting}", delta_color="off",
                  delta_arrow="off", help="Requests that arrived but are not admitted: "
                                          "no hole holds their reservation (contiguous), not "
                                          "enough free blocks (paged).")
        live_badge(story, step, last,
                   idle="No request is running at this step: no attention to check.")
        timed, seconds = live_measured(story, step) or (0, 0.0)
        if c.copied_tokens:
            big = kv_layout(shared(load_presets)()[SCALE_MODEL], "fp16").bytes_per_token
            st.caption(f"Here a token's K and V take {bytes_per_token} bytes (1 layer, 2 KV "
                       f"heads of 32, float32). In {SCALE_MODEL} (fp16) a token takes "
                       f"{big // 1024} KiB: the same {c.copied_tokens} tokens' copies would move "
                       f"{format_bytes(c.copied_tokens * big)}, each during its request's "
                       "decode step.")
        copies = f"{timed} cop{'y' if timed == 1 else 'ies'} timed" if timed else None
        m3.metric("Copy time", duration(seconds) if timed else "—", delta=copies,
                  delta_color="off", delta_arrow="off",
                  help="Measured: the wall time of the moves' K/V copies on the real tensor, "
                       "on this machine (time.perf_counter around each copy, synchronised on a "
                       "GPU). It varies from run to run.")
    with parts.main, hatched(not hidden, "the address space", key="ue_map"):
        show_figure(address_map(frame, cfg.capacity, guess), key="ue_map",
                    file_name="unknown_ending_map", main=True)
        holes = (" Violet and hatched (\"hole\"): free, but too small for the "
                 f"{frame.next_reservation} slots the next waiting request must reserve."
                 if frame.next_reservation else "")
        st.caption("Solid: slots holding a token's K/V. Pale: reserved (contiguous) or "
                   f"allocated (paged) but empty. White: free.{holes} A red outline marks what "
                   "grew, moved, was admitted or took a block at this step; a dashed box and an "
                   "arrow show where a moved region was. Each request keeps its colour in both "
                   "rows.")
    with parts.after:
        with hatched(not hidden, "the run so far", key="ue_after"):
            st.table(pd.DataFrame([_row("Contiguous", c), _row("Paged", p)])
                     .set_index("allocator").T)  # a row per quantity: it fits a phone
            show_figure(over_time(all_frames, step), key="ue_time",
                        file_name="unknown_ending_over_time")
        explain("The kernel check reads every running request's K/V where it lives now, a "
                "moved region at its new place, and compares the Triton kernel's attention "
                "with dense attention over the K/V the request wrote: a copy that lost or "
                "shifted a token would turn the badge red. A request that cannot grow at all "
                "(no hole holds its doubled region) makes the newest running request give its "
                "memory back (preemption by recompute, as vLLM does), and that request's "
                "tokens are prefilled again later.", title="What the badge proves, and when "
                                                           "growth fails")
        export_trace(story, step)
        export_lesson(story, step_view, last, idle="No request is running at this step: no "
                      "attention to check.", questions=lambda: [
                          lesson_question(question, reveal, until=reveal)
                          for question, reveal in QUESTIONS])
        for question in questions.later:
            question.ask()
        next_page(step == last)


with stage:
    show_step(step_controls(last, events=EVENTS))
