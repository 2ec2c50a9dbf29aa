"""The one-line decisions the scheduler keeps for a page (`explain`), in vLLM V1's terms.

Block counts come from the paged backend's KV cache manager (`kv_cache`), summed over its KV
cache groups: with several groups a request holds a table per group, so its blocks are not its
slots over the block size (a windowed group holds fewer, its null entries hold none).
"""

from __future__ import annotations

from lab.memory.kv_cache_groups import NULL_BLOCK
from lab.serving.request import Request


def _blocks(n: int) -> str:
    return f"{n} block{'s' if n != 1 else ''}"


def held_blocks(kv_cache, req_id: int) -> int:
    """The blocks a request holds now, over every group (null entries hold none)."""
    return sum(len(t) - t.count(NULL_BLOCK) for t in kv_cache.block_tables(req_id))


def _groups(kv_cache) -> str:
    n = kv_cache.num_groups
    return f" over its {n} KV cache groups" if n > 1 else ""


def admitted_line(req: Request, hit: int, chunk: int, cap: int, v1: bool, backend) -> str:
    """An admission: new or re-admitted, its prefix hit, its first chunk and the blocks it got
    (V1: the hit and the chunk, after the whole sequence was checked to fit). `backend` is
    the scheduler's KVBackend (block_size None: one contiguous region, no blocks)."""
    block_size = backend.block_size
    if req.num_preemptions:
        outputs = req.length - req.spec.prompt_len
        what = (f"request {req.req_id} re-admitted after its preemption: {req.length} tokens "
                f"(prompt + {outputs} sampled)")
    else:
        what = f"request {req.req_id} admitted: {req.length} tokens"
    if hit:
        own = set(req.block_table[:hit // block_size]) & set(req.released_table) \
            if block_size else set()
        whose = ", its own blocks from before its preemption" if own else ""
        what += f", {hit} from the prefix cache{whose}"
    rest = req.length - hit
    if block_size is None:
        return f"{what}; its reservation holds {cap} slots"
    kv_cache = backend.kv_cache
    got = held_blocks(kv_cache, req.req_id)
    if chunk < rest:
        chunk_text = f"; a prefill chunk of {chunk} of its {rest} to compute"
    else:
        chunk_text = f"; computes {chunk}"
    if v1:
        # The whole sequence with no hit: a windowed group counts at most its cap.
        whole = kv_cache.blocks_to_admit(req.length, backend.no_hit)
        return (f"{what}{chunk_text}: the whole sequence ({_blocks(whole)}{_groups(kv_cache)}) "
                f"was checked to fit, it holds {_blocks(got)} now")
    return f"{what}{chunk_text}: it takes all its {_blocks(got)} at once (vLLM V0)"


def grown_line(req_id: int, computed: int, chunk: int, length: int, new: int) -> str:
    """A running request's next prefill chunk and the `new` blocks it brought, over every
    group (0 on a contiguous server, whose reservation never grows here)."""
    got = f", {_blocks(new)} more" if new > 0 else ""
    return (f"request {req_id}: next prefill chunk, tokens {computed}-{computed + chunk - 1} "
            f"of {length}{got}")


def preempted_line(victim: Request, why: str, lost: int, swap_asked: bool) -> str:
    note = " (swap space full)" if swap_asked else ""
    kept = victim.length - victim.spec.prompt_len
    return (f"request {victim.req_id} preempted by recompute{note}: {why}; its blocks are "
            f"freed and its {lost} computed tokens dropped, its {kept} sampled tokens kept; it "
            "goes back to the front of the waiting queue")
