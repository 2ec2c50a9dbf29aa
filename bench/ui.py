"""Time, in the real browser, from clicking Step to the page having settled, per page.

Starts the app (`python -m ui.serve`, as `make run` does) on a free localhost port and drives
Debian's Chromium (headless, through Playwright). For each animated page at its default sizes:
click Step, then wait until the step slider shows the new step, Streamlit reports no script run
in progress, no element is stale and every figure has been drawn by plotly.js
(tests/browser/harness.py: IDLE_JS). "Step" times a step never seen before (the live pool
plays it and runs the kernel); "Back" times a step already seen (frames and checks are kept:
rendering only). Clicks are --think seconds apart, like a reader's: pages compute the next
step's check in the background meanwhile.
Times run on the page's own clock, from the click event on the button to the animation frame in
which the page is seen settled; Playwright's checks before it clicks (that the button is visible
and has stopped moving: two animation frames and a few round trips, ~40 ms here) are left out,
and shown apart in the last browser column.

    python bench/ui.py [--clicks 6] [--think 1.5] [--pages block_tables attention]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright

from kernels.backend import backend
from lab.figures.blocks import block_table_figure, pool_grid, token_strip
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.attention import AttentionConfig, AttentionStory
from lab.scenarios.block_tables import BlockTablesStory, WalkParams
from tests.browser.harness import (
    CHROMIUM,
    IDLE_JS,
    STEP_THUMB,
    VIEWPORT,
    click_control,
    current_step,
    launch_chromium,
    open_page,
    serve_app,
)

# Default sizes, except enough steps to click through: 12 output tokens on Block tables (the
# default request is the guide's 4), block size 8 on Attention (7 blocks to read).
PAGES = {"unknown_ending": "", "block_tables": "output_len=12", "attention": "block_size=8",
         "fragmentation": "", "copy_on_write": "", "prefix_cache": ""}
SERVER_CPU = ("block_tables", "attention")  # pages whose step compute is timed in-process


# The page notes when a click happens (capture phase: before Streamlit's own handlers run).
CLICK_CLOCK_JS = ("() => { if (!window.labClock) { window.labClock = true; document."
                  "addEventListener('click', () => { window.labClickAt = performance.now(); },"
                  " true); } }")


def settled_js(step: int) -> str:
    """A JS predicate: true once the slider shows `step` and the page is idle."""
    return (f"() => Number(document.querySelector('{STEP_THUMB}')?.innerText) === {step}"
            f" && ({IDLE_JS})()")


def timed_click(page, control: str, expected: int, think_s: float = 0.0
                ) -> tuple[float, float]:
    """(ms from the click event to settled on the page's clock, ms from asking Playwright to
    click to settled)."""
    time.sleep(think_s)  # a reader looks at the page before the next click
    page.evaluate(CLICK_CLOCK_JS)
    start = time.perf_counter()
    click_control(page, control)
    since_click = page.wait_for_function(
        f"() => ({settled_js(expected)})() && performance.now() - window.labClickAt",
        timeout=120_000).json_value()
    return since_click, (time.perf_counter() - start) * 1000


def last_step(page) -> int:
    """The last step of the page's story, from its slider's label "Step (0 to N)"."""
    label = page.locator(".st-key-step label").first.inner_text()
    return int(re.search(r"0 to (\d+)", label).group(1))


def measure(page, url: str, clicks: int, think_s: float
            ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    open_page(page, url)
    clicks = min(clicks, last_step(page) - 1)
    timed_click(page, "forward", 1)  # warm-up: first kernel launch, imports, plotly.js
    forward = [timed_click(page, "forward", 2 + i, think_s) for i in range(clicks)]
    back = [timed_click(page, "back", clicks - i, think_s) for i in range(clicks)]
    assert current_step(page) == 1
    return forward, back


def compute_ms(name: str, steps: int) -> float:
    """Median process CPU time of what the server computes for a new step (replay, kernel,
    reference, figures), in this process: a reading that other load on the machine barely
    moves, unlike the wall times of the browser columns."""
    times = []
    if name == "block_tables":  # frames are shared; a new step plays one more on the pool
        story = BlockTablesStory(WalkParams(output_len=12), 0)
        walk, live = story.frames(), story.live()
    last = len(walk if name == "block_tables" else attention_frames()) - 1
    for step in range(1, min(steps, last) + 1):  # as many as the browser clicked
        start = time.process_time()
        if name == "block_tables":
            live.check(step)
            for build in (token_strip, block_table_figure, pool_grid):
                build(walk[step].snapshot, walk[step].seq_names)
        else:  # a step only changes the view: the frames are cached per placement
            frame = attention_frames()[step]
            pool_grid(frame.snapshot, frame.seq_names, highlight=frame.read)
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def attention_story(placement: int) -> AttentionStory:
    walk = WalkParams(PoolConfig(num_blocks=64, block_size=8), output_len=20)
    return AttentionStory(AttentionConfig(walk, placement=placement), 0)


@cache
def attention_frames():
    return attention_story(0).frames()


def shuffle_ms() -> float:
    """CPU time of a new placement on Attention: walk, relocation, two kernel checks."""
    attention_frames()
    start = time.process_time()
    attention_story(1).frames()
    return (time.process_time() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=6)
    parser.add_argument("--pages", nargs="+", default=list(PAGES), choices=list(PAGES))
    parser.add_argument("--think", type=float, default=1.5,
                        help="seconds between a settled page and the next click")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} not found: this benchmark needs Debian's chromium")
    print(f"backend: {backend().label}; viewport {VIEWPORT['width']}x{VIEWPORT['height']}; "
          f"{args.clicks} clicks each, {args.think:g} s apart; median (min-max) ms from the "
          "click event to settled, on the page's clock\n")
    print("| page | Step (new step) | Back (cached step) | Step, from Playwright's click call "
          "| server CPU per new step |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp, serve_app(Path(tmp) / "server.log") as url, \
            sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        for name in args.pages:
            forward, back = measure(page, f"{url}/{name}?{PAGES[name]}", args.clicks,
                                    args.think)
            cells = [f"{statistics.median(t):.0f} ({min(t):.0f}-{max(t):.0f})"
                     for t in ([f[0] for f in forward], [b[0] for b in back])]
            wall = statistics.median(f[1] for f in forward)
            cpu = f"{compute_ms(name, args.clicks):.0f}" if name in SERVER_CPU else "—"
            print(f"| {name} | {cells[0]} | {cells[1]} | {wall:.0f} | {cpu} |", flush=True)
        browser.close()
    print(f"\nA new placement on Attention (Shuffle): {shuffle_ms():.0f} ms server CPU.")


if __name__ == "__main__":
    main()
