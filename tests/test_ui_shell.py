"""The app shell: every page in the navigation renders from the entry point without an error."""

from __future__ import annotations

import re

import pytest

from tests.browser.harness import ROOT

PAGES = re.findall(r'st\.Page\("(pages/\w+\.py)"', (ROOT / "app.py").read_text())


def test_navigation_lists_pages_in_the_guide_order() -> None:
    assert PAGES[0] == "pages/home.py"
    order = ["home", "block_tables", "attention", "fragmentation", "copy_on_write",
             "prefix_cache", "scheduler", "calculator", "model"]
    present = [name for name in order if f"pages/{name}.py" in PAGES]
    assert [p for p in PAGES if p.removeprefix("pages/").removesuffix(".py") in order] == [
        f"pages/{name}.py" for name in present]


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_exception(open_app_page, page: str) -> None:
    at = open_app_page(page, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.get("code"), "sidebar() was not called: no copy-link box"
    assert at.title, "every page has a title"
