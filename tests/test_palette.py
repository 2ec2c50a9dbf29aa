"""Every learner can tell the figures' colours apart: the palette and the colours that share a
figure, compared under simulated protanopia, deuteranopia and tritanopia.

Simulation: Machado, Oliveira & Fernandes, "A Physiologically-based Model for Simulation of
Color Vision Deficiency" (IEEE TVCG 2009), severity 1.0 matrices on linear sRGB. Distance:
CIE76 delta E in CIELAB (D65). A delta E of about 10 or more is easy to tell apart side by side;
the palette's colours, which label requests, must stay 15 apart.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import pytest

from lab.figures import style
from lab.figures.style import (
    CACHED_COLOR,
    EXTERNAL_COLOR,
    FREE_COLOR,
    HIGHLIGHT_COLOR,
    INK,
    PALE,
    PALETTE,
    SHARED_COLOR,
    lighten,
    request_look,
)

MACHADO = {
    "protanopia": ((0.152286, 1.052583, -0.204868), (0.114503, 0.786281, 0.099216),
                   (-0.003882, -0.048116, 1.051998)),
    "deuteranopia": ((0.367322, 0.860646, -0.227968), (0.280085, 0.672501, 0.047413),
                     (-0.011820, 0.042940, 0.968881)),
    "tritanopia": ((1.255528, -0.076749, -0.178779), (-0.078411, 0.930809, 0.147602),
                   (0.004733, 0.691367, 0.303900)),
}
VISIONS = (None, *MACHADO)


def _linear(channel: int) -> float:
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def lab(color: str, vision: str | None) -> tuple[float, float, float]:
    r, g, b = (_linear(int(color[i:i + 2], 16)) for i in (1, 3, 5))
    if vision is not None:
        m = MACHADO[vision]
        r, g, b = (min(1.0, max(0.0, m[i][0] * r + m[i][1] * g + m[i][2] * b))
                   for i in range(3))
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def delta_e(a: str, b: str, vision: str | None) -> float:
    return math.dist(lab(a, vision), lab(b, vision))


def test_the_simulation_reproduces_a_known_confusion() -> None:
    """Red and green collapse for a protanope; blue and yellow do not."""
    assert delta_e("#FF0000", "#00A000", "protanopia") < 0.5 * delta_e("#FF0000", "#00A000",
                                                                        None)
    assert delta_e("#0000FF", "#FFFF00", "protanopia") > 50


@pytest.mark.parametrize("vision", VISIONS)
def test_request_colours_stay_apart(vision: str | None) -> None:
    worst = min((delta_e(a, b, vision), a, b) for a, b in itertools.combinations(PALETTE, 2))
    assert worst[0] >= 15, worst


@pytest.mark.parametrize("vision", VISIONS)
def test_a_hole_is_told_from_every_request_solid_or_pale(vision: str | None) -> None:
    """The fragmentation map: solid and pale request colours, white, and holes side by side."""
    others = [*PALETTE, *(lighten(c, PALE) for c in PALETTE), FREE_COLOR]
    worst = min((delta_e(EXTERNAL_COLOR, o, vision), o) for o in others)
    assert worst[0] >= 20, worst


@pytest.mark.parametrize("vision", VISIONS)
def test_the_pool_grids_states_stay_apart(vision: str | None) -> None:
    """A pool grid: free, free-but-cached and shared tiles, and the highlight outline."""
    assert delta_e(FREE_COLOR, CACHED_COLOR, vision) >= 10
    for color in PALETTE:
        assert delta_e(SHARED_COLOR, color, vision) >= 10, color
    assert delta_e(HIGHLIGHT_COLOR, FREE_COLOR, vision) >= 40


def test_request_colours_are_different_hues_with_normal_vision() -> None:
    """Side by side with normal vision, no two request colours read as one (Okabe & Ito's blue
    and sky blue, 26 apart, did: "R0 and R4 share a colour")."""
    worst = min((delta_e(a, b, None), a, b) for a, b in itertools.combinations(PALETTE, 2))
    assert worst[0] >= 30, worst


def test_pale_reservations_of_neighbours_stay_apart() -> None:
    """The fragmentation map puts one request's reserved-but-empty (pale) slots next to
    another's, pale or solid; and a request's stored slots must differ from its own empty ones."""
    pale = [lighten(c, PALE) for c in PALETTE]
    assert min(delta_e(a, b, None) for a, b in itertools.combinations(pale, 2)) >= 12
    assert min(delta_e(pale[i], PALETTE[j], None) for i in range(len(PALETTE))
               for j in range(len(PALETTE)) if i != j) >= 25
    assert min(delta_e(p, c, None) for p, c in zip(pale, PALETTE)) >= 15


def test_every_request_looks_different() -> None:
    """Past the palette a request is striped: forty requests, forty looks."""
    looks = [request_look(i) for i in range(40)]
    assert len(set(looks)) == 40
    assert looks[0] == (PALETTE[0], "") and looks[len(PALETTE)] == (PALETTE[0], "/")


def test_series_ink_is_no_request_colour() -> None:
    assert INK not in PALETTE
    assert min(delta_e(INK, c, None) for c in PALETTE) >= 15


@pytest.mark.parametrize("module", ["fragmentation", "prefix"])
def test_figures_take_every_colour_from_the_style_module(module: str) -> None:
    """One meaning per colour across pages: a figure module names no colour of its own."""
    source = (Path(style.__file__).parent / f"{module}.py").read_text()
    assert re.findall(r"#[0-9A-Fa-f]{6}\b", source) == []
