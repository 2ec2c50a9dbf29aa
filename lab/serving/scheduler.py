"""The lab's serving loop: vLLM V1's (0.33) scheduler over the lab's KV pool, step by step.

A step (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule` then `update_from_output`):
1. Running requests first, in running order, while the token budget lasts: each wants the
   tokens it has not computed (1 for a decode, the rest of its prompt for a chunked prefill),
   at most `long_prefill_token_threshold` when more than one request runs or waits, at most
   what the budget has left. Only the blocks those tokens need are allocated. When none is
   free, a victim is preempted by recompute (FCFS: the last running request; priority: the
   largest (priority, arrival), whose tokens of this step, if it had some, go back to the
   budget), until the blocks are found or the request preempted itself.
2. Only if nothing was preempted, waiting requests in queue order (FCFS, or by priority):
   the prefix cache is looked up for the whole current sequence (prompt + outputs so far, so a
   re-admitted request can hit its own blocks), the whole sequence must fit in the free blocks
   (`scheduler_reserve_full_isl`; the watermark held back only while something runs), and
   only the first chunk's blocks are allocated. A refusal ends admission for the step.
3. Full blocks are hashed as they are allocated, before the model runs.
4. The batch runs (simulated time; in compute mode the real kernel, checked against dense
   attention). A request whose computed tokens caught up samples its next token; at its
   output length it finishes and frees its blocks.

`engine="v0"` runs the paper's engine (2023) in the same loop, labelled so: rows by priority,
a prompt's blocks all at admission, a 1 % watermark, swapped requests back first, preemption
by swap to CPU blocks or by recompute. A request that can never fit (even alone in the pool)
is rejected when it arrives; with `explain`, every decision is kept as one line of text.
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from lab.memory.block_table import blocks_for
from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import Cost, attention_pairs
from lab.serving.decisions import admitted_line, grown_line, preempted_line
from lab.serving.guess_backend import GuessBackend
from lab.serving.kv_backends import make_backend
from lab.serving.request import IterationRecord, Request, RequestState, StepDetail, planned_tokens
from lab.serving.running_table import RunningTable, budget_shares, step_detail
from lab.serving.workloads import RequestSpec

S = RequestState


class SchedulerStuck(RuntimeError):
    """No request could be scheduled although work is left (a configuration the checks missed)."""


class Scheduler:
    def __init__(self, requests: tuple[RequestSpec, ...], config: SchedulerConfig,
                 cost: Cost, seed: int = 0, detail: bool = False) -> None:
        self.cfg, self.cost = config, cost
        self.v1 = config.engine == "v1"
        self.backend = (GuessBackend(config, seed) if config.contiguous_guess is not None
                        else make_backend(config, seed))
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.req_id)))
        self.rng = np.random.default_rng(seed)
        self.requests: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.table = RunningTable()  # the running requests, in running order
        self.swapped: deque[Request] = deque()  # vLLM V0 only
        self.clock, self.iteration = 0.0, 0
        self._taken = 0  # the backend's blocks taken, as of the last step
        self.records: list[IterationRecord] = []
        self.num_finished = self.num_rejected = 0
        self.preemptions = {"recompute": 0, "swap": 0}
        self.recomputed_tokens = self.swapped_out_bytes = self.swapped_in_bytes = 0
        self.readmit_hit_tokens = 0  # tokens re-admitted requests found in the prefix cache
        self.itl: list[np.ndarray] = []  # inter-token latencies, one array per step
        self._order, self._arrivals, self._lines, self._last_wait = 0, 0, [], ""
        self._admitted: list[int] = []
        self._preempted: list[int] = []
        self.detail: StepDetail | None = None  # the last step's entries, when detail=True
        self._detailed = detail
        self._lookups: list[tuple[int, int, int]] = []
        self._victims: list[tuple[int, int, int, int]] = []
        if detail:
            self.backend.new_blocks = {}

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.table or self.swapped)

    @property
    def idle(self) -> bool:
        """Nothing to run until the next arrival."""
        return not (self.waiting or self.table or self.swapped)

    def next_start(self) -> float | None:
        """When the next step starts: now, or at the next arrival when idle (None: done)."""
        if self.done:
            return None
        return max(self.clock, self.pending[0].arrival_s) if self.idle else self.clock

    def _say(self, line: str) -> None:
        if self.cfg.explain:
            self._lines.append(line)

    def _say_once(self, line: str) -> None:
        """A waiting line, said again only when it changes."""
        if line != self._last_wait:
            self._last_wait = line
            self._say(line)

    def _arrive(self) -> None:
        if self.idle and self.pending:
            self.clock = max(self.clock, self.pending[0].arrival_s)  # idle until the next one
        arrived = []
        while self.pending and self.pending[0].arrival_s <= self.clock:
            arrived.append(self.pending.popleft())
        for spec, planned in zip(arrived, planned_tokens(arrived, self.rng)):
            req = Request(spec, planned, spec.prompt_len, arrival=self._arrivals)
            self._arrivals += 1
            self.requests[spec.req_id] = req
            reason = self.backend.never_fits(req)
            limit = self.cfg.max_model_len
            if reason is None and limit is not None and req.longest > limit:
                reason = f"prompt + max_tokens = {req.longest} tokens exceeds max_model_len {limit}"
            if reason is None and not self.cfg.enable_chunked_prefill \
                    and req.longest > self.cfg.max_num_batched_tokens:
                reason = (f"prompt + max_tokens = {req.longest} tokens exceeds the token "
                          f"budget of {self.cfg.max_num_batched_tokens} and chunked prefill is off")
            if reason is not None:
                req.state, req.reject_reason = S.REJECTED, reason
                self.num_rejected += 1
                self._say(f"request {spec.req_id} rejected: {reason}")
            else:
                self._enqueue(req)

    def _enqueue(self, req: Request, front: bool = False) -> None:
        req.state = S.WAITING
        if self.cfg.policy == "priority":
            bisect.insort(self.waiting, req, key=lambda r: (r.spec.priority, r.arrival))
        elif front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def step(self) -> IterationRecord | None:
        """Run one step; None when every request is finished or rejected."""
        self._arrive()
        while self.idle and self.pending:
            self._arrive()  # everything so far was rejected: move on to the next arrival
        if self.done:
            return None
        self.backend.events.step = self.iteration  # stamp the memory's events
        t, cfg, budget = self.table, self.cfg, self.cfg.max_num_batched_tokens
        want = t.length - t.computed  # >= 1: a running request always has a token to compute
        threshold = cfg.long_prefill_token_threshold
        self._long_cap = threshold if threshold and len(t) + len(self.waiting) > 1 else 0
        if self._long_cap:
            want = np.minimum(want, threshold)
        by_rank = None if self.v1 else t.process_order(cfg.policy == "priority")
        if by_rank is None:  # the rows as they are (vLLM V1's running list)
            order, alloc = np.arange(len(t)), budget_shares(want, budget)
        else:
            order, alloc = by_rank, np.zeros(len(t), dtype=np.int64)
            alloc[order] = budget_shares(want[order], budget)
        alive = np.ones(len(t), dtype=bool)
        running_rows = len(t)
        preempted = self._find_blocks(order, want, alloc, alive)
        new_tokens = int(alloc.sum())
        if not preempted:
            shares = self._admit(len(t), budget - new_tokens)
            if shares:
                new_tokens += sum(shares)
                alloc = np.concatenate([alloc, np.array(shares, dtype=np.int64)])
                alive = np.concatenate([alive, np.ones(len(shares), dtype=bool)])
        elif self.waiting and cfg.explain:
            self._say("no admission in this step: it preempted"
                      + (" (vLLM V1 admits nothing in a step that preempted)" if self.v1 else ""))
        if not new_tokens and not preempted:  # a request that preempted itself runs next time
            raise SchedulerStuck(f"step {self.iteration}: nothing could run with "
                                 f"{len(self.waiting)} waiting and {len(self.swapped)} swapped")
        if self._detailed:
            self._keep_detail(alloc, alive, running_rows)
        return self._execute(alloc, alive, preempted, new_tokens)

    def _find_blocks(self, order: np.ndarray, want: np.ndarray, alloc: np.ndarray,
                     alive: np.ndarray) -> int:
        """Blocks for the rows whose tokens need one (or, hashing, fill one), in serving order,
        preempting until each gets them or is the victim itself; victims get alloc 0 and alive
        False, and the rows after get their shares of the budget again."""
        t, bs, budget = self.table, self.backend.block_size, self.cfg.max_num_batched_tokens
        preempted, start = 0, 0
        while True:
            rest = order[start:]
            needs = t.needs_blocks(alloc, bs, self.backend.hashes)
            at = needs[rest].nonzero()[0]  # positions in rest
            rows = rest[at]
            # Read as lists: these rows' counts do not change until something is preempted.
            for pos, row, computed, n in zip((start + at).tolist(), rows.tolist(),
                                             t.computed[rows].tolist(), alloc[rows].tolist()):
                before = preempted
                while alive[row]:
                    req, taken = t.reqs[row], self.backend.taken
                    cap = self.backend.grow(req, computed, n)
                    if cap is not None:
                        if self.cfg.explain and computed < req.length - 1:
                            new = self.backend.taken - taken if bs else 0  # over every group
                            self._say(grown_line(req.req_id, computed, n, req.length, new))
                        t.cap[row] = cap
                        break
                    victim = self._victim(order, alive)
                    self._preempt(victim, row)
                    alive[victim], alloc[victim] = False, 0
                    preempted += 1
                if preempted > before:  # the budget and the rows left to serve changed
                    start = pos + 1
                    left = budget - int(alloc[order[:start]].sum())
                    rest = order[start:]
                    alloc[rest] = budget_shares(np.where(alive[rest], want[rest], 0), left)
                    break
            else:
                return preempted

    def _victim(self, order: np.ndarray, alive: np.ndarray) -> int:
        if self.v1 and self.cfg.policy == "priority":
            return self.table.lowest_priority(alive)
        return int(order[np.flatnonzero(alive[order])[-1]])  # the last one still running

    def _preempt(self, row: int, needy_row: int) -> None:
        t = self.table
        needy = t.reqs[needy_row].req_id
        victim = t.store(row)
        victim.num_preemptions += 1
        self._preempted.append(victim.req_id)
        if self._detailed:
            self._victims.append((victim.req_id, victim.num_computed, victim.length,
                                  self.backend.num_free))
            self.backend.new_blocks.pop(victim.req_id, None)  # its entry is withdrawn
        why = ("no free block for its own next tokens" if row == needy_row
               else f"no free block for request {needy}")
        if self.cfg.preemption_mode == "swap" and self.backend.can_swap_out(victim):
            moved = self.backend.swap_out(victim)
            self.swapped_out_bytes += moved
            victim.state = S.SWAPPED
            self.swapped.append(victim)
            self.preemptions["swap"] += 1
            self._say(f"request {victim.req_id} preempted by swap (vLLM V0): its blocks, "
                      f"{moved:,} bytes, copied to CPU memory: {why}")
            return
        lost = victim.num_computed
        self.backend.release(victim)
        victim.num_computed = 0
        self.recomputed_tokens += lost
        victim.num_recomputed += lost
        self.preemptions["recompute"] += 1
        self._enqueue(victim, front=True)
        self._say(preempted_line(victim, why, lost, self.cfg.preemption_mode == "swap"))

    def _admit(self, seats_taken: int, budget: int) -> list[int]:
        """(V0: swapped requests first, then) waiting ones, while budget, seats and blocks
        allow; return the new rows' token shares."""
        cfg, t = self.cfg, self.table
        shares: list[int] = []
        rows: list[tuple[Request, int]] = []  # the admitted requests and their slot capacity
        watermark = cfg.watermark_blocks
        while budget > 0 and seats_taken + len(shares) < cfg.max_num_seqs:
            # V1 holds the watermark back only while something runs; V0 always did.
            reserve = watermark if not self.v1 or seats_taken + len(shares) else 0
            if self.swapped:
                req = self.swapped[0]
                short = self.backend.swap_in_shortfall(req, reserve)
                if short is not None:
                    self._say_once(f"request {req.req_id} stays swapped out: {short}")
                    break
                self.swapped.popleft()
                moved, cap = self.backend.swap_in(req)
                self.swapped_in_bytes += moved
                n = min(req.length - req.num_computed, budget)
                self._say(f"request {req.req_id} swapped in ({moved:,} bytes from CPU)")
            elif self.waiting:
                req = self.waiting[0]
                hit = self.backend.lookup(req)
                if self._detailed:
                    self._lookups.append((req.req_id, req.length, hit))
                n = req.length - hit
                if self._long_cap:
                    n = min(n, self._long_cap)
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                short = (self.backend.admit_shortfall(req, reserve)
                         if cfg.scheduler_reserve_full_isl or not self.v1 else None)
                # V1 allocates the hit and the first chunk; V0 the whole sequence at once.
                hold = hit + n if self.v1 else req.length
                cap = self.backend.admit(req, hold, reserve) if short is None else None
                if cap is None:
                    self._say_once(f"request {req.req_id} waits: "
                                   f"{short or 'no free blocks for its first chunk'}")
                    break
                self.waiting.popleft()
                if req.num_preemptions:
                    self.readmit_hit_tokens += hit
                if cfg.explain:
                    self._say(admitted_line(req, hit, n, cap, self.v1, self.backend))
            else:
                break
            req.state, req.order = S.RUNNING, self._order
            self._order += 1
            self._admitted.append(req.req_id)
            if req.num_computed + n > cap:  # a swapped-in decode: its next token needs a block
                cap = self.backend.grow(req, req.num_computed, n)
            rows.append((req, cap))
            shares.append(n)
            budget -= n
        if rows:
            t.add(rows)  # one call for the step's admissions: each call copies every column
        return shares

    def _keep_detail(self, alloc: np.ndarray, alive: np.ndarray, running_rows: int) -> None:
        blocks = self.backend.new_blocks or {}
        self.detail = step_detail(self.table, alloc, alive, running_rows, blocks,
                                  self._victims, self._lookups, self.backend.num_free)
        self._victims, self._lookups = [], []
        blocks.clear()

    def _execute(self, alloc: np.ndarray, alive: np.ndarray, preempted: int,
                 new_tokens: int) -> IterationRecord:
        t = self.table
        scheduled = alloc > 0  # rows not computed this step (and victims) have alloc 0
        end = t.computed + alloc
        ends = end[scheduled]
        # K/V caught up: the model samples a token. Every row had a token to compute before
        # the step, so only rows computed in it can catch up.
        caught = end == t.length
        first = caught & (t.outputs == 0)  # its first token (first_token_s is NaN until then)
        later = caught & ~first
        decode = np.count_nonzero(later & (alloc == 1))
        pairs = int(attention_pairs(alloc, end).sum())
        block_size = self.backend.block_size
        visits = int(blocks_for(ends, block_size).sum()) if block_size else 0
        ops, self._taken = self.backend.taken - self._taken, self.backend.taken
        cost = self.cost.iteration(new_tokens, int(ends.sum()), pairs, visits, ops)
        check = None
        if self.backend.computes:
            check = self.backend.compute([(t.reqs[r], int(t.computed[r]), int(alloc[r]))
                                          for r in np.flatnonzero(scheduled)])
        start_s = self.clock
        self.clock = now = start_s + cost.seconds
        t.computed += alloc
        t.total += alloc
        t.outputs += caught
        t.first_token_s[first] = now
        gaps = now - t.last_token_s[later]
        if gaps.size:
            self.itl.append(gaps)
        t.last_token_s[caught] = now
        done = (caught & (t.outputs >= t.target)).nonzero()[0].tolist()
        finished = [t.reqs[r].req_id for r in done]
        for r in done:
            self._finish(r)
        # The sampled tokens join their sequences (the finished rows, stored already, leave).
        t.length += caught
        if done or preempted:
            alive[done] = False
            t.keep(alive)
        usage, waste = self.backend.usage(t.length, t.cap, self.next_in_line())
        record = IterationRecord(
            self.iteration, start_s, cost.seconds, cost.bound, len(ends), len(t),
            len(self.waiting), len(self.swapped), new_tokens - decode, decode, usage, waste,
            preempted, self.num_finished, tuple(self._admitted), tuple(finished),
            tuple(self._preempted), check, tuple(self._lines))
        self._lines, self._admitted, self._preempted = [], [], []
        self.records.append(record)
        self.iteration += 1
        return record

    def _finish(self, row: int) -> None:
        req = self.table.store(row)
        self.backend.release(req)
        req.state, req.finish_s = S.FINISHED, self.clock
        self.num_finished += 1
        self._say(f"request {req.req_id} finished: {req.num_output} tokens, freed its memory")

    def next_in_line(self) -> Request | None:
        """The request to be admitted next (a contiguous server measures its holes by it)."""
        return self.waiting[0] if self.waiting else None

    def running(self) -> list[Request]:
        """The running requests, their progress copied out of the table."""
        self.table.store_all()
        return list(self.table.reqs)

    def picture(self):
        """The memory now, every block or region (`KVBackend.picture`)."""
        return self.backend.picture(self.running(), self.next_in_line())

    def check_invariants(self) -> None:
        """The memory's invariants, and every running request's memory covering its tokens."""
        running = self.running()
        self.backend.check_invariants(running)
        t = self.table
        assert len(t) <= self.cfg.max_num_seqs
        assert ((t.length - t.computed) >= 1).all(), "a running request with nothing to compute"
        assert (t.computed <= t.cap).all()
