"""Crafted links on every page (AppTest, opened from app.py as a browser does).

Each page's link parameters are read off the page itself (the sidebar's copy link holds every
setting on screen), in each view that draws other settings. Hypothesis then opens the page with
hostile values for a few of them (numbers as text, inf/nan, huge, empty, unicode, repeated
keys). Every run must show no traceback; a refused value is named in the page's warning and
its setting shows its default; an accepted one shows the value the link asked for; when every
value was refused, the page is exactly its default.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from streamlit.testing.v1 import AppTest

from tests.hostile_inputs import examples, hostile_texts
from ui.chapters import CHAPTERS
from ui.state import parse_bool, parse_float, parse_int

# The views that draw settings the first view does not (and run nothing long on their own).
VIEWS: dict[str, list[dict[str, str]]] = {
    "pages/scheduler.py": [{"sched_view": "Sweeps"}],
    "pages/model.py": [{"model_q": "Your own…", "model_decoding": "sampling"}],
    "pages/calculator.py": [{"model": "Custom", "gpu": "Custom"}],
}
PAGES = [c.path for c in CHAPTERS]
_DEFAULTS: dict[tuple, dict[str, str]] = {}


def copy_link(at: AppTest) -> dict[str, str]:
    link = at.sidebar.get("code")[0].value
    return {k: v[-1] for k, v in parse_qs(urlsplit(link).query, keep_blank_values=True).items()}


def defaults(open_app_page, page: str, view: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Every setting the page draws in this view, with the value it shows by default."""
    if (page, view) not in _DEFAULTS:
        at = open_app_page(page, **dict(view))
        assert not at.exception, [e.value for e in at.exception]
        _DEFAULTS[page, view] = copy_link(at)
    return _DEFAULTS[page, view]


def contexts(page: str) -> list[tuple[tuple[str, str], ...]]:
    return [(), *(tuple(v.items()) for v in VIEWS.get(page, []))]


def same_value(asked: str, shown: str) -> bool:
    """The setting shows what the link asked for, in its own spelling ("07" -> "7")."""
    if asked == shown:
        return True
    for parse in (parse_int, parse_float, parse_bool):
        try:
            return parse(asked) == parse(shown)
        except ValueError:
            continue
    return False


link_values = hostile_texts | st.lists(hostile_texts, min_size=2, max_size=3)  # repeated keys


@pytest.mark.parametrize("page", PAGES)
@examples(8)
@given(data=st.data())
def test_a_crafted_link_is_refused_by_name_and_the_page_keeps_its_defaults(open_app_page,
                                                                           page: str,
                                                                           data) -> None:
    view = data.draw(st.sampled_from(contexts(page)), label="view")
    shown_by_default = defaults(open_app_page, page, view)
    names = sorted(set(shown_by_default) - set(dict(view)))
    query = data.draw(st.dictionaries(st.sampled_from(names), link_values, min_size=1,
                                      max_size=4), label="query")
    at = open_app_page(page, **dict(view), **query)
    assert not at.exception, [e.value for e in at.exception]
    shown, warning = copy_link(at), "\n".join(str(w.value) for w in at.warning)
    refused = set()
    for name, value in query.items():
        asked = value[-1] if isinstance(value, list) else value  # a repeated key: the last
        if f"`{name}=" in warning:
            refused.add(name)
            assert shown.get(name) == shown_by_default[name], name
        elif name in shown:
            assert same_value(asked, shown[name]), (name, asked, shown[name])
    if refused == set(query):
        assert shown == shown_by_default


# The issue's crafted links, one by one (they raised before ui/state.py parsed links at the edge).
ISSUE_LINKS = [
    ("pages/home.py", {"seed": "inf"}), ("pages/home.py", {"seed": "-inf"}),
    ("pages/home.py", {"seed": "1e400"}), ("pages/home.py", {"seed": "abc"}),
    ("pages/block_tables.py", {"num_blocks": "inf"}), ("pages/calculator.py", {"layers": "inf"}),
    ("pages/attention.py", {"seq": ""}), ("pages/attention.py", {"head": ""}),
    ("pages/copy_on_write.py", {"mode": ""}), ("pages/scheduler.py", {"sched_view": ""}),
    ("pages/model.py", {"model_block_size": ""}),
]


@pytest.mark.parametrize("page, query", ISSUE_LINKS)
def test_the_issues_links_are_refused_by_name(open_app_page, page: str,
                                              query: dict[str, str]) -> None:
    at = open_app_page(page, **query)
    assert not at.exception, [e.value for e in at.exception]
    warning = "\n".join(str(w.value) for w in at.warning)
    (name,) = query
    assert f"`{name}=" in warning and "expected" in warning
    assert copy_link(at)[name] == defaults(open_app_page, page, ())[name]


_RANGE = re.compile(r"`(\w+)=[^`]*` was ignored: expected a (?:whole )?number from "
                    r"(-?[\d,.]+) to (-?[\d,.]+)")


def ranges(open_app_page, page: str, view: tuple[tuple[str, str], ...]) -> dict[str, tuple]:
    """Each number setting's (min, max), read off the page's own refusal of a non-number."""
    names = set(defaults(open_app_page, page, view)) - set(dict(view))
    at = open_app_page(page, **dict(view), **dict.fromkeys(names, "x"))
    warning = "\n".join(str(w.value) for w in at.warning)
    return {m[1]: (m[2].replace(",", ""), m[3].replace(",", ""))
            for m in _RANGE.finditer(warning)}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("corner", [0, 1], ids=["min", "max"])
def test_every_number_setting_at_its_corner(open_app_page, page: str, corner: int) -> None:
    """Every number setting at its minimum, or at its maximum, at once: accepted, and the page
    draws or says why the combination cannot run (no traceback, no freeze)."""
    for view in contexts(page):
        corners = {name: bounds[corner]
                   for name, bounds in ranges(open_app_page, page, view).items()
                   if name != "seed"}
        at = open_app_page(page, **dict(view), **corners)
        assert not at.exception, (view, corners, [e.value for e in at.exception])
        assert not at.warning or "was ignored" not in "\n".join(str(w.value)
                                                                for w in at.warning)
