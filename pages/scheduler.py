"""Admission control: a continuous-batching scheduler on the real block pool."""

import streamlit as st

from kernels.backend import backend
from lab.figures.blocks import pool_grid
from lab.figures.lesson import StepView
from lab.figures.scheduler import region_map
from lab.scenarios.admission_control import (
    AdmissionControlStory,
    event_steps,
    first_chunked_admission,
    first_own_hit,
    next_preemption,
)
from lab.scenarios.story import MAX_STEPS
from lab.serving.config import SchedulerConfig
from ui.chapters import chapter_strip, next_page
from ui.layout import explain, page_parts, settings, show_figure, step_parts
from ui.predict import Question, gate, hatched
from ui.scenario import export_lesson, frames, lesson_question, live_badge
from ui.scheduler_runs import chain_section, replay_section, sweeps_section
from ui.scheduler_views import cost_widgets, engine_widgets, workload_widgets
from ui.sidebar import sidebar
from ui.state import bool_param, choice_param, is_classroom, seed, set_param
from ui.step_controls import announce, step_controls

sidebar()
chapter_strip()
st.title("Admission control: the scheduler")
SECTIONS = {"Step through": "step", "Replay & metrics": "replay", "Batch chain": "chain",
            "Sweeps": "sweeps"}
section = SECTIONS[choice_param("View", "sched_view", list(SECTIONS), default="Step through",
                                widget="segmented")]
small = section == "step"


def _two_classes(requests) -> bool:
    return requests is not None and len({r.priority for r in requests}) > 1


settings_area, stage = page_parts()
with settings_area:
    explain(
        "Paging makes the pool easy to fill, but the pool still has an end. Every **step**, "
        "vLLM V1 (0.33) first gives each running request its next tokens (one for a decode, the "
        "next chunk of a prompt) within a **token budget** and **max_num_seqs**, then admits "
        "waiting requests with what is left: the whole sequence must fit in the free blocks, "
        "but only the scheduled chunk's blocks are taken. When a running request needs a block "
        "and none is free, a victim is **preempted by recompute**: its blocks are freed, it goes "
        "back to the front of the queue, and nothing is admitted in that step. The paper's "
        "engine (vLLM V0, 2023) took a prompt's blocks all at once above a 1% **watermark** and "
        "could also **swap** a victim to CPU memory; choose it under Engine to compare. Memory "
        "decides who stays active; scheduling decides which tokens run next."
    )

    with settings(folded=small):
        if small:
            requests = workload_widgets("step", preset="alpaca", n=16, max_n=60, max_tokens=128,
                                        seed=seed())
            engine = engine_widgets("step", blocks=48, block_size=8, seats=8, budget=64,
                                    max_blocks=128, priorities=_two_classes(requests),
                                    prefix_caching=True)
        else:
            requests = workload_widgets("big", preset="sharegpt", n=1000, max_n=20_000,
                                        max_tokens=2048, seed=seed())
            engine = engine_widgets("big", blocks=2048, block_size=16, seats=128, budget=2048,
                                    max_blocks=200_000, priorities=_two_classes(requests))
        left, right = st.columns([2, 1])
        with left:
            cost = cost_widgets("sched")
        allocator = "paged"
        if small:
            allocator = choice_param("Allocator (step view)", "sched_allocator",
                                     ["paged", "contiguous"], default="paged", widget="segmented",
                                     container=right)
        compute = small and bool_param(
            "Triton kernel each iteration", "sched_compute", default=False, container=right,
            help="Compute mode: real K/V in the pool, paged attention checked against dense "
                 "attention each iteration. Slow on the CPU interpreter: small workloads only.")

if requests is None:
    st.stop()
try:
    cfg = SchedulerConfig(**engine, allocator=allocator)
except ValueError as err:
    st.error(f"These settings cannot run: {err}", icon=":material/settings:")
    st.stop()
compute_limit = 50_000 if backend().is_cuda else 600  # tokens in all; the CPU interprets
if compute and sum(r.prompt_len + r.output_len for r in requests) > compute_limit:
    st.warning(f"Compute mode runs the kernel every iteration ({backend().triton_mode}): keep the "
               f"workload under {compute_limit:,} tokens in all (e.g. 8 requests, max_tokens "
               "32). Showing the allocator-only run instead.", icon=":material/hourglass_top:")
    compute = False

