"""The scheduler page's settings widgets: the workload, the engine and its settings (vLLM's
names), the cost model. The long runs built on them are in `ui.scheduler_runs`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from lab.serving.config import COMPUTE_POOL, ENGINE_LABELS, SchedulerConfig
from lab.serving.cost_model import CostModel, cost_model
from lab.serving.runs import CARD_RESERVE_BYTES, CARD_UTILIZATION, card_sheet
from lab.serving.workloads import (
    PRESETS,
    RequestSpec,
    WorkloadError,
    from_preset,
    parse_csv,
    with_priorities,
)
from lab.sizing.capacity import GIB, load_gpus
from lab.sizing.model_spec import load_presets
from ui.state import bool_param, choice_param, float_param, int_param

CSV = "csv"
CARD_MAX_BLOCKS = 200_000  # the largest pool the big views' Pool size setting takes
Requests = tuple[RequestSpec, ...]
ENGINES = {label: engine for engine, label in ENGINE_LABELS.items()}


# -- settings -----------------------------------------------------------------------------------
def workload_widgets(prefix: str, *, preset: str, n: int, max_n: int, max_tokens: int,
                     seed: int) -> Requests | None:
    """Workload widgets; None (with a message on the page) when no usable workload is given."""
    left, middle, right = st.columns(3)
    by_label = {p.label: name for name, p in PRESETS.items()} | {"Your CSV upload": CSV}
    label = choice_param("Workload", f"{prefix}_workload", list(by_label),
                         default=PRESETS[preset].label, container=left)
    chosen = by_label[label]
    rate = float_param("Arrival rate (requests/s; 0 = all at once)", f"{prefix}_rate",
                       default=0.0, min_value=0.0, max_value=200.0, step=0.5, container=left,
                       help="Poisson arrivals at this rate; 0 queues every request at time 0.")
    if chosen == CSV:
        upload = middle.file_uploader("CSV rows: prompt_len,output_len[,arrival_s]", type="csv",
                                      key=f"{prefix}_csv", max_upload_size=2,
                                      help=f"At most {max_n:,} rows and 2 MiB.")
        if upload is None:
            st.info("Upload a CSV to replay your own length distribution.",
                    icon=":material/description:")
            return None
        try:  # this view's own request limit: its frames hold every request's state
            return parse_csv(upload.getvalue(), max_requests=max_n)
        except WorkloadError as err:
            st.error(f"The CSV cannot be used here: {err}. This view replays at most "
                     f"{max_n:,} requests" + (" (Replay & metrics takes up to 20,000)."
                                              if max_n < 20_000 else "."),
                     icon=":material/description:")
            return None
    count = int_param("Requests", f"{prefix}_requests", default=n, min_value=2, max_value=max_n,
                      widget="number", container=middle)
    ceiling = int_param("max_tokens: output ceiling (contiguous reserves it)",
                        f"{prefix}_max_tokens", default=max_tokens,
                        min_value=8, max_value=4096, widget="number", container=middle)
    urgent = int_param("Interactive requests (%): priority 0, the rest 1", f"{prefix}_urgent",
                       default=0, min_value=0, max_value=100, widget="number", container=right,
                       help="A seeded share of the requests is interactive (priority 0, more "
                            "important); the rest is batch work (priority 1). With two classes, "
                            "the scheduler can preempt by priority instead of by arrival.")
    right.caption(PRESETS[chosen].note + ". Outputs are clipped at max_tokens.")
    requests = from_preset(chosen, count, seed=seed, rate=rate or None, max_tokens=ceiling)
    return with_priorities(requests, urgent / 100, seed=seed) if urgent else requests


def engine_widgets(prefix: str, *, blocks: int, block_size: int, seats: int, budget: int,
                   max_blocks: int, priorities: bool = False,
                   prefix_caching: bool = False) -> dict[str, Any]:
    """Scheduler settings shared by every section (SchedulerConfig keyword arguments).
    `priorities`: the workload has more than one priority, so the priority policy means
    something (otherwise it is not offered)."""
    left, middle, right = st.columns(3)
    engine = ENGINES[choice_param(
        "Engine", f"{prefix}_engine", list(ENGINES), default=ENGINE_LABELS["v1"],
        container=left,
        help="vLLM V1 (0.33), today's scheduler: running requests first, then waiting ones; "
             "a whole-sequence fit check, then blocks for the scheduled chunk only; preemption "
             "by recompute. vLLM V0, the paper's engine (2023): a prompt's blocks all taken at "
             "admission, a 1% watermark, preemption by swap or recompute.")]
    size = choice_param("Block size (tokens)", f"{prefix}_block_size",
                        [1, 2, 4, 8, 16, 32, 64, 128, 256], default=block_size, container=left,
                        help="Tokens per KV block: the unit the pool hands out.")
    count = int_param("Pool size (blocks)", f"{prefix}_blocks", default=blocks, min_value=4,
                      max_value=max_blocks, widget="number", container=left,
                      help="The contiguous baseline gets the same number of slots.")
    v0 = engine == "v0"
    watermark = float_param(  # each engine keeps its own default: V1 0, V0 1 %
        "Watermark (% of blocks kept free)", f"{prefix}_watermark" + ("_v0" if v0 else ""),
        default=1.0 if v0 else 0.0, min_value=0.0, max_value=50.0, step=0.5, container=left,
        help="Blocks admission leaves free, so requests already running find blocks for their "
             "next tokens before anyone must be preempted. vLLM V1 (0.33): 0 by default, held "
             "back only from waiting requests while something runs. vLLM V0 kept 1% at every "
             "admission.")
    policies = ["fcfs", "priority"] if priorities else ["fcfs"]
    settings = dict(
        engine=engine,
        pool=replace(COMPUTE_POOL, num_blocks=count, block_size=size),
        watermark=watermark / 100,
        max_num_seqs=int_param(
            "max_num_seqs", f"{prefix}_seats", default=seats, min_value=1, max_value=512,
            widget="number", container=middle,
            help="At most this many requests run at once (vLLM's max_num_seqs); the rest wait "
                 "even when memory is free."),
        max_num_batched_tokens=int_param(
            "Token budget (max_num_batched_tokens)", f"{prefix}_budget", default=budget,
            min_value=1, max_value=32768, widget="number", container=middle,
            help="Tokens computed in one step at most: one per decoding request, plus prompt "
                 "tokens of requests being prefilled."),
        long_prefill_token_threshold=int_param(
            "long_prefill_token_threshold (0: off)", f"{prefix}_long", default=0, min_value=0,
            max_value=32768, widget="number", container=middle,
            help="vLLM caps a prefill chunk at this many tokens when more than one request "
                 "runs or waits, so one long prompt does not take the whole budget."),
        policy=choice_param(
            "policy", f"{prefix}_policy", policies, default="fcfs", widget="segmented",
            container=right,
            help="fcfs: waiting requests in arrival order, the last running request preempted "
                 "first. priority (with two classes in the workload): the waiting queue by "
                 "(priority, arrival), and V1 preempts the running request with the largest "
                 "(priority, arrival). Set 'Interactive requests' above 0 to offer it."),
        enable_prefix_caching=bool_param(
            "Prefix caching", f"{prefix}_prefix", default=prefix_caching, container=right,
            help="Full blocks are hashed when allocated; a request whose leading blocks match "
                 "takes them instead of computing them (vLLM V1's default is on)."),
        enable_chunked_prefill=bool_param(
            "Chunked prefill", f"{prefix}_chunk", default=True, container=right,
            help="On: a long prompt is computed over several steps, a budget-sized chunk at a "
                 "time, beside the decodes. Off: a prompt must fit the token budget whole, and "
                 "waits until it does."),
    )
    if v0:
        settings["preemption_mode"] = choice_param(
            "Preemption (vLLM V0)", f"{prefix}_preempt", ["recompute", "swap"],
            default="recompute", widget="segmented", container=right,
            help="vLLM V0 could swap a victim's blocks to CPU memory and back, or free them and "
                 "recompute its tokens later. vLLM V1 always recomputes: a re-admitted request "
                 "often finds its own blocks still in the prefix cache.")
    return settings


def cost_widgets(prefix: str) -> CostModel:
    left, right = st.columns(2)
    model = choice_param("Model (times from the cost model)", f"{prefix}_model",
                         list(load_presets()), default="Llama-3.1-8B", container=left)
    gpu = choice_param("GPU", f"{prefix}_gpu", list(load_gpus()), default="H100 80 GB",
                       container=right)
    return cost_model(load_presets()[model], gpu)


def card_pool(cfg: SchedulerConfig, prefix: str) -> SchedulerConfig:
    """cfg on the pool the memory calculator gives the model and GPU `cost_widgets(prefix)`
    chose (a toggle, on by default); off, cfg's own pool, with a warning when it is smaller than
    that card's (its preemptions are then a small pool's, not the card's)."""
    model, gpu = st.session_state[f"{prefix}_model"], st.session_state[f"{prefix}_gpu"]
    sheet = card_sheet(load_presets()[model], gpu, cfg.block_size)
    card, blocks = f"{model} on one {gpu}", min(sheet.num_blocks, CARD_MAX_BLOCKS)
    on = bool_param(
        "Pool from the memory calculator", f"{prefix}_card_pool", default=True,
        help="On: the KV blocks this GPU holds for this model, as the Memory calculator sizes "
             "them. Off: the Pool size setting, e.g. a small pool to watch preemption.")
    if on and blocks >= 4:
        capped = (f", capped at {CARD_MAX_BLOCKS:,} of its {sheet.num_blocks:,}"
                  if blocks < sheet.num_blocks else "")
        st.caption(f"Pool: {blocks:,} blocks of {cfg.block_size} tokens "
                   f"({blocks * cfg.block_size:,} tokens), what the memory calculator gives "
                   f"{card}{capped}: "
                   f"{CARD_UTILIZATION:.0%} of {sheet.gpu_bytes / GIB:,.1f} GiB, less "
                   f"{sheet.weight_bytes / GIB:,.1f} GiB of weights and a "
                   f"{CARD_RESERVE_BYTES / GIB:g} GiB non-KV reserve. The Pool size setting "
                   "is not used while this is on.")
        return cfg.with_pool(num_blocks=blocks)
    if blocks < 4:
        st.warning(f"{model}'s weights ({sheet.weight_bytes / GIB:,.1f} GiB) and the non-KV "
                   f"reserve leave no room for KV blocks on one {gpu}, so this uses the Pool size"
                   f" setting ({cfg.num_blocks:,} blocks): a pool that card could not hold.",
                   icon=":material/memory:")
    elif cfg.num_blocks < sheet.num_blocks:
        share = cfg.num_blocks / sheet.num_blocks
        st.warning(f"**A small pool:** {cfg.num_blocks:,} blocks, {share:.0%} of the "
                   f"{sheet.num_blocks:,} that {card} holds. The preemptions and queueing "
                   "below are this small pool's, not that card's: turn on 'Pool from the memory "
                   "calculator' for the card's.", icon=":material/memory:")
    else:
        st.caption(f"Pool: the Pool size setting's {cfg.num_blocks:,} blocks, more than the "
                   f"{sheet.num_blocks:,} that {card} holds.")
    return cfg
