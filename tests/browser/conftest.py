"""Browser fixtures: one headless Chromium per session, a fresh 1280x800 page per test.

Every test here is skipped, cleanly, when /usr/bin/chromium is missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.browser.harness import CHROMIUM, VIEWPORT, launch_chromium

pytestmark = pytest.mark.browser


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: browser tests need Debian's chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    yield tab
    context.close()
