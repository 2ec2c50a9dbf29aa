"""The guide's allocator walk, for several interleaved requests, step by step.

Request A has the prompt and output lengths the learner picks (the guide's example: prompt 30,
output 4, block size 16). Requests B, C, ... get seeded lengths around A's and arrive one step
apart, so their blocks interleave in the pool. Step 0 is the empty pool; at step i + 1 request
i arrives and its prompt is prefilled; every request already in the pool then decodes one token
per step until it has its output. A finished request is shown whole for one step (its last
block's unused tail on screen), then it leaves and its blocks go back to the free queue, so
the walk ends with the pool empty: the cache "disappears when the request ends".

A token's K/V depends only on (seed, token id, position) (lab/serving/synthetic_kv.py): played
on the real pool, the walk writes each token's K/V into the slot the allocator gave it, and the
Triton kernel reads them back through the block tables.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.events import Event
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.scenarios.story import Story
from lab.serving.synthetic_kv import VOCAB, SyntheticKV
from lab.serving.workloads import RequestSpec

REQUEST_NAMES = "ABCDEFGH"


class WalkTooBig(ValueError):
    """The requests together need more blocks than the pool has (a message for the learner)."""


@dataclass(frozen=True)
class WalkParams:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_blocks=64, block_size=16))
    prompt_len: int = 30
    output_len: int = 4
    num_requests: int = 3

    def __post_init__(self) -> None:
        for name in ("prompt_len", "output_len", "num_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_requests > len(REQUEST_NAMES):
            raise ValueError(f"at most {len(REQUEST_NAMES)} requests, got {self.num_requests}")


def request_name(req_id: int) -> str:
    return REQUEST_NAMES[req_id]


def last_decode(request: RequestSpec) -> int:
    """The step at which the request decodes its last token (it leaves at the next)."""
    return int(request.arrival_s) + request.output_len


def walk_requests(params: WalkParams, seed: int) -> tuple[RequestSpec, ...]:
    """Request A from the parameters; the others seeded around A's lengths. Request i arrives
    at step i + 1."""
    rng = random.Random(seed)
    requests = []
    for i in range(params.num_requests):
        prompt_len, output_len = params.prompt_len, params.output_len
        if i > 0:
            prompt_len = rng.randint(max(1, prompt_len // 2), prompt_len + prompt_len // 2)
            output_len = rng.randint(max(1, output_len // 2), output_len + output_len // 2)
        tokens = tuple(rng.randrange(VOCAB) for _ in range(prompt_len + output_len))
        requests.append(RequestSpec(i, prompt_len, output_len, float(i + 1), tokens=tokens))
    return tuple(requests)


@dataclass(frozen=True)
class WalkFrame:
    step: int
    requests: tuple[RequestSpec, ...]
    seq_names: dict[int, str]  # engine seq_id -> request name, for the requests in the pool
    snapshot: Snapshot
    events: tuple[Event, ...]  # what this step did
    left: dict[int, str] = field(default_factory=dict)  # seq_id -> name of those that left


class WalkStepper:
    def __init__(self, params: WalkParams, seed: int, store_kv: bool = False) -> None:
        self.params = params
        self.requests = walk_requests(params, seed)
        self.manager = KVCacheManager(params.pool, enable_prefix_cache=False, store_kv=store_kv)
        self.kv = SyntheticKV(params.pool, seed) if store_kv else None
        self.names: dict[int, str] = {}  # seq_id -> request name
        self.seq_of: dict[int, int] = {}  # req_id -> seq_id
        self.step = -1
        self.last_step = max(last_decode(r) for r in self.requests) + 1

    @property
    def done(self) -> bool:
        return self.step >= self.last_step

    def advance(self) -> WalkFrame:
        self.step += 1
        self.manager.events.step = self.step
        mark = len(self.manager.events)
        left = {}
        for r in self.requests:
            arrival = int(r.arrival_s)
            if arrival == self.step:  # prefill: blocks for the whole prompt
                seq = self.manager.add_sequence(list(r.tokens[:r.prompt_len]))
                self.names[seq.seq_id], self.seq_of[r.req_id] = request_name(r.req_id), seq.seq_id
                self._write(seq.seq_id, 0, r.tokens[:r.prompt_len])
            elif arrival < self.step <= arrival + r.output_len:  # decode one token
                pos = r.prompt_len + self.step - arrival - 1
                self.manager.append_token(self.seq_of[r.req_id], r.tokens[pos])
                self._write(self.seq_of[r.req_id], pos, r.tokens[pos:pos + 1])
            elif self.step == last_decode(r) + 1:  # finished: its blocks go back
                seq_id = self.seq_of.pop(r.req_id)
                self.manager.free(seq_id)
                left[seq_id] = self.names.pop(seq_id)
        events = tuple(self.manager.events.since(mark))
        return WalkFrame(self.step, self.requests, dict(self.names), self.manager.snapshot(),
                         events, left)

    def _write(self, seq_id: int, start: int, tokens: tuple[int, ...]) -> None:
        if self.kv is None:
            self.manager.commit(seq_id, start + len(tokens))
        else:
            keys, values = self.kv.keys_values(list(tokens), start)  # [L, n, kv_heads, D]
            self.manager.write(seq_id, start, keys, values)

    def check_attention(self) -> AttentionCheck | None:
        """The kernel vs dense attention, each sequence's newest token as the query."""
        if self.kv is None or not self.names:
            return None
        return self.kv.check_newest(self.manager, list(self.names))

    def events(self) -> dict[str, list[dict]]:
        return {"paged": self.manager.events.as_dicts()}


