"""Figures of the fragmentation page: the two memory maps, the run over time, the block-size sweep.

`memory_maps` draws both systems on one address axis (token slots of the same byte size), so
the learner compares like with like: the contiguous regions with their reserved-but-unused
tails and the holes between them, and the paged pool's blocks with their unused tail slots.
"""

from __future__ import annotations

import plotly.graph_objects as go

from lab.figures.alt_text import with_alt
from lab.figures.common import over_time_figure, two_panels
from lab.figures.style import (
    EDGE_COLOR,
    EXTERNAL_COLOR,
    FONT_SIZE,
    FREE_COLOR,
    HIGHLIGHT_COLOR,
    HOLE_HATCH,
    INK,
    PALE,
    SERIES_DASHES,
    STRIPE_COLOR,
    TAIL_COLOR,
    base_figure,
    label_margin,
    lighten,
    request_look,
)
from lab.scenarios.fragmentation import FragFrame, SweepRow

CONTIGUOUS, PAGED = "Contiguous (reserve prompt + max output)", "Paged (blocks as tokens arrive)"
SYSTEM_DASHES = {CONTIGUOUS: SERIES_DASHES[1], PAGED: SERIES_DASHES[0]}  # both ink
ROW_NAMES = ["Contiguous", "Paged"]  # the memory map's rows, top to bottom
ROWS = {"contiguous": 1, "paged": 0}
MIN_LABEL_SLOTS = 28  # segments narrower than this get no request label (hover still tells)


def request_color(req_id: int) -> str:
    return request_look(req_id)[0]


def _segment(segments: dict[str, list], row: int, x0: int, x1: int, color: str, text: str,
             changed: bool = False, pattern: str = "", stripes: str = STRIPE_COLOR) -> None:
    """One stretch of slots on a row of the map, as one bar of the map's bar trace; `changed`
    outlines it (its request was admitted at this step), `pattern` hatches it in `stripes`."""
    for key, value in (("y", row), ("base", x0), ("x", x1 - x0), ("color", color),
                       ("line", HIGHLIGHT_COLOR if changed else EDGE_COLOR),
                       ("width", 2.5 if changed else 0.6), ("pattern", pattern),
                       ("stripes", stripes), ("hover", text)):
        segments[key].append(value)


def _request(segments: dict[str, list], row: int, req: int, start: int, used: int, end: int,
             hover: tuple[str, str], changed: bool) -> None:
    """A request's slots: solid where they hold tokens, pale where they are empty; a request
    past the palette's colours is striped as well (`request_look`)."""
    color, pattern = request_look(req)
    _segment(segments, row, start, start + used, color, hover[0], changed, pattern)
    if used < end - start:
        _segment(segments, row, start + used, end, lighten(color, PALE), hover[1], changed,
                 pattern, stripes=color)


def memory_maps(frame: FragFrame, capacity: int, block_size: int,
                finished_at: dict[str, int | None] | None = None) -> go.Figure:
    """Row 1: contiguous regions and holes. Row 0: the paged pool, block after block.

    Each request keeps one look (colour, and stripes past the palette): solid = slots holding
    its tokens, pale = reserved or allocated but empty (internal fragmentation). Holes smaller
    than the reservation of the request that must be placed next are violet and hatched:
    external fragmentation. A row whose system has finished (`finished_at`, system -> step)
    says so across it.
    """
    external_threshold = frame.next_reservation
    segments: dict[str, list] = {k: [] for k in ("y", "base", "x", "color", "line", "width",
                                                 "pattern", "stripes", "hover")}
    labels: list[dict] = []
    changed = {name: set(r.admitted_ids) if r else set() for name, r in frame.records.items()}
    for r in frame.regions:
        _request(segments, 1, r.req_id, r.start, r.used, r.start + r.reserved,
                 (f"R{r.req_id}: {r.used} tokens stored",
                  f"R{r.req_id}: {r.reserved - r.used} slots reserved, unused"),
                 r.req_id in changed["contiguous"])
        if r.reserved >= MIN_LABEL_SLOTS:
            labels.append(dict(x=r.start + r.reserved / 2, y=1, text=f"R{r.req_id}"))
    for start, size in frame.holes:
        external = size < external_threshold
        why = f": too small for the next request ({external_threshold} slots)" if external else ""
        # Hatched and labelled as well as violet: told apart without seeing the colour.
        _segment(segments, 1, start, start + size, EXTERNAL_COLOR if external else FREE_COLOR,
                 f"hole of {size} free slots{why}", pattern="x" if external else "",
                 stripes=HOLE_HATCH)
        if external and size >= MIN_LABEL_SLOTS:
            labels.append(dict(x=start + size / 2, y=1, text="hole"))
    request_of = {seq: req for req, seq in frame.seq_of_request.items()}
    for block in frame.snapshot.blocks:
        x0 = block.block_id * block_size
        if block.state != "used":
            _segment(segments, 0, x0, x0 + block_size, FREE_COLOR,
                     f"block {block.block_id}: free")
            continue
        req = request_of[block.owners[0]]
        _request(segments, 0, req, x0, block.filled, x0 + block_size,
                 (f"block {block.block_id} of R{req}: {block.filled}/{block_size} slots filled",
                  f"block {block.block_id} of R{req}: {block_size - block.filled} empty tail "
                  "slots"), req in changed["paged"])
    done = {name: at for name, at in (finished_at or {}).items()
            if at is not None and at <= frame.step}
    for name, at in done.items():
        what = "reservation" if name == "contiguous" else "block"
        labels.append(dict(x=capacity / 2, y=ROWS[name],
                           text=f"<b>done</b>: all {getattr(frame, name).finished} requests "
                                f"finished at step {at}; every {what} is back in the free pool"))
    # Segments are bars of one horizontal bar trace, not layout shapes: plotly.js lays out and
    # draws each shape on its own, and a map has a hundred or more.
    traces = [dict(type="bar", orientation="h", y=segments["y"], base=segments["base"],
                   x=segments["x"], width=0.76, hovertext=segments["hover"], hoverinfo="text",
                   marker=dict(color=segments["color"],
                               line=dict(color=segments["line"], width=segments["width"]),
                               pattern=dict(shape=segments["pattern"],
                                            fgcolor=segments["stripes"], size=8,
                                            solidity=0.25)))]
    layout = dict(
        barmode="overlay", margin=dict(l=label_margin(ROW_NAMES), r=20, t=50, b=45),
        annotations=[dict(a, showarrow=False, font=dict(size=FONT_SIZE - 1, color=INK),
                          bgcolor="rgba(255,255,255,0.7)") for a in labels],
        xaxis=dict(title=dict(text="slot address (each slot holds one token's K and V)"),
                   range=[0, capacity], showgrid=False, zeroline=False),
        yaxis=dict(tickvals=[1, 0], ticktext=ROW_NAMES, range=[-0.6, 1.6],
                   showgrid=False, zeroline=False, fixedrange=True))
    title = f"Memory map at step {frame.step}: the same {capacity} token slots"
    regions = "; ".join(f"R{r.req_id} reserves slots {r.start} to {r.start + r.reserved - 1} "
                        f"and stores {r.used} tokens" for r in frame.regions)
    holes = [size for _, size in frame.holes if size < external_threshold]
    c, p = frame.contiguous, frame.paged
    return with_alt(base_figure(traces, layout, title, 250), (
        f"{title}. Contiguous: {regions or 'nothing reserved'}; "
        f"{len(holes)} holes too small for the next reservation ({sum(holes)} slots); "
        f"{c.internal} slots reserved but empty. Paged: {p.used} slots hold tokens in "
        f"{frame.snapshot.usage.blocks_used} blocks, {p.internal} empty tail slots, "
        f"{p.free} slots free."
        + "".join(f" {name.capitalize()} finished all its requests at step {at}."
                  for name, at in done.items())))


