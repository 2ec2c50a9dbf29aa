"""The real-model page in a browser: a short two-sample generation streams and finishes cleanly."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.harness import exceptions, open_page, screenshot, serve_app, wait_settled

pytestmark = pytest.mark.browser

# One moment of the page, read at once: what is drawn while the model may still be loading.
DRAWN_JS = """() => {
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  const text = main ? main.innerText : '';
  return {title: main?.querySelector('h1')?.innerText ?? '',
          intro: text.includes('runs here in plain torch'),
          progress: !!main?.querySelector('[data-testid="stProgress"]'),
          ready: text.includes('Press Generate')};
}"""


@pytest.fixture(scope="module")
def fresh_app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of its own, so that no earlier test has loaded the model in it."""
    with serve_app(tmp_path_factory.mktemp("fresh") / "server.log") as url:
        yield url


def test_the_page_is_drawn_before_the_model_has_loaded(page, fresh_app_url: str) -> None:
    page.goto(f"{fresh_app_url}/model", wait_until="domcontentloaded")
    handle = page.wait_for_function(f"() => {{ const s = ({DRAWN_JS})(); "
                                    "return s.progress || s.ready ? s : null; }",
                                    timeout=180_000)
    loading = handle.json_value()
    # The load's progress is shown before its result, under the page's title and text.
    assert loading == {"title": "A real model on the paged cache", "intro": True,
                       "progress": True, "ready": False}
    page.get_by_text("Press Generate").wait_for(timeout=180_000)
    wait_settled(page)
    assert page.evaluate(DRAWN_JS)["progress"] is False
    assert exceptions(page) == []


def test_short_generation_fills_the_pool(page, app_url: str, tmp_path: Path) -> None:
    open_page(page, f"{app_url}/model?model_max_new=4&model_n=2&model_decoding=sampling")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text("Same as dense cache").wait_for(timeout=180_000)
    wait_settled(page)
    screenshot(page, tmp_path, "model_generated")
    assert exceptions(page) == []
    assert page.get_by_text(re.compile(r"sample 2 \(\d tokens, done\)")).count() == 1
    assert page.get_by_text("Copy-on-write at step 0").count() == 1
    # The same two samples held V0's way and V1's, side by side.
    for title in ("vLLM V0 (the paper, 2023): fork + copy-on-write",
                  "vLLM V1 (0.33): child requests through the prefix cache"):
        assert page.get_by_text(title, exact=True).count() == 1
    assert page.get_by_text(re.compile(r"S2 found \d+ tokens \(\d+ full blocks\) and "
                                       r"computed \d+")).count() == 1


def test_stop_ends_the_generation_and_keeps_the_partial_answer(page, app_url: str) -> None:
    open_page(page, f"{app_url}/model?model_max_new=96&model_n=3&model_decoding=sampling")
    stop = page.locator('[data-testid="stMainBlockContainer"]').get_by_role("button", name="Stop")
    assert stop.is_disabled()  # nothing to stop yet
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(re.compile(r"sample 1 \(\d+ tokens, writing…\)")).first.wait_for(
        timeout=180_000)
    stop.click()
    page.get_by_text(re.compile(r"Stopped after \d+ of at most 96 new tokens")).wait_for(
        timeout=60_000)
    wait_settled(page)
    assert exceptions(page) == []
    assert page.get_by_text("not checked").count() == 1  # a stopped answer is not compared
    assert page.get_by_text(re.compile(r"sample 3 \(\d+ tokens, stopped\)")).count() == 1
