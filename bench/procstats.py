"""What a process tree and the machine use, read from /proc (Linux), for bench/load.py."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (the server and its worker processes)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
    return out


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class ServerProcess:
    """The server's process trees (one per replica, workers included): CPU over a window,
    RSS now."""

    def __init__(self, pids: list[int] | None = None) -> None:
        self.pids = list(pids or [])
        self._cpu: dict[int, float] = {}
        self._rss = 0.0

    def attach(self, process) -> None:
        self.pids.append(process.pid)

    def processes(self) -> list[int]:
        return [p for pid in self.pids for p in _tree(pid)]

    def rss_mib(self) -> float:
        return sum(_rss_mib(p) for p in self.processes())

    def mark(self) -> None:
        self._cpu = {p: _cpu_s(p) for p in self.processes()}
        self._rss = self.rss_mib()

    def since_mark(self, window_s: float) -> dict:
        """cores: CPU seconds per second since mark(), counting processes started since."""
        busy = sum(_cpu_s(p) - self._cpu.get(p, 0.0) for p in self.processes())
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg()[:1])
        return {"cores": busy / window_s, "rss_start": self._rss, "rss_end": self.rss_mib(),
                "load": load}


class Machine:
    """How busy every CPU of the machine was since this object was made (all users)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    def busy_since(self) -> float:
        total, idle = self._read()
        dt = total - self._start[0]
        return 1 - (idle - self._start[1]) / dt if dt else 0.0
