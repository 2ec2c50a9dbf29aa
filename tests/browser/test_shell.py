"""The app in a real browser: every page opens without an exception, with screenshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import ROOT, exceptions, open_page, screenshot
from ui.chapters import CHAPTERS

pytestmark = pytest.mark.browser


def page_paths() -> list[str]:
    """URL paths of the pages in app.py's navigation (ui/chapters.py lists them; Streamlit
    derives the paths from the file names)."""
    paths = ["" if c.url_path == "home" else c.url_path for c in CHAPTERS]
    assert len(paths) == len(list((ROOT / "pages").glob("*.py")))  # every page is listed
    return paths


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
