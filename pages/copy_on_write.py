"""Copy-on-write: parallel sampling and beam search over one prompt, vLLM V0 beside vLLM V1."""

import streamlit as st

from lab.figures.blocks import block_table_figure, legend_markdown, pool_grid
from lab.figures.cow import memory_figure
from lab.figures.lesson import StepView
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.copy_on_write import (
    BranchConfig,
    BranchFrame,
    CopyOnWriteStory,
    event_steps,
)
from lab.scenarios.cow_captions import v0_lines, v1_lines
from ui.chapters import chapter_strip, next_page
from ui.layout import bullets, explain, page_parts, settings, show_figure, step_parts
from ui.predict import Question, gate, hatched
from ui.scenario import export_lesson, export_trace, frames, lesson_question, live_badge, or_stop
from ui.sidebar import sidebar
from ui.state import choice_param, int_param, seed
from ui.step_controls import announce, step_controls

MODES = {"Parallel sampling": "parallel", "Beam search": "beam"}  # label (in the link) -> mode
V0_TITLE = "vLLM V0 (the paper, 2023): fork + copy-on-write"
V1_TITLE = "vLLM V1 (0.33): separate requests + prefix cache"

sidebar()
chapter_strip()
st.title("Copy-on-write")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "Several sequences grow from **one prompt**. Left, the guide's mechanism, as the "
        "paper's engine ran it (**vLLM V0**, 2023): **fork** the prompt's blocks (**ref "
        "count**), and **copy** a shared, partly filled block before writing into it. Right, "
        "**vLLM V1 (0.33)** on the same branches: separate requests sharing full blocks through "
        "the **prefix cache**. Compare **blocks held** and **tokens computed**, step by step.")
    with st.expander("How vLLM V1 (0.33) runs the same branches", icon=":material/info:"):
        st.markdown(
            "- **Parallel sampling** (`n > 1`): the front end turns the request into n child "
            "requests of the same prompt and adds them together, so one scheduler step admits "
            "them all (when the token budget and `max_num_seqs` allow, as here). The first "
            "computes the whole prompt (the cache starts empty here); V1 hashes full blocks as it "
            "allocates them, so the others find those blocks in the **prefix cache** (ref count "
            "+ 1) and compute only the rest: the partial last block, or the last full block "
            "when the prompt fills its blocks exactly, since a hit never covers a request's "
            "last token. From then on each child writes into blocks of its own.\n"
            "- **Beam search** (`LLM.beam_search`) runs outside the engine core: each step it "
            "sends every beam (its tokens so far) as a new request for one token, then keeps "
            "the best candidates. A request hits its beam's full blocks in the prefix cache, "
            "computes its partial last block again, and frees its blocks when its token is "
            "out (full ones stay cached for the next step).\n"
            "- Each engine runs on its own real KV pool of the size set below, through the "
            "lab's KV cache manager; the branches and their tokens are the same seeded draws "
            "for both.")

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
        num_blocks = int_param("Pool size (physical blocks, each engine)", "num_blocks",
                               default=32, min_value=4, max_value=128, widget="number",
                               container=right)

cfg = or_stop(lambda: BranchConfig(
    PoolConfig(num_blocks=num_blocks, block_size=block_size), mode=mode,
    num_branches=num_branches, prompt_len=prompt_len, max_new_tokens=new_tokens))
story = CopyOnWriteStory(cfg, seed())
all_frames: tuple[BranchFrame, ...] = frames(story)
# One question per story and setting: its key names them, so a new setting starts with an
# empty box and its own score entry (an answer to another setting is never overwritten).
SETTING = (f"{mode}_n{num_branches}_p{prompt_len}_t{new_tokens}_b{block_size}_k{num_blocks}"
           f"_s{seed()}")


