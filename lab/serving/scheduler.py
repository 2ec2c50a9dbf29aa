"""An iteration-level (continuous-batching) scheduler over the lab's KV pool.

Each iteration:
1. Running requests, oldest first, get their next tokens: one for a decode, a chunk of the
   prompt for a prefill (chunked when the prompt exceeds what is left of the token budget).
   A decode that needs a block when none is free preempts a victim (the newest request, or the
   lowest priority one) among those not yet scheduled in this iteration — by recompute (blocks
   freed, back to the head of the queue, its tokens computed again later) or by swap (blocks
   copied to the CPU pool) — until the block is found or the request itself is the victim.
2. Only if nothing was preempted: swapped requests come back, then waiting requests are
   admitted (first come, first served; by priority under the priority policy) while the token
   budget, `max_num_seqs` and the pool allow; a prompt's blocks must fit above the watermark.
3. The batch runs: simulated time from the cost model; in compute mode the K/V are written and
   the real paged-attention kernel runs, checked against dense attention.
4. A request whose K/V caught up with its tokens emits its next token; at its output length it
   finishes and frees its memory.

A request that can never fit (even alone in the pool) is rejected when it arrives.
Every decision is kept as one line of text when `explain` is on.
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from lab.memory.block_table import blocks_for
from lab.serving.config import SchedulerConfig
from lab.serving.cost_model import Cost, attention_pairs
from lab.serving.guess_backend import GuessBackend
from lab.serving.kv_backends import make_backend
from lab.serving.request import IterationRecord, Request, RequestState
from lab.serving.running_table import RunningTable
from lab.serving.synthetic_kv import VOCAB
from lab.serving.workloads import RequestSpec

S = RequestState


class SchedulerStuck(RuntimeError):
    """No request could be scheduled although work is left (a configuration the checks missed)."""


class Scheduler:
    def __init__(self, requests: tuple[RequestSpec, ...], config: SchedulerConfig,
                 cost: Cost, seed: int = 0) -> None:
        self.cfg, self.cost = config, cost
        self.backend = (GuessBackend(config, seed) if config.contiguous_guess is not None
                        else make_backend(config, seed))
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.req_id)))
        self.rng = np.random.default_rng(seed)
        self.requests: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.table = RunningTable()  # the running requests
        self.swapped: deque[Request] = deque()
        self.clock, self.iteration = 0.0, 0
        self._taken = 0  # the backend's blocks taken, as of the last iteration
        self.records: list[IterationRecord] = []
        self.num_finished = self.num_rejected = 0
        self.preemptions = {"recompute": 0, "swap": 0}
        self.recomputed_tokens = self.swapped_out_bytes = self.swapped_in_bytes = 0
        self.itl: list[np.ndarray] = []  # inter-token latencies, one array per iteration
        self._order, self._lines, self._last_wait = 0, [], ""
        self._admitted: list[int] = []
        self._preempted: list[int] = []

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.table or self.swapped)

    @property
    def idle(self) -> bool:
        """Nothing to run until the next arrival."""
        return not (self.waiting or self.table or self.swapped)

    def next_start(self) -> float | None:
        """When the next iteration starts: now, or at the next arrival when idle (None: done)."""
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

    # -- arrivals ----------------------------------------------------------------------------
    def _arrive(self) -> None:
        if self.idle and self.pending:
            self.clock = max(self.clock, self.pending[0].arrival_s)  # idle until the next one
        while self.pending and self.pending[0].arrival_s <= self.clock:
            spec = self.pending.popleft()
            planned = list(spec.tokens) or self.rng.integers(0, VOCAB, spec.total_len).tolist()
            req = Request(spec, planned, spec.prompt_len)
            self.requests[spec.req_id] = req
            reason = self.backend.never_fits(req)
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
        if self.cfg.victim_policy == "priority":
            bisect.insort(self.waiting, req,
                          key=lambda r: (r.spec.priority, r.spec.arrival_s, r.req_id))
        elif front:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    # -- one iteration -----------------------------------------------------------------------
    def step(self) -> IterationRecord | None:
        """Run one iteration; None when every request is finished or rejected."""
        self._arrive()
        while self.idle and self.pending:
            self._arrive()  # everything so far was rejected: move on to the next arrival
        if self.done:
            return None
        self.backend.events.step = self.iteration  # stamp the memory's events
        t = self.table
        budget = self.cfg.max_num_batched_tokens
        order = t.process_order(self.cfg.victim_policy == "priority")
        want = t.length - t.computed  # >= 1: a running request always has a token to compute
        if order is None:  # admission order: the rows as they are
            alloc = np.minimum(want, np.maximum(budget - (np.cumsum(want) - want), 0))
        else:
            want = want[order]
            alloc = np.zeros(len(t), dtype=np.int64)
            alloc[order] = np.minimum(want, np.maximum(budget - (np.cumsum(want) - want), 0))
        # alloc: decode 1, prefill a (chunked) share of what the rows before it left
        alive = np.ones(len(t), dtype=bool)
        preempted = self._find_blocks(order, alloc, alive)
        if not preempted:  # no admissions in an iteration that preempted
            shares = self._admit(len(t), budget - int(alloc.sum()))
            if shares:
                alloc = np.concatenate([alloc, np.array(shares, dtype=np.int64)])
                alive = np.concatenate([alive, np.ones(len(shares), dtype=bool)])
        if not alloc.any() and not preempted:  # a request that preempted itself runs next time
            raise SchedulerStuck(f"iteration {self.iteration}: nothing could run with "
                                 f"{len(self.waiting)} waiting and {len(self.swapped)} swapped")
        return self._execute(alloc, alive, preempted)

    def _find_blocks(self, order: np.ndarray | None, alloc: np.ndarray, alive: np.ndarray) -> int:
        """Blocks for decodes whose blocks are full, preempting from the back of the serving
        order (victims get alloc 0 and alive False)."""
        t = self.table
        needs = t.computed + alloc > t.cap
        if not needs.any():
            return 0
        if order is None:
            order = np.arange(len(t))
        preempted, tail = 0, len(order) - 1
        for pos in np.flatnonzero(needs[order]):
            row = int(order[pos])
            while alive[row]:
                cap = self.backend.grow(t.reqs[row], int(t.computed[row]))
                if cap is not None:
                    t.cap[row] = cap
                    break
                while not alive[order[tail]]:
                    tail -= 1
                victim = int(order[tail])  # the newest (or least important) not yet served
                needy = t.reqs[row].req_id
                self._preempt(victim, "no free block for its own next token" if victim == row
                              else f"no free block for request {needy}")
                alive[victim], alloc[victim] = False, 0
                preempted += 1
        return preempted

    def _preempt(self, row: int, why: str) -> None:
        victim = self.table.store(row)
        victim.num_preemptions += 1
        self._preempted.append(victim.req_id)
        mode = self.cfg.preemption_mode
        if mode == "swap" and self.backend.can_swap_out(victim):
            moved = self.backend.swap_out(victim)
            self.swapped_out_bytes += moved
            victim.state = S.SWAPPED
            self.swapped.append(victim)
            self.preemptions["swap"] += 1
            self._say(f"request {victim.req_id} preempted (swap, {moved:,} bytes to CPU): {why}")
            return
        note = " — swap space full" if mode == "swap" else ""
        lost = victim.num_computed
        self.backend.release(victim)
        victim.num_computed = 0
        self.recomputed_tokens += lost
        victim.num_recomputed += lost
        self.preemptions["recompute"] += 1
        self._enqueue(victim, front=True)
        self._say(f"request {victim.req_id} preempted (recompute{note}): {why}; "
                  f"{lost} tokens to compute again")

    def _admit(self, seats_taken: int, budget: int) -> list[int]:
        """Swapped requests first, then waiting ones, while budget, seats and blocks allow;
        return the new rows' token shares."""
        cfg, t = self.cfg, self.table
        shares: list[int] = []
        while budget > 0 and seats_taken + len(shares) < cfg.max_num_seqs:
            if self.swapped:
                req = self.swapped[0]
                short = self.backend.swap_in_shortfall(req)
                if short is not None:
                    self._say_once(f"request {req.req_id} stays swapped out: {short}")
                    break
                self.swapped.popleft()
                moved, cap = self.backend.swap_in(req)
                self.swapped_in_bytes += moved
                self._say(f"request {req.req_id} swapped in ({moved:,} bytes from CPU)")
            elif self.waiting:
                req = self.waiting[0]
                if not cfg.enable_chunked_prefill and req.length > budget:
                    break
                short = self.backend.admit_shortfall(req)
                if short is not None:
                    self._say_once(f"request {req.req_id} waits: {short}")
                    break
                self.waiting.popleft()
                cap = self.backend.admit(req)
                if cfg.explain:
                    self._say_admitted(req, budget)
            else:
                break
            req.state, req.order = S.RUNNING, self._order
            self._order += 1
            self._admitted.append(req.req_id)
            row = t.add(req, cap)
            n = min(req.length - req.num_computed, budget)
            if req.num_computed + n > cap:  # a swapped-in decode: its next token needs a block
                t.cap[row] = self.backend.grow(req, req.num_computed)
            shares.append(n)
            budget -= n
        return shares

    def _execute(self, alloc: np.ndarray, alive: np.ndarray, preempted: int) -> IterationRecord:
        t = self.table
        scheduled = alloc > 0  # rows not computed this iteration (and victims) have alloc 0
        end = t.computed + alloc
        decode = int(((alloc == 1) & (t.length == end) & (t.outputs > 0)).sum())
        new_tokens = int(alloc.sum())
        pairs = int(attention_pairs(alloc, end).sum())
        block_size = self.backend.block_size
        visits = int(blocks_for(end[scheduled], block_size).sum()) if block_size else 0
        ops, self._taken = self.backend.taken - self._taken, self.backend.taken
        cost = self.cost.iteration(new_tokens, int(end[scheduled].sum()), pairs, visits, ops)
        rows = np.flatnonzero(scheduled)
        check = None
        if self.backend.computes:
            check = self.backend.compute([(t.reqs[r], int(t.computed[r]), int(alloc[r]))
                                          for r in rows])
        start_s = self.clock
        self.clock = now = start_s + cost.seconds
        t.computed += alloc
        t.total += alloc
        caught = scheduled & (t.computed == t.length)  # K/V caught up: the model emits a token
        t.outputs[caught] += 1
        first = caught & np.isnan(t.first_token_s)
        t.first_token_s[first] = now
        later = caught & ~first
        if later.any():
            self.itl.append(now - t.last_token_s[later])
        t.last_token_s[caught] = now
        done = caught & (t.outputs >= t.target)
        t.length[caught & ~done] += 1
        finished = [t.reqs[r].req_id for r in np.flatnonzero(done)]
        for r in np.flatnonzero(done):
            self._finish(int(r))
        alive &= ~done
        if not alive.all():
            t.keep(alive)
        usage, waste = self.backend.usage(t.length, t.cap, self.next_in_line())
        record = IterationRecord(
            self.iteration, start_s, cost.seconds, cost.bound, len(rows), len(t),
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
        if self.cfg.explain:
            self._say(f"request {req.req_id} finished: {req.num_output} tokens, freed its memory")

    def _say_admitted(self, req: Request, budget: int) -> None:
        hit = f", {req.num_computed} from the prefix cache" if req.num_computed else ""
        rest = req.length - req.num_computed
        chunk = f"; prefill chunk of {budget} (token budget)" if rest > budget else ""
        self._say(f"request {req.req_id} admitted: {req.length} tokens{hit}{chunk}")

    def next_in_line(self) -> Request | None:
        """The request to be admitted next (a contiguous server measures its holes by it)."""
        return self.waiting[0] if self.waiting else None

    # -- views for pages and tests -----------------------------------------------------------
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
