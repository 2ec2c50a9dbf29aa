"""The guessing contiguous backend under the lab's scheduler: prompt + the guess reserved, growth
in place when the next slots are free, a move (its K/V really copied) when they are not, and a
preemption when no hole holds the doubled region; its invariants after every iteration."""

from __future__ import annotations

import pytest

from lab.memory.contiguous_kv import Growth, Move
from lab.memory.kv_pool import PoolConfig
from lab.serving.config import SchedulerConfig, step_server
from lab.serving.cost_model import StepClock
from lab.serving.guess_backend import GuessBackend
from lab.serving.request import IterationRecord
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec

POOL = PoolConfig(num_blocks=4, block_size=16, num_kv_heads=2, head_dim=8)  # 64 slots
BYTES_PER_TOKEN = 128  # K and V: 2 x 1 layer x 2 KV heads x 8 dims x 4 bytes


def serve(guess: int, *requests: tuple[int, int, float],
          compute: bool = False) -> tuple[Scheduler, list[IterationRecord]]:
    """(prompt, output, arrival step) each, served to the end on a step clock, the invariants
    checked after every iteration."""
    specs = tuple(RequestSpec(i, p, o, a) for i, (p, o, a) in enumerate(requests))
    sched = Scheduler(specs, step_server(POOL, allocator="contiguous", contiguous_guess=guess,
                                         compute=compute), StepClock(), seed=3)
    records = []
    while (record := sched.step()) is not None:
        sched.check_invariants()
        records.append(record)
    assert sched.num_finished == len(specs)
    return sched, records


def test_it_reserves_prompt_plus_the_guess_and_grows_in_place_when_the_next_slots_are_free():
    sched, _ = serve(4, (6, 20, 0))  # alone: every growth finds the slots after it free
    backend = sched.backend
    assert isinstance(backend, GuessBackend)
    # 6 + 4 = 10 slots, then prompt + 2 x the output reservation: 14, 22, 38 (holds 6 + 19)
    assert backend.cache.growths == [Growth(0, 0, 10, 14), Growth(0, 0, 14, 22),
                                     Growth(0, 0, 22, 38)]
    assert backend.cache.moves == [] and backend.no_room == []
    assert [(r.reserved, r.used) for r in backend.finished] == [(38, 25)]  # last K/V unstored


@pytest.mark.parametrize("compute", [False, True])
def test_a_full_region_with_a_neighbour_moves_and_its_kv_is_copied(compute: bool) -> None:
    """A (prompt 4) at 0-5 and B (prompt 4) at 6-11, guess 2: A fills its 6 slots first and B
    sits right after it, so A moves to a region of 4 + 2 x 2 = 8 slots at 12, its 6 tokens'
    K/V copied; the kernel then reads A at its new place."""
    sched, records = serve(2, (4, 8, 0), (4, 5, 0), compute=compute)
    move = sched.backend.cache.moves[0]
    assert (move.req_id, move.src, move.dst, move.old_size, move.new_size, move.tokens) == (
        0, 0, 12, 6, 8, 6)
    assert move.nbytes == 6 * BYTES_PER_TOKEN
    assert (move.seconds is not None and move.seconds > 0) if compute else move.seconds is None
    assert sum(isinstance(m, Move) for m in sched.backend.cache.moves) == len(
        [e for e in sched.backend.events.events if e.kind == "copy"])
    if compute:
        checks = [r.check for r in records if r.check is not None]
        assert checks and all(c.ok for c in checks)  # every iteration, moved region included


def test_when_no_hole_holds_the_grown_region_the_newest_request_is_preempted() -> None:
    """A (prompt 20 + guess 4) at 0-23, B (prompt 30 + 4) at 24-57: A fills 24 slots, wants
    28; nothing is free after it and the hole at the end holds 6, so B is preempted and A grows
    in place into B's slots. B comes back later, its tokens computed again."""
    sched, records = serve(4, (20, 10, 0), (30, 10, 0))
    backend = sched.backend
    preempting = next(r for r in records if r.preempted_ids)
    assert preempting.preempted_ids == (1,) and preempting.admitted_ids == ()
    assert backend.no_room[0] == (0, 28)
    assert backend.cache.growths[0] == Growth(0, 0, 24, 28)
    assert sched.requests[1].num_preemptions >= 1 and sched.recomputed_tokens > 0


def test_a_request_alone_that_cannot_grow_preempts_itself_and_comes_back() -> None:
    """A (prompt 24 + guess 8) at 0-31 finishes at once; B (prompt 22 + 8) at 32-61 fills its
    30 slots alone: it needs 22 + 16 = 38, the 2 slots after it and the 32-slot hole before
    it are too small, so it preempts itself (an iteration that runs nothing) and is
    re-admitted with the 38 slots at 0."""
    sched, records = serve(8, (24, 2, 0), (22, 20, 0))
    empty = next(r for r in records if r.preempted_ids)
    assert empty.preempted_ids == (1,) and empty.num_seqs == 0
    after = records[records.index(empty) + 1]
    assert after.admitted_ids == (1,)
    assert sched.backend.no_room == [(1, 38)]


def test_a_guess_is_for_the_contiguous_allocator_only() -> None:
    with pytest.raises(ValueError, match="contiguous_guess"):
        SchedulerConfig(contiguous_guess=16)
    with pytest.raises(ValueError, match="contiguous_guess"):
        SchedulerConfig(allocator="contiguous", contiguous_guess=0)
