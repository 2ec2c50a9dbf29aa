"""The unknown ending's two servers on one step clock, each the lab's scheduler (see
lab/scenarios/unknown_ending.py for the story and the policy): the contiguous server over
`GuessBackend` (prompt + the guess, grown in place or moved), the paged one over the cache
manager; after each step, what each did (`StepLog`), read from its scheduler and memory, and
the frame a page draws.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.contiguous import Region
from lab.memory.contiguous_kv import Growth, Move
from lab.memory.kernel_check import check_kernel, merge_checks
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.serving.config import step_server
from lab.serving.cost_model import StepClock
from lab.serving.guess_backend import GuessBackend
from lab.serving.request import IterationRecord
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec

SYSTEMS = ("contiguous", "paged")


def request_label(req_id: int) -> str:
    """A request as the captions name it."""
    return f"**R{req_id}**"


_r = request_label


@dataclass(frozen=True)
class StepLog:
    """What one server did at one step (read from its scheduler and memory after the step)."""

    admitted: tuple[int, ...] = ()
    prefilled: tuple[int, ...] = ()  # tokens each admitted request prefilled (more: again)
    finished: tuple[tuple[int, int, int], ...] = ()  # (request, slots it frees, tokens held)
    # (victim, who lacked room or None when the memory does not say, what it lacked)
    preempted: tuple[tuple[int, int | None, str], ...] = ()
    growths: tuple[Growth, ...] = ()  # contiguous: grew in place
    moves: tuple[Move, ...] = ()  # contiguous: moved, its K/V copied
    new_blocks: tuple[tuple[int, int], ...] = ()  # paged: (request, the block its token took)
    waiting: tuple[int, ...] = ()  # after the step, in queue order
    wait_reason: str = ""  # why the head of the queue waits


@dataclass(frozen=True)
class SystemStats:
    """One server after one step, in token slots (x bytes_per_token for bytes)."""

    capacity: int
    used: int  # slots holding a token
    unused: int  # reserved (contiguous) or allocated (paged: last blocks' tails), holding nothing
    running: int
    waiting: int
    finished: int
    moves: int  # so far
    growths: int  # so far, in place
    copied_tokens: int  # so far
    copied_bytes: int
    preemptions: int
    recomputed: int  # tokens computed again after a preemption

    @property
    def unused_pct(self) -> float:
        return 100 * self.unused / self.capacity


@dataclass(frozen=True)
class EndingFrame:
    step: int
    contiguous: SystemStats
    paged: SystemStats
    logs: dict[str, StepLog]
    regions: tuple[Region, ...]  # the contiguous address space after the step
    holes: tuple[tuple[int, int], ...]  # its free runs: (start, size)
    next_reservation: int  # slots the contiguous queue's head needs (0: nobody waits)
    snapshot: Snapshot  # the paged pool
    seq_of_request: dict[int, int]  # paged: request -> sequence id


NOT_AFTER_PREEMPTION = ("is not admitted at a step that preempted (the freed room goes to the "
                        "running requests first)")


class EndingStepper:
    """Both servers, each the lab's scheduler, on one step clock: step s runs each one's
    iteration that starts at s."""

    def __init__(self, pool: PoolConfig, guess: int, requests: tuple[RequestSpec, ...],
                 seed: int, store_kv: bool = False,
                 timings: dict[tuple[int, int], float] | None = None) -> None:
        self.pool = pool
        # (step, request) -> seconds each move's copy took; a live run's replays share one
        self.timings = timings if timings is not None else {}
        self.contiguous = Scheduler(requests, step_server(
            pool, allocator="contiguous", contiguous_guess=guess, compute=store_kv,
            kernel_check=False), StepClock(), seed)
        self.paged = Scheduler(requests, step_server(pool, compute=store_kv, kernel_check=False),
                               StepClock(), seed)
        self.servers = dict(zip(SYSTEMS, (self.contiguous, self.paged)))
        self.memory: GuessBackend = self.contiguous.backend
        self.step = -1
        self.last: dict[str, IterationRecord | None] = dict.fromkeys(SYSTEMS)
        self._seen = {"moves": 0, "growths": 0, "no_room": 0, "finished": 0}
        self._tables: dict[int, tuple[int, ...]] = {}  # paged: each request's blocks, so far

    @property
    def done(self) -> bool:
        return all(s.done for s in self.servers.values())

    def advance(self) -> EndingFrame:
        self.step += 1
        for name, sched in self.servers.items():
            start = sched.next_start()
            self.last[name] = sched.step() if start is not None and start <= self.step else None
        c, p = self.contiguous, self.paged
        picture = c.picture()
        u = picture.usage
        moves = self.memory.cache.moves
        c_stats = SystemStats(u.capacity, u.used, u.internal, len(c.table), len(c.waiting),
                              c.num_finished, len(moves), len(self.memory.cache.growths),
                              sum(m.tokens for m in moves), self.memory.cache.bytes_copied,
                              sum(c.preemptions.values()), c.recomputed_tokens)
        snap = p.picture()
        p_stats = SystemStats(u.capacity, snap.usage.slots_filled, snap.usage.tail_slots,
                              len(p.table), len(p.waiting), p.num_finished, 0, 0, 0, 0,
                              sum(p.preemptions.values()), p.recomputed_tokens)
        seq_of = {r.req_id: r.seq_id for r in p.running()}
        logs = {"contiguous": self._contiguous_log(), "paged": self._paged_log(snap, seq_of)}
        for m in logs["contiguous"].moves:
            if m.seconds is not None:
                self.timings[self.step, m.req_id] = m.seconds
        return EndingFrame(self.step, c_stats, p_stats, logs, picture.regions, u.holes,
                           picture.next_request, snap, seq_of)

    def _new(self, name: str, items: list) -> list:
        """What the contiguous memory added to one of its lists at this step."""
        seen, self._seen[name] = self._seen[name], len(items)
        return items[seen:]

    def _contiguous_log(self) -> StepLog:
        record, m = self.last["contiguous"], self.memory
        # the scheduler preempts once for each growth no hole could hold, in that order
        no_room = self._new("no_room", m.no_room)
        preempted = record.preempted_ids if record else ()
        assert len(no_room) == len(preempted), "a preemption without a failed growth"
        why = tuple((victim, needer, f"{_r(needer)} must grow to {size} slots, and neither "
                     "the slots after it nor any hole has room")
                    for victim, (needer, size) in zip(preempted, no_room))
        finished = tuple((r.req_id, r.reserved, r.used)
                         for r in self._new("finished", m.finished))
        head = self.contiguous.next_in_line()
        reason = ""
        if head is not None:
            u = m.allocator.usage()
            reason = NOT_AFTER_PREEMPTION if preempted else (
                f"needs a hole of {m.reservation(head)} slots, the largest is "
                f"{u.largest_hole} ({u.free} free in all)")
        admitted = record.admitted_ids if record else ()
        return StepLog(admitted, _prefilled(self.contiguous, admitted), finished, why,
                       tuple(self._new("growths", m.cache.growths)),
                       tuple(self._new("moves", m.cache.moves)), (),
                       tuple(r.req_id for r in self.contiguous.waiting), reason)

    def _paged_log(self, snap: Snapshot, seq_of: dict[int, int]) -> StepLog:
        record, sched = self.last["paged"], self.paged
        bs = self.pool.block_size
        admitted = record.admitted_ids if record else ()
        tables = {s.seq_id: s.block_table for s in snap.sequences}
        new_blocks = []
        for req_id, seq_id in seq_of.items():
            table = tables[seq_id]
            if req_id not in admitted:
                new_blocks += [(req_id, b) for b in table[len(self._tables[req_id]):]]
        self._tables = {r: tables[s] for r, s in seq_of.items()}
        finished = []
        for req_id in record.finished_ids if record else ():
            held = sched.requests[req_id].num_computed
            finished.append((req_id, blocks_for(held, bs) * bs, held))
        why = tuple((victim, None, "no free block for a running request's next token")
                    for victim in (record.preempted_ids if record else ()))
        head = sched.next_in_line()
        reason = ""
        if head is not None:
            reason = NOT_AFTER_PREEMPTION if why else (
                f"needs {blocks_for(head.length, bs)} blocks, "
                f"{snap.usage.blocks_free} free")
        return StepLog(admitted, _prefilled(sched, admitted), tuple(finished), why,
                       new_blocks=tuple(new_blocks),
                       waiting=tuple(r.req_id for r in sched.waiting), wait_reason=reason)

    def check_attention(self) -> AttentionCheck | None:
        """Every request running after this step, on both tensors: its newest computed token
        over the K/V where they live now (a moved region at its new place), with the Triton
        kernel, against dense attention over the K/V it wrote (None: nobody runs, or no
        tensors). Run for the step a page shows, not every step (`kernel_check` off): a
        request that finished at this step has given its memory back."""
        checks = []
        running = self.contiguous.running()
        if running and self.memory.kv is not None:
            checks.append(self.memory.check([(r, r.num_computed) for r in running]))
        running, paged = self.paged.running(), self.paged.backend
        if running and paged.kv is not None:
            newest = [r.planned[r.num_computed - 1] for r in running]
            checks.append(check_kernel(paged.manager, [r.seq_id for r in running],
                                       paged.kv.queries(newest),  # [n, heads, head_dim]
                                       context_lens=[r.num_computed for r in running]))
        return merge_checks(checks)

    def measured(self, step: int) -> tuple[int, float]:
        """(moves timed, seconds their copies took) up to `step`, on the real tensor (by any
        stepper of this live run: a replay measures again)."""
        times = [t for (at, _), t in list(self.timings.items()) if at <= step]
        return len(times), sum(times)

    def events(self) -> dict[str, list[dict]]:
        return {name: s.backend.events.as_dicts() for name, s in self.servers.items()}


def _prefilled(sched: Scheduler, admitted: tuple[int, ...]) -> tuple[int, ...]:
    """Tokens each request admitted at this step prefilled (its whole prompt, or after a
    preemption every token it held: no token budget)."""
    return tuple(sched.requests[r].num_computed for r in admitted)
