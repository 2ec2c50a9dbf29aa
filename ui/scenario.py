"""A page's scenario: settings that may not run, and replays cached per user-visible state.

* `or_stop(build)`: build the page's config (or check its settings); on a bad combination show
  what is wrong and stop the page, instead of a traceback.
* `cached(replay)`: the engine's replay function, cached with ``st.cache_resource`` per
  argument tuple (e.g. ``(cfg, seed)``): frames are pure functions of their arguments, so every
  user with the same settings shares them: frames are frozen dataclasses, shared and never
  changed (DESIGN: ``st.cache_resource`` for immutable, shared things). ``st.cache_data`` would
  hand each run an unpickled copy instead (37 ms per rerun for the Fragmentation page's 144
  frames, measured).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

import streamlit as st

P = ParamSpec("P")
T = TypeVar("T")


def or_stop(build: Callable[[], T], *, errors: type[Exception] = ValueError,
            message: str = "These settings cannot run: {error}.") -> T:
    """`build()`, or its error (`message` with ``{error}``) and the end of this page run."""
    try:
        return build()
    except errors as error:
        st.error(message.format(error=error), icon=":material/error:")
        st.stop()


def cached(replay: Callable[P, T], *, max_entries: int = 64,
           spinner: bool | str = False) -> Callable[P, T]:
    """`replay` (a module-level engine function, e.g. `lab.scenarios.copy_on_write.run`) cached
    per arguments.

    The cache belongs to `replay` itself (Streamlit keys it by its module, name and source),
    so each engine function keeps its own entries across reruns and pages. Callers must not
    change what it returns: every run and every user gets the same objects.
    """
    return st.cache_resource(replay, max_entries=max_entries, show_spinner=spinner)
