"""The three linked views of a paged KV cache, built from a `Snapshot` (plotly in, go.Figure out).

* `token_strip`: each sequence's tokens in logical order, coloured by logical block, with the
  unused tail slots of its last block.
* `block_table_figure`: each sequence's block table, logical block -> physical block id.
* `pool_grid`: every physical block of the pool as a tile: whose it is (colour), how many of its
  slots hold tokens (the fill bar), its ref count when shared, free or cached-free.

The views are linked by colour (one colour per sequence, `sequence_colors`) and by the physical
ids printed in the table and on the tiles. Pages 3-5 and the scheduler/model pages reuse
`pool_grid`: pass `names` (seq_id -> label) and optionally `highlight` (physical ids to outline,
with short labels such as the order the kernel reads them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from lab.figures.alt_text import pool_alt, with_alt
from lab.figures.style import (
    CACHED_COLOR,
    EDGE_COLOR,
    FONT_SIZE,
    FREE_COLOR,
    HIGHLIGHT_COLOR,
    PALETTE,
    SHARED_COLOR,
    TAIL_COLOR,
    base_figure,
    label_margin,
    lighten,
)
from lab.memory.snapshot import Snapshot

MAX_LABELLED_COLUMNS = 30  # beyond this, cell labels would overlap: hover still tells
MAX_TABLE_LABELS = 24  # block-table cells hold 1-3 digit ids: fewer fit across


def sequence_colors(snapshot: Snapshot) -> dict[int, str]:
    """One palette colour per live sequence, in the snapshot's order."""
    return {s.seq_id: PALETTE[i % len(PALETTE)] for i, s in enumerate(snapshot.sequences)}


def _label(names: Mapping[int, str] | None, seq_id: int) -> str:
    return names.get(seq_id, f"seq {seq_id}") if names else f"seq {seq_id}"


def token_strip(snapshot: Snapshot, names: Mapping[int, str] | None = None,
                title: str = "Logical view: tokens in logical blocks") -> go.Figure:
    """One row per sequence; cell = token position; shade alternates per logical block."""
    bs = snapshot.block_size
    colors = sequence_colors(snapshot)
    width = max((len(s.block_table) * bs for s in snapshot.sequences), default=bs)
    traces, annotations = [], []
    outline_x: list[float | None] = []  # every logical block's outline, as one line trace
    outline_y: list[float | None] = []
    rows = [_label(names, s.seq_id) for s in snapshot.sequences]
    for index, seq in enumerate(snapshot.sequences):
        row = rows[index]
        slots = len(seq.block_table) * bs
        z, hover = [], []
        for pos in range(slots):
            block, offset = divmod(pos, bs)
            physical = seq.block_table[block]
            # One numbering everywhere: 0-based positions, slots within a block, pool slots.
            where = (f"logical block {block} → physical block {physical}, slot {offset} "
                     f"(pool slot {physical * bs + offset})")
            if pos < seq.num_tokens:
                z.append(block % 2)
                hover.append(f"{row}, position {pos}<br>{where}")
            else:
                z.append(2)
                hover.append(f"{row}: empty slot (unused tail)<br>{where}")
        color = colors[seq.seq_id]
        scale = [[0, color], [0.33, color], [0.33, lighten(color, 0.45)],
                 [0.66, lighten(color, 0.45)], [0.66, TAIL_COLOR], [1, TAIL_COLOR]]
        traces.append(dict(type="heatmap", z=[z], x=list(range(slots)), y=[index], zmin=0, zmax=2,
                           colorscale=scale, showscale=False, xgap=1 if slots <= 256 else 0,
                           ygap=6, hovertext=[hover], hoverinfo="text"))
        blocks = range(len(seq.block_table))
        if bs > 1 and len(blocks) <= 4 * MAX_LABELLED_COLUMNS:  # outline each logical block
            for b in blocks:
                x0, x1, y0, y1 = b * bs - 0.5, (b + 1) * bs - 0.5, index - 0.42, index + 0.42
                outline_x += [x0, x1, x1, x0, x0, None]
                outline_y += [y0, y0, y1, y1, y0, None]
        if bs > 1 and len(blocks) <= MAX_LABELLED_COLUMNS:  # L0, L1, ... when they fit
            annotations += [dict(x=b * bs + (bs - 1) / 2, y=index, text=f"L{b}",
                                 showarrow=False, bgcolor="rgba(255,255,255,0.8)",
                                 font=dict(size=FONT_SIZE - 2, color="#111111")) for b in blocks]
    if outline_x:  # a line trace, not layout shapes: plotly.js draws each shape on its own
        traces.append(dict(type="scatter", x=outline_x, y=outline_y, mode="lines",
                           line=dict(color="#333333", width=1.5), hoverinfo="skip",
                           name="logical blocks"))
    layout = dict(annotations=annotations,
                  xaxis=dict(title=dict(text="token position (logical order)"),
                             range=[-0.5, width - 0.5], showgrid=False, zeroline=False),
                  yaxis=_row_axis(rows), margin=_row_margin(rows))
    words = [f"{row}: {seq.num_tokens} tokens in logical blocks L0 to "
             f"L{len(seq.block_table) - 1}, {len(seq.block_table) * bs - seq.num_tokens} empty "
             "slots in the last" for row, seq in zip(rows, snapshot.sequences)]
    return with_alt(base_figure(traces, layout, title, 110 + 48 * max(1, len(rows))),
                    f"{title}. " + ("; ".join(words) or "No sequence yet") + ".")


