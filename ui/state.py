"""Page state that lives in the link, page by page, so a link reopens exactly what the learner
saw and no page inherits another page's settings.

Every setting of a page is a widget made here (`int_param`, `float_param`, `choice_param`,
`bool_param`, `text_param`), named by its link parameter. Its value lives in session state
under the page's own name (a page keeps its settings while the learner visits others), and in
the address bar when it differs from its default:

* When the browser brings a new query string (a link opened, the address edited), each
  widget takes the link's value, or its default if the link does not name it. A value the
  widget cannot take (out of range, not a number, inf, a choice that does not exist) is
  refused with a message naming it and what is accepted; the page shows its default.
* Otherwise (a rerun, or back from another page, which clears the query) each widget keeps
  this page's last value.
* The sidebar's "copy link" holds every parameter on screen, defaults included, so it stays
  exact even if a default changes later.

Settings that belong to the whole lab (the seed, classroom mode, a teacher link's hidden
controls and lock) are the same on every page (`GLOBAL`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import streamlit as st

T = TypeVar("T")

CURRENT_PAGE = "_ui_current_page"  # session: url path of the page app.py is running
GLOBAL = "*"  # the "page" that holds the lab-wide settings
_MODEL = "_ui_model"  # session: {page: {param: value}}, kept across page visits
_OWNER = "_ui_owner"  # session: {widget key: the page it was last drawn on}
_WRITTEN = "_ui_written"  # session: the query string we last put in the address bar
_WRITTEN_PAGE = "_ui_written_page"  # session: the page it belongs to
_RUN = "_ui_run"  # session: this run's RunState
MAX_SHOWN = 40  # characters of a refused value quoted back
TEACHER = ("hide", "lock", "lesson", "stop")  # a teacher link's (teacher_settings, ui.lesson_path)
_INT = re.compile(r"[+-]?\d{1,15}")
_FLOAT = re.compile(r"[+-]?(\d{1,15}(\.\d{0,15})?|\.\d{1,15})([eE][+-]?\d{1,3})?")


@dataclass
class RunState:
    page: str
    link: dict[str, str] | None  # a new query string to apply, or None
    params: dict[str, str]  # every parameter on screen: the copy link
    defaults: dict[str, str]
    refused: list[str]
    link_slot: Any = None  # the sidebar element showing the copy link
    warn_slot: Any = None  # the page element listing refused link values
    said: set[str] = field(default_factory=set)  # notes already on the page in this run


# -- the run ----------------------------------------------------------------------------------
def current_page() -> str:
    return st.session_state.get(CURRENT_PAGE) or "home"


def begin_run(warn_slot: Any = None) -> None:
    """Start a page run (the sidebar calls this first): is the query string new?"""
    page = current_page()
    query = {k: st.query_params.get(k, "") for k in st.query_params}
    fresh = query != st.session_state.get(_WRITTEN)
    st.session_state[_RUN] = RunState(page, query if fresh and query else None, {}, {}, [],
                                      None, warn_slot)
    if fresh or st.session_state.get(_WRITTEN_PAGE) != page:
        st.session_state[_WRITTEN] = dict(query)
        st.session_state[_WRITTEN_PAGE] = page


def first_time_this_run(note: str) -> bool:
    """True the first time a note is asked for in this run: a note said once per page."""
    said = _run().said
    first = note not in said
    said.add(note)
    return first


def set_link_slot(slot: Any) -> None:
    """Where the copy link is shown; every register() from now on redraws it."""
    _run().link_slot = slot
    slot.code(share_url(), language=None, wrap_lines=True)


def _run() -> RunState:
    run = st.session_state.get(_RUN)
    if run is None or run.page != current_page():
        begin_run()
        run = st.session_state[_RUN]
    return run


def register(param: str, text: str, default: str | None = None) -> None:
    """Record a parameter of what is on screen; the address bar keeps it unless it is the
    default, and the copy link keeps it always (a teacher link's own settings only when set)."""
    run = _run()
    if param not in TEACHER or text != default:
        run.params[param] = text
    if default is not None:
        run.defaults[param] = default
    written = st.session_state.setdefault(_WRITTEN, {})
    if text == default:
        if param in st.query_params:
            del st.query_params[param]
        written.pop(param, None)
    elif written.get(param) != text or st.query_params.get(param) != text:
        st.query_params[param] = text
        written[param] = text
    if run.link_slot is not None:
        run.link_slot.code(share_url(), language=None, wrap_lines=True)


def link_params() -> dict[str, str]:
    """Every parameter on screen in this run, as query-string text."""
    return dict(_run().params)


def share_url(extra: dict[str, str] | None = None) -> str:
    """The full URL of the current state (relative when the browser's URL is unknown)."""
    base = (st.context.url or "").split("?")[0]
    query = urlencode({**link_params(), **(extra or {})})
    return f"{base}?{query}" if query else base or "?"


def _refuse(param: str, raw: str, expected: str) -> None:
    run = _run()
    shown = raw if len(raw) <= MAX_SHOWN else raw[:MAX_SHOWN] + "…"
    shown = "".join(c if c.isprintable() and c != "`" else "?" for c in shown)  # inert text
    run.refused.append(f"`{param}={shown}` was ignored: expected {expected}")
    if run.warn_slot is not None:
        listed = "\n".join(f"- {r}" for r in run.refused)
        run.warn_slot.warning("The link asked for what this page cannot show, so it shows the "
                              f"default instead:\n\n{listed}", icon=":material/link:")


# -- the one way a widget is bound to the link ---------------------------------------------------
def bind_param(param: str, default: T, parse: Callable[[str], T], valid: Callable[[T], bool],
               expected: str, to_text: Callable[[T], str], make: Callable[[str], T],
               page: str | None = None) -> T:
    """Bind the widget that `make(key)` draws to the link parameter `param` (the widget key);
    its value is kept under `page` (this page, or GLOBAL for a lab-wide setting)."""
    run = _run()
    models = st.session_state.setdefault(_MODEL, {}).setdefault(page or run.page, {})
    drawn_on = st.session_state.setdefault(_OWNER, {})
    key = param
    value: Any = None
    if run.link is not None:  # a new link: its value, or the default
        value = default
        raw = run.link.get(param)
        if raw is not None:
            try:
                parsed = parse(raw)
                ok = valid(parsed)
            except (ValueError, OverflowError, TypeError):
                ok = False
            if ok:
                value = parsed
            else:
                _refuse(param, raw, expected)
    elif drawn_on.get(key) != run.page or key not in st.session_state:
        # First drawn on this page (another page's widget may have held the key): its value.
        stored = models.get(param, default)
        value = stored if valid(stored) else default
    elif not valid(st.session_state[key]):  # the range shrank since the last run
        value = default
    else:
        # Carried over by hand: a widget whose range changed (a step slider after a setting
        # changed the run's length) is a new widget to Streamlit, which would start it over.
        value = st.session_state[key]
    if value is not None:
        st.session_state.pop(key, None)  # unbind it from a widget of another page
        st.session_state[key] = value
    drawn_on[key] = run.page
    value = make(key)
    models[param] = value
    register(param, to_text(value), to_text(default))
    return value


def set_param(param: str, value: Any) -> None:
    """Change a setting of this page from a callback (a preset, an example button)."""
    st.session_state.setdefault(_MODEL, {}).setdefault(current_page(), {})[param] = value
    st.session_state[param] = value
    st.session_state.setdefault(_OWNER, {})[param] = current_page()


def reset_page() -> None:
    """Every setting of this page back to its default (a callback: "Back to the example")."""
    page = current_page()
    for key in st.session_state.setdefault(_MODEL, {}).pop(page, {}):
        st.session_state.pop(key, None)
        st.session_state.get(_OWNER, {}).pop(key, None)


# -- parsing link text -------------------------------------------------------------------------
def parse_int(text: str) -> int:
    text = text.strip()
    if not _INT.fullmatch(text):
        raise ValueError(text)
    return int(text)


def parse_float(text: str) -> float:
    text = text.strip()
    if not _FLOAT.fullmatch(text):
        raise ValueError(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise ValueError(text)


def _bool_text(value: bool) -> str:
    return "1" if value else "0"


def _number_text(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# -- the widgets --------------------------------------------------------------------------------
def _where(container: Any) -> Any:
    return container if container is not None else st


def int_param(label: str, param: str, *, default: int, min_value: int, max_value: int,
              widget: Literal["slider", "number"] = "slider", help: str | None = None,
              container: Any = None, page: str | None = None) -> int:
    """An integer setting bound to the link parameter `param`."""
    if not min_value <= default <= max_value:
        raise ValueError(f"default {default} of {param} outside [{min_value}, {max_value}]")
    where = _where(container)
    make = where.slider if widget == "slider" else where.number_input
    locked = is_locked()  # the seed too: a locked class link shows one example
    return int(bind_param(
        param, default, parse_int,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and min_value <= v <= max_value,
        f"a whole number from {min_value:,} to {max_value:,}", str,
        lambda key: make(label, min_value=min_value, max_value=max_value, step=1, key=key,
                         help=help, disabled=locked), page))


def float_param(label: str, param: str, *, default: float, min_value: float, max_value: float,
                step: float, widget: Literal["slider", "number"] = "slider",
                help: str | None = None, disabled: bool = False, container: Any = None) -> float:
    """A number setting bound to the link parameter `param`."""
    where = _where(container)
    make = where.slider if widget == "slider" else where.number_input
    low, high = float(min_value), float(max_value)
    return float(bind_param(
        param, float(default), parse_float,
        lambda v: isinstance(v, float | int) and math.isfinite(v) and low <= v <= high,
        f"a number from {min_value:g} to {max_value:g}", _number_text,
        lambda key: make(label, min_value=low, max_value=high, step=float(step), key=key,
                         help=help, disabled=disabled or is_locked())))


def choice_param(label: str, param: str, options: Sequence[T], *, default: T,
                 widget: Literal["select", "segmented", "radio"] = "select",
                 format_func: Callable[[T], str] = str, help: str | None = None,
                 container: Any = None) -> T:
    """One choice among `options`, bound to the link parameter `param` (the link holds the
    option's text as shown)."""
    options = list(options)
    texts = {format_func(o): o for o in options} | {str(o): o for o in options}

    def parse(text: str) -> T:
        if text not in texts:
            raise ValueError(text)
        return texts[text]

    where = _where(container)

    def make(key: str) -> T:
        common = dict(key=key, format_func=format_func, help=help, disabled=is_locked())
        if widget == "segmented":
            return where.segmented_control(label, options, required=True, **common)
        if widget == "radio":
            return where.radio(label, options, **common)
        return where.selectbox(label, options, **common)

    listed = ", ".join(format_func(o) for o in options[:12]) + (" …" if len(options) > 12 else "")
    return bind_param(param, default, parse, lambda v: v in options, f"one of {listed}",
                  format_func, make)


def bool_param(label: str, param: str, *, default: bool, help: str | None = None,
               container: Any = None, page: str | None = None,
               on_change: Callable[[], None] | None = None) -> bool:
    """An on/off setting (a toggle) bound to the link parameter `param`."""
    where = _where(container)
    locked = is_locked() and page != GLOBAL
    return bool(bind_param(param, default, parse_bool, lambda v: isinstance(v, bool),
                       "1 or 0", _bool_text,
                       lambda key: where.toggle(label, key=key, help=help, disabled=locked,
                                                on_change=on_change), page))


def text_param(label: str, param: str, *, default: str, max_chars: int,
               help: str | None = None, container: Any = None) -> str:
    """A short text setting bound to the link parameter `param`."""
    where = _where(container)
    return str(bind_param(param, default, lambda t: t,
                      lambda v: isinstance(v, str) and len(v) <= max_chars,
                      f"at most {max_chars} characters", str,
                      lambda key: where.text_input(label, key=key, max_chars=max_chars,
                                                   help=help, disabled=is_locked())))


# -- the lab-wide settings -----------------------------------------------------------------------
# What a teacher link may hide (`?hide=settings,questions`), with the words the class-link
# panel shows.
HIDEABLE = {"settings": "Settings", "explanations": "Explanations",
            "questions": "Questions (predict, then reveal)", "scrubber": "Step slider",
            "speed": "Play speed", "downloads": "Downloads", "sidebar": "Sidebar (pages, seed)"}


def _parse_hide(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def teacher_settings() -> tuple[tuple[str, ...], bool]:
    """A teacher link's hidden controls and lock, lab-wide and without a widget of their own
    (the class-link panel builds them)."""
    def stored(key: str):
        return st.session_state[key]

    hide = bind_param("hide", (), _parse_hide,
                  lambda v: isinstance(v, tuple) and all(c in HIDEABLE for c in v),
                  "a comma-separated list of " + ", ".join(HIDEABLE), ",".join, stored, GLOBAL)
    lock = bind_param("lock", False, parse_bool, lambda v: isinstance(v, bool), "1 or 0",
                  _bool_text, stored, GLOBAL)
    return hide, lock


def global_value(param: str, default: T) -> T:
    return st.session_state.get(_MODEL, {}).get(GLOBAL, {}).get(param, default)


def is_classroom() -> bool:
    """Classroom mode (`?classroom=1` or the sidebar toggle), the same on every page."""
    return bool(global_value("classroom", False))


def is_locked() -> bool:
    """A teacher link's lock (`?lock=1`): the page's settings cannot be changed."""
    return bool(global_value("lock", False))


def is_hidden(control: str) -> bool:
    """Whether a teacher link hides this control (`?hide=settings,questions`)."""
    return control in global_value("hide", ())


def seed() -> int:
    """The random seed chosen in the sidebar (every random thing on a page derives from it)."""
    return int(global_value("seed", 0))
