"""Kernel checks in worker processes, so that many sessions' checks run side by side.

Without CUDA the Triton kernels run in Triton's interpreter, which patches `triton.language`
for its whole process: within one process, kernel launches take turns
(kernels/backend.py: kernel_launch), and they hold Python's GIL, so one server process checks
one session's step at a time while the others' pages wait. `LiveWorkers` runs the checks in
`count` worker processes instead, each with its own interpreter, lock and GIL, each keeping
the LiveRuns of its stories (lab/scenarios/live_runs.py). A story always goes to the same
worker (by its hash), so its run stays warm there and everyone stepping it shares it.

Robust by construction: a worker that dies is replaced on the next request (a check in flight
is retried once on the new one); a check that takes longer than `timeout_s` raises
`CheckTimeout` instead of holding the page (the worker finishes it and keeps the result for
the next ask; asking again meanwhile waits for the same answer); prefetches are sent at once
and wait, in the worker, behind every check a page is waiting for. Messages are plain
pickles over two pipes per worker; tensors come back as CPU tensors.

`live_checks()` is the process-wide choice: PAGED_LAB_LIVE_WORKERS worker processes, or
LiveRuns in this process when it is 0 or unset (tests, notebooks). `python -m ui.serve` sets
it (ui/serve.py).
"""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import cache
from multiprocessing.connection import Connection
from pathlib import Path

from kernels.reference import AttentionCheck
from lab.scenarios.live_runs import CheckTimeout, LiveChecks, LiveRuns
from lab.scenarios.story import Story

ROOT = Path(__file__).resolve().parents[2]
WORKERS_ENV = "PAGED_LAB_LIVE_WORKERS"


class WorkerLost(RuntimeError):
    """The worker process died (or its pipe broke) before it answered."""


class CheckFailed(RuntimeError):
    """The check raised in the worker (the message names the error)."""


class _Worker:
    """One worker process and the requests it has not answered yet."""

    def __init__(self, max_runs: int, idle_s: float, budget_mib: float) -> None:
        worker_reads, server_writes = os.pipe()
        server_reads, worker_writes = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lab.scenarios.live_worker", str(worker_reads),
             str(worker_writes), str(max_runs), str(idle_s), str(budget_mib)],
            pass_fds=(worker_reads, worker_writes), cwd=ROOT)
        os.close(worker_reads)
        os.close(worker_writes)
        self._out = Connection(server_writes, readable=False)
        self._in = Connection(server_reads, writable=False)
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.lost = False
        threading.Thread(target=self._read, name="live-worker-reader", daemon=True).start()

    def submit(self, kind: str, story: Story | None = None, step: int = 0,
               reply: bool = True) -> Future | None:
        with self._lock:
            if self.lost:
                raise WorkerLost(f"worker {self.process.pid} is gone")
            req_id = future = None
            if reply:
                req_id, future = next(self._ids), Future()
                self._pending[req_id] = future
            try:
                self._out.send_bytes(pickle.dumps((kind, req_id, story, step)))
            except OSError as error:
                self._pending.pop(req_id, None)
                self._lose()
                raise WorkerLost(f"worker {self.process.pid}: {error}") from error
        return future

    def _read(self) -> None:
        try:
            while True:
                req_id, ok, value = pickle.loads(self._in.recv_bytes())
                with self._lock:
                    future = self._pending.pop(req_id, None)
                if future is None:
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(CheckFailed(value))
        except (EOFError, OSError):
            pass
        with self._lock:
            self._lose()

    def _lose(self) -> None:
        """Under the lock: mark the worker gone and fail whoever waits on it."""
        self.lost = True
        for future in self._pending.values():
            future.set_exception(WorkerLost(f"worker {self.process.pid} exited"))
        self._pending.clear()
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        self.lost = True
        self._out.close()  # the worker reads EOF and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LiveWorkers:
    """`count` worker processes behind the LiveChecks interface."""

    def __init__(self, count: int, *, timeout_s: float = 30.0, max_runs: int = 64,
                 idle_s: float = 600.0, budget_mib: float = 512.0) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        self.timeout_s = timeout_s
        self._settings = (max_runs, idle_s, budget_mib)
        self._lock = threading.Lock()
        self._workers = [_Worker(*self._settings) for _ in range(count)]  # start them now
        self._asked: dict[tuple[Story, int], Future] = {}  # checks in flight, asked once
        self.replaced = 0

    def _worker(self, story: Story) -> _Worker:
        slot = hash(story) % len(self._workers)
        with self._lock:
            old = self._workers[slot]
            if old.lost or old.process.poll() is not None:
                old.close()
                self._workers[slot] = _Worker(*self._settings)
                self.replaced += 1
            return self._workers[slot]

    def check(self, story: Story, step: int,
              timeout_s: float | None = None) -> AttentionCheck | None:
        return self._twice(lambda: self._ask(story, step), timeout_s)

    def measured(self, story: Story, step: int,
                 timeout_s: float | None = None) -> tuple | None:
        return self._twice(lambda: self._worker(story).submit("measured", story, step),
                           timeout_s)

    def _twice(self, ask: Callable[[], Future], timeout_s: float | None):
        """ask()'s answer within timeout_s (default self.timeout_s); if the worker died before
        answering, once more, on the worker replacing it."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            return _answer(ask(), wait_s)
        except WorkerLost:
            return _answer(ask(), wait_s)

    def _ask(self, story: Story, step: int) -> Future:
        """The answer to (story, step): the request already in flight, or a new one."""
        key = (story, step)
        with self._lock:
            future = self._asked.get(key)
        if future is None or (future.done() and future.exception() is not None):
            future = self._worker(story).submit("check", story, step)
            with self._lock:
                self._asked[key] = future
            future.add_done_callback(lambda _: self._forget(key, future))
        return future

    def _forget(self, key: tuple[Story, int], future: Future) -> None:
        with self._lock:
            if self._asked.get(key) is future:
                del self._asked[key]

    def prefetch(self, story: Story, step: int) -> None:
        try:
            self._worker(story).submit("prefetch", story, step, reply=False)
        except WorkerLost:
            pass  # only a head start: the check itself will ask again

    def stats(self) -> list[dict]:
        """Each worker's pid, kept runs and RSS (what tests and benchmarks look at)."""
        return [w.submit("stats").result(self.timeout_s) for w in self._workers]

    def close(self) -> None:
        for worker in self._workers:
            worker.close()


def _answer(future: Future, wait_s: float) -> AttentionCheck | None:
    try:
        return future.result(wait_s)
    except FutureTimeout:
        raise CheckTimeout(f"the kernel check took more than {wait_s:g} s") from None


@cache
def live_checks() -> LiveChecks:
    """The process's checks: PAGED_LAB_LIVE_WORKERS worker processes, or in this process."""
    count = int(os.environ.get(WORKERS_ENV) or 0)
    return LiveWorkers(count) if count > 0 else LiveRuns()
