"""The last line of defence on every page: an exception no check foresaw becomes a short message,
never a traceback; its details go to the server log under a reference the message shows.

It is not a substitute for validation (every input is parsed at the edge, with a message that
says what is accepted): it catches only what slipped through. Streamlit's own control flow
(st.stop, st.rerun, st.switch_page, a rerun asked for by a widget) raises StopException and
RerunException, which derive from BaseException, not Exception, so they pass through untouched.
A fragment's exception is shown by Streamlit in the fragment and re-raised as
FragmentHandledException; that one is passed on, so it is not reported twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import streamlit as st
from streamlit.errors import FragmentHandledException

from ui.state import reset_page

_log = logging.getLogger(__name__)


def run_guarded(run: Callable[[], object]) -> None:
    """run(), or a short message about the exception it raised (logged with its traceback)."""
    try:
        run()
    except FragmentHandledException:
        raise
    except Exception:
        reference = uuid.uuid4().hex[:8]
        _log.exception("page run failed (reference %s)", reference)
        st.error(f"Something went wrong on this page (reference {reference}); the details are "
                 "in the server log. Change a setting, or reset this page's settings and try "
                 "again.", icon=":material/error:")
        st.button("Reset this page's settings", key="_guard_reset", on_click=reset_page,
                  icon=":material/restart_alt:")