def _row_margin(rows: list[str]) -> dict:
    return dict(l=max(60, label_margin(rows)), r=20, t=56, b=40)


def _row_axis(rows: list[str]) -> dict:
    """A y axis with one labelled row per sequence, first at the top. (Numeric rows: plotly.js
    fails on several one-row heatmaps over a categorical axis.)"""
    return dict(tickvals=list(range(len(rows))), ticktext=rows, range=[len(rows) - 0.5, -0.5],
                showgrid=False, zeroline=False)


def block_table_figure(snapshot: Snapshot, names: Mapping[int, str] | None = None,
                       title: str = "Block tables") -> go.Figure:
    """One row per sequence; column = logical block index; cell text = physical block id."""
    colors = sequence_colors(snapshot)
    width = max((len(s.block_table) for s in snapshot.sequences), default=1)
    labelled = width <= MAX_TABLE_LABELS
    traces = []
    rows = [_label(names, s.seq_id) for s in snapshot.sequences]
    for index, (row, seq) in enumerate(zip(rows, snapshot.sequences)):
        table = list(seq.block_table)
        hover = [f"{row}: logical block {i} is physical block {p}" for i, p in enumerate(table)]
        face = lighten(colors[seq.seq_id], 0.55)
        traces.append(dict(type="heatmap", z=[[1] * len(table)], x=list(range(len(table))),
                           y=[index], colorscale=[[0, face], [1, face]], showscale=False, xgap=4,
                           ygap=6, text=[[str(p) for p in table]],
                           texttemplate="%{text}" if labelled else "",
                           textfont=dict(size=FONT_SIZE + 1, color="#111111"),
                           hovertext=[hover], hoverinfo="text"))
    layout = dict(xaxis=dict(title=dict(text="logical block index"), range=[-0.5, width - 0.5],
                             dtick=1 if labelled else None, showgrid=False, zeroline=False),
                  yaxis=_row_axis(rows), margin=_row_margin(rows))
    words = [f"{row}: " + ", ".join(f"L{i} to block {p}" for i, p in enumerate(seq.block_table))
             for row, seq in zip(rows, snapshot.sequences)]
    return with_alt(base_figure(traces, layout, title, 110 + 48 * max(1, len(rows))),
                    f"{title}, logical block to physical block. "
                    + ("; ".join(words) or "No sequence yet") + ".")


