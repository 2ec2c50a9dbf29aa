"""The app shell: every page in the navigation renders from the entry point without an error, and
a teacher composes a lesson path in the sidebar."""

from __future__ import annotations

import base64
import zlib
from urllib.parse import parse_qs, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from tests.browser.harness import ROOT
from ui.chapters import CHAPTERS
from ui.lesson_path import Stop, decode, encode

PAGES = [c.path for c in CHAPTERS]


def test_navigation_lists_pages_in_the_guide_order() -> None:
    assert PAGES[0] == "pages/home.py"
    order = ["home", "unknown_ending", "block_tables", "attention", "fragmentation",
             "copy_on_write", "prefix_cache", "mixed_attention", "scheduler", "serving_metrics",
             "calculator", "model"]
    present = [name for name in order if f"pages/{name}.py" in PAGES]
    assert [p for p in PAGES if p.removeprefix("pages/").removesuffix(".py") in order] == [
        f"pages/{name}.py" for name in present]


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_exception(open_app_page, page: str) -> None:
    at = open_app_page(page, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.get("code"), "sidebar() was not called: no copy-link box"
    assert at.title, "every page has a title"


def test_streamlit_still_has_the_legacy_pages_mode() -> None:
    """ui/navigation.py works around this decision; if a Streamlit upgrade drops it (or decides
    it elsewhere), this fails: check that the workaround is still needed, and where."""
    from streamlit.runtime.pages_manager import PagesManager

    saved = PagesManager.uses_pages_directory
    try:
        PagesManager.uses_pages_directory = None
        PagesManager(str(ROOT / "app.py"), setup_watcher=False)
        assert PagesManager.uses_pages_directory is True
    finally:
        PagesManager.uses_pages_directory = saved


def test_a_click_without_a_callback_reaches_the_page(open_app_page) -> None:
    """No rerun under AppTest: a button whose click the page reads after it is drawn."""
    at = open_app_page("pages/serving_metrics.py")
    at.text_input(key="vllm_url").input("http://127.0.0.1:9/metrics").run()
    at.button(key="vllm_fetch").click().run()
    assert not at.exception and at.error, "the Fetch click was lost"


def test_a_plain_streamlit_run_opens_a_page_link_through_app_navigation() -> None:
    """Without the launcher the legacy mode is on: the page turns it off and reruns once."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    at = at.switch_page("pages/block_tables.py").run()
    assert not at.exception and at.title[0].value == "Block tables"


def test_a_teacher_composes_a_lesson_path_in_the_sidebar(open_app_page) -> None:
    at = open_app_page("pages/block_tables.py", step="2")
    at.text_area(key="_lesson_note").input("Count the blocks").run()
    at.button(key="_lesson_add").click().run()
    assert at.text_area(key="_lesson_note").value == ""  # ready for the next stop's note
    at = at.switch_page("pages/attention.py").run()
    at.button(key="_lesson_add").click().run()
    assert not at.exception
    link = next(c.value for c in at.sidebar.code if "lesson=" in c.value)
    query = parse_qs(urlsplit(link).query)
    stops = decode(query["lesson"][0])
    assert [s.page for s in stops] == ["block_tables", "attention"]
    assert (stops[0].step, stops[0].note, stops[1].note) == ("2", "Count the blocks", "")
    assert stops[0].hide == ("settings", "questions", "downloads")  # the panel's default
    assert urlsplit(link).path.endswith("/block_tables")  # the link opens the first stop
    assert query["stop"] == ["0"] and query["classroom"] == ["1"] and query["step"] == ["2"]


@pytest.mark.parametrize("text", ["x", "not-a-lesson", "eJwLycgsVgCi4pLSnFQA", "A" * 20_000])
def test_a_lesson_text_the_maker_would_not_make_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode(text)


def test_a_lesson_survives_its_link_text() -> None:
    stops = (Stop("block_tables", (("step", "3"), ("seed", "7")), ("settings",), "Ask first"),
             Stop("home", (), (), ""))
    assert decode(encode(stops)) == stops
    nested = base64.urlsafe_b64encode(zlib.compress(b"[" * 100_000)).decode()
    with pytest.raises(ValueError):
        decode(nested)  # deeply nested JSON: refused, not a RecursionError
    bad_page = encode((Stop("nowhere", (), (), ""),))
    with pytest.raises(ValueError):
        decode(bad_page)