@dataclass(frozen=True)
class BlockTablesStory(Story[WalkFrame]):
    page = "block_tables"
    config: WalkParams
    seed: int

    def stepper(self, store_kv: bool = False) -> WalkStepper:
        self.check_fits()
        return WalkStepper(self.config, self.seed, store_kv)

    @property
    def requests(self) -> tuple[RequestSpec, ...]:
        return walk_requests(self.config, self.seed)

    @property
    def last_step(self) -> int:
        """The step at which the last request leaves and the pool is empty again."""
        return max(last_decode(r) for r in self.requests) + 1

    def blocks_required(self) -> int:
        """The most blocks the walk holds at once."""
        bs = self.config.pool.block_size

        def held(r: RequestSpec, step: int) -> int:
            arrival = int(r.arrival_s)
            if not arrival <= step <= last_decode(r):
                return 0
            return blocks_for(r.prompt_len + step - arrival, bs)

        return max(sum(held(r, step) for r in self.requests) for step in range(self.last_step))

    def check_fits(self) -> None:
        """Raise WalkTooBig, saying what to change, if the pool is too small for the walk."""
        needed, p = self.blocks_required(), self.config
        if needed > p.pool.num_blocks:
            raise WalkTooBig(
                f"These {p.num_requests} request(s) need {needed} blocks of "
                f"{p.pool.block_size} tokens at once, but the pool has {p.pool.num_blocks}. "
                "Shorten the prompt or the output, use fewer requests, or enlarge the pool.")

    def blocks_held(self, frames: tuple[WalkFrame, ...], num_tokens: int) -> int:
        """Physical blocks request A holds once it has `num_tokens` tokens."""
        first = self.requests[0]
        if not first.prompt_len <= num_tokens <= first.total_len:
            raise ValueError(f"request A has between {first.prompt_len} and {first.total_len} "
                             f"tokens, not {num_tokens}")
        frame = frames[int(first.arrival_s) + num_tokens - first.prompt_len]
        return len(frame.snapshot.sequences[0].block_table)

    def tail_slots(self, frames: tuple[WalkFrame, ...], req_id: int) -> int:
        """Unused slots in a request's last block once it has all its tokens."""
        frame = frames[last_decode(self.requests[req_id])]
        seq_id = {name: s for s, name in frame.seq_names.items()}[request_name(req_id)]
        seq = next(s for s in frame.snapshot.sequences if s.seq_id == seq_id)
        return len(seq.block_table) * self.config.pool.block_size - seq.num_tokens

    def caption(self, frame: WalkFrame) -> list[str]:
        """What happened at this step, one sentence per request that did something."""
        bs = self.config.pool.block_size
        if frame.step == 0:
            return [f"The pool is empty: {frame.snapshot.num_blocks} free blocks of {bs} "
                    "slots. Press Step to prefill request A's prompt."]
        by_name = {name: seq_id for seq_id, name in (frame.seq_names | frame.left).items()}
        lines = []
        for request in frame.requests:
            name = request_name(request.req_id)
            seq_id = by_name.get(name)
            mine = [e for e in frame.events if e.seq_id == seq_id]
            taken = [e.block_id for e in mine if e.kind == "allocate"]
            if int(request.arrival_s) == frame.step:
                lines.append(f"**{name}** arrives: its {request.prompt_len}-token prompt "
                             f"(positions 0–{request.prompt_len - 1}) is prefilled into "
                             f"{len(taken)} new block(s): {', '.join(map(str, taken))}.")
            for e in (e for e in mine if e.kind == "append"):
                pos, slot = e.detail["pos"], e.detail["slot"]
                where = (f"slot {slot % bs} of physical block {e.block_id} (pool slot {slot})")
                new = " — a **new block**, because its last block was full" if taken else ""
                lines.append(f"**{name}** decodes position {pos} into {where}{new}.")
                if pos + 1 == request.total_len:
                    tail = blocks_for(request.total_len, bs) * bs - request.total_len
                    lines.append(f"**{name}** is finished at {request.total_len} tokens: "
                                 f"{tail} slot(s) of its last block stay unused.")
            freed = [e.block_id for e in mine if e.kind == "free"]
            if freed:
                lines.append(f"**{name}** has left: its {len(freed)} block(s) "
                             f"({', '.join(map(str, freed))}) go back to the free queue, "
                             "ready for the next request.")
        if not frame.seq_names and frame.left:
            lines.append("Every request has finished: the pool is empty again.")
        return lines


def event_steps(frames: tuple[WalkFrame, ...]) -> list[tuple[int, str]]:
    """The walk's notable steps, (step, short label), for "Next event": a request arriving, a
    request taking a new block while it decodes, a request leaving (its blocks freed)."""
    events = []
    for frame in frames[1:]:
        arrived = {request_name(r.req_id) for r in frame.requests
                   if int(r.arrival_s) == frame.step}
        names = frame.seq_names | frame.left
        for e in frame.events:
            name = names.get(e.seq_id, "")
            if e.kind == "allocate" and name not in arrived:
                events.append((frame.step, f"new block ({name})"))
        events += [(frame.step, f"{name} arrives") for name in sorted(arrived)]
        events += [(frame.step, f"{name} leaves") for name in sorted(frame.left.values())]
    return list(dict.fromkeys(events))
