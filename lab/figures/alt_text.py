"""Text alternatives: what a figure shows, in words, for a learner who cannot see it.

A figure carries its own text in `layout.meta["alt"]` (plotly keeps `meta` for the user's own
data and draws nothing from it); the figure view makes it the plot's accessible name. Figures
that change with the step say what this step shows (the pool's blocks, who holds them); any
other figure is described from its title, axes and traces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import plotly.graph_objects as go

from lab.memory.snapshot import Snapshot

TAG = re.compile(r"<[^>]+>")
MAX_LISTED = 12  # ids listed one by one; past it, a count


def with_alt(fig: go.Figure, text: str) -> go.Figure:
    fig.layout.meta = {**(fig.layout.meta or {}), "alt": text}
    return fig


def alt_text(fig: go.Figure) -> str:
    """The figure's own text, or one made from its title, axes and traces."""
    meta = fig.layout.meta
    if isinstance(meta, Mapping) and meta.get("alt"):
        return str(meta["alt"])
    title = _plain(fig.layout.title.text) if fig.layout.title and fig.layout.title.text else ""
    parts = [title or "A chart"]
    axes = [_plain(axis.title.text) for name in ("xaxis", "yaxis")
            if (axis := fig.layout[name]) is not None and axis.title and axis.title.text]
    if axes:
        parts.append(" against ".join(reversed(axes)))
    named = [f"{trace.name} ({_points(trace)} points)" for trace in fig.data if trace.name]
    if named:
        parts.append("series: " + ", ".join(named))
    return ". ".join(parts) + "."


def ids(values: list[int]) -> str:
    """Block ids in words: listed when few, counted when many."""
    if len(values) <= MAX_LISTED:
        return ", ".join(map(str, values))
    return f"{len(values)} blocks, {values[0]} to {values[-1]}"


def pool_alt(snapshot: Snapshot, names: Mapping[int, str] | None = None,
             highlight: list[int] | tuple[int, ...] = ()) -> str:
    """The pool at this step: who holds which blocks, and how many are free or cached."""
    label = (lambda seq: names.get(seq, f"seq {seq}")) if names else (lambda seq: f"seq {seq}")
    usage = snapshot.usage
    lines = [f"Physical KV pool of {snapshot.num_blocks} blocks of {snapshot.block_size} slots: "
             f"{usage.blocks_used} in use, {usage.blocks_free} free"
             + (f" ({usage.blocks_cached_free} of them cached)" if usage.blocks_cached_free
                else "") + "."]
    for seq in snapshot.sequences:
        lines.append(f"{label(seq.seq_id)} holds blocks {ids(list(seq.block_table))} "
                     f"({seq.num_tokens} tokens).")
    shared = [b.block_id for b in snapshot.blocks if b.state == "used" and b.ref_count > 1]
    if shared:
        lines.append(f"Shared: blocks {ids(shared)}.")
    if highlight:
        lines.append(f"Outlined at this step: blocks {ids(list(highlight))}.")
    return " ".join(lines)


def _plain(text: str) -> str:
    return TAG.sub(" ", text).replace("  ", " ").strip()


def _points(trace) -> int:
    for attr in ("y", "x", "z", "values"):
        values = getattr(trace, attr, None)
        if values is not None:
            return len(values)
    return 0
