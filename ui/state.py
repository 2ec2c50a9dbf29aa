"""Page state that lives in the URL, so a link reopens exactly what the learner saw.

Every page parameter is a widget bound to a query parameter (Streamlit's
``bind="query-params"``: the widget key is the parameter name). The helpers here add what the
binding lacks:

* a clear message when a link carries a value the widget cannot take (instead of a silent reset),
* a per-run registry of every parameter on screen, from which the sidebar builds the
  "copy link" URL (bound parameters that equal their default are dropped from the address bar,
  the copied link keeps them all so it stays exact even if a default changes later).

Usage on a page::

    block_size = int_param("Block size", "block_size", default=16, min_value=1, max_value=64)
    mode = choice_param("Layout", "layout", ["grid", "list"], default="grid")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import streamlit as st

T = TypeVar("T")

_REGISTRY = "_ui_link_params"  # session_state: {param: value} of this run, for the link
_LINK_SLOT = "_ui_link_slot"  # session_state: the sidebar placeholder showing the link
CLASSROOM_KEY = "classroom_mode"
CURRENT_PAGE = "_ui_current_page"  # session_state: url path of the page app.py is running


# -- the link registry ----------------------------------------------------------------------
def begin_run() -> None:
    """Forget the previous run's parameters (the sidebar calls this first on every page)."""
    st.session_state[_REGISTRY] = {}


def register(param: str, value: Any) -> None:
    """Record a parameter of the current state and refresh the "copy link" box."""
    st.session_state.setdefault(_REGISTRY, {})[param] = value
    slot = st.session_state.get(_LINK_SLOT)
    if slot is not None:
        slot.code(share_url(), language=None, wrap_lines=True)


def link_params() -> dict[str, str]:
    """Every parameter registered in this run, as query-string text."""
    return {k: _to_text(v) for k, v in st.session_state.get(_REGISTRY, {}).items()}


def share_url() -> str:
    """The full URL of the current state (relative when the browser's URL is unknown)."""
    base = st.context.url or ""
    query = urlencode(link_params())
    return f"{base}?{query}" if query else base or "?"


def set_link_slot(slot: Any) -> None:
    st.session_state[_LINK_SLOT] = slot


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


# -- reading a link value before the widget exists ---------------------------------------------
def check_link_value(param: str, parse: Callable[[str], T], valid: Callable[[T], bool],
                      expected: str) -> None:
    """Warn (once per session) when the URL holds a value this widget cannot take."""
    raw = st.query_params.get(param)
    if raw is None or param in st.session_state:
        return
    try:
        ok = valid(parse(raw))
    except ValueError:
        ok = False
    if not ok:
        st.warning(f"The link's `{param}={raw}` was ignored: expected {expected}. "
                   "Showing the default instead.", icon="🔗")


# -- query-param-backed widgets -------------------------------------------------------------
def int_param(label: str, param: str, *, default: int, min_value: int, max_value: int,
              widget: Literal["slider", "number"] = "slider", help: str | None = None,
              container: Any = None) -> int:
    """An integer widget whose value lives in the query parameter `param`."""
    if not min_value <= default <= max_value:
        raise ValueError(f"default {default} of {param} outside [{min_value}, {max_value}]")
    check_link_value(param, int, lambda v: min_value <= v <= max_value,
                      f"an integer from {min_value} to {max_value}")
    _clamp_state(param, min_value, max_value)
    where = container if container is not None else st
    make = where.slider if widget == "slider" else where.number_input
    value = make(label, min_value=min_value, max_value=max_value, value=default, step=1,
                 key=param, help=help, bind="query-params")
    value = int(value)
    register(param, value)
    return value


def float_param(label: str, param: str, *, default: float, min_value: float, max_value: float,
                step: float, widget: Literal["slider", "number"] = "slider",
                help: str | None = None, disabled: bool = False, container: Any = None) -> float:
    """A float widget whose value lives in the query parameter `param`."""
    check_link_value(param, float, lambda v: min_value <= v <= max_value,
                      f"a number from {min_value} to {max_value}")
    _clamp_state(param, min_value, max_value)
    where = container if container is not None else st
    make = where.slider if widget == "slider" else where.number_input
    value = float(make(label, min_value=min_value, max_value=max_value, value=default,
                       step=step, key=param, help=help, disabled=disabled,
                       bind="query-params"))
    register(param, value)
    return value


def choice_param(label: str, param: str, options: Sequence[T], *, default: T,
                 widget: Literal["select", "segmented", "radio"] = "select",
                 format_func: Callable[[T], str] = str, help: str | None = None,
                 container: Any = None) -> T:
    """One choice among `options`, stored in the query parameter `param`.

    Streamlit's binding writes and reads the displayed label (format_func's text), so the copy
    link carries that label too.
    """
    texts = [format_func(o) for o in options]
    check_link_value(param, str, lambda v: v in texts, "one of " + ", ".join(texts))
    where = container if container is not None else st
    if widget == "segmented":
        value = where.segmented_control(label, list(options), default=default, required=True,
                                        key=param, format_func=format_func, help=help,
                                        bind="query-params")
    else:
        make = where.selectbox if widget == "select" else where.radio
        value = make(label, list(options), index=list(options).index(default), key=param,
                     format_func=format_func, help=help, bind="query-params")
    register(param, format_func(value))
    return value


def _clamp_state(param: str, low: float, high: float) -> None:
    """Keep a stored value inside a range that may have shrunk since the last run."""
    value = st.session_state.get(param)
    if value is not None and not low <= value <= high:  # only write on a real change
        st.session_state[param] = min(max(value, low), high)


# -- classroom mode -------------------------------------------------------------------------
def is_classroom() -> bool:
    """True in classroom mode (`?classroom=1` or the sidebar toggle)."""
    if CLASSROOM_KEY in st.session_state:
        return bool(st.session_state[CLASSROOM_KEY])
    return st.query_params.get("classroom") in ("1", "true")


def seed() -> int:
    """The random seed chosen in the sidebar (every random thing on a page derives from it)."""
    return int(st.session_state.get("seed", 0))
