"""The lab replays vLLM 0.33.0's own outcomes: `python -m lab.vllm.conformance` on every golden
trace of ../shared/conformance/ (the allocator's operations on the lab's KVCacheManager, the v1
Scheduler's steps on the lab's Scheduler, with one KV cache group or the hybrid traces' several;
their READMEs define every field).

The replayer compares every value after every operation or step and names the first
difference; a test alters one expected value of a trace and checks that it is caught there.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.vllm.conformance import check_file, load, main

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT.parent / "shared" / "conformance"
FILES = sorted(p for p in GOLDEN.rglob("*.json*")) if GOLDEN.is_dir() else []
ABSENT = pytest.mark.skipif(not GOLDEN.is_dir(), reason=f"no golden traces: {GOLDEN} is absent "
                            "(the shared folder beside the repository)")


@pytest.mark.parametrize("path", FILES or [pytest.param(None, marks=ABSENT)],
                         ids=lambda p: str(p.relative_to(GOLDEN)) if p else "none")
def test_replay_matches_vllm(path: Path):
    ok, line = check_file(path)
    assert ok, line
    assert "identical" in line and "s CPU" in line


@ABSENT
def test_an_altered_value_fails_at_its_step(tmp_path: Path):
    data = load(GOLDEN / "scheduler" / "tiny.json")
    step = next(s for s in data["steps"] if s["step"] == 5)
    step["scheduled"][1]["computed"] = 4  # vLLM resumed request 2 with a hit of 8
    altered = tmp_path / "tiny_altered.json.gz"
    with gzip.open(altered, "wt") as f:
        json.dump(data, f)
    ok, line = check_file(altered)
    assert not ok
    assert "step 5, request 2, field 'computed': lab 8, vLLM 4" in line, line
    assert main([str(GOLDEN / "scheduler" / "tiny.json"), str(altered)]) == 1
    assert main([str(GOLDEN / "scheduler" / "tiny.json")]) == 0


@ABSENT
def test_an_altered_null_entry_fails_at_its_step(tmp_path: Path):
    data = load(GOLDEN / "hybrid" / "tiny_swa.json")
    step = next(s for s in data["steps"] if s["step"] == 1)
    assert step["tables"]["0"][1][0] == -1  # the window of 8 has left block 3 behind
    step["tables"]["0"][1][0] = 3
    altered = tmp_path / "tiny_swa_altered.json"
    altered.write_text(json.dumps(data))
    ok, line = check_file(altered)
    assert not ok
    assert "step 1, field 'tables': lab {'0': [[0, 1, 2, 6, 7, 8], [-1, 4," in line, line


@ABSENT
def test_the_command_prints_one_line_per_file_and_exits_by_them(tmp_path: Path):
    allocator = GOLDEN / "small.json"
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    run = subprocess.run([sys.executable, "-m", "lab.vllm.conformance", str(allocator),
                          str(broken)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stderr
    assert lines[0].startswith("small.json: identical, 45 steps checked, replay ")
    assert lines[1].startswith("broken.json: cannot read it")
