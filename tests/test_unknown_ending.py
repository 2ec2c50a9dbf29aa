"""The unknown-ending story: one workload, a contiguous server that guesses and a paged one,
both failure modes of the guess, the live run on the real tensors, captions and trace."""

from __future__ import annotations

import json

import pytest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.story import LiveRun
from lab.scenarios.unknown_ending import EndingConfig, UnknownEndingStory, make_workload
from lab.serving.guess_backend import GuessBackend
from lab.serving.scheduler import Scheduler

# A small run for the live tests: 4 requests, 256 slots, outputs up to 60 tokens.
SMALL = EndingConfig(PoolConfig(num_blocks=16, block_size=16, num_kv_heads=2, head_dim=32),
                     guess=4, num_requests=4, max_output=60)


def story(guess: int) -> UnknownEndingStory:
    return UnknownEndingStory(EndingConfig(guess=guess), 0)


def test_the_workload_has_short_and_much_longer_requests() -> None:
    for seed in range(5):
        requests = make_workload(EndingConfig(), seed)
        outputs = sorted(r.output_len for r in requests)
        assert outputs[-1] >= 100 and outputs[0] <= 25  # some much longer than others
        assert all(r.total_len <= EndingConfig().capacity for r in requests)
    assert make_workload(EndingConfig(), 3) == make_workload(EndingConfig(), 3)


def test_guess_low_moves_long_requests_and_guess_high_makes_them_wait() -> None:
    low, high = story(16), story(200)
    low_frames, high_frames = low.frames(), high.frames()
    end_low, end_high = low_frames[-1], high_frames[-1]
    assert end_low.contiguous.moves > 0 and end_low.contiguous.copied_bytes > 0
    assert end_low.contiguous.copied_bytes == (end_low.contiguous.copied_tokens
                                               * EndingConfig().pool.bytes_per_token)
    assert end_high.contiguous.moves == end_high.contiguous.growths == 0
    # Guessing high: much more reserved and unused, and requests wait that paging admits.
    assert max(f.contiguous.unused_pct for f in high_frames) > 40
    assert max(f.contiguous.waiting for f in high_frames) >= 3
    assert max(f.paged.waiting for f in high_frames) == 0
    assert len(high_frames) > len(low_frames)  # serving them takes longer
    for frames in (low_frames, high_frames):  # everyone finishes, on both servers
        assert frames[-1].contiguous.finished == frames[-1].paged.finished == 8
        assert all(f.paged.moves == f.paged.copied_bytes == 0 for f in frames)


def test_both_servers_are_the_lab_scheduler_and_a_request_stores_all_but_its_last_token():
    s = story(16)
    stepper = s.stepper()
    assert isinstance(stepper.contiguous, Scheduler) and isinstance(stepper.paged, Scheduler)
    assert isinstance(stepper.memory, GuessBackend)
    specs = {r.req_id: r for r in s.requests()}
    frames = s.frames()
    for name in ("contiguous", "paged"):
        finished = [f for frame in frames for f in frame.logs[name].finished]
        assert sorted(r for r, *_ in finished) == sorted(specs)
        # vLLM's model: the prefill emits the first output token; the last one's K/V is
        # never computed (nothing attends to it)
        assert all(held == specs[r].total_len - 1 for r, _, held in finished)


def test_the_paged_run_does_not_depend_on_the_guess() -> None:
    low, high = story(16).frames(), story(200).frames()
    for a, b in zip(low, high):
        assert (a.paged, a.logs["paged"]) == (b.paged, b.logs["paged"])


def test_moves_of_the_longest_request_and_where_it_first_grows() -> None:
    s = story(16)
    frames = s.frames()
    longest = s.longest()
    moves, growths = s.moves_of(frames, longest.req_id), s.growths_of(frames, longest.req_id)
    assert moves or growths
    first = s.first_growth(frames, longest.req_id)
    log = frames[first].logs["contiguous"]
    assert any(g.req_id == longest.req_id for g in (*log.moves, *log.growths))
    high = story(200)
    high_frames = high.frames()
    assert high.moves_of(high_frames, longest.req_id) == ()
    assert any(r == longest.req_id
               for r, *_ in high_frames[high.first_growth(high_frames, longest.req_id)]
               .logs["contiguous"].finished)


def test_captions_say_what_moved_how_many_bytes_and_what_waits() -> None:
    s = story(16)
    frames = s.frames()
    moved = next(f for f in frames if f.logs["contiguous"].moves)
    move = moved.logs["contiguous"].moves[0]
    text = " ".join(s.caption(moved))
    assert f"**R{move.req_id}**" in text and "**moves**" in text
    assert f"**{move.nbytes:,} bytes**" in text and f"slot {move.dst}" in text
    high = story(200)
    waiting = next(f for f in high.frames() if f.logs["contiguous"].waiting)
    assert "wait" in " ".join(high.caption(waiting)) and "needs a hole of" in " ".join(
        high.caption(waiting))


def test_the_trace_records_each_move_as_a_copy() -> None:
    s = story(16)
    frames = s.frames()
    trace = json.loads(s.trace(len(frames) - 1))
    copies = [e for e in trace["contiguous"] if e["kind"] == "copy"]
    assert len(copies) == frames[-1].contiguous.moves
    assert all(e["detail"]["reason"] == "move" for e in copies)
    assert trace["meta"]["params"]["guess"] == 16


@pytest.fixture(scope="module")
def small_live() -> tuple[UnknownEndingStory, tuple, LiveRun]:
    s = UnknownEndingStory(SMALL, 1)
    return s, s.frames(), s.live()


def test_the_live_run_makes_the_same_decisions_on_the_real_tensors(small_live) -> None:
    s, frames, live = small_live
    moved_at = [f.step for f in frames if f.logs["contiguous"].moves]
    assert moved_at, "the small run should move something"
    stepper = live.at(len(frames) - 1)
    live_moves = stepper.memory.cache.moves
    assert [(m.req_id, m.src, m.dst, m.tokens) for m in live_moves] == [
        (m.req_id, m.src, m.dst, m.tokens) for f in frames for m in f.logs["contiguous"].moves]
    assert all(m.seconds is not None and m.seconds > 0 for m in live_moves)
    timed, seconds = stepper.measured(len(frames) - 1)
    assert timed == len(live_moves) and seconds > 0
    assert stepper.measured(moved_at[0] - 1) == (0, 0)


def test_the_kernel_check_at_a_move_reads_the_moved_request(small_live) -> None:
    s, frames, live = small_live
    step = next(f.step for f in frames if f.logs["contiguous"].moves)
    frame = frames[step]
    check = live.check(step)
    assert check is not None and check.ok
    # every request still running, on both servers (a request that finished at this step
    # has given its memory back: the check runs for the step shown, not every step)
    assert check.num_seqs == frame.contiguous.running + frame.paged.running
    moved = frame.logs["contiguous"].moves[0].req_id
    assert moved in [r.req_id for r in live.at(step).contiguous.running()]  # at its new place
    assert live.check(0).ok


def test_going_back_replays_the_same_check(small_live) -> None:
    s, frames, live = small_live
    later = live.check(len(frames) // 2)
    rebuilt = LiveRun(s, lambda: s.stepper(store_kv=True))
    assert rebuilt.check(len(frames) // 2).max_abs_error == later.max_abs_error


def test_settings_that_cannot_run_say_why() -> None:
    with pytest.raises(ValueError, match="holds only 200 slots"):
        EndingConfig(PoolConfig(num_blocks=25, block_size=8), max_output=200)
    with pytest.raises(ValueError, match="guess"):
        EndingConfig(guess=0)