def copies_question() -> Question:
    first = all_frames[1].v0.total_copies if len(all_frames) > 1 else 0
    partial = prompt_len % block_size
    return Question(
        f"cow_copies_{SETTING}",
        f"vLLM V0: the {prompt_len}-token prompt fills {prompt_len // block_size} full block(s) "
        f"of {block_size} {'plus one partial block' if partial else 'exactly'}, shared by "
        f"{num_branches} forks. When they write their first new token, how many blocks are "
        "copied?", answer=first,
        explanation=("Only the shared, partly filled last block is copied, once for each fork "
                     "but the last writer, which finds ref count 1 and writes in place. V1 "
                     "copies nothing: each child request computed its own last block at step 0."
                     if partial else "The last shared block is full, so each fork simply "
                     "takes a fresh block: nothing is copied."), context=story)


def compute_question() -> Question:
    length = prompt_len + 1
    return Question(
        f"cow_beam_compute_{SETTING}",
        f"vLLM V1: at step 1 the search sends its {num_branches} beams as {num_branches} "
        f"separate requests of {length} tokens each (block size {block_size}). The prompt's "
        "full blocks are in the prefix cache; a hit covers whole full blocks only, and never a "
        "request's last token. How many tokens does V1 compute at step 1, all requests "
        "together?", answer=all_frames[1].v1.computed,
        explanation=(f"Each request hits {(length - 1) // block_size} full block(s) "
                     f"({(length - 1) // block_size * block_size} tokens) and computes the "
                     f"rest of its {length} tokens. V0 computes one token per beam: "
                     f"{all_frames[1].v0.computed}; it copies blocks instead."), context=story)


QUESTIONS = [(copies_question() if mode == "parallel" else compute_question(), 1)]
EVENTS = event_steps(all_frames, mode)


def counters(frame: BranchFrame, v1: bool) -> None:
    view, other = (frame.v1, frame.v0) if v1 else (frame.v0, frame.v1)
    tag, other_tag = ("V1", "V0") if v1 else ("V0", "V1")
    m1, m2, m3 = st.columns(3)
    more = view.blocks_used - other.blocks_used
    m1.metric(f"Blocks held ({tag})", view.blocks_used,
              delta=f"{more:+d} vs {other_tag}" if more else f"as many as {other_tag}",
              delta_color="inverse" if more else "off", delta_arrow="auto" if more else "off",
              help="Physical blocks with ref count > 0 in this engine's pool.")
    m2.metric(f"Computed ({tag})", view.total_computed,
              delta=f"+{view.computed} this step", delta_color="off", delta_arrow="off",
              help="Tokens whose K/V this engine computed so far (a prefill computes every "
                   "prompt token it did not find in the prefix cache).")
    if v1:
        m3.metric("Recomputed", view.total_recomputed,
                  help="Of the tokens V1 computed, those whose K/V had been computed before (by "
                       "another request, or by this beam's request at an earlier step).")
    else:
        m3.metric("Copies", view.total_copies,
                  help="Copy-on-write copies so far: one block each time a fork wrote into a "
                       "shared, partly filled block.")


def pool_figure(frame: BranchFrame, v1: bool):
    view, tag = (frame.v1, "V1") if v1 else (frame.v0, "V0")
    copied = sorted({b for e in view.events if e.kind == "copy"
                     for b in (e.detail["src"], e.detail["dst"])})
    snapshot, names = view.by_branch()
    return pool_grid(snapshot, names, highlight=copied, title=f"{tag} KV pool")


def pool(frame: BranchFrame, v1: bool) -> None:
    tag = "v1" if v1 else "v0"
    st.markdown(f"**{V1_TITLE if v1 else V0_TITLE}**")
    show_figure(pool_figure(frame, v1), key=f"cow_pool_{tag}", file_name=f"kv_pool_{tag}",
                main=True)


def step_lines(frame: BranchFrame) -> tuple[list[str], list[str]]:
    """What each engine did at this step (V0's lines, V1's lines)."""
    return (v0_lines(frame.v0, frame, mode) or ["Nothing allocated, copied or freed: every "
                                                "branch writes into its own block."],
            v1_lines(frame.v1, frame, mode) or ["Nothing allocated or freed: every request "
                                                "writes into its own block."])


