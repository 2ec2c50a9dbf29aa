"""Shared fixtures: pages opened from the entry point (AppTest), and a running copy of the app
for the browser tests.

`app_url` starts `streamlit run app.py` once per test session on a free localhost port
(8620-8640), waits for its health check and stops it afterwards. It is only started when a test
asks for it, so unit and page tests never pay for it. Streamlit is imported by the fixtures that
use it, so the kernel and engine tests also run where only torch, Triton and pytest are
installed (a GPU machine's image: bench/gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from tests.browser.harness import ROOT, serve_app  # the standard library only

if TYPE_CHECKING:
    from streamlit.testing.v1 import AppTest


@pytest.fixture(scope="session")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the app served by a fresh `streamlit run`."""
    with serve_app(tmp_path_factory.mktemp("streamlit") / "server.log") as url:
        yield url


@pytest.fixture
def app_navigation(monkeypatch: pytest.MonkeyPatch) -> None:
    """AppTest resets Streamlit's legacy-pages flag before every run; turn it off again as soon
    as the run's PagesManager has decided it, as the lab's launcher does for a server."""
    from streamlit.runtime.pages_manager import PagesManager

    from ui.navigation import use_app_navigation

    decide = PagesManager.__init__

    def init(self, *args, **kwargs) -> None:
        decide(self, *args, **kwargs)
        use_app_navigation()

    monkeypatch.setattr(PagesManager, "__init__", init)


@pytest.fixture
def open_app_page(app_navigation) -> Callable[..., AppTest]:
    """Open a page's link the way a browser does: app.py runs (its st.navigation) and shows
    the page, with the given query parameters, e.g. open_app_page("pages/x.py", step="3")."""
    from streamlit.testing.v1 import AppTest

    def open_page(page: str, *, timeout: float = 120, **query: str) -> AppTest:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
        for name, value in query.items():
            at.query_params[name] = value
        return at.switch_page(page).run()

    return open_page


@pytest.fixture
def open_page(open_app_page, request: pytest.FixtureRequest) -> Callable[..., AppTest]:
    """open_app_page for the test module's `PAGE`, e.g. open_page(step="3")."""
    page = request.module.PAGE
    return lambda **query: open_app_page(page, **query)
