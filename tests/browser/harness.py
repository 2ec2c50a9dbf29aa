"""Drive the running app in headless Chromium: start the server, open pages, wait for Streamlit.

Shared by the browser tests (tests/browser/) and the UI benchmark (bench/ui.py). The browser is
Debian's system Chromium through Playwright's `executable_path`; nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]
# pytest-xdist's workers (gw0, gw1, ...) each take their own ten ports: two workers checking
# the same free port at once would both try to serve on it.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
PORTS = range(8620 + 10 * _WORKER, 8630 + 10 * _WORKER)
VIEWPORT = {"width": 1280, "height": 800}
START_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_MS = 60_000

# While a script run is in progress the app root says so (the "Running" status widget may
# only appear after a delay); elements from before the run carry data-stale until redrawn, and
# elements announced but not yet drawn show as skeletons; a figure (ui/figure_view.js) is
# marked pending from receiving a new figure until plotly has drawn it.
RUNNING = '[data-testid="stApp"]:not([data-test-script-state="notRunning"])'
STALE = ('[data-stale="true"], [data-testid="stMain"] [data-testid="stSkeleton"], '
         '.lab-figure[data-pending]')
EXCEPTION = '[data-testid="stException"]'
IDLE_JS = f"() => !document.querySelector('{RUNNING}') && !document.querySelector('{STALE}')"


def venv_python(root: Path = ROOT) -> str:
    candidate = root / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def free_port(ports: range = PORTS, count: int = 1) -> int:
    """A free localhost port in `ports`, the first of `count` free ones in a row."""
    for port in ports:
        with ExitStack() as stack:
            try:
                for p in range(port, port + count):
                    stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)).bind(
                        ("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no {count} free port(s) in {ports.start}-{ports.stop - 1}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextmanager
def serve_app(log_path: Path, *, root: Path = ROOT, env: dict[str, str] | None = None,
              on_start=None) -> Iterator[str]:
    """Run the app as `make run` does (`python -m ui.serve`) on a free localhost port; yield
    its URL; stop it after. `root`: another checkout of the lab (bench/load.py compares two);
    `env`: extra environment variables; `on_start(process)` is told the server's process."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [venv_python(root), "-m", "ui.serve", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})})
    if on_start is not None:
        on_start(server)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start on {url}:\n"
                                   f"{log_path.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


NGINX = Path(shutil.which("nginx") or "/usr/sbin/nginx")
DEPLOY = ROOT / "deploy" / "lab.sh"


@contextmanager
def serve_replicas(run_dir: Path, replicas: int) -> Iterator[tuple[str, list[int]]]:
    """Run `replicas` copies of the app behind nginx, as deploy/lab.sh does for a class, on
    free localhost ports; yield nginx's URL and the replicas' pids; stop them all after."""
    listen = free_port(range(8700, 8750))
    env = {**os.environ, "RUN_DIR": str(run_dir), "NGINX_BIN": str(NGINX),
           "PYTHON": venv_python()}
    # Output to a file, not a pipe: the daemons it starts would hold a pipe open.
    with open(run_dir / "lab.sh.out", "wb") as out:
        started = subprocess.run([str(DEPLOY), "start", str(replicas), f"127.0.0.1:{listen}",
                                  str(free_port(range(8650, 8700), count=replicas))],
                                 env=env, timeout=300, stdout=out, stderr=subprocess.STDOUT)
    try:
        if started.returncode:
            logs = "".join(p.read_text()[-1500:] for p in sorted(run_dir.glob("*.log")))
            raise RuntimeError(f"deploy/lab.sh start failed:\n"
                               f"{(run_dir / 'lab.sh.out').read_text()}\n{logs}")
        yield (f"http://127.0.0.1:{listen}",
               [int(p.read_text()) for p in sorted(run_dir.glob("replica-*.pid"))])
    finally:
        subprocess.run([str(DEPLOY), "stop"], env=env, check=True, timeout=120)


def launch_chromium(playwright):
    """Headless system Chromium (the caller checks CHROMIUM exists)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)


def wait_settled(page, *, start_grace_ms: int = 250, quiet_ms: int = 300) -> None:
    """Wait until Streamlit has finished the current script run and redrawn everything.

    A run may start a moment after the triggering click, so first give the "Running" status a
    short chance to appear; then wait until it is gone and no element is stale, and stays so
    for `quiet_ms` (a page may rerun itself right after its first run).
    """
    try:
        page.wait_for_selector(RUNNING, state="attached", timeout=start_grace_ms)
    except Exception:
        pass
    while True:
        page.wait_for_function(IDLE_JS, timeout=SETTLE_TIMEOUT_MS)
        page.wait_for_timeout(quiet_ms)
        if page.evaluate(IDLE_JS):
            return


def open_page(page, url: str) -> None:
    """Load a page of the app and wait for its first run to finish."""
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stSidebar"]', state="attached", timeout=SETTLE_TIMEOUT_MS)
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1',
                           timeout=SETTLE_TIMEOUT_MS)
    wait_settled(page, start_grace_ms=1000)


def exceptions(page) -> list[str]:
    """Texts of every Streamlit exception box on the page (empty when all is well)."""
    return [e.inner_text() for e in page.query_selector_all(EXCEPTION)]


STEP_THUMB = '.st-key-step [data-testid="stSliderThumbValue"]'


def current_step(page, *, wait: bool = True) -> int | None:
    """The value the step slider shows (waiting for it to be drawn), or None without one."""
    if wait:
        page.wait_for_selector(STEP_THUMB, timeout=SETTLE_TIMEOUT_MS)
    thumb = page.query_selector(STEP_THUMB)
    return None if thumb is None else int(thumb.inner_text())


def click_control(page, control: str, key: str = "step") -> None:
    """Click a step control: "reset", "back", "forward" or "play" (by its widget key; the
    scheduler page's controls are keyed "sched_step")."""
    page.locator(f".st-key-{key}_{control} button:visible").first.click()


def screenshot(page, directory: Path, name: str, *, full: bool = True) -> Path:
    """Save a PNG of the page. Streamlit scrolls inside its main pane, so for the whole page
    the viewport is stretched to the pane's height for the shot, then restored."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    size = page.viewport_size
    if full:
        height = page.evaluate(
            "() => document.querySelector('[data-testid=\"stMain\"]')?.scrollHeight ?? 0")
        page.set_viewport_size({"width": size["width"], "height": max(size["height"], height)})
        page.wait_for_timeout(400)  # let plotly re-lay out its charts
    page.screenshot(path=str(path))
    if full:
        page.set_viewport_size(size)
    return path
