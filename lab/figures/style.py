"""The look every figure shares: one palette, one font size, one template, one way to build.

Figures are built from plain dicts with `base_figure` (plotly's validation would cost on every
step) on `lab_template()`: plotly_white with the lab's palette and no automatic margins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache

import plotly.graph_objects as go
import plotly.io as pio

# One colour per request or sequence, each a different hue, chosen from Okabe & Ito's, Tol's and
# Tableau's colour-blind-aware sets so that they stay apart, solid and pale, with normal vision
# and under the common colour-vision deficiencies; tests/test_palette.py measures the distances.
PALETTE = ("#4477AA", "#FF7F0E", "#59A14F", "#EE3377", "#17BECF", "#F0E442", "#661100", "#882255")
# Past the palette a request takes the same colours again, striped (`request_look`): R8 is R0's
# colour with "/" stripes, R16 with "\\" stripes, and so on, so no two requests look alike.
REPEAT_PATTERNS = ("", "/", "\\", "|", "-", "+", ".")
STRIPE_COLOR = "#FFFFFF"  # the stripes over a repeated colour
SHARED_COLOR = "#221133"  # a block held by more than one sequence
FREE_COLOR = "#FFFFFF"
CACHED_COLOR = "#D4D4D4"  # free, but still holding a prefix-cache hash
TAIL_COLOR = "#F1F1F1"  # an allocated slot with no token yet
EDGE_COLOR = "#9A9A9A"
HIGHLIGHT_COLOR = "#D62728"  # an outline: what changed at this step
# A free hole too small for the next reservation: hatched and labelled too, and a violet no
# request's colour, solid or pale, comes near under any simulated deficiency.
EXTERNAL_COLOR = "#9966FF"
HOLE_HATCH = "#8B1A1A"  # the cross-hatching over such a hole
# Lines over the steps (a system, a rate, a count) are ink, told apart by dash and named in a
# legend: a colour on a page means a request (or one of the states above), nothing else.
INK = "#222222"
SERIES_DASHES = ("solid", "dash", "dot", "dashdot")
PALE = 0.55  # how far a request's reserved-but-empty slots are lightened towards white
FONT_SIZE = 15


def request_look(index: int) -> tuple[str, str]:
    """The colour and stripe pattern ("" for none) of request (or sequence) number `index`."""
    turn, position = divmod(index, len(PALETTE))
    return PALETTE[position], REPEAT_PATTERNS[turn % len(REPEAT_PATTERNS)]


def lighten(hex_color: str, amount: float) -> str:
    """Mix a colour with white: amount 0 keeps it, 1 gives white."""
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * amount) for c in (r, g, b)]
    return "#{:02X}{:02X}{:02X}".format(*mix)


@cache
def lab_template() -> dict:
    """plotly_white with the lab's palette and without automatic margins: fitting them makes
    plotly.js draw a figure twice. Figures size their margins instead (`label_margin` for axes
    with word labels)."""
    template = pio.templates["plotly_white"].to_plotly_json()
    for axis in ("xaxis", "yaxis"):
        template["layout"][axis]["automargin"] = False
    template["layout"]["colorway"] = list(PALETTE)  # traces without a colour take the palette
    return template


@cache
def _template_object() -> go.layout.Template:
    return go.layout.Template(lab_template())


def apply_template(fig: go.Figure) -> go.Figure:
    """Give a validated figure (make_subplots, update_layout) the lab's template as plotly's
    object, built once: assigned as a dict it is validated whole again, most of a small
    figure's build time."""
    fig.layout.template = _template_object()
    return fig


def label_margin(labels: Sequence[str], font_size: int = FONT_SIZE) -> int:
    """Pixels of margin that fit the longest tick label (about 0.6 em a character)."""
    return 20 + math.ceil(0.6 * font_size * max((len(t) for t in labels), default=0))


def base_figure(traces: list[dict], layout: dict, title: str, height: int) -> go.Figure:
    """Build the figure in one go from plain dicts, without plotly's validation, which would
    cost more than drawing the figure, on every step. The dicts here use only documented plotly
    attributes, and the tests render every figure in a real browser."""
    base = dict(title=dict(text=title, x=0, xanchor="left"), height=height,
                template=lab_template(), font=dict(size=FONT_SIZE), showlegend=False,
                margin=dict(l=60, r=20, t=56, b=40), hoverlabel=dict(font=dict(size=FONT_SIZE)))
    return go.Figure(data=traces, layout=base | layout, _validate=False)