def timeline(frames: list[FragFrame], step: int) -> go.Figure:
    """Sequences running at once, and wasted memory (internal + external, % of the pool)."""
    layout = two_panels(("Running at once", "Wasted, % of pool"))
    steps = [f.step for f in frames]
    traces = []
    for name, pick in ((CONTIGUOUS, lambda f: f.contiguous), (PAGED, lambda f: f.paged)):
        stats = [pick(f) for f in frames]
        line = dict(color=INK, dash=SYSTEM_DASHES[name], width=2.5, shape="hv")
        traces += [dict(type="scatter", x=steps, y=[s.running for s in stats], name=name,
                        line=line, legendgroup=name),
                   dict(type="scatter", x=steps, y=[s.wasted_pct for s in stats], name=name,
                        line=line, legendgroup=name, showlegend=False, xaxis="x2",
                        yaxis="y2")]
    layout["yaxis"]["rangemode"] = "tozero"
    layout["yaxis2"]["range"] = [0, 100]
    return over_time_figure(traces, layout, step, step_axes=("x", "x2"), height=340,
                            margin=dict(l=50, r=20, t=64, b=45),
                            legend=dict(orientation="h", y=-0.3, x=0))


def sweep_figure(rows: list[SweepRow], current: int) -> go.Figure:
    """Tail waste (bars, left axis) against block-table entries (line, right, log axis)."""
    names = [str(r.block_size) for r in rows]
    bars = dict(
        type="bar", x=names, y=[r.tail_pct for r in rows],
        name="tail waste: empty slots in last blocks (%)",
        # Empty tail slots are TAIL_COLOR on every page; the block size in use is outlined
        # in ink.
        marker=dict(color=TAIL_COLOR,
                    line=dict(color=[INK if r.block_size == current else EDGE_COLOR
                                     for r in rows],
                              width=[3 if r.block_size == current else 1 for r in rows])),
        text=[f"{r.tail_pct:.0f}%" for r in rows], textposition="outside",
        hovertemplate="block size %{x}: %{y:.1f}% of allocated slots empty<extra></extra>")
    entries = dict(
        type="scatter", x=names, y=[r.table_entries for r in rows], yaxis="y2",
        name="block-table entries per sequence", mode="lines+markers",
        line=dict(color=INK, width=3), customdata=[r.table_bytes for r in rows],
        hovertemplate="block size %{x}: %{y:.1f} entries (%{customdata:.0f} bytes)"
                      "<extra></extra>")
    top = max(r.tail_pct for r in rows)
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
             if t <= 2 * max(r.table_entries for r in rows)]
    layout = dict(
        showlegend=True, margin=dict(l=80, r=90, t=56, b=50), bargap=0.35,
        legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom"),
        xaxis=dict(title=dict(text="block size (tokens per block)"), type="category",
                   domain=[0.0, 0.94]),
        yaxis=dict(title=dict(text="tail waste (%)"), range=[0, max(10.0, top * 1.3)]),
        yaxis2=dict(title=dict(text="table entries"), type="log", tickvals=ticks,
                    showgrid=False, overlaying="y", side="right", anchor="x"))
    layout["margin"]["t"] = 96  # the legend sits above the plot, under the title
    return base_figure([bars, entries], layout, "Tail waste vs table entries", 400)