def pool_grid(snapshot: Snapshot, names: Mapping[int, str] | None = None, *,
              highlight: Sequence[int] = (), highlight_labels: Mapping[int, str] | None = None,
              columns: int | None = None, notes: Mapping[int, str] | None = None,
              title: str = "Physical KV pool") -> go.Figure:
    """Every physical block as a tile.

    Tile colour: the owning sequence (purple when shared, with its ref count), white when free,
    grey when free but cached. The bar at the bottom of a used tile shows filled slots out of
    block_size. `highlight` outlines the given physical ids in red, labelled from
    `highlight_labels` (e.g. "1st", "2nd": the order a kernel reads them). `notes` adds a word
    to some tiles (physical id -> e.g. "A·L0": which prompt a block holds).
    """
    n, bs = snapshot.num_blocks, snapshot.block_size
    # Wide rows for larger pools: the grid stays a few rows high, under the step controls.
    cols = columns or min(n, 8 if n <= 16 else 12 if n <= 48 else 16)
    rows = math.ceil(n / cols)
    colors = sequence_colors(snapshot)
    tiles = dict(y=[], base=[], face=[], edge=[], width=[])  # one per physical block
    fills = dict(y=[], base=[], x=[], color=[])  # one per block holding tokens
    xs, ys, texts, hovers = [], [], [], []
    marked = set(highlight)
    for block in snapshot.blocks:
        r, c = divmod(block.block_id, cols)
        x0, y0 = c, rows - 1 - r  # row 0 at the top
        owners = ", ".join(_label(names, o) for o in block.owners)
        if block.state == "used":
            color = SHARED_COLOR if block.ref_count > 1 else colors.get(block.owners[0], EDGE_COLOR)
            face = lighten(color, 0.7)
        else:
            color, face = EDGE_COLOR, CACHED_COLOR if block.state == "cached" else FREE_COLOR
        tiles["y"].append(y0 + 0.5)
        tiles["base"].append(x0 + 0.05)
        tiles["face"].append(face)
        tiles["edge"].append(HIGHLIGHT_COLOR if block.block_id in marked else EDGE_COLOR)
        tiles["width"].append(4 if block.block_id in marked else 1)
        if block.state == "used" and block.filled:
            fills["y"].append(y0 + 0.175)
            fills["base"].append(x0 + 0.05)
            fills["x"].append(0.9 * block.filled / bs)
            fills["color"].append(color)
        xs.append(x0 + 0.5)
        ys.append(y0 + 0.62)
        note = (notes or {}).get(block.block_id)
        texts.append(_tile_text(block, names, highlight_labels) + (f" {note}" if note else ""))
        hovers.append(_tile_hover(block, owners, bs) + (f"<br>holds {note}" if note else ""))
    # Tiles and fill bars are horizontal bars (one trace each), not layout shapes, which plotly.js
    # lays out and draws one by one (bench/RESULTS.md, "Why the UI code is shaped so").
    traces = [
        dict(type="bar", orientation="h", y=tiles["y"], base=tiles["base"],
             x=[0.9] * len(tiles["y"]), width=0.9, hoverinfo="skip", name="tiles",
             marker=dict(color=tiles["face"],
                         line=dict(color=tiles["edge"], width=tiles["width"]))),
        dict(type="bar", orientation="h", y=fills["y"], base=fills["base"], x=fills["x"],
             width=0.25, hoverinfo="skip", name="filled slots",
             marker=dict(color=fills["color"], line=dict(width=0))),
        dict(type="scatter", x=xs, y=ys, mode="text", text=texts, hovertext=hovers,
             hoverinfo="text", textfont=dict(size=FONT_SIZE - 1), name="labels"),
    ]
    layout = dict(barmode="overlay", xaxis=dict(range=[0, cols], visible=False, fixedrange=True),
                  yaxis=dict(range=[0, rows], visible=False, fixedrange=True))
    held = "; ".join(f"block {b} holds {note}" for b, note in sorted((notes or {}).items()))
    return with_alt(base_figure(traces, layout, title, 90 + 64 * rows),
                    pool_alt(snapshot, names, list(highlight)) + (f" {held}." if held else ""))


def _tile_text(block, names: Mapping[int, str] | None,
               highlight_labels: Mapping[int, str] | None) -> str:
    top = f"<b>{block.block_id}</b>"
    if block.state != "used":
        return f"{top}<br>{'cached' if block.state == 'cached' else ''}"
    who = _label(names, block.owners[0]) if block.ref_count == 1 else f"×{block.ref_count}"
    if highlight_labels and block.block_id in highlight_labels:
        who += f" <span style='color:{HIGHLIGHT_COLOR}'>{highlight_labels[block.block_id]}</span>"
    return f"{top}<br>{who}"


def _tile_hover(block, owners: str, bs: int) -> str:
    if block.state == "used":
        return (f"physical block {block.block_id}<br>held by {owners} (ref count "
                f"{block.ref_count})<br>{block.filled}/{bs} slots filled")
    if block.state == "cached":
        return (f"physical block {block.block_id}: free, but its K/V is still in the prefix "
                f"cache (hash {block.block_hash})")
    return f"physical block {block.block_id}: free"


def legend_markdown(snapshot: Snapshot, names: Mapping[int, str] | None = None) -> str:
    """A one-line colour key for the three views (pages show it under the figures)."""
    colors = sequence_colors(snapshot)
    keys = [f"<span style='color:{colors[s.seq_id]}'>■</span> {_label(names, s.seq_id)}"
            for s in snapshot.sequences]
    keys += [f"<span style='color:{SHARED_COLOR}'>■</span> shared (×ref count)",
             "□ free", f"<span style='color:{CACHED_COLOR}'>■</span> free, cached"]
    return " &nbsp; ".join(keys)
