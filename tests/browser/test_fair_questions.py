"""Fair questions in a real browser: on every animated page with questions, a fresh session steps
its story to the end, and at every step no open question's answer is on screen and no question
is open after the step that answers it.

An open question is drawn in a container keyed ``lab_open_<key>_at_<reveal>`` (ui/predict.py,
the step that shows its answer), or ``lab_open_<key>`` when the page asks it at every step
(then what answers it is held back for as long as it is open). The check at each step:

- no question is open before the step ahead of its reveal step, nor after its reveal step;
- at its reveal step, while it is open, every figure on the page is held back (hatched, its
  content invisible), and so is every held-back place;
- a question asked at every step holds something back while it is open.
"""

from __future__ import annotations

import re

import pytest

from lab.scenarios.unknown_ending import EndingConfig, UnknownEndingStory
from tests.browser.harness import exceptions, open_page, wait_settled

pytestmark = pytest.mark.browser
OPEN = '[class*="st-key-lab_open_"]'
HELD = '[class*="st-key-lab_hatched_"]'


def _ending_start() -> str:
    """The unknown ending with two requests, from two steps before its question: its outputs
    reach 200 tokens, and before that step nothing is asked."""
    story = UnknownEndingStory(EndingConfig(num_requests=2), 0)
    frames = story.frames()
    asked = story.first_growth(frames, story.longest().req_id) - 1
    return f"unknown_ending?requests=2&step={asked - 1}"


# (page and link, the step controls' key): each page's default story, shortened by its link
# where the default runs for a hundred steps or more.
PAGES = [("block_tables", "step"), ("attention", "step"), ("mixed_attention", "step"),
         ("prefix_cache", "step"), ("copy_on_write", "step"),
         ("fragmentation?requests=4&mean_output=16&max_output=40", "step"),
         ("copy_on_write?mode=Beam+search", "step"), (_ending_start(), "step"),
         ("scheduler?step_requests=8&step_blocks=32", "sched_step")]


def visible(page, selector: str) -> bool:
    """Whether an element matching `selector` can be seen (not hidden in a held-back place)."""
    return page.evaluate("""(selector) => [...document.querySelectorAll(selector)].some(
        el => getComputedStyle(el).visibility === 'visible' && el.getClientRects().length > 0)""",
                         selector)


def open_questions(page) -> list[tuple[str, int | None]]:
    """(key, reveal step or None) of every open question on the page."""
    classes = page.evaluate(f"""() => [...document.querySelectorAll('{OPEN}')].map(
        el => [...el.classList].find(c => c.startsWith('st-key-lab_open_')))""")
    found = []
    for name in classes:
        match = re.fullmatch(r"st-key-lab_open_(.+?)(?:_at_(\d+))?", name)
        found.append((match[1], None if match[2] is None else int(match[2])))
    return found


def step_of(page, key: str) -> int:
    match = re.search(rf"[?&]{key}=(\d+)", page.url)
    return int(match[1]) if match else 0


def check_step(page, step: int) -> list[str]:
    """What is unfair at this step, in words (empty: all fair)."""
    unfair = []
    for key, reveal in open_questions(page):
        if reveal is None:
            if page.locator(HELD).count() == 0:
                unfair.append(f"step {step}: {key} is open and holds nothing back")
            continue
        if not reveal - 1 <= step <= reveal:
            unfair.append(f"step {step}: {key} is open, but its answer is at step {reveal}")
        elif step == reveal:
            if visible(page, ".lab-figure"):
                unfair.append(f"step {step}: {key} is open under a figure that shows its answer")
            if page.locator(HELD).count() == 0:
                unfair.append(f"step {step}: {key} is open and nothing is held back")
    if visible(page, f"{HELD} .lab-figure"):
        unfair.append(f"step {step}: a held-back figure can be seen")
    return unfair


@pytest.mark.parametrize("path, key", PAGES)
def test_no_open_question_has_its_answer_on_screen(page, app_url: str, path: str,
                                                   key: str) -> None:
    open_page(page, f"{app_url}/{path}")
    unfair: list[str] = []
    asked: set[str] = set()
    step = step_of(page, key)
    while True:
        unfair += check_step(page, step)
        asked.update(k for k, _ in open_questions(page))
        forward = page.locator(f".st-key-{key}_forward button:visible").first
        if forward.is_disabled():
            break
        forward.click()
        wait_settled(page)
        now = step_of(page, key)
        assert now == step + 1, f"Step went from {step} to {now}"
        step = now
    assert exceptions(page) == []
    assert unfair == []
    assert asked, "no question was asked in the whole story"


def test_the_admission_question_holds_back_the_queues_while_open(page, app_url: str) -> None:
    """'Which request is preempted' is asked without the running list, the waiting queue or the
    note on a later re-admission (it names a preempted request) on screen; answered, they come
    back."""
    open_page(page, f"{app_url}/scheduler?step_requests=8&step_blocks=32")
    for _ in range(60):
        if any(k == "sched_victim" for k, _ in open_questions(page)):
            break
        page.locator(".st-key-sched_step_forward button:visible").first.click()
        wait_settled(page)
    else:
        pytest.fail("no preemption question in 60 steps")
    assert page.locator(".st-key-lab_hatched_sched_queues").count() == 1
    assert not visible(page, ".st-key-lab_hatched_sched_queues [data-testid='stMarkdown']")
    main = page.locator('[data-testid="stMain"]').inner_text()  # what can be read
    assert "Running (" not in main and "preempted earlier" not in main
    page.locator(".st-key-sched_victim_show button").click()
    wait_settled(page)
    assert page.locator(".st-key-lab_hatched_sched_queues").count() == 0
    assert "Running (" in page.locator('[data-testid="stMain"]').inner_text()
