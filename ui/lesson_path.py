"""A teacher's lesson path: stops a class walks with "Next stop", all in one link.

A stop is a page, its settings and step (the page's link parameters as they were on screen),
the controls hidden there and a presenter note. The teacher composes the path in the sidebar's
class-link panel (`lesson_maker`): "Add this page as a stop" takes the page as it is now with
the controls picked to hide and the note typed; the panel lists the stops and gives the link.

The link opens the first stop: its page with its settings, plus `lesson=` (every stop,
compressed) and `stop=` (which one), lab-wide settings like a class link's `hide` and `lock`,
so the path survives reruns and visits to other pages. At a stop a box above the page's title
shows "Stop i of n", the note, and links to the previous and next stops, each with that stop's
page and settings. A link whose path cannot be read is refused with a message (ui/state.py)
and the page shows as it would without it.
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from dataclasses import dataclass
from urllib.parse import urlencode

import streamlit as st

from ui.chapters import CHAPTERS
from ui.state import (
    CURRENT_PAGE,
    GLOBAL,
    HIDEABLE,
    bind_param,
    current_page,
    is_locked,
    link_params,
    parse_int,
)

MAX_STOPS = 30
MAX_NOTE = 600  # characters of a presenter note
MAX_PARAMS = 60  # link parameters of one stop
MAX_TEXT = 200  # characters of one parameter's name or value
MAX_CODE = 16_000  # characters of the `lesson=` text
# Lab-wide settings the lesson sets itself (classroom mode on, each stop's hidden controls,
# the lock, the path and the stop): never part of a stop's own settings.
LESSON_WIDE = frozenset({"classroom", "hide", "lock", "lesson", "stop"})
PAGES = {c.url_path: c for c in CHAPTERS}
_DRAFT = "_lesson_draft"  # session: the stops the teacher has added so far


@dataclass(frozen=True)
class Stop:
    page: str  # the page's url path (ui.chapters)
    params: tuple[tuple[str, str], ...]  # its link parameters: settings, step, seed
    hide: tuple[str, ...]  # controls hidden at this stop (ui.state.HIDEABLE)
    note: str  # what the presenter says here

    @property
    def step(self) -> str | None:
        return dict(self.params).get("sched_step" if self.page == "scheduler" else "step")


# -- the `lesson=` text -------------------------------------------------------------------------
def encode(stops: tuple[Stop, ...]) -> str:
    """The stops as link text: JSON, compressed, URL-safe base64 without padding."""
    if not stops:
        return ""
    data = [{"p": s.page, "q": dict(s.params), "h": list(s.hide), "n": s.note} for s in stops]
    packed = zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 9)
    return base64.urlsafe_b64encode(packed).decode().rstrip("=")


def decode(text: str) -> tuple[Stop, ...]:
    """The stops of a `lesson=` text; ValueError for anything the lesson maker would not make."""
    if not text:
        return ()
    if len(text) > MAX_CODE:
        raise ValueError("too long")
    try:
        raw = zlib.decompressobj().decompress(
            base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), 1_000_000)
        data = json.loads(raw)
    except (binascii.Error, zlib.error, UnicodeDecodeError, json.JSONDecodeError,
            RecursionError) as error:
        raise ValueError("unreadable") from error
    if not isinstance(data, list) or not 1 <= len(data) <= MAX_STOPS:
        raise ValueError("not a list of stops")
    return tuple(_stop(item) for item in data)


def _stop(item: object) -> Stop:
    if not isinstance(item, dict) or set(item) != {"p", "q", "h", "n"}:
        raise ValueError("not a stop")
    page, params, hide, note = item["p"], item["q"], item["h"], item["n"]
    if page not in PAGES:
        raise ValueError("no such page")
    if (not isinstance(params, dict) or len(params) > MAX_PARAMS
            or not all(_short_text(k) and _short_text(v) for k, v in params.items())
            or LESSON_WIDE & set(params)):
        raise ValueError("bad settings")
    if not isinstance(hide, list) or not all(isinstance(h, str) and h in HIDEABLE for h in hide):
        raise ValueError("bad hidden controls")
    if not isinstance(note, str) or len(note) > MAX_NOTE:
        raise ValueError("bad note")
    return Stop(page, tuple(params.items()), tuple(dict.fromkeys(hide)), note)


def _short_text(value: object) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


# -- links to a stop ----------------------------------------------------------------------------
def stop_query(stops: tuple[Stop, ...], index: int, *, lock: bool) -> dict[str, str]:
    """The query string that opens stop `index` of the path."""
    stop = stops[index]
    query = dict(stop.params) | {"classroom": "1", "lesson": encode(stops), "stop": str(index)}
    if stop.hide:
        query["hide"] = ",".join(stop.hide)
    if lock:
        query["lock"] = "1"
    return query


def lesson_url(stops: tuple[Stop, ...], *, lock: bool) -> str:
    """The whole lesson's link: its first stop's page and settings, and every stop."""
    first = stops[0].page
    path = "" if PAGES[first].path == CHAPTERS[0].path else first
    return f"{_app_root()}/{path}?{urlencode(stop_query(stops, 0, lock=lock))}"


def _app_root() -> str:
    """The app's base URL, from the browser's URL of the page now shown."""
    url = (st.context.url or "").split("?")[0].rstrip("/")
    here = st.session_state.get(CURRENT_PAGE) or ""
    return url[: -len(here)].rstrip("/") if here and url.endswith(here) else url


# -- at a stop ----------------------------------------------------------------------------------
def lesson_settings() -> tuple[tuple[Stop, ...], int]:
    """The path and the stop the link names (lab-wide, without widgets of their own)."""
    def stored(key: str):
        return st.session_state[key]

    stops = bind_param("lesson", (), decode,
                       lambda v: isinstance(v, tuple) and all(isinstance(s, Stop) for s in v),
                       "a lesson path made by the class-link panel's lesson maker", encode,
                       stored, GLOBAL)
    index = bind_param("stop", 0, parse_int,
                       lambda v: type(v) is int and 0 <= v < max(1, len(stops)),
                       f"a stop from 0 to {max(0, len(stops) - 1)}", str, stored, GLOBAL)
    return stops, index


def lesson_stop() -> None:
    """Above the page's title: where the class is in the teacher's path, the presenter note,
    and the way on (nothing without a path)."""
    stops, index = lesson_settings()
    if not stops:
        return
    stop, lock = stops[index], is_locked()
    with st.container(border=True, key="lab_lesson_stop"):
        if stop.page != current_page():
            st.page_link(PAGES[stop.page].path, query_params=stop_query(stops, index, lock=lock),
                         label=f"Back to the lesson: stop {index + 1} of {len(stops)}, "
                               f"{PAGES[stop.page].title}", icon=":material/school:")
            return
        step = f" · step {stop.step}" if stop.step is not None else ""
        st.markdown(f"**:material/school: Lesson · stop {index + 1} of {len(stops)}**{step}")
        if stop.note:
            st.info(stop.note, icon=":material/co_present:")
        back, forward = st.columns(2)
        if index > 0:
            previous = stops[index - 1]
            back.page_link(PAGES[previous.page].path, label=f"Previous stop: "
                           f"{PAGES[previous.page].title}", icon=":material/arrow_back:",
                           query_params=stop_query(stops, index - 1, lock=lock))
        if index + 1 < len(stops):
            following = stops[index + 1]
            forward.page_link(PAGES[following.page].path, label=f"Next stop: "
                              f"{PAGES[following.page].title}", icon=":material/arrow_forward:",
                              query_params=stop_query(stops, index + 1, lock=lock))
        else:
            forward.caption(":material/flag: The last stop of this lesson.")


# -- composing a path (the sidebar's class-link panel) ------------------------------------------
def lesson_maker(hide: list[str], lock: bool) -> None:
    """Add the page as it is now as a stop, with the controls in `hide` hidden and a note;
    list the stops; the lesson's link (locked if `lock`)."""
    st.markdown("**A lesson path**: stops the class walks with *Next stop*.")
    st.text_area("Presenter note for this stop", key="_lesson_note", max_chars=MAX_NOTE,
                 height=80, placeholder="What to say or ask here")
    draft: tuple[Stop, ...] = st.session_state.get(_DRAFT, ())
    add, clear = st.columns([3, 2])
    add.button("Add this page as a stop", key="_lesson_add", icon=":material/add_location:",
               on_click=_add_stop, args=(tuple(hide),), disabled=len(draft) >= MAX_STOPS,
               help="This page with its settings and step as they are now, the controls "
                    "picked above hidden, and the note.")
    clear.button("Clear", key="_lesson_clear", on_click=st.session_state.pop,
                 args=(_DRAFT, None), disabled=not draft, type="tertiary")
    if not draft:
        return
    st.markdown("\n".join(
        f"{i + 1}. {PAGES[s.page].title}" + (f", step {s.step}" if s.step is not None else "")
        + (f": *{_excerpt(s.note)}*" if s.note else "") for i, s in enumerate(draft)))
    st.code(lesson_url(draft, lock=lock), language=None, wrap_lines=True)


def _add_stop(hide: tuple[str, ...]) -> None:
    params = tuple((k, v) for k, v in link_params().items() if k not in LESSON_WIDE)
    note = str(st.session_state.get("_lesson_note") or "")[:MAX_NOTE]
    stop = Stop(current_page(), params, hide, note)
    st.session_state[_DRAFT] = (*st.session_state.get(_DRAFT, ()), stop)
    st.session_state["_lesson_note"] = ""


def _excerpt(note: str, length: int = 40) -> str:
    one_line = " ".join(note.split()).replace("*", "")
    return one_line if len(one_line) <= length else one_line[:length] + "…"
