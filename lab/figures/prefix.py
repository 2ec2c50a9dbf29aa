"""Figures of the prefix-cache page: one prompt's hash chain, and hits and evictions over time.

The pool itself is drawn with `lab.figures.blocks.pool_grid` (grey tiles: free but cached).
"""

from __future__ import annotations

import plotly.graph_objects as go

from lab.figures.alt_text import with_alt
from lab.figures.common import over_time_figure, two_panels
from lab.figures.style import (
    CACHED_COLOR,
    EDGE_COLOR,
    FREE_COLOR,
    INK,
    SERIES_DASHES,
    TAIL_COLOR,
    base_figure,
)
from lab.scenarios.prefix_cache import Admission, PrefixFrame

# status -> (fill, word on the box). No request colours: a box is a block of this prompt, grey
# when it came from the cache (as a cached tile in the pool), white when computed, the tail
# colour when partly empty; the word says which.
STATUS_STYLE = {
    "hit": (CACHED_COLOR, "hit"),
    "miss": (FREE_COLOR, "miss"),
    "last": (FREE_COLOR, "last"),
    "partial": (TAIL_COLOR, "partial"),
}


def hash_chain(admission: Admission) -> go.Figure:
    """The prompt's logical blocks left to right: tokens, hash, parent link, cache outcome."""
    shapes, notes = [], []
    for link in admission.chain:
        x0 = link.index * 1.25
        fill, word = STATUS_STYLE[link.status]
        shapes.append(dict(type="rect", x0=x0, x1=x0 + 1, y0=0, y1=1, fillcolor=fill,
                           line=dict(color=INK if link.status == "hit" else EDGE_COLOR,
                                     width=3 if link.status == "hit" else 1.5)))
        start, end = link.positions
        digest = f"#{link.block_hash[:6]}" if link.block_hash else "(not hashed)"
        notes.append(dict(x=x0 + 0.5, y=0.5, showarrow=False, align="center",
                          text=f"<b>L{link.index}</b> → block {link.block_id}<br>"
                               f"tokens {start}–{end - 1}<br>{digest}<br><i>{word}</i>"))
        if link.index:
            notes.append(dict(x=x0, y=0.5, ax=x0 - 0.25, ay=0.5, xref="x", yref="y", axref="x",
                              ayref="y", showarrow=True, arrowhead=2, arrowwidth=1.5, text=""))
    width = 1.25 * len(admission.chain) - 0.25
    layout = dict(
        shapes=shapes, annotations=notes, margin=dict(l=10, r=10, t=50, b=10),
        xaxis=dict(range=[-0.05, max(width, 4.95) + 0.05], visible=False, fixedrange=True),
        yaxis=dict(range=[-0.05, 1.05], visible=False, fixedrange=True))
    title = f"R{admission.req_id}'s prompt as a hash chain"
    links = "; ".join(f"L{link.index} (tokens {link.positions[0]} to {link.positions[1] - 1}) "
                      f"in block {link.block_id}: {STATUS_STYLE[link.status][1]}"
                      for link in admission.chain)
    return with_alt(base_figure([], layout, title, 230), f"{title}. {links}.")


def cache_over_time(frames: list[PrefixFrame], step: int) -> go.Figure:
    """Left: hit rate in prompt tokens so far. Right: cached free blocks and evictions. Drawn up
    to `step` only, on axes for the whole run: a later step's hits are for the learner to
    predict, not to read off."""
    layout = two_panels(("Hit rate, %", "Cached free, evicted"),
                        spacing=0.12)
    for axis in ("xaxis", "xaxis2"):
        layout[axis]["range"] = [-0.5, max(len(frames) - 0.5, 1)]
    top = max((max(f.snapshot.usage.blocks_cached_free, f.evictions) for f in frames), default=0)
    layout["yaxis2"]["range"] = [0, top + 1]
    frames = frames[:step + 1]
    steps = [f.step for f in frames]
    traces = [
        dict(type="scatter", x=steps, y=[100 * f.hit_rate for f in frames], name="hit rate",
             line=dict(color=INK, dash=SERIES_DASHES[0], width=3, shape="hv"),
             showlegend=False),
        dict(type="bar", x=steps, y=[f.snapshot.usage.blocks_cached_free for f in frames],
             name="cached free blocks (as the grey tiles)",
             marker=dict(color=CACHED_COLOR, line=dict(color=EDGE_COLOR, width=1)), xaxis="x2",
             yaxis="y2"),
        dict(type="scatter", x=steps, y=[f.evictions for f in frames], name="evictions so far",
             line=dict(color=INK, dash=SERIES_DASHES[1], width=3, shape="hv"), xaxis="x2",
             yaxis="y2")]
    layout["yaxis"]["range"] = [0, 100]
    layout["bargap"] = 0.3
    return over_time_figure(traces, layout, step, step_axes=("x", "x2"), height=330,
                            margin=dict(l=50, r=20, t=64, b=45),
                            legend=dict(orientation="h", y=-0.3, x=0.55))
