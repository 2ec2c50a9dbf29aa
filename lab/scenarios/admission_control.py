"""Admission control: a continuous-batching scheduler on the block pool, step by step.

The story is one workload on the lab's scheduler (lab/serving/scheduler.py) with the page's
settings, under vLLM V1 (0.33) or the paper's V0 (2023); a frame is the state after one step:
the record (batch, budget, decisions), the step's entries (who got how many tokens and which
new blocks), the memory picture (every block of the paged pool, or the contiguous regions) and
the queues. Played on the real pool (compute mode), every step writes real K/V and runs the
Triton kernel over its batch, checked against dense attention.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.contiguous import ContiguousPicture
from lab.memory.snapshot import Snapshot
from lab.scenarios.story import MAX_STEPS, Story
from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import Cost
from lab.serving.request import IterationRecord, Request, ScheduledEntry, StepDetail
from lab.serving.scheduler import Scheduler
from lab.serving.workloads import RequestSpec


@dataclass(frozen=True)
class IterationFrame:
    """The state after one iteration, for the step-through view."""

    record: IterationRecord
    clock_s: float
    picture: Snapshot | ContiguousPicture
    names: dict[int, str]  # paged: sequence id -> "R<request>"
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    running_ids: tuple[int, ...]  # the running requests, in the scheduler's serving order
    swapped: tuple[str, ...]
    finished: int
    rejected: tuple[str, ...]
    preemptions: int
    detail: StepDetail  # the step's entries: kinds, tokens, new blocks, preemptions, lookups
    new_blocks: tuple[int, ...]  # blocks allocated in this step (a chunk's blocks with it)
    own_hits: dict[int, tuple[int, ...]]  # re-admitted request -> its own old blocks it hit


def _progress_text(req: Request) -> str:
    if req.num_output == 0 or req.num_computed < req.length - 1:
        return f"R{req.req_id} prefill {req.num_computed}/{req.length}"
    return f"R{req.req_id} decode {req.num_output}/{req.spec.output_len}"


class SchedulerStepper:
    """The scheduler advanced one iteration per step, each iteration's picture kept.

    It runs one iteration ahead: only running the next iteration tells whether there is one
    (the requests still to arrive may all be rejected)."""

    def __init__(self, requests: tuple[RequestSpec, ...], cfg: SchedulerConfig, cost: Cost,
                 seed: int) -> None:
        self.sched = Scheduler(requests, cfg, cost, seed, detail=True)
        self.record: IterationRecord | None = None
        self.step = -1
        self._next = self._iterate()

    @property
    def done(self) -> bool:
        return self._next is None or self.step + 1 >= MAX_STEPS

    def advance(self) -> IterationFrame:
        if self._next is None:
            raise ValueError("the workload is served: there is no next iteration")
        frame, self.step = self._next, self.step + 1
        self.record = frame.record
        self._next = self._iterate() if self.step + 1 < MAX_STEPS else None
        return frame

    def _iterate(self) -> IterationFrame | None:
        s = self.sched
        record = s.step()
        if record is None:
            return None
        running = s.running()
        detail = s.detail
        bs = s.backend.block_size or 1
        own, new = {}, []
        for e in detail.scheduled:
            hits = 0 if e.kind == "running" else e.computed // bs  # taken, not allocated
            blocks = e.new_blocks[0] if e.new_blocks else []  # one full-attention group here
            new += blocks[hits:]
            if e.kind == "resumed" and hits:
                hit = set(blocks[:hits])
                own[e.req_id] = tuple(b for b in s.requests[e.req_id].released_table if b in hit)
        return IterationFrame(
            record, s.clock, s.picture(), {r.seq_id: f"R{r.req_id}" for r in running},
            tuple(f"R{r.req_id}" for r in s.waiting), tuple(_progress_text(r) for r in running),
            tuple(r.req_id for r in running), tuple(f"R{r.req_id}" for r in s.swapped),
            s.num_finished,
            tuple(f"R{r.req_id}: {r.reject_reason}" for r in s.requests.values()
                  if r.reject_reason), sum(s.preemptions.values()), detail,
            tuple(new), {r: b for r, b in own.items() if b})

    def check_attention(self) -> AttentionCheck | None:
        return self.record.check if self.record is not None else None

    def events(self) -> dict[str, list[dict]]:
        backend = self.sched.backend  # (the iteration run ahead is left out)
        return {backend.name: [e for e in backend.events.as_dicts() if e["step"] <= self.step]}


@dataclass(frozen=True)
class AdmissionControlStory(Story[IterationFrame]):
    """The first MAX_STEPS iterations of a workload (a page says when it stops there)."""

    page = "scheduler"
    config: SchedulerConfig
    requests: tuple[RequestSpec, ...]
    cost: Cost
    seed: int

    def stepper(self, store_kv: bool = False) -> SchedulerStepper:
        return SchedulerStepper(self.requests, replace(self.config, compute=store_kv), self.cost,
                             self.seed)

    def caption(self, frame: IterationFrame) -> list[str]:
        return list(frame.record.decisions)


@dataclass(frozen=True)
class Preemption:
    """The first preemption at or after a step: what a learner can predict the step before."""

    step: int  # the frame whose iteration preempts
    victim: int  # the first request it preempted
    candidates: tuple[int, ...]  # the requests running before that iteration
    decision: str  # the scheduler's own line about it


def next_preemption(frames: list[IterationFrame], step: int) -> Preemption | None:
    """The first iteration at or after `step` (and after the first) that preempts a request
    running before it."""
    for k in range(max(step, 1), len(frames)):
        record = frames[k].record
        before = frames[k - 1].running_ids
        victims = [i for i in record.preempted_ids if i in before]
        if victims:
            line = next((d for d in record.decisions if f"request {victims[0]} preempted" in d),
                        "")
            return Preemption(k, victims[0], before, line)
    return None


@dataclass(frozen=True)
class ChunkedAdmission:
    """The first admission whose prefill is chunked: what a learner can predict before it."""

    step: int  # the frame whose step admits it
    req_id: int
    length: int  # tokens it holds (its prompt, or prompt + outputs after a preemption)
    hit: int  # of those, found in the prefix cache
    chunk: int  # tokens scheduled in that step
    blocks: int  # blocks it holds after the step
    whole: int  # blocks its whole sequence needs (checked to fit at admission)


def first_chunked_admission(frames: list[IterationFrame], block_size: int
                            ) -> ChunkedAdmission | None:
    for k, frame in enumerate(frames):
        chunked = _chunked_admissions(frame)
        if chunked:
            e, length = chunked[0]
            return ChunkedAdmission(k, e.req_id, length, e.computed, e.tokens,
                                    len(e.new_blocks[0]), blocks_for(length, block_size))
    return None


def _chunked_admissions(frame: IterationFrame) -> list[tuple[ScheduledEntry, int]]:
    """The step's admissions whose prefill is chunked, each with the tokens it holds."""
    found = []
    for e in frame.detail.scheduled:
        if e.kind == "running" or not e.new_blocks:
            continue
        length = next(n for r, n, _ in frame.detail.lookups if r == e.req_id)
        if e.computed + e.tokens < length:
            found.append((e, length))
    return found


def first_own_hit(frames: list[IterationFrame]) -> tuple[int, int, tuple[int, ...]] | None:
    """(step, request, its own blocks it hit) of the first re-admission that found blocks it
    held before its preemption still cached."""
    for k, frame in enumerate(frames):
        if frame.own_hits:
            req_id, blocks = next(iter(frame.own_hits.items()))
            return k, req_id, blocks
    return None


def event_steps(frames: list[IterationFrame]) -> list[tuple[int, str]]:
    """The run's notable steps, (step, short label), for "Next event": a preemption, a chunked
    prefill's admission, a re-admission that hits its own cached blocks."""
    events = []
    for k, frame in enumerate(frames):
        if frame.record.preempted_ids:
            events.append((k, "preemption"))
        if _chunked_admissions(frame):
            events.append((k, "chunked prefill"))
        if frame.own_hits:
            events.append((k, "own blocks hit"))
    return events
