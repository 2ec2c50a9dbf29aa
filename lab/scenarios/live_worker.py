"""One worker process of lab/scenarios/live_workers.py: the kernel checks of its stories.

    python -m lab.scenarios.live_worker READ_FD WRITE_FD MAX_RUNS IDLE_S BUDGET_MIB

Reads (kind, req_id, story, step) pickles from READ_FD and answers (req_id, ok, value) on
WRITE_FD. A reader thread queues requests as they come, so the compute loop takes checks a
page waits for before prefetches (which have no req_id and get no answer). The loop is the
only thread that launches kernels here. Memory: LiveRuns bounds the runs by count and idle
time; beyond BUDGET_MIB of growth over the worker's size after start, it drops the least
recently used half of its runs. The worker exits when the server closes its pipe.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import pickle
import queue
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

import torch

import kernels.backend  # noqa: F401  (decides the device before Triton loads)
from lab.scenarios.live_runs import LiveRuns

PRIORITY = {"check": 0, "measured": 0, "stats": 0, "prefetch": 1}
TRIM_EVERY_S = 30.0  # how often an idle worker drops runs left unused for idle_s


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _release_memory() -> None:
    """Hand freed heap back to the OS, so RSS shows what is really kept (glibc only)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _read(source: Connection, requests: queue.PriorityQueue) -> None:
    order = itertools.count()
    try:
        while True:
            message = pickle.loads(source.recv_bytes())
            requests.put((PRIORITY[message[0]], next(order), message))
    except (EOFError, OSError):
        requests.put((-1, -1, None))  # the server is gone: stop


def serve(source: Connection, sink: Connection, runs: LiveRuns, budget_mib: float) -> None:
    requests: queue.PriorityQueue = queue.PriorityQueue()
    threading.Thread(target=_read, args=(source, requests), daemon=True).start()
    baseline = None
    while True:
        try:
            message = requests.get(timeout=TRIM_EVERY_S)[2]
        except queue.Empty:
            if runs.trim():
                _release_memory()
            continue
        if message is None:
            return
        kind, req_id, story, step = message
        try:
            if kind == "stats":
                value = {"runs": len(runs), "rss_mib": rss_mib(), "baseline_mib": baseline or 0}
            elif kind == "measured":
                value = runs.measured(story, step)
            else:
                value = runs.check(story, step)
            ok = True
        except Exception as error:  # the page shows it; the worker lives on
            traceback.print_exc()
            value, ok = f"{type(error).__name__}: {error}", False
        if req_id is not None:
            sink.send_bytes(pickle.dumps((req_id, ok, value)))
        if baseline is None and kind != "stats":
            baseline = rss_mib()
        elif baseline is not None and rss_mib() - baseline > budget_mib and runs.trim(
                keep=story, fraction=0.5):
            _release_memory()


def main(argv: list[str]) -> None:
    read_fd, write_fd, max_runs = int(argv[0]), int(argv[1]), int(argv[2])
    idle_s, budget_mib = float(argv[3]), float(argv[4])
    torch.set_num_threads(1)  # tiny tensors: a second thread only waits (see ui/serve.py)
    serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False),
          LiveRuns(max_runs, idle_s), budget_mib)


if __name__ == "__main__":
    main(sys.argv[1:])
