"""A vLLM startup log, number by number, against the lab's vLLM sheet for the same settings.

Two sheets stand beside the log. One starts from the "Available KV cache memory" the log
prints: from there on vLLM's arithmetic has no unknowns, so its blocks, tokens and
concurrency must match the log (within the two decimals the log rounds the memory to), and a
mismatch means the settings differ (model, KV dtype, tensor parallelism, block size,
max_model_len) or the engine's version counts differently. The other starts from the card, as
the calculator does: there the weights and the profile the engine measured (activation peak,
non-torch memory, CUDA graphs) are the unknowns, and each line says by how much they moved.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lab.sizing.kv_formula import KVLayout
from lab.sizing.vllm_sheet import GIB, VllmSheet, vllm_sheet
from lab.vllm.startup_log import StartupLog

LOG_ROUNDING_GIB = 0.005  # "53.29 GiB" stands for anything in [53.285, 53.295)


@dataclass(frozen=True)
class Check:
    quantity: str
    engine: str  # as the log prints it ("—" when it does not)
    from_log_memory: str  # the sheet started from the log's available KV memory
    from_card: str  # the sheet started from the GPU preset
    agrees: bool | None  # the log against the sheet from its own memory; None: no comparison
    why: str


def guess_preset(model: str | None, names: Iterable[str]) -> str | None:
    """The preset a logged model id most likely is ("meta-llama/Llama-3.1-8B-Instruct" ->
    "Llama-3.1-8B"): the longest preset name the id's last part starts with."""
    if not model:
        return None
    tail = model.rstrip("/").rsplit("/", 1)[-1].lower().removeprefix("meta-")
    return max((n for n in names if tail.startswith(n.lower())), key=len, default=None)


def _span(low: float, high: float, fmt: str) -> str:
    a, b = format(low, fmt), format(high, fmt)
    return a if a == b else f"{a} – {b}"


def check_log(log: StartupLog, card: VllmSheet, layout: KVLayout) -> list[Check]:
    """One row per number the log prints, with the reason when log and sheet part."""
    rows = _memory_rows(log, card, layout)
    if log.kv_memory_gib is None:
        low = high = None
    else:
        bytes_low = int((log.kv_memory_gib - LOG_ROUNDING_GIB) * GIB)
        bytes_high = int((log.kv_memory_gib + LOG_ROUNDING_GIB) * GIB) - 1
        low, high = (vllm_sheet(layout, available_kv_memory=b, block_size=card.block_size,
                                max_model_len=card.max_model_len,
                                max_num_batched_tokens=card.max_num_batched_tokens)
                     for b in (bytes_low, bytes_high))
    for quantity, logged, get, fmt in (
            ("num_gpu_blocks", log.gpu_blocks, lambda s: s.num_blocks, ",.0f"),
            ("GPU KV cache size (tokens)", log.kv_cache_tokens, lambda s: s.num_tokens, ",.0f"),
            (f"Maximum concurrency for {card.max_model_len:,} tokens per request",
             log.max_concurrency, lambda s: s.max_concurrency, ",.2f")):
        if logged is None:
            continue
        derived = "—" if low is None else _span(get(low), get(high), fmt)
        agrees = None if low is None else (
            round(get(low), 2) <= logged <= round(get(high), 2))
        rows.append(Check(quantity, format(logged, fmt), derived, format(get(card), fmt),
                          agrees, _why_blocks(log, card, agrees, logged,
                                              None if low is None else get(low))))
    return rows


