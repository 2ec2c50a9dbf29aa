"""Figures of the mixed-attention page: KV cache groups over one pool (plotly in, go.Figure out).

* `group_tables`: each request's block table in each KV cache group, the null block shown.
* `group_pool`: every physical block of the one pool, by request and group; a free block that
  keeps its hash says which group cached it and which positions it holds.
* `blocks_held`: blocks each request holds per group, step by step (up to the current step):
  the full-attention group's grow with the sequence, the sliding window's level off.

One colour per request (the order it arrived), as on the other pages; rows and tiles name the
group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from lab.figures.alt_text import ids, with_alt
from lab.figures.common import over_time_figure, two_panels
from lab.figures.style import (
    CACHED_COLOR,
    EDGE_COLOR,
    FONT_SIZE,
    FREE_COLOR,
    HIGHLIGHT_COLOR,
    PALETTE,
    SHARED_COLOR,
    base_figure,
    label_margin,
    lighten,
)
from lab.memory.kv_cache_groups import NULL_BLOCK
from lab.scenarios.mixed_frames import MixedFrame

SHORT = ("full", "window")  # group names on table rows and in hover text
LETTER = ("F", "W")  # on pool tiles, which have room for a few characters
NULL_FACE = "#F4F4F4"
MAX_LABELS = 24  # table cells hold 1-3 digit ids: fewer fit across


def request_color(name: str) -> str:
    return PALETTE[(ord(name) - ord("A")) % len(PALETTE)]


def group_tables(frame: MixedFrame, title: str = "A block table per group") -> go.Figure:
    """Two rows per request (full attention, sliding window); column = logical block; cell =
    the physical block, or "null" where the position left the window."""
    rows = [f"{r.name} · {SHORT[g]}" for r in frame.requests for g in range(len(SHORT))]
    width = max((len(t) for r in frame.requests for t in r.tables), default=1)
    labelled = width <= MAX_LABELS
    traces, words = [], []
    for index, (row, (req, g)) in enumerate(zip(rows, ((r, g) for r in frame.requests
                                                        for g in range(len(SHORT))))):
        table = req.tables[g]
        face = lighten(request_color(req.name), 0.55 if g == 0 else 0.75)
        bs = frame.block_size
        hover = [f"{row}: logical block {i} (positions {i * bs}–{(i + 1) * bs - 1})"
                 + (" is the null block: out of the window, nothing held" if b == NULL_BLOCK
                    else f" is physical block {b}") for i, b in enumerate(table)]
        traces.append(dict(
            type="heatmap", z=[[0 if b == NULL_BLOCK else 1 for b in table]],
            x=list(range(len(table))), y=[index], zmin=0, zmax=1, showscale=False,
            colorscale=[[0, NULL_FACE], [0.5, NULL_FACE], [0.5, face], [1, face]],
            xgap=4, ygap=6, text=[["null" if b == NULL_BLOCK else str(b) for b in table]],
            texttemplate="%{text}" if labelled else "",
            textfont=dict(size=FONT_SIZE, color="#111111"), hovertext=[hover],
            hoverinfo="text"))
        nulls = sum(b == NULL_BLOCK for b in table)
        held = [b for b in table if b != NULL_BLOCK]
        words.append(f"{row}: {len(table)} logical blocks, " + (f"{nulls} null, " if nulls else "")
                     + f"held in {ids(held) or 'none'}")
    layout = dict(xaxis=dict(title=dict(text="logical block index"), range=[-0.5, width - 0.5],
                             dtick=1 if labelled else None, showgrid=False, zeroline=False),
                  yaxis=dict(tickvals=list(range(len(rows))), ticktext=rows,
                             range=[len(rows) - 0.5, -0.5], showgrid=False, zeroline=False),
                  margin=dict(l=max(60, label_margin(rows)), r=20, t=56, b=40))
    if not rows:
        layout["annotations"] = [dict(text="No request in the pool", x=0.5, y=0.5, xref="paper",
                                      yref="paper", showarrow=False)]
        layout["xaxis"]["visible"] = layout["yaxis"]["visible"] = False
    return with_alt(base_figure(traces, layout, title, 110 + 40 * max(2, len(rows))),
                    f"{title}. " + ("; ".join(words) or "No request in the pool") + ".")


def legend_markdown(frame: MixedFrame) -> str:
    """A one-line colour key for the tables and the pool (pages show it above the pool)."""
    keys = [f"<span style='color:{request_color(r.name)}'>■</span> {r.name}"
            for r in frame.requests]
    keys += [f"<span style='color:{SHARED_COLOR}'>■</span> shared by two requests",
             f"<span style='color:{CACHED_COLOR}'>■</span> free, still cached (its group and "
             "positions)", "□ free", "**F** full attention, **W** sliding window",
             "**null**: out of the window, no block held",
             f"<span style='color:{HIGHLIGHT_COLOR}'>□</span> changed at this step"]
    return " &nbsp; ".join(keys)


def group_pool(frame: MixedFrame, highlight: Sequence[int] = (),
               title: str = "One KV pool, both groups") -> go.Figure:
    """Every physical block as a tile: its holder(s) and group when used (dark: shared), the
    group and positions it caches when free but cached (grey), blank when free."""
    n, bs = len(frame.blocks), frame.block_size
    cols = min(n, 9 if n <= 18 else 12 if n <= 48 else 16)
    rows = math.ceil(n / cols)
    marked = set(highlight)
    face, edge, widths, xs, ys, texts, hovers = [], [], [], [], [], [], []
    for block in frame.blocks:
        r, c = divmod(block.block_id, cols)
        x0, y0 = c, rows - 1 - r
        positions = (f"{block.first_pos}–{block.first_pos + bs - 1}"
                     if block.first_pos is not None else "")
        if block.state == "used":
            shared = len(block.holders) > 1
            face.append(lighten(SHARED_COLOR if shared else request_color(block.holders[0]),
                                0.55 if shared else 0.7))
            texts.append(f"<b>{block.block_id}</b><br>{'+'.join(block.holders)} "
                         f"{LETTER[block.group]}")
            hovers.append(f"physical block {block.block_id}: {' and '.join(block.holders)}, "
                          f"{SHORT[block.group]} group, positions {positions} "
                          f"({block.filled}/{bs} slots filled)")
        elif block.state == "cached":
            face.append(CACHED_COLOR)
            texts.append(f"<b>{block.block_id}</b><br>{LETTER[block.group]} {positions}")
            hovers.append(f"physical block {block.block_id}: free, but still cached by the "
                          f"{SHORT[block.group]} group (positions {positions})")
        else:
            face.append(FREE_COLOR)
            texts.append(f"<b>{block.block_id}</b><br> ")
            hovers.append(f"physical block {block.block_id}: free")
        edge.append(HIGHLIGHT_COLOR if block.block_id in marked else EDGE_COLOR)
        widths.append(4 if block.block_id in marked else 1)
        xs.append(x0 + 0.5)
        ys.append(y0 + 0.5)
    traces = [
        dict(type="bar", orientation="h", y=ys, base=[x - 0.45 for x in xs], x=[0.9] * n,
             width=0.9, hoverinfo="skip", name="tiles",
             marker=dict(color=face, line=dict(color=edge, width=widths))),
        dict(type="scatter", x=xs, y=ys, mode="text", text=texts, hovertext=hovers,
             hoverinfo="text", textfont=dict(size=FONT_SIZE - 2), name="labels")]
    layout = dict(barmode="overlay", xaxis=dict(range=[0, cols], visible=False, fixedrange=True),
                  yaxis=dict(range=[0, rows], visible=False, fixedrange=True),
                  margin=dict(l=10, r=10, t=56, b=10))
    used = [b for b in frame.blocks if b.state == "used"]
    cached = [b for b in frame.blocks if b.state == "cached"]
    alt = (f"{title}: {n} blocks of {bs} slots, {len(used)} in use, {frame.num_free} free"
           + (f" ({len(cached)} of them cached)" if cached else "") + ". "
           + " ".join(f"Block {b.block_id}: {'+'.join(b.holders)}, {SHORT[b.group]}."
                      for b in used)
           + "".join(f" Block {b.block_id}: cached, {SHORT[b.group]}, positions {b.first_pos} to "
                      f"{b.first_pos + bs - 1}." for b in cached)
           + (f" Outlined at this step: blocks {ids(sorted(marked))}." if marked else ""))
    return with_alt(base_figure(traces, layout, title, 70 + 64 * rows), alt)


def blocks_held(frames: Sequence[MixedFrame], step: int, names: Sequence[str],
                labels: Sequence[str]) -> go.Figure:
    """Blocks each request holds in each group at every step up to `step` (the x axis spans
    the whole walk, so the lines grow as the learner steps)."""
    layout = two_panels(tuple(label.capitalize() for label in labels), spacing=0.1)
    traces = []
    for name in names:
        for g, axis in enumerate(("", "2")):
            xs, ys = [], []
            for frame in frames[:step + 1]:
                view = next((r for r in frame.requests if r.name == name), None)
                xs.append(frame.step)
                ys.append(view.held[g] if view else None)
            traces.append(dict(type="scatter", x=xs, y=ys, name=name, mode="lines+markers",
                               line=dict(color=request_color(name), width=3, shape="hv"),
                               showlegend=g == 0, legendgroup=name, xaxis=f"x{axis}",
                               yaxis=f"y{axis}", connectgaps=False))
    top = max((v for frame in frames for r in frame.requests for v in r.held), default=1)
    for axis in ("xaxis", "xaxis2"):
        layout[axis]["range"] = [-0.5, len(frames) - 0.5]
    for axis in ("yaxis", "yaxis2"):
        layout[axis]["range"] = [0, top + 1]
        layout[axis]["dtick"] = 2 if top > 8 else 1
    layout["yaxis"]["title"] = dict(text="blocks held")
    fig = over_time_figure(traces, layout, step, step_axes=("x", "x2"), height=320,
                           margin=dict(l=60, r=20, t=64, b=45),
                           legend=dict(orientation="h", y=-0.32, x=0.4))
    now = "; ".join(f"{r.name} {', '.join(f'{h} in {label}' for h, label in zip(r.held, labels))}"
                    for r in frames[step].requests)
    return with_alt(fig, f"Blocks each request holds per KV cache group, steps 0 to {step}. "
                         f"At step {step}: {now or 'no request in the pool'}.")
