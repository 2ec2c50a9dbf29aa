"""A minimal serving loop on the paged cache, for the walkthrough's workloads.

Requests arrive at known steps with a known prompt and an output length the server does not
know in advance (it only sees the request stop). Every step: arrivals join a first-come,
first-served queue; every running request decodes one token (a block is allocated only when
its last one is full); requests that reach their length finish and free their blocks; then the
head of the queue is admitted while its prompt's blocks fit (prefill: the prompt's K/V is
written). If a decode finds no free block, the youngest running request is preempted by
recompute: its blocks are freed and it goes back to the front of the queue.

With a KV pool (`store_kv=True` manager) the loop writes real K/V from `SyntheticKV`; without
one it only moves block ids, which is enough to count memory over long runs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from kernels.reference import AttentionCheck
from lab.memory.block_pool import PoolExhausted
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kernel_check import check_kernel
from lab.serving.synthetic_kv import SyntheticKV


@dataclass(frozen=True)
class Request:
    req_id: int
    arrival: int  # the step at which it reaches the server
    prompt: tuple[int, ...]  # token ids, known on arrival
    output: tuple[int, ...]  # the tokens it will generate; the server learns the length at the end

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def output_len(self) -> int:
        return len(self.output)

    @property
    def total_len(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass
class StepReport:
    """What one step did, by request id."""

    step: int
    arrived: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)


class RequestQueue:
    """Arrivals and the first-come, first-served waiting queue, shared by every server."""

    def __init__(self, requests: list[Request]) -> None:
        self.requests = {r.req_id: r for r in requests}
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival, r.req_id)))
        self.waiting: deque[int] = deque()
        self.running: dict[int, int] = {}  # req_id -> server-side id, in admission order
        self.finished: list[int] = []
        self.step = -1  # no step run yet

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.running)

    def next_demand(self) -> Request | None:
        """The request the server must place next: head of the queue, else the next arrival."""
        if self.waiting:
            return self.requests[self.waiting[0]]
        return self.pending[0] if self.pending else None

    def _arrive(self) -> list[int]:
        """Start a step: requests whose arrival step has come join the queue."""
        self.step += 1
        arrived = []
        while self.pending and self.pending[0].arrival <= self.step:
            arrived.append(self.pending.popleft().req_id)
        self.waiting.extend(arrived)
        return arrived


class PagedReplay(RequestQueue):
    def __init__(self, manager: KVCacheManager, requests: list[Request],
                 kv: SyntheticKV | None = None) -> None:
        if manager.pool is not None and kv is None:
            raise ValueError("a manager with a KV pool needs a SyntheticKV to write K/V from")
        for r in requests:
            if blocks_for(r.total_len, manager.block_size) > manager.config.num_blocks:
                raise ValueError(f"request {r.req_id} grows to {r.total_len} tokens, more than "
                                 f"the whole pool of {manager.config.num_blocks} blocks holds")
            if not r.output:
                raise ValueError(f"request {r.req_id} must generate at least one token")
        super().__init__(requests)
        self.manager = manager
        self.kv = kv if manager.pool is not None else None
        self.generated: dict[int, int] = {}  # req_id -> output tokens so far
        self.num_preemptions = 0

    def advance(self) -> StepReport:
        arrived = self._arrive()
        report = StepReport(self.step, arrived=arrived)
        self.manager.events.step = self.step  # events are stamped with this step
        self._decode(list(self.running), report)
        for req_id in list(self.running):
            if self.generated[req_id] == self.requests[req_id].output_len:
                self.manager.free(self.running.pop(req_id))
                self.finished.append(req_id)
                report.finished.append(req_id)
        self._admit(report)
        return report

    def _admit(self, report: StepReport) -> None:
        while self.waiting:
            req = self.requests[self.waiting[0]]
            if self.manager.blocks_needed(list(req.prompt)) > self.manager.blocks.num_free:
                return  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq = self.manager.add_sequence(list(req.prompt))
            cached = seq.num_cached_tokens
            self._write(seq.seq_id, cached, list(req.prompt[cached:]))
            self.running[req.req_id] = seq.seq_id
            self.generated[req.req_id] = 0
            report.admitted.append(req.req_id)

    def _decode(self, decoders: list[int], report: StepReport) -> None:
        appended: list[tuple[int, int, int]] = []  # (seq_id, position, token)
        for req_id in decoders:
            if req_id not in self.running:  # preempted earlier in this step
                continue
            token = self.requests[req_id].output[self.generated[req_id]]
            seq_id = self.running[req_id]
            while not self._try_append(seq_id, token):
                victim = next(reversed(self.running))
                self._preempt(victim, report)
                if victim == req_id:
                    break
            else:
                self.generated[req_id] += 1
                appended.append((seq_id, len(self.manager.sequences[seq_id]) - 1, token))
        write_appended(self.manager, self.kv, appended)

    def _try_append(self, seq_id: int, token: int) -> bool:
        try:
            self.manager.append_token(seq_id, token)
        except PoolExhausted:
            return False
        return True

    def _preempt(self, req_id: int, report: StepReport) -> None:
        """Recompute preemption: drop every block; the request restarts from its prompt."""
        seq_id = self.running.pop(req_id)
        self.manager.events.emit("preempt", seq_id, None, req_id=req_id)
        self.manager.free(seq_id)
        del self.generated[req_id]
        self.waiting.appendleft(req_id)
        self.num_preemptions += 1
        report.preempted.append(req_id)

    # -- K/V -------------------------------------------------------------------------------
    def _write(self, seq_id: int, start: int, tokens: list[int]) -> None:
        if self.kv is None:
            self.manager.commit(seq_id, start + len(tokens))
            return
        if tokens:
            keys, values = self.kv.keys_values(tokens, start)  # [L, n, kv_heads, D] each
            self.manager.write(seq_id, start, keys, values)

    def check_attention(self) -> AttentionCheck | None:
        """The kernel vs dense attention for the newest token of every running request."""
        if self.kv is None or not self.running:
            return None
        return check_newest_tokens(self.manager, self.kv, list(self.running.values()))


def write_appended(manager: KVCacheManager, kv: SyntheticKV | None,
                   appended: list[tuple[int, int, int]]) -> None:
    """Store the K/V of tokens just appended, (seq_id, position, token) each, in one pool
    write, then mark them written. Without a KV pool only the marking happens."""
    if kv is not None and appended:
        parts = [kv.keys_values([tok], pos) for _, pos, tok in appended]
        keys = torch.cat([k for k, _ in parts], dim=1)  # [L, num_appended, kv_heads, D]
        values = torch.cat([v for _, v in parts], dim=1)
        slots = [manager.sequences[s].slot(pos) for s, pos, _ in appended]
        manager.pool.write(slots, keys, values)
    for seq_id, pos, _ in appended:
        manager.commit(seq_id, pos + 1)


def check_newest_tokens(manager: KVCacheManager, kv: SyntheticKV,
                        seq_ids: list[int]) -> AttentionCheck:
    """Kernel vs dense attention, each sequence's newest token as the query."""
    newest = [manager.sequences[s].tokens[-1] for s in seq_ids]
    return check_kernel(manager, seq_ids, kv.queries(newest))  # queries [num_seqs, heads, D]