if section == "replay":
    replay_section(requests, cfg, cost, seed())
    st.stop()
if section == "chain":
    explain("The guide's chain: **1.** less wasted KV capacity lets the server **2.** keep more "
            "sequences live, which **3.** forms larger batches per iteration, which **4.** raises "
            "throughput *while holding a latency target*. Here both allocators replay the same "
            "workload; throughput is the best over max_num_seqs among runs whose inter-token "
            "latency p90 meets the target.")
    chain_section(requests, cfg, cost, seed())
    st.stop()
if section == "sweeps":
    explain("Block size: smaller blocks waste less in each last block but need more table "
            "entries; the pool has the same bytes at every size. Pool size: how much memory it "
            "takes before the paged and contiguous servers stop preempting or queueing.")
    sweeps_section(requests, cfg, cost, seed())
    st.stop()


story = AdmissionControlStory(cfg, requests, cost, seed())
all_frames = frames(story, spinner="Scheduling every step…")
if not all_frames:
    reason = story.stepper().sched.requests[0].reject_reason if requests else ""
    st.error(f"Every request was rejected, for example request 0: {reason}. Give the pool more "
             "blocks, lower max_tokens, raise the token budget or turn chunked prefill on.",
             icon=":material/view_module:")
    st.stop()
if len(all_frames) == MAX_STEPS:
    st.caption(f"Showing the first {MAX_STEPS} steps.")
# The other engine on the same workload and pool, beside it (paged only: the engines differ in
# how they take blocks). V0 beside V1 swaps, the preemption V1 no longer has.
other_story = other_frames = None
if cfg.allocator == "paged":
    other_engine = "v0" if cfg.engine == "v1" else "v1"
    other_story = AdmissionControlStory(cfg.as_engine(other_engine, "swap"), requests, cost,
                                        seed())
    other_frames = frames(other_story)


VICTIM_RULE = {
    "fcfs": "the scheduler preempts the last request in its running list: the one admitted "
            "last gives its blocks back first",
    "priority": "vLLM V1 preempts the running request with the largest (priority, arrival): "
                "the least important, the latest arrival among equals (vLLM V0 preempted the "
                "last one in its priority-sorted serving order)",
}


def victim_question() -> list[tuple[Question, int]]:
    """The first preemption, as a question asked the step before. It names what decides the
    victim (the running requests' order, or their priorities and arrivals) and offers them by
    id, so neither the choices nor the screen (the queues are held back while it is open)
    give the answer."""
    coming = next_preemption(all_frames, 0)
    if coming is None:
        return []
    specs = {r.req_id: r for r in requests}
    if cfg.policy == "priority":
        running = ", ".join(f"R{i} (priority {specs[i].priority}, arrived at "
                            f"{specs[i].arrival_s:.2f} s)" for i in sorted(coming.candidates))
        named = f"The running requests: {running}. Lower priority values are more important."
    else:
        named = ("The running requests, in the order the scheduler admitted them: "
                 + ", ".join(f"R{i}" for i in coming.candidates) + ".")
    question = Question(
        "sched_victim", f"Step {all_frames[coming.step].record.index} runs out of free "
        f"blocks: {cfg.label} preempts one running request by "
        f"{'recompute' if cfg.engine == 'v1' else cfg.preemption_mode}. {named} Which one "
        "is preempted?",
        answer=f"R{coming.victim}", choices=[f"R{i}" for i in sorted(coming.candidates)],
        explanation=f"{VICTIM_RULE[cfg.policy].capitalize()}. The scheduler's own line: "
                    f"“{coming.decision}”", context=(story, coming.step))
    return [(question, coming.step)]


def chunk_question() -> list[tuple[Question, int]]:
    """The first chunked admission: how many blocks the request holds after that step."""
    if cfg.allocator != "paged":
        return []
    c = first_chunked_admission(all_frames, cfg.block_size)
    if c is None:
        return []
    hit = f", {c.hit} of them found in the prefix cache" if c.hit else ""
    if cfg.engine == "v1":
        why = (f"vLLM V1 first checked that the whole sequence ({c.whole} blocks) fits, then "
               f"allocated only what this step computes: {c.hit + c.chunk} tokens in "
               f"{c.blocks} blocks. The rest arrive with the next chunks. vLLM V0 took all "
               f"{c.whole} at admission (the other engine, beside it).")
    else:
        why = (f"vLLM V0 takes every block of the prompt at admission, chunk or not: "
               f"{c.whole}. vLLM V1 would hold only the chunk's blocks now (beside it).")
    question = Question(
        "sched_chunk", f"In step {all_frames[c.step].record.index}, request {c.req_id} "
        f"({c.length} tokens{hit}) is admitted with a prefill chunk of {c.chunk} tokens: what "
        f"the token budget left. With blocks of {cfg.block_size} tokens, how many blocks does "
        f"it hold after this step, under {cfg.label}?",
        answer=c.blocks, explanation=why, context=(story, c.step))
    return [(question, c.step)]


