"""Shared versus per-user state: the one place pages keep results between reruns.

* `shared(fn)`: `fn` cached across sessions (``st.cache_resource``) per argument tuple. For
  immutable results that are pure functions of their arguments (a story's frames, the model's
  weights): every user with the same settings gets the same objects, and must not change them.
  ``st.cache_data`` would hand each rerun an unpickled copy instead, which costs more than the
  page's drawing for a long story (bench/RESULTS.md).
* `per_user(key, params, make)`: one object per browser session (``st.session_state``), rebuilt
  when `params` change. For mutable things a user drives (a live KV pool, a model session) and
  for results only this user asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import ParamSpec, TypeVar

import streamlit as st

P = ParamSpec("P")
T = TypeVar("T")


def shared(fn: Callable[P, T], *, max_entries: int = 64,
           spinner: bool | str = False) -> Callable[P, T]:
    """`fn` (a module-level function) cached per arguments, for every session. The cache
    belongs to `fn` itself (Streamlit keys it by its module, name and source), so it survives
    reruns and page changes."""
    return st.cache_resource(fn, max_entries=max_entries, show_spinner=spinner)


def per_user(key: str, params: Hashable, make: Callable[[], T]) -> T:
    """This session's object under `key`, built by `make()` the first time and whenever
    `params` differ from those it was built for."""
    stored = st.session_state.get(key)
    if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == params):
        stored = st.session_state[key] = (params, make())
    return stored[1]
