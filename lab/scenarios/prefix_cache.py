"""Prefix caching: requests that share a system prompt, on the paged pool with the prefix cache.

Each request is one of a few "apps" (a system prompt) followed by its own question, served by
the lab's scheduler on a step clock (as on the fragmentation page). Full blocks are named by a
hash chained over every earlier token, so a later request with the same leading tokens finds
those blocks and skips their prefill. Finished requests leave their full blocks in the free
queue still holding their hash ("cached free"): reusable until a new allocation needs the space
and evicts one. Only full blocks are shared, and at most (prompt_len - 1) // block_size of them:
the last prompt token's query must be computed to produce the first output token, so its block
is always prefilled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.events import Event
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.scenarios.story import Story
from lab.serving.config import step_server
from lab.serving.cost_model import StepClock
from lab.serving.request import IterationRecord
from lab.serving.scheduler import Scheduler
from lab.serving.synthetic_kv import VOCAB
from lab.serving.workloads import RequestSpec

APP_NAMES = "ABCDEFGH"


@dataclass(frozen=True)
class PrefixConfig:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_blocks=16, block_size=8))
    num_requests: int = 8
    num_apps: int = 2  # distinct system prompts; requests mostly use the first
    system_len: int = 20  # tokens of each system prompt
    question_min: int = 3
    question_max: int = 12
    output_min: int = 2
    output_max: int = 6
    arrival_gap: int = 2  # steps between arrivals

    def __post_init__(self) -> None:
        for name in ("num_requests", "num_apps", "system_len", "question_min", "output_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_apps > len(APP_NAMES):
            raise ValueError(f"at most {len(APP_NAMES)} apps, got {self.num_apps}")
        if self.arrival_gap < 0:
            raise ValueError(f"arrival_gap must be 0 or more, got {self.arrival_gap}")
        for low, high in (("question_min", "question_max"), ("output_min", "output_max")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} ({getattr(self, low)}) is above {high} "
                                 f"({getattr(self, high)})")
        longest = self.system_len + self.question_max + self.output_max
        need = blocks_for(longest, self.pool.block_size)
        if need > self.pool.num_blocks:
            raise ValueError(f"one request may grow to {longest} tokens, {need} blocks, but the "
                             f"pool has {self.pool.num_blocks}: add blocks or shorten the prompts")


def make_workload(cfg: PrefixConfig, seed: int) -> tuple[tuple[RequestSpec, ...], tuple[int, ...]]:
    """The requests, and which app (system prompt) each one uses."""
    rng = random.Random(seed)
    systems = [[rng.randrange(VOCAB) for _ in range(cfg.system_len)] for _ in range(cfg.num_apps)]
    requests, apps = [], []
    for req_id in range(cfg.num_requests):
        # Apps share the pool: while one app is idle, another's blocks push it out of the cache.
        app = 0 if cfg.num_apps == 1 or rng.random() < 0.6 else rng.randrange(1, cfg.num_apps)
        question = [rng.randrange(VOCAB) for _ in range(rng.randint(cfg.question_min,
                                                                    cfg.question_max))]
        output = [rng.randrange(VOCAB) for _ in range(rng.randint(cfg.output_min,
                                                                  cfg.output_max))]
        prompt = systems[app] + question
        requests.append(RequestSpec(req_id, len(prompt), len(output),
                                    float(req_id * cfg.arrival_gap), tokens=(*prompt, *output)))
        apps.append(app)
    return tuple(requests), tuple(apps)


LinkStatus = Literal["hit", "miss", "last", "partial"]


@dataclass(frozen=True)
class ChainLink:
    """One logical block of a prompt, as the prefix cache saw it at admission.

    hit: found in the cache, not prefilled. miss: looked up, not found, prefilled and then
    registered. last: full, but holds the last prompt token, so it is never looked up (it is
    prefilled, then registered for later requests). partial: not full, so it has no hash.
    """

    index: int
    positions: tuple[int, int]  # [start, end) of the prompt tokens it holds
    block_hash: str | None  # its chain hash once full; None for a partial block
    parent: str | None  # the previous block's hash (None for the first block)
    status: LinkStatus
    block_id: int


@dataclass(frozen=True)
class Admission:
    req_id: int
    app: int
    prompt_len: int
    hit_tokens: int
    chain: tuple[ChainLink, ...]


@dataclass(frozen=True)
class PrefixFrame:
    step: int
    snapshot: Snapshot
    events: tuple[Event, ...]  # what this step did to the pool
    record: IterationRecord | None  # what the scheduler did (None: idle at this step)
    admissions: tuple[Admission, ...]  # requests admitted this step, with their hash chains
    query_tokens: int  # prompt tokens looked up so far
    hit_tokens: int  # of those, found in the cache
    evictions: int  # cached blocks whose hash was dropped for reuse, so far
    seq_of_request: dict[int, int]  # running req_id -> seq_id

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixPlay:
    def __init__(self, cfg: PrefixConfig, requests: tuple[RequestSpec, ...], seed: int,
                 store_kv: bool = False, apps: tuple[int, ...] = ()) -> None:
        self.cfg = cfg
        self.apps = apps or (0,) * len(requests)
        self.server = Scheduler(requests, step_server(cfg.pool, enable_prefix_caching=True,
                                                      compute=store_kv), StepClock(), seed)
        self.step = -1
        self.evictions = 0
        self.record: IterationRecord | None = None

    @property
    def done(self) -> bool:
        return self.server.done

    def advance(self) -> PrefixFrame:
        self.step += 1
        events = self.server.backend.events
        mark = len(events)
        start = self.server.next_start()
        self.record = self.server.step() if start is not None and start <= self.step else None
        new = tuple(events.since(mark))
        self.evictions += sum(e.kind == "evict" for e in new)
        snap = self.server.picture()
        admitted = self.record.admitted_ids if self.record else ()
        query, hits = self.server.backend.prefix_tokens()
        return PrefixFrame(self.step, snap, new, self.record,
                           tuple(self._admission(r, snap) for r in admitted), query, hits,
                           self.evictions,
                           {r.req_id: r.seq_id for r in self.server.running()})

    def _admission(self, req_id: int, snap: Snapshot) -> Admission:
        req = self.server.requests[req_id]  # (it may have finished in the same step)
        bs, prompt_len = self.cfg.pool.block_size, req.spec.prompt_len
        looked_up = (prompt_len - 1) // bs
        chain, parent = [], None
        for i, block_id in enumerate(req.block_table[:blocks_for(prompt_len, bs)]):
            full = (i + 1) * bs <= prompt_len
            block_hash = snap.blocks[block_id].block_hash if full else None
            status: LinkStatus = ("hit" if (i + 1) * bs <= req.num_cached else
                                  "miss" if i < looked_up else "last" if full else "partial")
            chain.append(ChainLink(i, (i * bs, min((i + 1) * bs, prompt_len)), block_hash,
                                   parent, status, block_id))
            parent = block_hash
        return Admission(req_id, self.apps[req_id], prompt_len, req.num_cached, tuple(chain))

    def check_attention(self) -> AttentionCheck | None:
        return self.record.check if self.record is not None else None

    def events(self) -> dict[str, list[dict]]:
        return {"paged": self.server.backend.events.as_dicts()}


@dataclass(frozen=True)
class PrefixCacheStory(Story[PrefixFrame]):
    page = "prefix_cache"
    config: PrefixConfig
    seed: int

    def play(self, store_kv: bool = False) -> PrefixPlay:
        requests, apps = make_workload(self.config, self.seed)
        return PrefixPlay(self.config, requests, self.seed, store_kv, apps)

    def caption(self, frame: PrefixFrame) -> list[str]:
        """What this step did: admissions with their hits, evictions, finished requests."""
        lines = []
        for a in frame.admissions:
            hits = [link.block_id for link in a.chain if link.status == "hit"]
            found = (f"{a.hit_tokens} tokens found in the cache (block(s) "
                     f"{', '.join(map(str, hits))}), " if hits else
                     "nothing found in the cache, ")
            lines.append(f"**R{a.req_id}** (app {APP_NAMES[a.app]}) is admitted with a "
                         f"{a.prompt_len}-token prompt: {found}{a.prompt_len - a.hit_tokens} "
                         "token(s) prefilled.")
        evicted = [str(e.block_id) for e in frame.events if e.kind == "evict"]
        if evicted:
            which = (f"Block {evicted[0]} was" if len(evicted) == 1 else
                     f"Blocks {', '.join(evicted)} were")
            lines.append(f"{which} free but still cached; new blocks were needed, so the "
                         "cached block(s) at the front of the free queue lost their hash "
                         "(eviction) and were reused.")
        record = frame.record
        for req_id in record.finished_ids if record else ():
            lines.append(f"**R{req_id}** finishes: its blocks lose a reference; full ones stay "
                         "in the pool as cached free blocks until the space is needed.")
        for req_id in record.preempted_ids if record else ():
            lines.append(f"**R{req_id}** is preempted (no free block for its next token): it "
                         "will recompute from its prompt.")
        return lines