def step_view(step: int) -> StepView:
    """What the lesson shows at a step: both pools, what each engine did, the counters."""
    frame = all_frames[step]
    lines0, lines1 = step_lines(frame)
    return StepView(
        {"pool_v0": pool_figure(frame, False), "pool_v1": pool_figure(frame, True)},
        [f"V0: {line}" for line in lines0] + [f"V1: {line}" for line in lines1],
        {"Blocks held (V0 / V1)": f"{frame.v0.blocks_used} / {frame.v1.blocks_used}",
         "Computed (V0 / V1)": f"{frame.v0.total_computed} / {frame.v1.total_computed}",
         "Copies (V0)": str(frame.v0.total_copies),
         "Recomputed (V1)": str(frame.v1.total_recomputed)})


def show_step(step: int) -> None:
    frame = all_frames[step]
    last = len(all_frames) - 1
    parts = step_parts()
    questions = gate(QUESTIONS, step)
    with parts.caption:
        for question in questions.due:
            question.ask()
    shown = not questions.hatch
    with parts.main, hatched(shown, "the pools", key="cow_pool"):
        for column, v1 in zip(st.columns(2, gap="medium"), (False, True)):
            with column:
                pool(frame, v1)
    lines0, lines1 = step_lines(frame)
    with parts.before, hatched(shown, "the counters and what this step did",
                                 key="cow_caption"):
        for column, v1, lines in zip(st.columns(2, gap="medium"), (False, True), (lines0, lines1)):
            with column:
                counters(frame, v1)
                st.markdown(f"**{'V1' if v1 else 'V0'} at step {step}** · live branches: "
                            + (", ".join(f"B{b}" for b in frame.live) or "none"))
                bullets(lines)
        announce(step, "what it did is held back until you answer the question on the page."
                 if questions.hatch else " ".join(["V0:", *lines0, "V1:", *lines1]))
        live_badge(story, step, last, idle="Neither engine computes anything at this step: no "
                                           "attention to check.")
        st.caption("The badge checks the Triton kernel against dense attention for every token "
                   "either engine computed at this step, over its K/V through its block table.")
    with parts.after, hatched(shown, "the run so far", key="cow_after"):
        st.markdown(legend_markdown(*frame.v0.by_branch()) + " &nbsp; red "
                    "outline: a copy at this step (the shared source and its new copy)",
                    unsafe_allow_html=True)
        show_figure(memory_figure(list(all_frames), step), key="cow_memory",
                    file_name="cow_memory")
        with st.expander("Block tables of both engines at this step"):
            for tag, view in (("V0", frame.v0), ("V1", frame.v1)):
                if view.snapshot.sequences:
                    show_figure(block_table_figure(*view.by_branch(),
                                                   title=f"{tag} block tables"),
                                key=f"cow_tables_{tag.lower()}", file_name=f"tables_{tag}")
                else:
                    st.caption(f"{tag}: no live sequence, every block table is gone.")
    with parts.after:
        if step == last:
            st.success(_ending(frame), icon=":material/flag:")
        export_trace(story, step)
        export_lesson(story, step_view, last, idle="Neither engine computes anything at this "
                      "step: no attention to check.", questions=lambda: [
                          lesson_question(question, reveal, until=reveal)
                          for question, reveal in QUESTIONS])
        for question in questions.later:
            question.ask()
        next_page(step == last)


def _ending(frame: BranchFrame) -> str:
    v0, v1 = frame.v0, frame.v1
    cached = v1.snapshot.usage.blocks_cached_free
    held = (f"the best beam still holds {v0.blocks_used} block(s) in V0"
            if v0.blocks_used else "every V0 block is back in the free queue")
    return (f"The story is over: {held}; V1 holds {v1.blocks_used} (its {cached} full block(s) "
            "in the free queue keep their hash, still cached for a later prompt). Over the run "
            f"V0 computed {v0.total_computed} tokens and copied {v0.total_copies} block(s); V1 "
            f"computed {v1.total_computed}, {v1.total_recomputed} of them again, and copied "
            "none.")


with stage:
    show_step(step_controls(len(all_frames) - 1, events=EVENTS))
