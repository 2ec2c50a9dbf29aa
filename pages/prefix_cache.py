"""Prefix cache: requests sharing a system prompt reuse its full blocks."""

import streamlit as st

from lab.figures.blocks import legend_markdown, pool_grid
from lab.figures.lesson import StepView
from lab.figures.prefix import cache_over_time, hash_chain
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.prefix_cache import (
    APP_NAMES,
    PrefixCacheStory,
    PrefixConfig,
    event_steps,
    hit_question,
)
from ui.chapters import chapter_strip, next_page
from ui.layout import explain, page_parts, settings, show_figure, step_caption, step_parts
from ui.predict import Question, gate, hatched
from ui.scenario import export_lesson, export_trace, frames, lesson_question, live_badge, or_stop
from ui.sidebar import sidebar
from ui.state import choice_param, int_param, seed
from ui.step_controls import step_controls

sidebar()
chapter_strip()
st.title("Prefix cache")
settings_area, stage = page_parts()
with settings_area:
    explain(
        "Requests to one application usually start with the same **system prompt**. Prefix caching"
        " names every **full** block by a **block hash** chained over all tokens before it, so a "
        "new request whose leading blocks hash the same reuses those physical blocks (ref count + "
        "1) and skips their prefill. When a request finishes, its full blocks stay in the **free "
        "queue** still holding their hash (*cached free*, grey): reusable until the pool runs "
        "short and the least recently freed one is **evicted**. Reuse is safe only when everything"
        " that shaped the K/V matches: same model, same adapters, same tokens before it."
    )

    with settings(folded=True):
        left, middle, right = st.columns(3)
        block_size = choice_param("Block size (tokens per block)", "block_size", [4, 8, 16],
                                  default=16, container=left,
                                  help="16, as in the guide's walkthrough.")
        num_blocks = int_param("Pool size (physical blocks)", "num_blocks", default=8, min_value=4,
                               max_value=64, widget="number", container=left,
                               help="8 by default: small enough that three apps' prompts do not "
                                    "all stay cached, so some are evicted. A larger pool keeps "
                                    "more cached.")
        system_len = int_param("System prompt length (tokens)", "system_len", default=36,
                               min_value=1, max_value=64, container=middle,
                               help="36 by default: two full blocks of 16 that can be shared, "
                                    "and 4 tokens that share a block with each request's own "
                                    "question.")
        num_apps = int_param("Apps (distinct system prompts)", "apps", default=3, min_value=1,
                             max_value=3, container=middle)
        num_requests = int_param("Requests", "requests", default=8, min_value=2, max_value=16,
                                 container=right)
        right.caption("Each request: its app's system prompt + a 3-12 token question, then 2-6 "
                      "output tokens. One arrives every 2 steps.")

cfg = or_stop(lambda: PrefixConfig(
    PoolConfig(num_blocks=num_blocks, block_size=block_size), num_requests=num_requests,
    num_apps=num_apps, system_len=system_len))
story = PrefixCacheStory(cfg, seed())
all_frames = frames(story)


def _hits_question() -> tuple[Question, int] | None:
    """The story's one question (about the admission that teaches most), with its step."""
    asked = hit_question(all_frames, block_size, system_len)
    if asked is None:
        return None
    a, app = asked.admission, APP_NAMES[asked.admission.app]
    return Question(
        "prefix_hits", f"At step {asked.step} **R{a.req_id}** is admitted: app {app}'s "
        f"{system_len}-token system prompt, then its own question, {a.prompt_len} prompt tokens "
        f"in all, in blocks of {block_size}. How many of its prompt tokens will be found in the "
        f"cache? The pool at step {asked.step - 1} decides it; a tile marked {app}·L0 holds block "
        f"L0 of app {app}'s system prompt (grey: free but still cached).",
        answer=a.hit_tokens,
        explanation=f"{asked.reason} Only full blocks whose whole chain is still cached can "
                    "hit, and never the block holding the last prompt token.",
        context=story), asked.step


HITS = _hits_question()


def step_questions(step: int) -> list[tuple[Question, int]]:
    """The question is open the step before its admission and at it, then closed."""
    return [HITS] if HITS is not None and HITS[1] - 1 <= step <= HITS[1] else []


def lesson_questions() -> list:
    return [lesson_question(HITS[0], HITS[1], until=HITS[1])] if HITS else []


def pool_notes(frame) -> dict[int, str]:
    """What a tile's block holds, where the owner does not say it: an app's system prompt
    block (in use or cached), or, on a cached tile, the request whose own tokens it holds."""
    states = {b.block_id: b.state for b in frame.snapshot.blocks}
    return {b: held for b, held in frame.holds.items() if "·" in held or states[b] == "cached"}


