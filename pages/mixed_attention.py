"""Mixed attention: a gpt-oss-like model's two KV cache groups over one pool, step by step."""

import streamlit as st

from lab.figures.groups import blocks_held, group_pool, group_tables, legend_markdown
from lab.figures.lesson import StepView
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.mixed_attention import (
    GROUP_LABELS,
    MixedAttentionStory,
    MixedParams,
    PoolTooSmall,
    event_steps,
)
from lab.scenarios.mixed_models import MAX_MODEL_LEN, available_models, model_groups
from ui.chapters import chapter_strip, next_page
from ui.kernel_badge import kernel_badge
from ui.layout import explain, page_parts, settings, show_figure, step_caption, step_parts
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
from ui.state import choice_param, int_param, seed
from ui.step_controls import step_controls

sidebar()
chapter_strip()
st.title("Mixed attention")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "Many models mix attention types. **gpt-oss** (20b and 120b) alternates layers with a "
        "**sliding window** of 128 tokens and layers with full attention; vLLM 0.33 gives each "
        "kind its own **KV cache group**. Every request then holds one block table per group, "
        "and every group takes its blocks from the **same pool**. A full-attention layer needs "
        "every earlier token, so its table grows with the sequence. A sliding-window layer needs "
        "only the last *window* tokens: each time the request gets a slot, the positions that "
        "left the window become the **null block** in its table and their physical blocks go "
        "back to the pool at once. Here the window is a few blocks (8 tokens over blocks of 4 "
        "by default, not 128 over 16), so it passes in a few steps. Requests **A**, **B** and "
        "**C** share a system prompt: A arrives at step 1, B at step 3, C at the step A leaves.")
    with settings(folded=True):
        cols = st.columns(5)
        block_size = choice_param("Block size", "block_size", [4, 8], default=4,
                                  container=cols[0], help="Tokens per block, in both groups.")
        window = choice_param("Sliding window", "window", [4, 6, 8, 12, 16], default=8,
                              container=cols[1],
                              help="Tokens a sliding-window layer attends to, its own included.")
        system_len = int_param("System prompt", "system_len", default=16, min_value=4,
                               max_value=32, container=cols[2],
                               help="Tokens every request's prompt starts with.")
        output_len = int_param("Output of A", "output_len", default=10, min_value=1,
                               max_value=40, container=cols[3],
                               help="Tokens A generates; B and C generate 6 each.")
        num_blocks = int_param("Pool (blocks)", "num_blocks", default=18, min_value=8,
                               max_value=64, widget="number", container=cols[4],
                               help="Physical blocks shared by both groups. A small pool "
                                    "evicts cached blocks sooner.")
        st.caption("K/V values are seeded random numbers per (token id, position), one layer per "
                   "group in the pool: the allocator and the kernel do not care where they "
                   "come from.")

cfg = or_stop(lambda: MixedParams(PoolConfig(num_blocks=num_blocks, block_size=block_size,
                                             num_layers=len(GROUP_LABELS)),
                                  window=window, system_len=system_len, output_len=output_len))
story = MixedAttentionStory(cfg, seed())
all_frames = or_stop(lambda: frames(story), errors=PoolTooSmall, message="{error}")
last = len(all_frames) - 1
a, _, c = story.requests
probe = min(a.output_len, 5)  # A's fifth decode, or its last
probe_step, probe_pos = a.arrival + probe, a.prompt_len + probe - 1
c_arrival = all_frames[c.arrival].arrivals[0]
hit_sizes = ", ".join(str(h) for h in range(0, c_arrival.group_hits[0] + 1, block_size))
QUESTIONS = [
    (Question("mx_window",
              f"The sliding window is {window} tokens (a token attends to itself and the "
              f"{window - 1} before it) and the block size {block_size}. When A decodes position "
              f"{probe_pos} (it then has {probe_pos + 1} tokens), how many physical blocks does "
              "it hold in the sliding-window group?",
              answer=next(r for r in all_frames[probe_step].requests if r.name == "A").held[1],
              explanation=f"Only the blocks holding positions {max(probe_pos - window + 1, 0)}"
                          f"–{probe_pos} (the window) are held; the positions before it are the "
                          "null block, and their blocks went back to the pool. The "
                          "full-attention group holds every block: "
                          f"⌈{probe_pos + 1} / {block_size}⌉ = "
                          f"{-(-(probe_pos + 1) // block_size)}.", context=story),
     probe_step),
    (Question("mx_hit",
              f"C's {c.prompt_len}-token prompt starts with the same {system_len}-token system "
              f"prompt as A and B. The full-attention group alone would find "
              f"{c_arrival.group_hits[0]} of its tokens cached. A hit of *h* tokens also needs "
              "the sliding-window group's own cached blocks for the window before position "
              f"*h* (positions *h* − {window - 1} to *h* − 1); a grey tile in the pool names "
              "the group that cached it and the positions it holds. A hit is whole blocks "
              f"({hit_sizes}) that every group can serve. How many prompt tokens will the "
              "prefix cache serve C?",
              answer=c_arrival.hit_tokens,
              explanation="Each group looks on its own: full attention from the left, the "
                          "sliding window from the right, needing only the blocks of the window "
                          "before the first token to compute. A hit must hold in every group, "
                          "so it is the shortest of them.", context=story),
     c.arrival),
]
WINDOW_QUESTION = QUESTIONS[0][0]
IDLE = "No request in the pool: no attention to check."


