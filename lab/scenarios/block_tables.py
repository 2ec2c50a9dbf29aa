"""The guide's allocator walk, for several interleaved requests, replayable at any step.

Request A has the prompt and output lengths the learner picks (the guide's example: prompt 30,
output 4, block size 16). Requests B, C, ... get seeded lengths around A's and arrive one step
apart, so their blocks interleave in the pool. Step 0 is the empty pool; at step i + 1 request
i arrives and its prompt is prefilled; every request already in the pool then decodes one token
per step until it has its output. Finished requests keep their blocks, so the last picture shows
each request's unused tail.

`replay_walk(params, seed, step)` rebuilds the state at `step` from nothing: the allocator runs
step by step, exactly as a live run would, then the K/V of every token in the pool is written
into the real KV pool at the slots the allocator gave it. A token's K/V depends only on (seed,
token id, position) (see lab/synthetic_kv.py), so the pool holds the same values a token-by-token
run would have written. The Triton kernel then reads them through the block tables.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from functools import lru_cache

from kernels.reference import AttentionCheck
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import KVCacheManager
from lab.memory.events import Event
from lab.memory.kernel_check import check_kernel
from lab.memory.kv_pool import PoolConfig
from lab.memory.snapshot import Snapshot
from lab.serving.synthetic_kv import VOCAB, SyntheticKV

REQUEST_NAMES = "ABCDEFGH"


class WalkTooBig(ValueError):
    """The requests together need more blocks than the pool has (a message for the learner)."""


@dataclass(frozen=True)
class WalkParams:
    block_size: int = 16
    prompt_len: int = 30
    output_len: int = 4
    num_requests: int = 3
    num_blocks: int = 64
    head_dim: int = 64
    num_kv_heads: int = 2

    def config(self) -> PoolConfig:
        return PoolConfig(num_blocks=self.num_blocks, block_size=self.block_size,
                          num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)


@dataclass(frozen=True)
class WalkRequest:
    name: str  # "A", "B", ...
    arrival: int  # the step at which its prompt is prefilled
    prompt: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def total_len(self) -> int:
        return len(self.prompt) + len(self.output)


@dataclass(frozen=True)
class WalkFrame:
    step: int
    requests: tuple[WalkRequest, ...]
    seq_names: dict[int, str]  # engine seq_id -> request name, for the requests in the pool
    snapshot: Snapshot
    events: tuple[Event, ...]  # what this step did
    trace_json: str  # every event up to this step, with the parameters that replay it
    check: AttentionCheck | None  # kernel vs dense for the newest token of each sequence


def walk_requests(params: WalkParams, seed: int) -> tuple[WalkRequest, ...]:
    """Request A from the parameters; the others seeded around A's lengths."""
    rng = random.Random(seed)
    requests = []
    for i in range(params.num_requests):
        prompt_len, output_len = params.prompt_len, params.output_len
        if i > 0:
            prompt_len = rng.randint(max(1, prompt_len // 2), prompt_len + prompt_len // 2)
            output_len = rng.randint(max(1, output_len // 2), output_len + output_len // 2)
        tokens = [rng.randrange(VOCAB) for _ in range(prompt_len + output_len)]
        requests.append(WalkRequest(REQUEST_NAMES[i], i + 1, tuple(tokens[:prompt_len]),
                                    tuple(tokens[prompt_len:])))
    return tuple(requests)


def blocks_required(params: WalkParams, seed: int) -> int:
    """Blocks the whole walk holds at its end (nothing is freed)."""
    return sum(blocks_for(r.total_len, params.block_size) for r in walk_requests(params, seed))


def last_step(params: WalkParams, seed: int) -> int:
    """The step at which the last request has decoded its last token."""
    return max(r.arrival + len(r.output) for r in walk_requests(params, seed))


def validate(params: WalkParams, seed: int) -> None:
    """Raise WalkTooBig, with a message saying what to change, if the pool is too small."""
    needed = blocks_required(params, seed)
    if needed > params.num_blocks:
        raise WalkTooBig(
            f"These {params.num_requests} request(s) need {needed} blocks of "
            f"{params.block_size} tokens by the end, but the pool has {params.num_blocks}. "
            "Shorten the prompt or the output, use fewer requests, or enlarge the pool.")


@lru_cache(maxsize=8)
def synthetic_kv(params: WalkParams, seed: int) -> SyntheticKV:
    """The K/V and query tables for these parameters (immutable once built, so shared)."""
    return SyntheticKV(params.config(), seed)


def run_walk(params: WalkParams, seed: int, step: int,
             store_kv: bool = True) -> tuple[KVCacheManager, dict[int, str]]:
    """The allocator after `step` steps, with every token's K/V written into the pool
    (store_kv=False: the allocator alone, no tensors)."""
    validate(params, seed)
    if not 0 <= step <= last_step(params, seed):
        raise ValueError(f"step must be in [0, {last_step(params, seed)}], got {step}")
    manager = KVCacheManager(params.config(), enable_prefix_cache=False, store_kv=store_kv)
    requests = walk_requests(params, seed)
    names: dict[int, str] = {}
    by_name = {}
    for now in range(1, step + 1):
        manager.events.next_step()
        for request in requests:
            if request.arrival == now:  # prefill: blocks for the whole prompt
                seq = manager.add_sequence(list(request.prompt))
                names[seq.seq_id], by_name[request.name] = request.name, seq.seq_id
            elif request.arrival < now <= request.arrival + len(request.output):  # decode
                manager.append_token(by_name[request.name],
                                     request.output[now - request.arrival - 1])
    for seq_id in names:
        tokens = manager.sequences[seq_id].tokens
        if store_kv:
            keys, values = synthetic_kv(params, seed).keys_values(tokens, 0)  # [L, n, H, D]
            manager.write(seq_id, 0, keys, values)
        else:
            manager.commit(seq_id, len(tokens))
    return manager, names


def blocks_held(params: WalkParams, seed: int, num_tokens: int) -> int:
    """Physical blocks request A holds once it has `num_tokens` tokens (allocator only)."""
    first = walk_requests(params, seed)[0]
    if not len(first.prompt) <= num_tokens <= first.total_len:
        raise ValueError(f"request A has between {len(first.prompt)} and {first.total_len} "
                         f"tokens, not {num_tokens}")
    manager, _ = run_walk(params, seed, first.arrival + num_tokens - len(first.prompt),
                          store_kv=False)
    return manager.sequences[0].num_blocks


def replay_walk(params: WalkParams, seed: int, step: int) -> WalkFrame:
    """The walk at `step`: picture, this step's events, trace and the attention check."""
    manager, names = run_walk(params, seed, step)
    check = None
    if names:
        seq_ids = list(names)
        kv = synthetic_kv(params, seed)
        queries = kv.queries([manager.sequences[s].tokens[-1] for s in seq_ids])
        check = check_kernel(manager, seq_ids, queries)  # [num_seqs, heads, head_dim] each
    events = tuple(e for e in manager.events.events if e.step == step and step > 0)
    trace = manager.events.to_json(page="block_tables", seed=seed, step=step,
                                   params=asdict(params))
    return WalkFrame(step, walk_requests(params, seed), names, manager.snapshot(), events,
                     trace, check)


def final_tail_slots(params: WalkParams, seed: int) -> int:
    """Unused slots in request A's last block once it has finished (allocator only)."""
    manager, _ = run_walk(params, seed, last_step(params, seed), store_kv=False)
    return manager.sequences[0].tail_slots


def describe_step(frame: WalkFrame, block_size: int) -> list[str]:
    """What happened at this step, one sentence per request that did something."""
    if frame.step == 0:
        return [f"The pool is empty: {frame.snapshot.num_blocks} free blocks of {block_size} "
                "slots. Press Step to prefill request A's prompt."]
    by_name = {name: seq_id for seq_id, name in frame.seq_names.items()}
    lines = []
    for request in frame.requests:
        seq_id = by_name.get(request.name)
        mine = [e for e in frame.events if e.seq_id == seq_id]
        taken = [e.block_id for e in mine if e.kind == "allocate"]
        if request.arrival == frame.step:
            lines.append(f"**{request.name}** arrives: its {len(request.prompt)}-token prompt "
                         f"is prefilled into {len(taken)} new block(s): "
                         f"{', '.join(map(str, taken))}.")
        for e in (e for e in mine if e.kind == "append"):
            pos, slot = e.detail["pos"], e.detail["slot"]
            where = f"slot {slot % block_size} of physical block {e.block_id}"
            new = " — a **new block**, because its last block was full" if taken else ""
            lines.append(f"**{request.name}** decodes its token #{pos + 1} (position {pos}) "
                         f"into {where}{new}.")
            if pos + 1 == request.total_len:
                tail = blocks_for(request.total_len, block_size) * block_size - request.total_len
                lines.append(f"**{request.name}** is finished at {request.total_len} tokens: "
                             f"{tail} slot(s) of its last block stay unused.")
    return lines
