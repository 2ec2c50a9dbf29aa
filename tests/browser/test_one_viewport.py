"""One viewport: after every Step, the step controls, the figure the Step changed and the
question it asks are on screen together, on a laptop (1400x900) and on a projector in
classroom mode (1280x720).

Streamlit scrolls its main pane inside the window, so what counts is the window: every box
must lie inside it, and the figure and the question below the step controls, which stick
under the header (nothing hidden behind them).
"""

from __future__ import annotations

import pytest

from tests.browser.harness import click_control, exceptions, open_page, wait_settled

pytestmark = pytest.mark.browser
# Every animated page (the scheduler in its step-through view), and the key of its controls.
ANIMATED = {"unknown_ending": "step", "block_tables": "step", "attention": "step",
            "fragmentation": "step", "copy_on_write": "step", "prefix_cache": "step",
            "mixed_attention": "step", "scheduler": "sched_step"}
SCREENS = {"1400x900": ({"width": 1400, "height": 900}, ""),
           "1280x720-classroom": ({"width": 1280, "height": 720}, "?classroom=1")}
STEPS = 3
# The boxes that must be seen together, with the window's size: the Step button, the whole
# step controls, every main figure, and every question the step asks (in the step's caption
# part: a form, or in classroom mode its one-line box).
BOXES_JS = """key => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; };
  // A figure held back until its question is answered keeps its place (hatched): its box
  // counts. A question counts unless it is folded away (the inside of a closed expander).
  const placed = e => e.getBoundingClientRect().height > 0;
  const shown = e => placed(e) && e.checkVisibility({visibilityProperty: true});
  const questions = '.st-key-lab_step_caption [data-testid="stForm"], '
                  + '.st-key-lab_step_caption [data-testid="stExpander"]';
  return {
    width: window.innerWidth, height: window.innerHeight,
    step: box(document.querySelector(`.st-key-${key}_forward button`)),
    controls: box(document.querySelector(`.st-key-${key}_controls`)),
    figures: [...document.querySelectorAll('.lab-figure[data-main]')].filter(placed).map(box),
    questions: [...document.querySelectorAll(questions)].filter(shown).map(box),
  };
}"""


def out_of_view(boxes: dict) -> list[str]:
    """What is not wholly in the window, or (figures, questions) hidden under the controls."""
    width, height, under = boxes["width"], boxes["height"], boxes["controls"]["bottom"]

    def inside(box: dict, top: float = 0) -> bool:
        return (box["left"] >= -1 and box["right"] <= width + 1 and box["top"] >= top - 1
                and box["bottom"] <= height + 1)

    missing = [] if inside(boxes["step"]) else ["the Step button"]
    if not boxes["figures"]:
        missing.append("the main figure (none drawn)")
    missing += [f"main figure {i} at {f['top']:.0f}-{f['bottom']:.0f} px"
                for i, f in enumerate(boxes["figures"]) if not inside(f, under)]
    missing += [f"question {i} at {q['top']:.0f}-{q['bottom']:.0f} px"
                for i, q in enumerate(boxes["questions"]) if not inside(q, under)]
    return missing


@pytest.mark.parametrize("screen", SCREENS)
@pytest.mark.parametrize("path", ANIMATED)
def test_a_step_its_figure_and_its_question_are_seen_together(browser, app_url: str, path: str,
                                                             screen: str) -> None:
    viewport, query = SCREENS[screen]
    key = ANIMATED[path]
    context = browser.new_context(viewport=viewport)
    tab = context.new_page()
    try:
        open_page(tab, f"{app_url}/{path}{query}")
        for step in range(1, STEPS + 1):
            click_control(tab, "forward", key=key)
            wait_settled(tab)
            tab.wait_for_timeout(300)  # the scroll that brings the step in follows the draw
            assert out_of_view(tab.evaluate(BOXES_JS, key)) == [], f"{path} after step {step}"
        assert exceptions(tab) == [], path
    finally:
        context.close()