def step_view(step: int) -> StepView:
    """What a step shows: on this page and in its lesson."""
    frame = all_frames[step]
    held = [sum(b.state == "used" and b.group == g for b in frame.blocks)
            for g in range(len(GROUP_LABELS))]
    changed = sorted({b for ch in frame.changes.values() for g in ch for b in g.new}
                     | {b for ch in frame.changes.values() for g in ch for _, b in g.nulled}
                     | {b for arr in frame.arrivals for g in arr.changes for b in g.new}
                     | {b for b, _, _ in frame.evicted})
    nulls = sum(b < 0 for r in frame.requests for t in r.tables for b in t)
    return StepView(
        {"tables": group_tables(frame),
         "pool": group_pool(frame, changed),
         "held": blocks_held(all_frames, step, [r.name for r in story.requests], GROUP_LABELS)},
        story.caption(frame),
        {"Blocks in use": f"{num_blocks - frame.num_free} / {num_blocks}",
         "Full-attention blocks": str(held[0]), "Sliding-window blocks": str(held[1]),
         "Null entries": str(nulls)})


def real_model_groups() -> None:
    """The KV cache groups vLLM 0.33 forms for a real model (lab/sizing reads its config)."""
    models = available_models()
    if not models:
        return
    st.subheader("A real model's KV cache groups")
    name = choice_param("Model", "model", models, default=models[0],
                        help="The groups, block size and page size vLLM 0.33 would use for "
                             "this model's published config, one GPU, KV cache in bf16.")
    m = model_groups(name)
    limit = {"sliding window": "window", "chunked local": "chunk"}
    rows = [f"| {i} | {g.kind} | {g.num_layers} | "
            + (f"{limit[g.kind]} {g.limit:,}" if g.kind in limit else "—")
            + f" | {g.pages_per_request:,} |" for i, g in enumerate(m.groups)]
    st.markdown("| group | kind | layers | tokens seen | pages per request |\n"
                "|---|---|---|---|---|\n" + "\n".join(rows))
    st.caption(f"Block size **{m.block_size}** tokens"
               + (f" ({m.why})" if m.why else ", vLLM's default on CUDA") + f"; a page (one "
               f"block of one layer) is {m.page_bytes:,} B. Layers are cut into groups of "
               f"{m.group_size}: a block id names one page in each of its group's layers. Pages "
               f"per request at max_model_len {MAX_MODEL_LEN:,}.")


