"""The unknown ending: a contiguous server that must guess each output's length, beside paging.

The guide's first section, shown: one seeded workload (a few requests, most short, some much
longer; the server learns an output's length only when the request stops) served two ways on
the same bytes and the same step clock. The contiguous server reserves prompt + the learner's
guess per request in one region of a real K/V tensor (`lab/serving/guess_backend.py` over
`lab/memory/contiguous_kv.py`): guess low and long requests fill their reservation and must
grow, in place or by moving (their K/V really copied, counted and timed); guess high and the
reservations sit mostly empty while the requests behind them wait. The paged server takes a
block only when a sequence's last is full.

Both servers are the lab's scheduler (`lab/serving/scheduler.py`, the one serving loop) on a
step clock with no token budget or seat limit, so one step is one iteration of each and the
scheduler's policy decides for both: arrivals join the queue; every running request, oldest
first, computes one decode token; a request that finds no room for it (no hole for its grown
region; no free block) preempts the newest running request by recompute (its memory freed, its
tokens prefilled again when it is re-admitted, at the front of the queue), itself if it is the
newest; then, if nobody was preempted, waiting requests are admitted first come first served
while the head of the queue fits, their prompt prefilled in that step, which emits their first
output token. A request finishes when it emits its last token (whose K/V nothing reads, so it
is never stored) and frees its memory. On the real tensors (`store_kv`) every step writes each
new token's seeded K/V, and the step a page shows runs the Triton kernel over both tensors
against dense attention.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from lab.memory.block_table import blocks_for
from lab.memory.contiguous_kv import Growth, Move
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.ending_stepper import EndingFrame, EndingStepper, StepLog, request_label
from lab.scenarios.story import LiveRun, Story
from lab.serving.synthetic_kv import VOCAB
from lab.serving.workloads import RequestSpec

GUESS_LOW = 16  # the quick choice "guess low": fewer output slots than most requests need
MAX_REQUESTS = 10


_r = request_label  # the captions name requests on almost every line


@dataclass(frozen=True)
class EndingConfig:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(
        num_blocks=40, block_size=16, num_kv_heads=2, head_dim=32))
    guess: int = GUESS_LOW  # output tokens the contiguous server reserves per request
    num_requests: int = 8
    prompt_min: int = 16
    prompt_max: int = 48
    max_output: int = 200  # the longest output a request may give

    def __post_init__(self) -> None:
        for name in ("guess", "num_requests", "prompt_min", "prompt_max", "max_output"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_requests > MAX_REQUESTS:
            raise ValueError(f"at most {MAX_REQUESTS} requests, got {self.num_requests}")
        if self.prompt_min > self.prompt_max:
            raise ValueError(f"prompt_min ({self.prompt_min}) is above prompt_max "
                             f"({self.prompt_max})")
        if self.prompt_max + self.max_output > self.capacity:
            raise ValueError(
                f"a request may hold {self.prompt_max + self.max_output} tokens (prompt "
                f"{self.prompt_max} + output {self.max_output}) but the pool holds only "
                f"{self.capacity} slots: enlarge the pool")

    @property
    def capacity(self) -> int:
        return self.pool.num_blocks * self.pool.block_size

    @property
    def guess_high(self) -> int:
        """The quick choice "guess high": the longest output any request may give."""
        return self.max_output


def make_workload(cfg: EndingConfig, seed: int) -> tuple[RequestSpec, ...]:
    """Uniform prompts; a third of the requests (at least one, among the first half) long, from
    half the maximum output to all of it, the rest short (4 to an eighth of it); arrivals 2 to
    10 steps apart, so short requests keep arriving while the long ones grow."""
    rng = random.Random(seed)
    n = cfg.num_requests
    long = set(rng.sample(range((n + 1) // 2), max(1, round(n / 3))))
    requests, arrival = [], 0
    for req_id in range(n):
        prompt_len = rng.randint(cfg.prompt_min, cfg.prompt_max)
        output_len = (rng.randint((cfg.max_output + 1) // 2, cfg.max_output) if req_id in long
                      else rng.randint(min(4, cfg.max_output),
                                       min(cfg.max_output, max(4, cfg.max_output // 8))))
        tokens = tuple(rng.randrange(VOCAB) for _ in range(prompt_len + output_len))
        requests.append(RequestSpec(req_id, prompt_len, output_len, float(arrival),
                                    max_tokens=cfg.max_output, tokens=tokens))
        arrival += rng.randint(2, 10)
    return tuple(requests)


@dataclass(frozen=True)
class UnknownEndingStory(Story[EndingFrame]):
    page = "unknown_ending"
    config: EndingConfig
    seed: int

    def requests(self) -> tuple[RequestSpec, ...]:
        return make_workload(self.config, self.seed)

    def stepper(self, store_kv: bool = False,
                timings: dict[tuple[int, int], float] | None = None) -> EndingStepper:
        return EndingStepper(self.config.pool, self.config.guess, self.requests(), self.seed,
                          store_kv, timings)

    def live(self) -> LiveRun:
        """On the real tensors; every replay records its copy times in one place, so a page
        can show them for any step played (`EndingStepper.measured`)."""
        timings: dict[tuple[int, int], float] = {}
        return LiveRun(self, lambda: self.stepper(store_kv=True, timings=timings))

    def longest(self) -> RequestSpec:
        return max(self.requests(), key=lambda r: (r.output_len, -r.req_id))

    def moves_of(self, frames: tuple[EndingFrame, ...], req_id: int) -> tuple[Move, ...]:
        return tuple(m for f in frames for m in f.logs["contiguous"].moves if m.req_id == req_id)

    def growths_of(self, frames: tuple[EndingFrame, ...], req_id: int) -> tuple[Growth, ...]:
        return tuple(g for f in frames for g in f.logs["contiguous"].growths
                     if g.req_id == req_id)

    def first_growth(self, frames: tuple[EndingFrame, ...], req_id: int) -> int:
        """The first step the contiguous server grows or moves the request (or, if it never
        does, the step it finishes): where the page starts to show how it grows."""
        return self._growth_steps(frames, req_id)[0]

    def _growth_steps(self, frames: tuple[EndingFrame, ...], req_id: int) -> list[int]:
        grown = [f.step for f in frames
                 if any(g.req_id == req_id for g in (*f.logs["contiguous"].moves,
                                                     *f.logs["contiguous"].growths))]
        finished = [f.step for f in frames
                    if any(r == req_id for r, *_ in f.logs["contiguous"].finished)]
        return grown or finished[:1] or [frames[-1].step]

    def caption(self, frame: EndingFrame) -> list[str]:
        """What each server did: preemptions, growth (in place, or a move with the bytes it
        copied), admissions, finished requests, and who waits for what."""
        c, p = frame.logs["contiguous"], frame.logs["paged"]
        specs = {r.req_id: r for r in self.requests()}
        regions = {r.req_id: r for r in frame.regions}
        lines = _preempt_lines("Contiguous", c.preempted)
        for g in c.growths:
            lines.append(f"Contiguous: {_r(g.req_id)} filled its {g.old_size} slots; the "
                         f"{g.new_size - g.old_size} after them are free, so it **grows in "
                         f"place** to {g.new_size} slots: nothing is copied.")
        for m in c.moves:
            lines.append(f"Contiguous: {_r(m.req_id)} filled its {m.old_size} slots and the "
                         f"slots after them are taken, so it **moves** to a {m.new_size}-slot "
                         f"region at slot {m.dst}: its {m.tokens} tokens' K/V, "
                         f"**{m.nbytes:,} bytes**, are copied from slots {m.src}–"
                         f"{m.src + m.tokens - 1}, and the old region is freed.")
        for req_id, held in zip(c.admitted, c.prefilled):
            r, spec = regions.get(req_id), specs[req_id]
            again = (f"re-admits {_r(req_id)} (its {held} tokens, prompt and output so far, "
                     "prefilled)"
                     if held > spec.prompt_len else f"admits {_r(req_id)}")
            where = "" if r is None else (  # None: it finished in the same step
                f", reserving {r.reserved} slots at {r.start}–{r.start + r.reserved - 1} "
                f"(prompt {spec.prompt_len} + output {r.reserved - spec.prompt_len})")
            lines.append(f"Contiguous: {again}{where}.")
        lines += _finish_lines("Contiguous", c.finished, specs)
        if c.moves or c.growths or c.admitted or c.finished or c.preempted:
            total = frame.contiguous
            so_far = (f"{total.moves} move{'s' * (total.moves != 1)}, "
                      f"{total.copied_bytes:,} bytes copied")
            lines.append(f"Contiguous so far: {so_far}." if c.moves else
                         f"Contiguous: nothing moved at this step (so far: {so_far}).")
        lines += _wait_line("Contiguous", c)
        lines += _preempt_lines("Paged", p.preempted)
        bs = self.config.pool.block_size
        for req_id, held in zip(p.admitted, p.prefilled):
            again = "re-admits" if held > specs[req_id].prompt_len else "admits"
            lines.append(f"Paged: {again} {_r(req_id)}: {blocks_for(held, bs)} block(s) for "
                         f"its {held} tokens.")
        if p.new_blocks:
            took = ", ".join(f"{_r(r)} block {b}" for r, b in p.new_blocks)
            lines.append(f"Paged: the last block was full, so a new one: {took}; nothing is "
                         "copied.")
        lines += _finish_lines("Paged", p.finished, specs)
        lines += _wait_line("Paged", p)
        return lines


def _rs(ids: tuple[int, ...]) -> str:
    return ", ".join(_r(i) for i in ids)


def _wait_line(label: str, log: StepLog) -> list[str]:
    if not log.waiting:
        return []
    verb = "waits" if len(log.waiting) == 1 else "wait"
    return [f"{label}: {_rs(log.waiting)} {verb}: {_r(log.waiting[0])} {log.wait_reason}."]


def _preempt_lines(label: str,
                   preempted: tuple[tuple[int, int | None, str], ...]) -> list[str]:
    lines = []
    for victim, needer, lacking in preempted:
        who = (f"{_r(victim)} itself, the newest running request," if victim == needer
               else f"{_r(victim)}, the newest running request,")  # as vLLM chooses
        lines.append(f"{label}: {lacking}, so {who} is **preempted** (recompute: its memory "
                     "freed, its tokens prefilled again when it is re-admitted).")
    return lines


def _finish_lines(label: str, finished: tuple[tuple[int, int, int], ...],
                  specs: dict[int, RequestSpec]) -> list[str]:
    return [f"{label}: {_r(r)} stops after {specs[r].output_len} output tokens (only now does "
            f"the server learn its length) and frees its {slots} slots, {slots - held} of "
            "them never used." for r, slots, held in finished]


def event_steps(frames: tuple[EndingFrame, ...]) -> list[tuple[int, str]]:
    """The story's notable steps, (step, short label), for "Next event": a contiguous move (K/V
    copied), a preemption on either server."""
    events = []
    for f in frames:
        c, p = f.logs["contiguous"], f.logs["paged"]
        events += [(f.step, f"R{m.req_id} moves") for m in c.moves]
        if c.preempted or p.preempted:
            events.append((f.step, "preemption"))
    return list(dict.fromkeys(events))
