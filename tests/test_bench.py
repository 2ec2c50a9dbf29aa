"""Every benchmark runs, at a tiny size: a benchmark that no longer runs measures nothing (the
scheduler's once broke on a moved import and nobody noticed). The numbers are not checked here:
bench/RESULTS.md holds them, measured at full size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "scheduler.py": ["--requests", "40"],
    "allocator.py": ["--requests", "40", "--rounds", "1", "--kv-requests", "2"],
    "kernel.py": ["--reps", "1", "--warmup", "0"],
    "model.py": ["--tokens", "2", "--batches", "1", "--rounds", "1"],
}


@pytest.mark.parametrize("script", sorted(TINY))
def test_the_benchmark_runs_and_prints_its_table(script: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *TINY[script]],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.splitlines()) >= 3, done.stdout  # a header and its rows


@pytest.mark.browser
def test_the_ui_benchmark_runs(tmp_path: Path) -> None:
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("the UI benchmark drives Debian's chromium")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "ui.py"), "--clicks", "1",
                           "--think", "0", "--pages", "block_tables"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "block_tables" in done.stdout