def show_step(step: int) -> None:
    frame, view = all_frames[step], step_view(step)
    asked_here = st.container()  # right under the controls, in classroom mode too
    parts = step_parts()
    questions = gate(QUESTIONS, step)
    hidden = questions.hatch
    # The steady count below answers the window question: kept back until it is answered or
    # its step has gone by (gate closed it), hatched while it is asked, absent before.
    window_open = not (WINDOW_QUESTION.answered or WINDOW_QUESTION.closed)
    window_asked = WINDOW_QUESTION in questions.due
    with asked_here:
        # Asked before the step that answers it; one open question at a time (a second
        # waits for the first's answer), so the controls and the figure stay in view.
        first_open = next((q for q in questions.due if not q.answered), None)
        for question in questions.due:
            if question.answered or question is first_open:
                question.ask()
    with parts.caption:
        with hatched(not hidden, "what this step did", key="mx_caption"):
            step_caption(step, list(view.caption), hatched=hidden)
    tips = {"Full-attention blocks": "Physical blocks in use in the full-attention group (a "
                                     "block two requests share counts once).",
            "Sliding-window blocks": "Physical blocks in use in the sliding-window group"
                                     + ("." if window_open else
                                        ". Per request at most ⌈(window − 1) / block size⌉ + "
                                        f"1 = {story.steady_window_blocks()} once its window "
                                        "has moved on."),
            "Null entries": "Block-table positions out of the window: no block held there."}
    with parts.before:
        with hatched(not hidden, "the counters", key="mx_counters"):
            for column, (label, value) in zip(st.columns(4), view.counters.items(),
                                              strict=True):
                column.metric(label, value, help=tips.get(label))
        if frame.requests:
            st.caption("The kernel against dense attention, both groups' layers together, "
                       "then each:")
        live_badge(story, step, last, idle=IDLE)
        per_group = live_measured(story, step) if frame.requests else None
        if per_group:
            for col, (label, check) in zip(st.columns(len(per_group)), per_group):
                with col:
                    st.caption(f"The {label} group's layer"
                               + (f" (window {window}: it reads only the window's blocks)"
                                  if label != GROUP_LABELS[0] else "") + ":")
                    if check is None:
                        st.caption("Not checked: this build's kernel takes no sliding window.")
                    else:
                        kernel_badge(check)
    with parts.main, hatched(not hidden, "the block tables", key="mx_tables"):
        show_figure(view.figures["tables"], key="mixed_tables",
                    file_name="block_tables_per_group", main=True)
    with parts.after:
        with hatched(not hidden, "the pool", key="mx_pool"):
            st.markdown(legend_markdown(frame), unsafe_allow_html=True)
            show_figure(view.figures["pool"], key="mixed_pool", file_name="kv_pool")
            show_figure(view.figures["held"], key="mixed_held", file_name="blocks_held")
        if window_asked or not window_open:
            with hatched(not window_open, "why the window levels off", key="mx_why"):
                explain(
                    "**Why does the sliding window level off?** Token *p* attends to positions "
                    f"*p* − {window - 1} to *p*. Before each new token gets its slot, every block "
                    "wholly before that range is replaced by the null block and freed, so a "
                    f"request holds at most ⌈({window} − 1) / {block_size}⌉ + 1 = "
                    f"{story.steady_window_blocks()} blocks in that group however long it grows, "
                    "while the full-attention group holds ⌈tokens / block size⌉. With gpt-oss's "
                    "window of 128 over blocks of 16, a request holds at most 9 blocks in the "
                    "sliding-window group, against 256 in the full-attention group at 4,096 "
                    "tokens. A freed block keeps its hash: it stays findable in the prefix cache "
                    "until the pool hands it out again (evicted).",
                    title="Why the sliding window levels off")
        explain(
            "**How is a prefix hit found with two groups?** Each group has its own cached "
            "blocks (a block is cached under its hash *and* its group). Full attention searches "
            "left to right and stops at the first miss. The sliding window searches right to "
            "left for a run of cached blocks covering the window before the first token to "
            "compute; the positions before the run stay null. The hit must hold in every group, "
            "so the shorter one wins: the full group may still have a whole system prompt "
            "cached while the window group lost the blocks it needs, and then nothing is "
            "reused. The lab does what vLLM 0.33's hybrid KV cache manager does, checked "
            "against traces recorded from it.", title="The prefix hit with two groups")
        real_model_groups()
        export_trace(story, step)
        export_lesson(story, step_view, last, idle=IDLE, questions=lambda: [
            lesson_question(question, reveal, until=reveal) for question, reveal in QUESTIONS])
        # A question not due yet waits at the end of the page; once the step that answers it
        # has passed, it is closed (asked once per story and setting).
        for question, reveal in QUESTIONS:
            if question in questions.later and step < reveal:
                question.ask()
        next_page(step == last)


with stage:
    show_step(step_controls(last, events=event_steps(all_frames)))