QUESTIONS = victim_question() + chunk_question()
EVENTS = event_steps(all_frames)


# Two pools side by side: in classroom type, 16 tiles in half the width crowd their labels.
POOL_COLUMNS = None if is_classroom() else 16


def pool_figure(frame):
    if cfg.allocator == "paged":
        return pool_grid(frame.picture, frame.names, columns=POOL_COLUMNS,
                         highlight=list(frame.new_blocks))
    return region_map(frame.picture.regions, cfg.capacity_slots)


def decisions_of(frame) -> list[str]:
    return story.caption(frame) or ["(every running request got its next tokens; nothing "
                                    "else changed)"]


def step_view(step: int) -> StepView:
    """What the lesson shows at a step: the pool, the scheduler's decisions, the counters."""
    frame = all_frames[step]
    rec = frame.record
    return StepView(
        {"pool": pool_figure(frame)}, decisions_of(frame),
        {"Step": str(rec.index), "Batch": f"{rec.num_seqs} seqs",
         "Waiting": str(rec.num_waiting), "KV used": f"{rec.kv_usage:.0%}",
         "Preemptions": str(frame.preemptions),
         "Finished": f"{frame.finished} / {len(requests)}"})


ALLOCATOR_ONLY = ("Allocator only: turn on “Triton kernel each iteration” to record the "
                  "kernel check of every step.")


def other_panel(step: int) -> None:
    """The other engine at the same step: its pool and its decisions."""
    frames_, k = other_frames, min(step, len(other_frames) - 1)
    frame = frames_[k]
    st.markdown(f"**{other_story.config.label}**, same workload, step {frame.record.index}"
                + (" (it served everything earlier)" if k < step else ""))
    show_figure(pool_grid(frame.picture, frame.names, columns=POOL_COLUMNS,
                          highlight=list(frame.new_blocks)), key="sched_grid_other")
    st.caption(f"Preemptions so far: {frame.preemptions} · waiting {frame.record.num_waiting}"
               f" · swapped {frame.record.num_swapped} · finished {frame.finished} / "
               f"{len(requests)}")
    with st.expander(f"What {other_story.config.label} decided in this step"):
        st.code("\n".join(other_story.caption(frame) or ["(every running request got its "
                                                         "next token)"]),
                language=None, wrap_lines=True)