def _memory_rows(log: StartupLog, card: VllmSheet, layout: KVLayout) -> list[Check]:
    rows = []
    if log.total_gpu_gib is not None:
        sheet = card.total_memory / GIB
        rows.append(Check("total GPU memory (GiB)", f"{log.total_gpu_gib:.2f}", "—",
                          f"{sheet:.2f}", None, _why_gap(
                              log.total_gpu_gib - sheet, "the GPU preset's figure comes from "
                              "another machine; drivers and ECC settings move it by a few MiB. "
                              "A Custom GPU with the logged figure removes the difference")))
    if log.weights_gib is not None:
        sheet = card.weights_memory / GIB
        rope = layout.spec.max_position_embeddings * layout.vector_len * 2 / GIB
        rows.append(Check("model weights (GiB)", f"{log.weights_gib:.2f}", "—", f"{sheet:.2f}",
                          None, _why_gap(log.weights_gib - sheet, (
                              "vLLM counts every byte it allocated while loading: the "
                              f"parameters, and buffers such as RoPE's cos/sin table "
                              f"(max_position × head_dim × 2 B ≈ {rope:.3f} GiB here)"
                              if abs(log.weights_gib - sheet) < 0.05 * max(sheet, 1) else
                              "more than buffers explain: check the model, its weight "
                              "dtype or quantization, and the tensor-parallel degree"))))
    profiled = log.profiled_gib
    if profiled is None and None not in (log.total_gpu_gib, log.utilization, log.weights_gib,
                                         log.kv_memory_gib):
        profiled = (log.total_gpu_gib * log.utilization - log.weights_gib - log.kv_memory_gib)
    if profiled is not None:
        rows.append(Check("activation peak + non-torch + CUDA graphs (GiB)", f"{profiled:.2f}",
                          "—", f"{card.other_memory / GIB:.2f}", None, _why_gap(
                              profiled - card.other_memory / GIB, "the sheet's reserve is "
                              "your estimate; vLLM measures it in a profile run. Type the "
                              "logged figure as the reserve to remove the difference")))
    if log.kv_memory_gib is not None:
        gap = log.kv_memory_gib - card.available_kv_memory / GIB
        rows.append(Check("Available KV cache memory (GiB)", f"{log.kv_memory_gib:.2f}",
                          f"{log.kv_memory_gib:.2f}", f"{card.available_kv_memory / GIB:.2f}",
                          None, _why_available(gap, log, card, profiled)))
    return rows


def _why_available(gap: float, log: StartupLog, card: VllmSheet,
                   profiled: float | None) -> str:
    """Split the available-memory gap into what the log explains and what it leaves open."""
    if abs(gap) < 0.01:
        return "the same, to the log's two decimals"
    parts, known = [], 0.0
    if log.total_gpu_gib is not None:
        share = (log.total_gpu_gib - card.total_memory / GIB) * card.requested_memory \
            / max(card.total_memory, 1)
        parts.append(f"{share:+.2f} from the total memory")
        known += share
    if log.weights_gib is not None:
        share = card.weights_memory / GIB - log.weights_gib
        parts.append(f"{share:+.2f} from the weights")
        known += share
    if profiled is not None:
        share = card.other_memory / GIB - profiled
        parts.append(f"{share:+.2f} from the profiled reserve")
        known += share
    rest = gap - known
    if abs(rest) >= 0.01:
        measured = card.other_memory / GIB - rest
        why = (f"if the card reports the preset's total, vLLM's profile kept {measured:.2f} GiB "
               f"beside the weights, not your {card.other_memory / GIB:.2f} GiB estimate")
        if not parts:  # the log names no cause at all
            return f"{gap:+.2f} GiB in the log, which says nothing of why: {why}."
        parts.append(f"{rest:+.2f} the log does not account for: {why}")
    return f"{gap:+.2f} GiB in the log: " + "; ".join(parts) + "."


def _why_gap(gap: float, reason: str) -> str:
    if abs(gap) < 0.01:
        return "the same, to the log's two decimals"
    return f"{'+' if gap > 0 else '−'}{abs(gap):.2f} GiB in the log: {reason}."


def _why_blocks(log: StartupLog, card: VllmSheet, agrees: bool | None, logged: float,
                derived: float | None) -> str:
    if agrees:
        return ("vLLM's arithmetic reproduced from the logged memory (a range where the log's "
                "two-decimal GiB leaves room for more than one block count)")
    if agrees is None:
        return "the log has no 'Available KV cache memory' line to start from"
    hints = []
    if log.concurrency_tokens and log.concurrency_tokens != card.max_model_len:
        hints.append(f"the log's concurrency is for {log.concurrency_tokens:,} tokens: set "
                     f"max_model_len to {log.concurrency_tokens:,}")
    if derived:
        ratio = logged / derived
        if abs(ratio - 2) < 0.05 or abs(ratio - 0.5) < 0.03:
            hints.append(f"the log's number is {ratio:.2f}× the sheet's, as an fp8 KV cache "
                         "(kv_cache_dtype) or a tensor-parallel split of 2 would make it")
        elif len(card.groups) > 1 and abs(ratio - len(card.groups)) < 0.05:
            hints.append(f"{ratio:.2f}× the sheet's, the number of KV-cache groups: older vLLM "
                         "versions logged num_blocks × block_size for hybrid models too")
    hints.append("check the model, KV dtype, tensor-parallel degree and block size against "
                 "the engine's config line")
    return "the settings differ from the engine's: " + "; ".join(hints) + "."

