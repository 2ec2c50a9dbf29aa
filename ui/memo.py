"""Shared versus per-user state: the one place pages keep results between reruns.

* `shared(fn)`: `fn` cached across sessions (``st.cache_resource``) per argument tuple. For
  immutable results that are pure functions of their arguments (a story's frames, the model's
  weights): every user with the same settings gets the same objects, and must not change them.
  ``st.cache_data`` would hand each rerun an unpickled copy instead, which costs more than the
  page's drawing for a long story (bench/RESULTS.md).
* `shared_within(fn, weigh, budget)`: the same, for results whose sizes vary by orders of
  magnitude with their arguments (a story's frames): the least recently used are dropped while
  the results' total weight passes `budget`, whatever the number of entries.
* `per_user(key, params, make)`: one object per browser session (``st.session_state``), rebuilt
  when `params` change. For mutable things a user drives (a live KV pool, a model session) and
  for results only this user asked for.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import nullcontext
from typing import Generic, ParamSpec, TypeVar

import streamlit as st

P = ParamSpec("P")
T = TypeVar("T")


def shared(fn: Callable[P, T], *, max_entries: int = 64,
           spinner: bool | str = False) -> Callable[P, T]:
    """`fn` (a module-level function) cached per arguments, for every session. The cache
    belongs to `fn` itself (Streamlit keys it by its module, name and source), so it survives
    reruns and page changes."""
    return st.cache_resource(fn, max_entries=max_entries, show_spinner=spinner)


class _Within(Generic[T]):
    """An LRU of fn's results, every session's, whose total weight stays within a budget."""

    def __init__(self, fn: Callable[..., T], weigh: Callable[[T], int], budget: int) -> None:
        self._fn, self._weigh, self.budget = fn, weigh, budget
        self._items: OrderedDict[tuple, tuple[T, int]] = OrderedDict()  # least recent first
        self.weight = 0
        self._lock = threading.Lock()  # the dict; two sessions may compute one key at once

    def __len__(self) -> int:
        return len(self._items)

    def get(self, args: tuple, spinner: bool | str = False) -> T:
        with self._lock:
            if args in self._items:
                self._items.move_to_end(args)
                return self._items[args][0]
        text = spinner if isinstance(spinner, str) else "Running…"
        with st.spinner(text) if spinner else nullcontext():
            value = self._fn(*args)
        weight = self._weigh(value)
        with self._lock:
            if args in self._items:  # another session got there first: share its result
                return self._items[args][0]
            self._items[args] = (value, weight)
            self.weight += weight
            while self.weight > self.budget and len(self._items) > 1:  # the newest stays
                _, (_, dropped) = self._items.popitem(last=False)
                self.weight -= dropped
        return value


_WITHIN: dict[Callable, _Within] = {}
_WITHIN_LOCK = threading.Lock()


def shared_within(fn: Callable[P, T], weigh: Callable[[T], int], budget: int, *,
                  spinner: bool | str = False) -> Callable[P, T]:
    """`fn` (a module-level function) cached per arguments for every session, the least
    recently used results dropped while their total `weigh(result)` passes `budget`; one cache
    per `fn` in the process, made on first use."""
    with _WITHIN_LOCK:
        cache = _WITHIN.get(fn)
        if cache is None:
            cache = _WITHIN[fn] = _Within(fn, weigh, budget)
    return lambda *args: cache.get(args, spinner)


def per_user(key: str, params: Hashable, make: Callable[[], T]) -> T:
    """This session's object under `key`, built by `make()` the first time and whenever
    `params` differ from those it was built for."""
    stored = st.session_state.get(key)
    if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == params):
        stored = st.session_state[key] = (params, make())
    return stored[1]