def step_view(step: int) -> StepView:
    """What a step shows: on this page and in its lesson."""
    frame = all_frames[step]
    names = {seq: f"R{req}" for req, seq in frame.seq_of_request.items()}
    usage = frame.snapshot.usage
    marked = sorted({link.block_id for a in frame.admissions for link in a.chain
                     if link.status == "hit"}
                    | {e.block_id for e in frame.events if e.kind == "evict"})
    figures = {"pool": pool_grid(frame.snapshot, names, highlight=marked,
                                 columns=8 if num_blocks <= 32 else 16, notes=pool_notes(frame),
                                 title="KV pool (grey: free but cached)")}
    shown = frame.admissions[0] if frame.admissions else next(
        (f.admissions[0] for f in reversed(all_frames[:step]) if f.admissions), None)
    if shown is not None:
        figures["hash_chain"] = hash_chain(shown)
    figures["cache_over_time"] = cache_over_time(all_frames, step)
    return StepView(
        figures, story.caption(frame) or ["Every running request decodes one token; nothing "
                                          "is admitted, evicted or finished."],
        {"Hit rate (prompt tokens)": f"{100 * frame.hit_rate:.0f}%",
         "Blocks in use": f"{usage.blocks_used} / {num_blocks}",
         "Free but cached": str(usage.blocks_cached_free),
         "Evictions so far": str(frame.evictions)})


def show_step(step: int) -> None:
    frame, view = all_frames[step], step_view(step)
    last = len(all_frames) - 1
    names = {seq: f"R{req}" for req, seq in frame.seq_of_request.items()}
    parts = step_parts()
    questions = gate(step_questions(step), step)
    with parts.caption:
        for question in questions.due:
            question.ask()
    with parts.caption, hatched(not questions.hatch, "what this step did", key="px_caption"):
        step_caption(step, list(view.caption), hatched=questions.hatch)
    tips = {"Hit rate (prompt tokens)": f"{frame.hit_tokens} of {frame.query_tokens} prompt "
                                        "tokens so far were found in the cache and not "
                                        "prefilled again.",
            "Free but cached": "Free blocks that still hold a full block's K/V and its hash: a "
                               "later request with the same prefix takes them back without "
                               "recomputing."}
    with parts.before, hatched(not questions.hatch, "the counters", key="px_counters"):
        for column, (label, value) in zip(st.columns(4), view.counters.items(), strict=True):
            column.metric(label, value, help=tips.get(label))
        live_badge(story, step, last)
    with parts.main, hatched(not questions.hatch, "the pool", key="px_pool"):
        show_figure(view.figures["pool"], key="prefix_pool", file_name="kv_pool", main=True)
    with parts.after:
        st.markdown(legend_markdown(frame.snapshot, names) + " &nbsp; red outline: hit or "
                    "evicted at this step &nbsp; A·L0: block L0 of app A's system prompt; "
                    "R3 on a grey tile: R3's own tokens", unsafe_allow_html=True)
        with st.container(), hatched(not questions.hatch, "the hash chain", key="px_chain"):
            if "hash_chain" in view.figures:  # (one block with or without: later ones stay put)
                show_figure(view.figures["hash_chain"], key="prefix_chain",
                            file_name="hash_chain")
                st.caption("Each hash covers its block's tokens and, through its parent's "
                           "hash, every token before them. **hit**: found, not prefilled. "
                           "**miss**: looked up, not found, prefilled, then cached. **last**: "
                           "full but holds the last prompt token, so never looked up "
                           "(prefilled, then cached for later). **partial**: not full, no "
                           "hash.")
        explain(
            "**Why only full blocks?** A block's hash names exactly its tokens after exactly "
            "this prefix. A partial block will still receive tokens, different for every "
            "request, so it has no stable name and is never shared. **Why is the last prompt "
            "token always recomputed?** Its query is what produces the first output token, so "
            "the model must run on it; at most (prompt length − 1) // block size leading blocks "
            "can hit. A prompt that is exactly two full blocks reuses only the first.",
            title="Only full blocks, and never the last token")
        explain(
            "**Which free block is handed out first?** New blocks come from the head of the **free"
            " queue**. A finished (or preempted) request releases its blocks last block first: a "
            "full block holding a hash goes to the **back**, so cached blocks stay findable as "
            "long as possible and are evicted least recently freed first; its partly filled last "
            "block has no hash and nothing another request could reuse, so it goes to the "
            "**front** and is reused before any cached block is evicted. The lab does what vLLM v1"
            " (0.33) does, checked operation by operation against traces recorded from vLLM's own "
            "KV cache manager; older vLLM (0.11, for one) put every freed block at the back and "
            "evicted cached prefixes sooner. The default pool of 8 blocks shows it as you step: "
            "after a request finishes, the next admission gets its partial block back, with no "
            "eviction; only when none is left does a new block come from a grey cached one, the "
            "one at the front of the queue (red outline, **Evictions so far** + 1), and a later "
            "request with that prefix misses it.",
            title="Which free block goes first")
        with hatched(not questions.hatch, "the run so far", key="px_time"):
            show_figure(view.figures["cache_over_time"], key="prefix_time",
                        file_name="prefix_cache_over_time")
        for question in questions.later:
            question.ask()
        export_trace(story, step)
        export_lesson(story, step_view, last, questions=lesson_questions)
        next_page(step == last)


with stage:
    show_step(step_controls(len(all_frames) - 1, events=event_steps(all_frames)))
