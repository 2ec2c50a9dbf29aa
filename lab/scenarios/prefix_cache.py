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
from lab.memory.prefix_cache import chain
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
    # The guide's block size; a pool small enough that cached prompts are evicted by default.
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(num_blocks=8, block_size=16))
    num_requests: int = 8
    num_apps: int = 3  # distinct system prompts; requests mostly use the first
    system_len: int = 36  # tokens of each system prompt: two full blocks of 16, and 4 more
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
    # Which prompt each hashed block holds: "A·L1" for logical block 1 of app A's system prompt
    # (any request of app A can hit it), "R3" for a block of R3's own tokens.
    holds: dict[int, str]
    evicted: tuple[str, ...]  # what each block evicted at this step held (as in `holds`)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixStepper:
    def __init__(self, cfg: PrefixConfig, requests: tuple[RequestSpec, ...], seed: int,
                 store_kv: bool = False, apps: tuple[int, ...] = ()) -> None:
        self.cfg = cfg
        self.apps = apps or (0,) * len(requests)
        self.server = Scheduler(requests, step_server(cfg.pool, enable_prefix_caching=True,
                                                      compute=store_kv), StepClock(), seed)
        self.step = -1
        self.evictions = 0
        self.record: IterationRecord | None = None
        bs = cfg.pool.block_size
        self.names: dict[str, str] = {}  # block hash -> what it holds (see PrefixFrame.holds)
        for r, app in zip(requests, self.apps):
            system = r.tokens[:cfg.system_len]
            for i, h in enumerate(chain(system, bs, len(system) // bs)):
                self.names[h.value] = f"{APP_NAMES[app]}·L{i}"

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
        names = {seq: f"R{r.req_id}" for r in self.server.running() for seq in (r.seq_id,)}
        for block in snap.blocks:
            if block.block_hash and block.state == "used":
                self.names.setdefault(block.block_hash, names[block.owners[0]])
        evicted = tuple(self.names.get(e.detail.get("hash"), "?") for e in new
                        if e.kind == "evict")
        admitted = self.record.admitted_ids if self.record else ()
        query, hits = self.server.backend.prefix_tokens()
        return PrefixFrame(self.step, snap, new, self.record,
                           tuple(self._admission(r, snap) for r in admitted), query, hits,
                           self.evictions,
                           {r.req_id: r.seq_id for r in self.server.running()},
                           {b.block_id: self.names[b.block_hash] for b in snap.blocks
                            if b.block_hash in self.names}, evicted)

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

    def stepper(self, store_kv: bool = False) -> PrefixStepper:
        requests, apps = make_workload(self.config, self.seed)
        return PrefixStepper(self.config, requests, self.seed, store_kv, apps)

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
        evicted = [f"{e.block_id} ({held})" for e, held in
                   zip((e for e in frame.events if e.kind == "evict"), frame.evicted)]
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
        if record and record.finished == self.config.num_requests:
            cached = frame.snapshot.usage.blocks_cached_free
            lines.append(f"All {record.finished} requests are done: every block is back in the "
                         f"free queue, {cached} of them still cached (grey) for a later request "
                         "with the same prefix.")
        return lines


@dataclass(frozen=True)
class HitQuestion:
    """The one admission a story asks about: how many of its prompt tokens will hit. Asked at
    `step - 1`, whose pool (with what each block holds) decides the answer."""

    step: int  # the step that admits it
    admission: Admission
    found: tuple[str, ...]  # what the blocks it hits hold ("A·L0", ...)
    reason: str  # why the answer is what it is, in the pool's terms


def hit_question(frames: tuple[PrefixFrame, ...], block_size: int,
                 system_len: int) -> HitQuestion | None:
    """The admission that teaches most, among those the pool one step before decides (no
    eviction or earlier admission in the same step changes it): first one whose app's cached
    system prompt was evicted, then one that revives cached free blocks, then one that hits
    blocks in use, then one of an app that has not run yet."""
    seen = {a.app for a in frames[0].admissions} if frames else set()  # apps admitted so far
    best: tuple[int, HitQuestion] | None = None
    for before, frame in zip(frames, frames[1:]):
        if not frame.admissions:
            continue
        a = frame.admissions[0]
        app, ran = APP_NAMES[a.app], a.app in seen
        seen.update(x.app for x in frame.admissions)
        lookups = (a.prompt_len - 1) // block_size
        present = {b.block_hash: b for b in before.snapshot.blocks if b.block_hash}
        hits = 0
        while hits < lookups and a.chain[hits].block_hash in present:
            hits += 1
        if hits * block_size != a.hit_tokens:
            continue  # this step changed the pool before the admission: not decidable
        found = tuple(before.holds[present[link.block_hash].block_id] for link in a.chain[:hits])
        system_blocks = min(system_len // block_size, lookups)
        evicted = [f.step for f in frames[:frame.step]
                   if f"{app}·L{hits}" in f.evicted] if hits < system_blocks else []
        cached = hits and all(present[link.block_hash].state == "cached"
                              for link in a.chain[:hits])
        rank = 0 if evicted else 1 if cached else 2 if hits else 3 if not ran else 4
        if rank == 4 or (best is not None and best[0] <= rank):
            continue
        where = ("cached free (grey)" if cached else "in the pool")
        parts = [f"{', '.join(found)} {'was' if hits == 1 else 'were'} {where} at step "
                 f"{before.step}, so {a.hit_tokens} tokens are found." if hits else
                 "Nothing is found."]
        if evicted:
            parts.append(f"{app}·L{hits} had been evicted at step {evicted[-1]} (it was at the "
                         "front of the free queue when a new block was needed), and a chain "
                         "stops at its first missing block.")
        elif not ran and not hits:
            parts.append(f"No request of app {app} had run before, so no block held its "
                         "system prompt.")
        if hits == lookups < a.prompt_len // block_size:
            parts.append("The block holding the last prompt token is never looked up.")
        best = rank, HitQuestion(frame.step, a, found, " ".join(parts))
    return best[1] if best else None


def event_steps(frames: tuple[PrefixFrame, ...]) -> list[tuple[int, str]]:
    """The steps where something worth stopping at happens, each with what: a prefix hit, an
    eviction, a request that finishes (its full blocks stay cached), a preemption."""
    out = []
    for f in frames:
        notes = [f"R{a.req_id} finds {a.hit_tokens} prompt tokens in the cache"
                 for a in f.admissions if a.hit_tokens]
        if f.evicted:
            notes.append(f"evicted: {', '.join(f.evicted)}")
        record = f.record
        notes += [f"R{r} finishes, its full blocks stay cached"
                  for r in (record.finished_ids if record else ())]
        notes += [f"R{r} is preempted" for r in (record.preempted_ids if record else ())]
        if notes:
            out.append((f.step, "; ".join(notes)))
    return out
