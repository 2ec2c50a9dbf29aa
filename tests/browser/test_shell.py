"""The app in a real browser: every page opens without an exception, with screenshots."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser.harness import ROOT, exceptions, open_page, screenshot

pytestmark = pytest.mark.browser


def page_paths() -> list[str]:
    """URL paths of the pages in app.py's navigation (Streamlit derives them from file names)."""
    files = re.findall(r'st\.Page\("pages/(\w+)\.py"', (ROOT / "app.py").read_text())
    return ["" if name == "home" else name for name in files]


def test_every_page_opens_without_exception(page, app_url: str, tmp_path: Path) -> None:
    for path in page_paths():
        open_page(page, f"{app_url}/{path}")
        screenshot(page, tmp_path, path or "home", full=False)
        assert exceptions(page) == [], f"page /{path} raised"


def test_classroom_mode_from_link(page, app_url: str, tmp_path: Path) -> None:
    open_page(page, f"{app_url}/?classroom=1")
    toggle = page.get_by_role("switch", name="Classroom mode")
    assert toggle.is_checked()
    screenshot(page, tmp_path, "home_classroom", full=False)
    assert exceptions(page) == []
