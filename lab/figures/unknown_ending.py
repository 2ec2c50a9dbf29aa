"""Figures of the unknown-ending page: the address space at a step, and the run over time.

`address_map` draws both servers on one slot axis (the same bytes): the contiguous regions
(solid: tokens held; pale: reserved but unused) with the holes between them, and the paged
pool block after block. A region that moved at this step is outlined at its new place, its old
place is drawn as a dashed ghost, and an arrow joins them with the bytes copied; a region that
grew in place is outlined too.
"""

from __future__ import annotations

import plotly.graph_objects as go

from lab.figures.common import over_time_figure, two_panels
from lab.figures.fragmentation import MIN_LABEL_SLOTS, request_color
from lab.figures.style import (
    EDGE_COLOR,
    EXTERNAL_COLOR,
    FONT_SIZE,
    FREE_COLOR,
    HIGHLIGHT_COLOR,
    PALE,
    PALETTE,
    base_figure,
    label_margin,
    lighten,
)
from lab.scenarios.ending_stepper import EndingFrame

SYSTEM_COLORS = {"contiguous": PALETTE[5], "paged": PALETTE[0]}
GHOST_LABEL_SHARE = 0.12  # a moved region's old place is labelled if this share of the axis


def _bar(y: int, x0: int, x1: int, color: str, hover: str, *, outlined: bool = False,
         hatched: bool = False, text: str = "") -> dict:
    """One stretch of slots [x0, x1) of a row; `text` is drawn inside it if it fits."""
    return dict(y=y, base=x0, x=x1 - x0, color=color, hover=hover, hatch="x" if hatched else "",
                line=HIGHLIGHT_COLOR if outlined else EDGE_COLOR, width=2.5 if outlined else 0.6,
                text=text)


def _contiguous_row(frame: EndingFrame) -> tuple[list[dict], list[dict]]:
    log = frame.logs["contiguous"]
    changed = {m.req_id for m in log.moves} | {g.req_id for g in log.growths} | set(log.admitted)
    bars, labels = [], []
    for r in frame.regions:
        color, new = request_color(r.req_id), r.req_id in changed
        bars.append(_bar(1, r.start, r.start + r.used, color,
                         f"R{r.req_id}: {r.used} tokens' K/V at slots {r.start}–"
                         f"{r.start + r.used - 1}", outlined=new, text=f"R{r.req_id}"))
        if r.reserved > r.used:
            bars.append(_bar(1, r.start + r.used, r.start + r.reserved, lighten(color, PALE),
                             f"R{r.req_id}: {r.reserved - r.used} slots reserved, unused",
                             outlined=new))
    need = frame.next_reservation
    for start, size in frame.holes:
        small = 0 < size < need  # too small for the request waiting at the head of the queue
        why = f": too small for the {need} slots the next request needs" if small else ""
        bars.append(_bar(1, start, start + size, EXTERNAL_COLOR if small else FREE_COLOR,
                         f"hole of {size} free slots{why}", hatched=small))
        if small and size >= MIN_LABEL_SLOTS:
            labels.append(dict(x=start + size / 2, y=1, text="hole"))
    return bars, labels


def _paged_row(frame: EndingFrame) -> list[dict]:
    bs = frame.snapshot.block_size
    request_of = {seq: req for req, seq in frame.seq_of_request.items()}
    log = frame.logs["paged"]
    taken = {b for _, b in log.new_blocks}  # outlined: taken at this step
    admitted = set(log.admitted)
    bars = []
    for block in frame.snapshot.blocks:
        x0 = block.block_id * bs
        if block.state != "used":
            bars.append(_bar(0, x0, x0 + bs, FREE_COLOR, f"block {block.block_id}: free"))
            continue
        req = request_of[block.owners[0]]
        where = f"block {block.block_id} of R{req}"
        new = block.block_id in taken or req in admitted
        bars.append(_bar(0, x0, x0 + block.filled, request_color(req),
                         f"{where}: {block.filled}/{bs} slots filled", outlined=new))
        if block.filled < bs:
            bars.append(_bar(0, x0 + block.filled, x0 + bs, lighten(request_color(req), PALE),
                             f"{where}: {bs - block.filled} empty tail slots", outlined=new))
    return bars


