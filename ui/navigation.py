"""The one workaround for Streamlit's legacy multipage mode.

Streamlit treats an app whose main script sits beside a `pages/` folder as an old-style
multipage app (`PagesManager.uses_pages_directory`, decided when the first session starts) until
the first `st.navigation` call turns that off for the process. In that mode it runs a page's
file alone, with navigation generated from the folder. The lab's navigation is app.py's, so:

- `use_app_navigation()` turns the legacy mode off for this process before any session starts:
  the launcher (ui/serve.py, what `make run` starts) and the page tests call it, so the mode
  never happens there and costs nothing.
- `ensure_app_navigation()` (every page calls it first, through the sidebar) covers a plain
  `streamlit run app.py` whose first visitor opens a page's link: the mode is still on, so it
  turns it off and reruns once; from then on it is one attribute read.

tests/test_ui_shell.py fails if a Streamlit upgrade changes this behaviour.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.pages_manager import PagesManager


def use_app_navigation() -> None:
    PagesManager.uses_pages_directory = False


def ensure_app_navigation() -> None:
    if PagesManager.uses_pages_directory:
        use_app_navigation()
        st.rerun()
