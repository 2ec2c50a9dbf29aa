"""A lesson that travels: a story's steps as one self-contained HTML file.

`lesson_html(lesson)` writes one page that plays the story with Step / Back / Play (and the
keyboard's Right / Left) from `file://`, with no server and no network: plotly.js is the
installed plotly package's own copy, inlined; every step's figures (plotly JSON), its caption,
its counters and the kernel check recorded at that step travel as one JSON document, gzipped
and base64-encoded (a story's figures repeat themselves from step to step, so they pack
small; base64 has no `<`, so nothing in a caption can end the script that holds it). The
browser unpacks it with its own DecompressionStream. A question is asked before the step that
answers it and holds back what would answer it until Check or "Just show me", as the pages do
(ui/predict.py). A "Save every step as PNG" button renders the figures in the browser
(plotly.js `toImage`) into a zip, for slides: plotly's static export in Python needs kaleido,
which the lab does not install.

The player and its styles are assets/lesson.html and assets/lesson.js.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import plotly
import plotly.graph_objects as go
from plotly.io.json import to_json_plotly

from kernels.reference import AttentionCheck

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
MAX_LESSON_BYTES = 5_000_000  # one file a teacher can mail or upload; plotly.js takes 4.8 MB
# The figures' toolbar in the lesson: nothing that leaves the file, PNGs at twice the size.
PLOTLY_CONFIG = {"displaylogo": False, "showSendToCloud": False, "responsive": True,
                 "modeBarButtonsToRemove": ["select2d", "lasso2d"],
                 "toImageButtonOptions": {"format": "png", "scale": 2}}


def check_line(check: AttentionCheck) -> str:
    """The kernel badge's text: the Triton kernel against the float64 dense reference."""
    verdict = "Kernel = dense attention" if check.ok else "Kernel differs from dense attention"
    return f"{verdict} · max abs error {check.max_abs_error:.1e}"


@dataclass(frozen=True)
class StepView:
    """What a page shows at one step: its figures by name (the main one first), its caption
    (markdown lines) and its counters (label -> value)."""

    figures: dict[str, go.Figure]
    caption: Sequence[str]
    counters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LessonStep:
    view: StepView
    check: str  # check_line, or why nothing was checked at this step
    check_ok: bool | None = None  # None: nothing attended


@dataclass(frozen=True)
class LessonQuestion:
    """Asked from the step before `reveal` (the first step that shows its answer); until it
    is answered, from `reveal` on, `holds` (names of figures or counters) are held back, or
    the whole step (caption, counters, check, figures) when `holds` is empty. A question
    with an `until` step is gone after it (the page asks its next question instead)."""

    text: str
    answer: int | str
    explanation: str
    reveal: int
    choices: Sequence[str] | None = None
    holds: Sequence[str] = ()
    until: int | None = None


@dataclass(frozen=True)
class Lesson:
    page: str  # the page's file name: the lesson's file and PNGs are named after it
    title: str
    settings: str  # what reproduces it in the lab (the page's link, or its settings in words)
    steps: Sequence[LessonStep]
    questions: Sequence[LessonQuestion] = ()
    extras: dict[str, go.Figure] = field(default_factory=dict)  # shown under every step


class LessonTooLarge(ValueError):
    """The lesson file would pass MAX_LESSON_BYTES."""


def lesson_html(lesson: Lesson, max_bytes: int = MAX_LESSON_BYTES) -> str:
    """The lesson as one HTML document (LessonTooLarge past `max_bytes`, in UTF-8)."""
    if not lesson.steps:
        raise ValueError("a lesson needs at least one step")
    packed = base64.b64encode(gzip.compress(_document(lesson).encode(), 9)).decode("ascii")
    parts = {"TITLE": html.escape(lesson.title), "PLOTLY_JS": _inline(_plotly_js()),
             "LESSON_JS": _inline(_asset("lesson.js")), "LESSON_DATA": packed}
    page = re.sub(r"\{\{([A-Z_]+)\}\}", lambda m: parts[m.group(1)], _asset("lesson.html"))
    size = len(page.encode())
    if size > max_bytes:
        raise LessonTooLarge(f"the lesson would take {size / 1e6:.1f} MB, more than "
                             f"{max_bytes / 1e6:.1f} MB: choose a shorter story")
    return page


def _document(lesson: Lesson) -> str:
    """The lesson as JSON; figures go in as plotly's own JSON text (no re-parsing)."""
    head = {"page": lesson.page, "title": lesson.title, "settings": lesson.settings,
            "config": PLOTLY_CONFIG,
            "questions": [{"text": q.text, "answer": q.answer, "explanation": q.explanation,
                           "reveal": q.reveal, "choices": list(q.choices or []) or None,
                           "holds": list(q.holds), "until": q.until}
                          for q in lesson.questions]}
    steps = ",".join(
        '{"figures":' + _figures(s.view.figures) + ',"caption":'
        + json.dumps(list(s.view.caption)) + ',"counters":'
        + json.dumps(list(s.view.counters.items())) + ',"check":'
        + json.dumps({"text": s.check, "ok": s.check_ok}) + "}" for s in lesson.steps)
    return (json.dumps(head)[:-1] + ',"extras":' + _figures(lesson.extras)
            + ',"steps":[' + steps + "]}")


def _figures(figures: dict[str, go.Figure]) -> str:
    return "{" + ",".join(f"{json.dumps(name)}:{to_json_plotly(fig.to_plotly_json())}"
                          for name, fig in figures.items()) + "}"


def _inline(script: str) -> str:
    """Script text safe inside <script>: the HTML parser ends a script at `</script` and
    treats `<!--` specially. Written `<\\/script` and `\\x3C!--` they mean the same to
    JavaScript in strings, regular expressions and comments, the only places they occur."""
    return re.sub(r"</(script)", r"<\\/\1", script, flags=re.IGNORECASE).replace(
        "<!--", "\\x3C!--")


@cache
def _plotly_js() -> str:
    return PLOTLY_JS.read_text(encoding="utf-8")


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")
