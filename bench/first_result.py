"""Admission control's replay views in a real browser: from choosing a view (or clicking a
sweep's button) to its first result, and to its last.

    python bench/first_result.py [--root PATH]

The app is served as `make run` serves it (`--root`: another checkout, to compare two) and
driven by headless Chromium at 1400x900, each view in a fresh browser context (a new session:
nothing kept per user). The page's own clock times every change of what the main area holds
(figures drawn, tables, metrics and notes, progress bars), polled every 50 ms; a view's first
result is the first table or figure of its own, its end the last change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from playwright.sync_api import sync_playwright

from tests.browser import harness

VIEWS = ("Replay & metrics", "Batch chain")
SWEEPS = ("Sweep block size", "Sweep pool size")  # buttons of the Sweeps view
WATCH = """() => { clearInterval(window.__timer); window.__log = []; let last = '';
  const main = () => document.querySelector('[data-testid="stMain"]');
  const count = (sel) => main().querySelectorAll(sel).length;
  window.__timer = setInterval(() => {
    const now = [count('.js-plotly-plot .main-svg'),
                 count('[data-testid="stDataFrame"], [data-testid="stMetric"], '
                       + '[data-testid="stAlert"]'),
                 count('[data-testid="stProgress"]')].join(' ');
    if (now !== last) { window.__log.push([performance.now() / 1000, now]); last = now; }
  }, 50);
  return performance.now() / 1000; }"""


def timeline(page, click) -> list[tuple[float, int, int, int]]:
    """(seconds after the click, figures, tables/metrics/notes, progress bars) per change."""
    start = page.evaluate(WATCH)
    click()
    harness.wait_settled(page, start_grace_ms=1000)
    return [(t - start, *map(int, s.split())) for t, s in page.evaluate("window.__log")]


def first_and_last(changes) -> tuple[float | None, float]:
    """The first change that adds a table or figure while the view still runs (its progress
    bar up) and stays 0.2 s at least (not a note flashing by), or None for a view that shows
    nothing before its end; and the last change."""
    before, ends = changes[0], [t for t, *_ in changes[1:]] + [float("inf")]
    first = next((t for (t, figs, tables, bars), end in zip(changes[1:], ends[1:])
                  if bars and (figs > before[1] or tables > before[2]) and end - t >= 0.2),
                 None)
    return first, changes[-1][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=harness.ROOT)
    args = parser.parse_args()
    rows = []
    with harness.serve_app(Path("/tmp/first_result.log"), root=args.root) as url, \
            sync_playwright() as p:
        browser = harness.launch_chromium(p)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        harness.open_page(context.new_page(), f"{url}/scheduler")  # the server's imports
        for view in VIEWS + ("Sweeps",):
            context.close()
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            harness.open_page(page, f"{url}/scheduler")
            choose = page.locator(".st-key-sched_view button", has_text=view).first
            changes = timeline(page, choose.click)
            if view != "Sweeps":
                rows.append((view, *first_and_last(changes)))
        for button in SWEEPS:
            changes = timeline(page, page.get_by_role("button", name=button).first.click)
            rows.append((button, *first_and_last(changes)))
    print(f"{'view':<20} {'first result s':>15} {'all of it s':>12}")
    for name, first, last in rows:
        shown = "at its end" if first is None else f"{first:.2f}"
        print(f"{name:<20} {shown:>15} {last:>12.2f}")


if __name__ == "__main__":
    main()
