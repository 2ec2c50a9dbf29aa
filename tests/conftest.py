"""Shared fixtures: pages opened from the entry point (AppTest), and a running copy of the app
for the browser tests.

`app_url` starts `streamlit run app.py` once per test session on a free localhost port
(8620-8640), waits for its health check and stops it afterwards. It is only started when a test
asks for it, so unit and page tests never pay for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from streamlit.testing.v1 import AppTest

from tests.browser.harness import ROOT, serve_app


@pytest.fixture(scope="session")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the app served by a fresh `streamlit run`."""
    with serve_app(tmp_path_factory.mktemp("streamlit") / "server.log") as url:
        yield url


@pytest.fixture
def open_app_page() -> Callable[..., AppTest]:
    """Open a page the way a browser does: app.py first (its st.navigation), then the page,
    with the given query parameters, e.g. open_app_page("pages/x.py", step="3")."""

    def open_page(page: str, *, timeout: float = 120, **query: str) -> AppTest:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
        for name, value in query.items():
            at.query_params[name] = value
        at.run()
        return at.switch_page(page).run()

    return open_page


@pytest.fixture
def open_page(open_app_page, request: pytest.FixtureRequest) -> Callable[..., AppTest]:
    """open_app_page for the test module's `PAGE`, e.g. open_page(step="3")."""
    page = request.module.PAGE
    return lambda **query: open_app_page(page, **query)