def address_map(frame: EndingFrame, capacity: int, guess: int) -> go.Figure:
    """Both servers' slots at this step; a move's old place (dashed) and new place (outlined)
    joined by an arrow that says how many bytes were copied."""
    bars, labels = _contiguous_row(frame)
    bars += _paged_row(frame)
    trace = dict(type="bar", orientation="h", y=[b["y"] for b in bars],
                 base=[b["base"] for b in bars], x=[b["x"] for b in bars], width=0.7,
                 hovertext=[b["hover"] for b in bars], hoverinfo="text",
                 # a request's name inside its tokens, hidden where it does not fit (a phone)
                 text=[b["text"] for b in bars], textposition="inside",
                 insidetextanchor="middle", textfont=dict(size=FONT_SIZE - 1),
                 marker=dict(color=[b["color"] for b in bars],
                             line=dict(color=[b["line"] for b in bars],
                                       width=[b["width"] for b in bars]),
                             pattern=dict(shape=[b["hatch"] for b in bars], fgcolor="#8B1A1A",
                                          size=8, solidity=0.25)))
    shapes, arrows = [], []
    for m in frame.logs["contiguous"].moves:
        shapes.append(dict(type="rect", x0=m.src, x1=m.src + m.old_size, y0=0.62, y1=1.38,
                           line=dict(color=HIGHLIGHT_COLOR, width=2, dash="dash"),
                           fillcolor="rgba(0,0,0,0)"))
        arrows.append(dict(x=m.dst + m.new_size / 2, y=1.42, ax=m.src + m.old_size / 2, ay=1.42,
                           xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=3, arrowsize=1.4, arrowwidth=2.5,
                           arrowcolor=HIGHLIGHT_COLOR, text=""))
        labels.append(dict(x=(m.src + m.dst + (m.old_size + m.new_size) / 2) / 2, y=1.62,
                           text=f"R{m.req_id} moved: {m.nbytes:,} bytes copied"))
        if m.old_size >= GHOST_LABEL_SHARE * capacity:
            labels.append(dict(x=m.src + m.old_size / 2, y=1, text=f"R{m.req_id} was here"))
    names = [f"Contiguous<br>guess {guess}", "Paged"]
    margin = label_margin([line for name in names for line in name.split("<br>")])
    layout = dict(
        barmode="overlay", shapes=shapes, margin=dict(l=margin, r=20, t=50, b=45),
        uniformtext=dict(mode="hide", minsize=FONT_SIZE - 3),
        annotations=arrows + [dict(a, showarrow=False, bgcolor="rgba(255,255,255,0.75)",
                                   font=dict(size=FONT_SIZE - 1, color="#111111"))
                              for a in labels],
        xaxis=dict(title=dict(text="slot (one token's K and V)"),
                   range=[0, capacity], showgrid=False, zeroline=False),
        yaxis=dict(tickvals=[1, 0], ticktext=names, range=[-0.55, 1.8], showgrid=False,
                   zeroline=False, fixedrange=True))
    return base_figure([trace], layout, f"Step {frame.step}: the same {capacity} slots", 270)


def over_time(frames: tuple[EndingFrame, ...], step: int) -> go.Figure:
    """Requests waiting (left) and slots reserved but unused (right), both servers, up to
    `step` (on the whole run's axis: what is to come is not drawn); the moves marked."""
    layout = two_panels(("Requests waiting", "Reserved but unused, % of pool"))
    last = frames[-1].step
    top = max(max(f.contiguous.waiting, f.paged.waiting) for f in frames)
    frames = frames[:step + 1]
    steps = [f.step for f in frames]
    traces = []
    for name in ("contiguous", "paged"):
        stats = [getattr(f, name) for f in frames]
        line = dict(color=SYSTEM_COLORS[name], width=2.5, shape="hv")
        traces += [dict(type="scatter", x=steps, y=[s.waiting for s in stats],
                        name=name.capitalize(), line=line, legendgroup=name),
                   dict(type="scatter", x=steps, y=[s.unused_pct for s in stats],
                        name=name.capitalize(), line=line, legendgroup=name, showlegend=False,
                        xaxis="x2", yaxis="y2")]
    moved = [f for f in frames if f.logs["contiguous"].moves]
    traces.append(dict(type="scatter", mode="markers", x=[f.step for f in moved],
                       y=[f.contiguous.unused_pct for f in moved], xaxis="x2", yaxis="y2",
                       name="a move (K/V copied)",
                       marker=dict(symbol="diamond", size=10, color=HIGHLIGHT_COLOR),
                       hovertext=[f"step {f.step}: " + ", ".join(
                           f"R{m.req_id} moved, {m.nbytes:,} bytes" for m in
                           f.logs["contiguous"].moves) for f in moved], hoverinfo="text"))
    layout["yaxis"] |= dict(range=[0, max(1, top) + 0.5], dtick=max(1, -(-top // 5)))
    layout["yaxis2"]["range"] = [0, 100]
    for axis in ("xaxis", "xaxis2"):
        layout[axis]["range"] = [0, max(1, last)]
    return over_time_figure(traces, layout, step, step_axes=("x", "x2"), height=330,
                            margin=dict(l=50, r=20, t=64, b=45),
                            legend=dict(orientation="h", y=-0.3, x=0))