def show_step(step: int) -> None:
    frame = all_frames[step]
    rec = frame.record
    parts = step_parts()
    questions = gate(QUESTIONS, step)
    with parts.caption:
        for question in questions.due:
            question.ask()
        st.markdown(f"**What the scheduler ({cfg.label}) decided in this step**")
        decisions = decisions_of(frame)
        with hatched(not questions.hatch, "the scheduler's decisions", key="sched_decisions"):
            st.code("\n".join(decisions), language=None, wrap_lines=True)
        announce(step, "; ".join(decisions) if not questions.hatch else
                 "the decisions are held back until you answer the question on the page.")
    with parts.before:
        m = st.columns(6)
        m[0].metric("Step", rec.index, help=f"Simulated time {frame.clock_s * 1e3:,.1f} "
                    f"ms; this iteration took {rec.seconds * 1e3:.2f} ms ({rec.bound}-bound: "
                    "the cost model's roofline takes the longer of moving the bytes, weights "
                    "and K/V, at the GPU's bandwidth and doing the arithmetic at its peak "
                    "rate; memory-bound means the bytes took longer).")
        m[1].metric("Batch", f"{rec.num_seqs} seqs",
                    help=f"{rec.prefill_tokens} prefill + {rec.decode_tokens} decode tokens, of "
                         f"a budget of {cfg.max_num_batched_tokens}.")
        m[2].metric("Waiting", rec.num_waiting)
        m[3].metric("KV used", f"{rec.kv_usage:.0%}",
                    help="KV-cache utilization: blocks in use (paged) or slots reserved "
                         f"(contiguous), as a share of the pool; {rec.waste_slots} of those "
                         "slots hold no token.")
        m[4].metric("Preemptions", frame.preemptions,
                    help=f"So far, by {'recompute' if cfg.engine == 'v1' else cfg.preemption_mode}"
                         f". Admission keeps {cfg.watermark_blocks} of {cfg.num_blocks} blocks "
                         f"free (the watermark, {cfg.watermark_fraction:.1%}"
                         f"{', only while something runs' if cfg.engine == 'v1' else ''}).")
        m[5].metric("Finished", f"{frame.finished} / {len(requests)}")
        if compute:
            live_badge(story, step, len(all_frames) - 1)
        with hatched(not questions.asking, "the queues", key="sched_queues"):
            q = st.columns(3)
            for col, title, items in ((q[0], "Waiting", frame.waiting),
                                      (q[1], "Running", frame.running),
                                      (q[2], "Swapped (in CPU memory)", frame.swapped)):
                with col.container(border=True):
                    st.markdown(f"**{title}** ({len(items)})")
                    st.caption(" · ".join(items) if items else "empty")
    with parts.main, hatched(not questions.hatch, "the pool", key="sched_pool"):
        if cfg.allocator == "paged":
            left, right = st.columns(2)
            with left:
                st.markdown(f"**{cfg.label}**")
                show_figure(pool_figure(frame), key="sched_grid", main=True)
            with right:
                other_panel(step)
            st.caption("Each tile is a physical block, labelled with the request (R0, R1, …) "
                       "whose block table holds it; the bar shows its filled slots. White "
                       "tiles are free; a red outline marks the blocks allocated in this step: "
                       "under vLLM V1 a chunked prefill's blocks arrive chunk by chunk, under "
                       "V0 all of a prompt's blocks at admission.")
        else:
            show_figure(pool_figure(frame), key="sched_regions", main=True)
            st.caption("Each request reserved prompt + max_tokens slots at admission; the "
                       "solid part holds tokens, the pale part is reserved but empty (internal "
                       "fragmentation).")
    with parts.after:
        own = first_own_hit(all_frames) if cfg.allocator == "paged" else None
        if own is not None:
            at, req_id, blocks = own
            text = (f"Step {all_frames[at].record.index}: request {req_id}, preempted earlier, "
                    f"is re-admitted and finds its own block(s) {', '.join(map(str, blocks))} "
                    "still in the prefix cache: it recomputes only the rest.")
            # It names a preempted request: not while a question asks which one.
            with hatched(not questions.asking, "the re-admission ahead", key="sched_own"):
                note, go = st.columns([4, 1], vertical_alignment="center")
                note.info(text, icon=":material/replay:")
                go.button("Go to that step", key="sched_go_own", disabled=step == at,
                          on_click=set_param, args=("sched_step", at))
        elif cfg.allocator == "paged" and not cfg.enable_prefix_caching:
            st.caption("Turn prefix caching on (vLLM V1's default) to see a preempted request "
                       "re-admitted with a hit on its own blocks.")
        explain("**Which engine swaps.** Swap is vLLM V0's: a victim's blocks were copied to "
                "CPU memory and back. vLLM "
                "V1 preempts by recompute only: its documentation says recomputation has lower "
                "overhead in the V1 architecture. The victim keeps its sampled tokens and goes "
                "to the front of the waiting queue; with prefix caching its full blocks stay "
                "cached until they are handed out again, so a re-admission often hits them.",
                title="Which engine swaps, and why V1 dropped it")
        if frame.rejected:
            with st.expander(f"Rejected requests ({len(frame.rejected)})"):
                st.markdown("\n".join(f"- {line}" for line in frame.rejected))
        export_lesson(story, step_view, len(all_frames) - 1,
                      checks=None if compute else lambda step: ALLOCATOR_ONLY,
                      questions=lambda: [lesson_question(question, reveal, until=reveal)
                                         for question, reveal in QUESTIONS])
        next_page(step == len(all_frames) - 1)


with stage:
    show_step(step_controls(len(all_frames) - 1, key="sched_step", events=EVENTS))
