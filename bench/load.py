"""A classroom against one server: N sessions stepping through pages, measured at the server.

Starts the app (`python -m ui.serve`, as `make run` does) on a free localhost port, then drives
N sessions through Streamlit's own websocket protocol (tests/load_client.py: no browser per
session). Session i opens one of the animated pages (a mix, in turn: those the checkout has)
with seed 1000 + i, then clicks Step 1.5 s (--think) after each run has finished, like a
reader; at the last step it clicks Reset and goes on. A Step's latency is the server's: from
sending the click's BackMsg to the run's script_finished ForwardMsg. Only Steps after every
session has opened count.

Reported per N: Step p50 / p95 / max, Steps per second, errors (an exception on the page, a
failed run, a timeout, a lost connection), the server's CPU (cores busy, its worker processes
included) and RSS, the machine's load average and how busy its CPUs were, and this client's own
CPU (it shares the machine). --browsers K adds K real Chromium tabs on Block tables, each timing
Step from the click to the page settled (bench/ui.py's clock): what a person sees.

    python bench/load.py [--sessions 10 30 60] [--duration 60] [--browsers 2]
    python bench/load.py --memory [--sessions 5] [--cycles 300]   # RSS over Step/Back/Reset
    python bench/load.py --root /tmp/before ...   # the same load on another checkout
    python bench/load.py --replicas 2 ...   # deploy/lab.sh: 2 replicas behind nginx

Servers run as `make run` runs them (one BLAS thread: the Makefile exports it). A session whose
page fails to load reloads it, as a person would (up to OPEN_TRIES times; each failure counts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procstats import Machine, ServerProcess
from tests.browser.harness import ROOT, serve_app, serve_replicas
from tests.load_client import LabSession, Run, query

# Each page at settings with enough steps to click through for a while.
PAGES = {"unknown_ending": {}, "block_tables": {"output_len": 12},
         "attention": {"block_size": 8}, "fragmentation": {}, "copy_on_write": {},
         "prefix_cache": {}}
RAMP_S = 0.1  # between two sessions' first loads
OPEN_TRIES = 3


def served_pages(root: Path) -> list[str]:
    """The PAGES the checkout at `root` has (an older one may lack the newer lessons)."""
    return [p for p in PAGES if (root / "pages" / f"{p}.py").exists()]


def session_page(i: int, pages: list[str]) -> tuple[str, str]:
    page = pages[i % len(pages)]
    return page, query(seed=1000 + i, **PAGES[page])


class Results:
    def __init__(self) -> None:
        self.steps: list[tuple[float, Run]] = []  # (when the click was sent, its run)
        self.opens: list[Run] = []
        self.errors: list[str] = []

    def add(self, kind: str, sent: float, run: Run) -> None:
        if run.error:
            self.errors.append(f"{kind}: {run.error}")
        if kind == "open":
            self.opens.append(run)
        elif kind == "forward":
            self.steps.append((sent, run))


async def stepper(url: str, i: int, pages: list[str], think_s: float, results: Results,
                  opened: asyncio.Barrier, stop: asyncio.Event) -> None:
    """Session i, until `stop` is set (a flag, not a cancel: asyncio.wait_for in Python 3.11
    can swallow a cancellation that meets an answer, and the session would step on alone)."""
    page, params = session_page(i, pages)
    await asyncio.sleep(i * RAMP_S)
    for _ in range(OPEN_TRIES):  # a page that failed to load is reloaded, as a person would
        session = LabSession(url, page, params)
        try:
            run = await session.open()
        except Exception as error:
            run = Run(0.0, None, repr(error))
        results.add("open", time.monotonic(), run)
        if not run.error:
            break
        await session.close()
    else:
        session.last_step = None  # it never loaded: this session sits the load out
    await opened.wait()
    try:
        while session.last_step is not None and not stop.is_set():
            await asyncio.sleep(think_s)
            control = "reset" if session.step >= session.last_step else "forward"
            sent = time.monotonic()
            results.add(control, sent, await session.click(control))
    except Exception as error:
        results.errors.append(f"{page} #{i}: {error!r}")
    finally:
        await session.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def browser_steps(url: str, count: int, stop: threading.Event, out: list[float]) -> None:
    """`count` Chromium tabs on Block tables clicking Step --think apart, in this thread. They
    open it as a class link that hides the questions (a question due holds Step back until it
    is answered; the websocket sessions' clicks are not held)."""
    from playwright.sync_api import sync_playwright

    from bench.ui import last_step, timed_click
    from tests.browser.harness import VIEWPORT, current_step, launch_chromium, open_page

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        tabs = [browser.new_context(viewport=VIEWPORT).new_page() for _ in range(count)]
        for k, tab in enumerate(tabs):
            link = query(seed=500 + k, output_len=12, hide="questions")
            open_page(tab, f"{url}/block_tables?{link}")
        lasts = [last_step(tab) for tab in tabs]  # each seed's story has its own length
        while not stop.is_set():
            for tab, last in zip(tabs, lasts):
                step = current_step(tab)
                control = "reset" if step >= last else "forward"
                ms, _ = timed_click(tab, control, 0 if control == "reset" else step + 1, 0.75)
                if control == "forward":
                    out.append(ms / 1000)
        browser.close()


async def drive(url: str, n: int, pages: list[str], think_s: float, duration_s: float,
                server: ServerProcess, browsers: int) -> dict:
    results, opened, done = Results(), asyncio.Barrier(n + 1), asyncio.Event()
    tasks = [asyncio.create_task(stepper(url, i, pages, think_s, results, opened, done))
             for i in range(n)]
    seen, stop = [], threading.Event()
    if browsers:
        watcher = threading.Thread(target=browser_steps, args=(url, browsers, stop, seen))
        watcher.start()
    await opened.wait()
    start, machine = time.monotonic(), Machine()
    server.mark()
    client_cpu = time.process_time()
    await asyncio.sleep(duration_s)
    window = time.monotonic() - start
    usage = server.since_mark(window)
    client = (time.process_time() - client_cpu) / window
    busy = machine.busy_since()
    stop.set()
    done.set()
    await asyncio.wait(tasks, timeout=180)  # each finishes its click, then closes
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if browsers:
        watcher.join()
    times = [run.seconds for sent, run in results.steps if start <= sent <= start + window]
    return {"n": n, "steps": len(times), "rate": len(times) / window,
            "p50": percentile(times, 0.5), "p95": percentile(times, 0.95),
            "max": max(times, default=0.0), "errors": results.errors,
            "open_p95": percentile([r.seconds for r in results.opens], 0.95),
            "browser": seen, "client_cores": client, "machine_busy": busy, **usage}


def row(r: dict) -> str:
    seen = r["browser"]
    browser = (f"{percentile(seen, 0.5):.2f} / {percentile(seen, 0.95):.2f} ({len(seen)})"
               if seen else "—")
    return (f"| {r['n']} | {r['steps']} | {r['rate']:.1f} | {r['p50']:.2f} | {r['p95']:.2f} | "
            f"{r['max']:.2f} | {len(r['errors'])} | {r['open_p95']:.1f} | {browser} | "
            f"{r['cores']:.2f} | {r['rss_start']:.0f} → {r['rss_end']:.0f} | "
            f"{r['machine_busy']:.0%} | {r['load']} | {r['client_cores']:.2f} |")


HEADER = ("| N | Steps | Steps/s | Step p50 s | p95 s | max s | errors | open p95 s | browser "
          "Step p50 / p95 s (clicks) | server cores | server RSS MiB | machine busy | "
          "load avg 1 min | client cores |\n|--:|--:|--:|--:|--:|--:|--:|--:|--|--:|--|--:|--|--:|")


async def memory(url: str, n: int, pages: list[str], cycles: int, release_s: float,
                 server: ServerProcess) -> None:
    """RSS while n sessions do `cycles` Step, Step, Back, Reset cycles each, then after they
    close: Streamlit drops a closed session after server.disconnectedSessionTTL (120 s), on
    its next new session; a worker drops a story's run after 600 s unused."""
    def report(what: str) -> None:
        print(f"{time.monotonic() - start:6.0f} s  {what}: {server.rss_mib():.0f} MiB", flush=True)

    start = time.monotonic()
    report("server before any session")
    sessions = [LabSession(url, *session_page(i, pages)) for i in range(n)]
    for s in sessions:
        await s.open()
    report(f"{n} sessions open")
    errors = 0
    for cycle in range(1, cycles + 1):
        for control in ("forward", "forward", "back", "reset"):
            runs = await asyncio.gather(*(s.click(control) for s in sessions))
            errors += sum(r.error is not None for r in runs)
        if cycle % 50 == 0:
            report(f"after {cycle} cycles ({4 * cycle * n} clicks, {errors} errors)")
    for s in sessions:
        await s.close()
    report("sessions closed")
    waited = 0.0
    while waited < release_s:
        await asyncio.sleep(min(60.0, release_s - waited))
        waited = time.monotonic() - start
        probe = LabSession(url, "home")  # a new session: the server drops expired ones
        await probe.open()
        await probe.close()
        report("after a new session")


@contextmanager
def served(args, env: dict[str, str], tmp: Path, server: ServerProcess) -> Iterator[str]:
    """One server (serve_app), or --replicas behind nginx (deploy/lab.sh); yields the URL."""
    if not args.replicas:
        with serve_app(tmp / "server.log", root=args.root, env=env,
                       on_start=server.attach) as url:
            yield url
        return
    os.environ.update(env)  # deploy/lab.sh passes its environment on to the replicas
    with serve_replicas(tmp, args.replicas) as (url, pids):
        server.pids = pids
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10, 30, 60])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds measured per N")
    parser.add_argument("--think", type=float, default=1.5)
    parser.add_argument("--browsers", type=int, default=0)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--release", type=float, default=700.0,
                        help="--memory: seconds to watch RSS after the sessions close")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to serve")
    parser.add_argument("--replicas", type=int, default=0,
                        help="serve through nginx with this many replicas (deploy/lab.sh)")
    parser.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for the server")
    args = parser.parse_args()
    # As `make run` serves (the Makefile exports it): one BLAS thread for the interpreter.
    env = {"OPENBLAS_NUM_THREADS": "1", **dict(item.split("=", 1) for item in args.env)}
    where = f"{args.replicas} replicas behind nginx" if args.replicas else args.root
    print(f"{os.cpu_count()} CPUs; serving {where} {env or ''}; think {args.think:g} s; "
          f"{args.duration:g} s measured per N\n")
    pages = served_pages(args.root)
    print(f"pages, in turn: {', '.join(pages)}\n")
    if not args.memory:
        print(HEADER)
    for n in args.sessions:
        server = ServerProcess()
        with tempfile.TemporaryDirectory() as tmp, served(args, env, Path(tmp), server) as url:
            if args.memory:
                asyncio.run(memory(url, n, pages, args.cycles, args.release, server))
                continue
            result = asyncio.run(drive(url, n, pages, args.think, args.duration, server,
                                       args.browsers))
        print(row(result), flush=True)
        for error in sorted(set(result["errors"]))[:5]:
            print(f"  error: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
