"""Kernel checks kept per story (lab/scenarios/live_runs.py) and run in worker processes
(lab/scenarios/live_workers.py): the same verdicts as in this process, bounded memory, and a
page that never waits forever on a worker that died or is busy."""

from __future__ import annotations

import os
import pickle
import signal
import time

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.admission_control import AdmissionControlStory
from lab.scenarios.attention import AttentionConfig, AttentionStory
from lab.scenarios.block_tables import BlockTablesStory, WalkParams
from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory
from lab.scenarios.fragmentation import FragConfig, FragmentationStory
from lab.scenarios.live_runs import LiveRuns
from lab.scenarios.live_workers import (
    WORKERS_ENV,
    CheckFailed,
    CheckTimeout,
    LiveWorkers,
    live_checks,
)
from lab.scenarios.prefix_cache import PrefixCacheStory, PrefixConfig
from lab.scenarios.unknown_ending import EndingConfig, UnknownEndingStory
from lab.serving.workloads import from_preset
from tests.scheduler_helpers import config, llama_h100

SMALL_ENDING = EndingConfig(PoolConfig(num_blocks=16, block_size=16, num_kv_heads=2, head_dim=32),
                            guess=4, num_requests=4, max_output=60)  # moves something


def walk(seed: int) -> BlockTablesStory:
    return BlockTablesStory(WalkParams(output_len=6), seed)


@pytest.fixture(scope="module")
def workers():
    pool = LiveWorkers(1, max_runs=2, timeout_s=60)
    yield pool
    pool.close()


def test_everyone_stepping_a_story_shares_its_run_and_checks() -> None:
    runs = LiveRuns()
    assert runs.run(walk(1)) is runs.run(walk(1))
    first = runs.check(walk(1), 3)
    assert first is runs.check(walk(1), 3)  # kept: nobody replays it again
    assert first.max_abs_error == walk(1).live().check(3).max_abs_error
    assert runs.run(walk(2)) is not runs.run(walk(1))


def test_in_this_process_a_check_not_kept_yet_says_so_at_once() -> None:
    runs = LiveRuns()
    with pytest.raises(CheckTimeout):  # the page shows a spinner, then asks without a timeout
        runs.check(walk(1), 2, timeout_s=0.25)
    runs.prefetch(walk(1), 3)  # in a background thread, a moment later
    first = runs.check(walk(1), 2)
    assert runs.check(walk(1), 2, timeout_s=0.25) is first
    deadline = time.monotonic() + 60
    while not runs.run(walk(1)).kept(3):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_runs_are_bounded_by_count_and_idle_time() -> None:
    runs = LiveRuns(max_runs=2, idle_s=60)
    for seed in (1, 2, 3):
        runs.run(walk(seed))
    assert len(runs) == 2 and walk(1) not in runs._runs  # the least recently used went
    assert runs.trim(keep=walk(3), fraction=0.5) == 1 and len(runs) == 1
    runs.idle_s = 0.0
    runs.run(walk(4))
    time.sleep(0.01)
    assert runs.trim() == 1 and len(runs) == 0  # left unused for idle_s: dropped


def test_every_page_story_travels_to_a_worker() -> None:
    stories = [walk(1), AttentionStory(AttentionConfig(), 2), FragmentationStory(FragConfig(), 3),
               CopyOnWriteStory(BranchConfig(), 4), PrefixCacheStory(PrefixConfig(), 5),
               AdmissionControlStory(config(), from_preset("alpaca", 4, seed=0, max_tokens=64),
                                     llama_h100(), 6), UnknownEndingStory(SMALL_ENDING, 7)]
    for story in stories:
        copy = pickle.loads(pickle.dumps(story))
        assert copy == story and hash(copy) == hash(story)  # the same key in the worker


def test_a_worker_gives_the_same_verdict_as_this_process(workers) -> None:
    story = walk(5)
    check = workers.check(story, 4)
    here = LiveRuns().check(story, 4)
    assert check.ok and check.num_seqs == here.num_seqs
    assert check.max_abs_error == here.max_abs_error
    assert check.output.device.type == "cpu" and check.output.equal(here.output)
    workers.prefetch(story, 5)  # no answer; the check after it is served from the kept run
    assert workers.check(story, 5).max_abs_error == LiveRuns().check(story, 5).max_abs_error
    assert workers.check(walk(0), 0) is None  # step 0: the pool is empty, nothing attends


def test_what_a_play_measured_comes_back_from_the_worker_that_played_it(workers) -> None:
    story = UnknownEndingStory(SMALL_ENDING, 1)
    moved = [f.step for f in story.frames() if f.logs["contiguous"].moves]
    last = len(story.frames()) - 1
    timed, seconds = workers.measured(story, last)
    assert timed == len(moved) > 0 and seconds > 0  # every move's copy, timed in the worker
    assert workers.measured(story, moved[0] - 1) == (0, 0)
    assert LiveRuns().measured(story, last)[0] == timed  # the same moves in this process
    assert workers.measured(walk(5), 3) is None  # a stepper that times nothing


def test_a_worker_keeps_at_most_max_runs(workers) -> None:
    for seed in (11, 12, 13):
        workers.check(walk(seed), 1)
    assert [s["runs"] for s in workers.stats()] == [2]


def test_an_error_in_the_worker_reaches_the_page_and_the_worker_lives_on(workers) -> None:
    with pytest.raises(CheckFailed, match="step must be 0 or more"):
        workers.check(walk(1), -1)
    assert workers.check(walk(1), 2).ok


def test_a_dead_worker_is_replaced_and_the_check_retried(workers) -> None:
    story = walk(6)
    workers.check(story, 1)
    os.kill(workers._workers[0].process.pid, signal.SIGKILL)
    time.sleep(0.2)
    assert workers.check(story, 2).ok
    assert workers.replaced == 1


def test_a_slow_check_times_out_instead_of_holding_the_page(workers) -> None:
    impatient = LiveWorkers(1, timeout_s=0.001)  # not even started yet
    try:
        with pytest.raises(CheckTimeout):
            impatient.check(walk(7), 3)
        impatient.timeout_s = 60
        assert impatient.check(walk(7), 3).ok  # it went on in the worker
    finally:
        impatient.close()


def test_without_workers_the_checks_run_in_this_process(monkeypatch) -> None:
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert isinstance(live_checks.__wrapped__(), LiveRuns)
    monkeypatch.setenv(WORKERS_ENV, "0")
    assert isinstance(live_checks.__wrapped__(), LiveRuns)
