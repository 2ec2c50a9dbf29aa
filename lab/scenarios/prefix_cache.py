"""Prefix caching: requests that share a system prompt, on the paged pool with the prefix cache.

Each request is one of a few "apps" (a system prompt) followed by its own question. Full blocks
are named by a hash chained over every earlier token, so a later request with the same leading
tokens finds those blocks and skips their prefill. Finished requests leave their full blocks in
the free queue still holding their hash ("cached free"): reusable until a new allocation needs
the space and evicts the least recently freed one. Only full blocks are shared, and at most
(prompt_len - 1) // block_size of them: the last prompt token's query must be computed to
produce the first output token, so its block is always prefilled.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Literal

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.events import Event
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.serving.paged_replay import PagedReplay, Request, StepReport
from lab.serving.synthetic_kv import VOCAB, SyntheticKV


@dataclass(frozen=True)
class PrefixConfig:
    num_requests: int = 8
    num_apps: int = 2  # distinct system prompts; requests mostly use the first
    system_len: int = 20  # tokens of each system prompt
    question_min: int = 3
    question_max: int = 12
    output_min: int = 2
    output_max: int = 6
    block_size: int = 8
    num_blocks: int = 16
    arrival_gap: int = 2  # steps between arrivals

    def __post_init__(self) -> None:
        for name in ("num_requests", "num_apps", "system_len", "question_min", "output_min",
                     "block_size", "num_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.arrival_gap < 0:
            raise ValueError(f"arrival_gap must be 0 or more, got {self.arrival_gap}")
        for low, high in (("question_min", "question_max"), ("output_min", "output_max")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} ({getattr(self, low)}) is above {high} "
                                 f"({getattr(self, high)})")
        longest = self.system_len + self.question_max + self.output_max
        if blocks_for(longest, self.block_size) > self.num_blocks:
            raise ValueError(f"one request may grow to {longest} tokens, "
                             f"{blocks_for(longest, self.block_size)} blocks, but the pool has "
                             f"{self.num_blocks}: add blocks or shorten the prompts")

    @property
    def pool_config(self) -> PoolConfig:
        return PoolConfig(num_blocks=self.num_blocks, block_size=self.block_size)


def make_workload(cfg: PrefixConfig, seed: int) -> tuple[list[Request], list[int]]:
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
        requests.append(Request(req_id, req_id * cfg.arrival_gap, tuple(systems[app] + question),
                                tuple(output)))
        apps.append(app)
    return requests, apps


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
    seq_id: int
    app: int
    prompt_len: int
    hit_tokens: int
    chain: tuple[ChainLink, ...]


@dataclass(frozen=True)
class PrefixFrame:
    step: int
    snapshot: Snapshot
    events: tuple[Event, ...]
    report: StepReport
    admissions: tuple[Admission, ...]  # requests admitted this step, with their hash chains
    query_tokens: int  # prompt tokens looked up so far
    hit_tokens: int  # of those, found in the cache
    evictions: int  # cached blocks whose hash was dropped for reuse, so far
    seq_of_request: dict[int, int]  # running req_id -> seq_id

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixScenario:
    def __init__(self, cfg: PrefixConfig, seed: int, store_kv: bool = False,
                 workload: tuple[list[Request], list[int]] | None = None) -> None:
        self.cfg = cfg
        self.requests, self.apps = workload or make_workload(cfg, seed)
        manager = KVCacheManager(cfg.pool_config, enable_prefix_cache=True, store_kv=store_kv)
        kv = SyntheticKV(cfg.pool_config, seed) if store_kv else None
        self.replay = PagedReplay(manager, self.requests, kv)
        self.evictions = 0

    @property
    def manager(self) -> KVCacheManager:
        return self.replay.manager

    @property
    def done(self) -> bool:
        return self.replay.done

    @property
    def step(self) -> int:
        return self.replay.step

    def advance(self) -> PrefixFrame:
        start = len(self.manager.events)
        report = self.replay.advance()
        events = tuple(self.manager.events.since(start))
        self.evictions += sum(e.kind == "evict" for e in events)
        admissions = tuple(self._admission(r) for r in report.admitted)
        m = self.manager
        return PrefixFrame(self.replay.step, m.snapshot(), events, report, admissions,
                           m.prefix_query_tokens, m.prefix_hit_tokens, self.evictions,
                           dict(self.replay.running))

    def _admission(self, req_id: int) -> Admission:
        seq = self.manager.sequences[self.replay.running[req_id]]
        bs, prompt_len = self.cfg.block_size, self.requests[req_id].prompt_len
        looked_up = (prompt_len - 1) // bs
        chain = []
        for i, block_id in enumerate(seq.block_table):
            full = i < len(seq.block_hashes)
            status: LinkStatus = ("hit" if (i + 1) * bs <= seq.num_cached_tokens else
                                  "miss" if i < looked_up else "last" if full else "partial")
            chain.append(ChainLink(i, (i * bs, min((i + 1) * bs, prompt_len)),
                                   seq.block_hashes[i] if full else None,
                                   seq.block_hashes[i - 1] if i else None, status, block_id))
        return Admission(req_id, seq.seq_id, self.apps[req_id], prompt_len,
                         seq.num_cached_tokens, tuple(chain))

    def check_attention(self) -> AttentionCheck | None:
        return self.replay.check_attention()


def run(cfg: PrefixConfig, seed: int, max_steps: int = 1000) -> list[PrefixFrame]:
    """Every frame until the last request finishes, allocator only (fast)."""
    scenario = PrefixScenario(cfg, seed)
    frames = []
    while not scenario.done:
        if len(frames) == max_steps:
            raise RuntimeError(f"the workload did not drain in {max_steps} steps")
        frames.append(scenario.advance())
    return frames


def trace_json(cfg: PrefixConfig, seed: int, step: int) -> str:
    """The event trace up to `step` (allocator only), with what replays it."""
    scenario = PrefixScenario(cfg, seed)
    while scenario.step < step and not scenario.done:
        scenario.advance()
    return scenario.manager.events.to_json(page="prefix_cache", seed=seed, step=step,
                                           params=asdict(cfg))


def describe(frame: PrefixFrame) -> list[str]:
    """What this step did: admissions with their hits, evictions, finished requests."""
    lines = []
    for a in frame.admissions:
        hits = [link.block_id for link in a.chain if link.status == "hit"]
        found = (f"{a.hit_tokens} tokens found in the cache (block(s) "
                 f"{', '.join(map(str, hits))}), " if hits else "nothing found in the cache, ")
        lines.append(f"**R{a.req_id}** (app {app_name(a.app)}) is admitted with a "
                     f"{a.prompt_len}-token prompt: {found}{a.prompt_len - a.hit_tokens} "
                     "token(s) prefilled.")
    evicted = [str(e.block_id) for e in frame.events if e.kind == "evict"]
    if evicted:
        which = (f"Block {evicted[0]} was" if len(evicted) == 1 else
                 f"Blocks {', '.join(evicted)} were")
        lines.append(f"{which} free but still cached; new blocks were needed, so the least "
                     "recently freed cached block(s) lost their hash (eviction) and were reused.")
    for req_id in frame.report.finished:
        lines.append(f"**R{req_id}** finishes: its blocks lose a reference; full ones stay in "
                     "the pool as cached free blocks until the space is needed.")
    for req_id in frame.report.preempted:
        lines.append(f"**R{req_id}** is preempted (no free block for its next token): it "
                     "will recompute from its prompt.")
    return lines


def app_name(app: int) -> str:
    return "ABCDEFGH"[app]
