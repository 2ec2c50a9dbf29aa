"""The one-line decisions the scheduler keeps for a page (`explain`), in vLLM V1's terms."""

from __future__ import annotations

from lab.memory.block_table import blocks_for
from lab.serving.request import Request


def _blocks(n: int) -> str:
    return f"{n} block{'s' if n != 1 else ''}"


def admitted_line(req: Request, hit: int, chunk: int, cap: int, v1: bool,
                  block_size: int | None) -> str:
    """An admission: new or re-admitted, its prefix hit, its first chunk and the blocks it got
    (V1: the hit and the chunk, after the whole sequence was checked to fit)."""
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
    got = cap // block_size
    if chunk < rest:
        chunk_text = f"; a prefill chunk of {chunk} of its {rest} to compute"
    else:
        chunk_text = f"; computes {chunk}"
    if v1:
        whole = blocks_for(req.length, block_size)
        return (f"{what}{chunk_text}: the whole sequence ({_blocks(whole)}) was checked to fit, "
                f"it holds {_blocks(got)} now")
    return f"{what}{chunk_text}: it takes all its {_blocks(got)} at once (vLLM V0)"


def grown_line(req_id: int, computed: int, chunk: int, length: int, cap: int, old_cap: int,
               block_size: int | None) -> str:
    """A running request's next prefill chunk and the blocks it brought."""
    new = (cap - old_cap) // block_size if block_size else 0
    got = f", {_blocks(new)} more" if new > 0 else ""
    return (f"request {req_id}: next prefill chunk, tokens {computed}-{computed + chunk - 1} "
            f"of {length}{got}")


def preempted_line(victim: Request, why: str, lost: int, swap_asked: bool) -> str:
    note = " (swap space full)" if swap_asked else ""
    kept = victim.length - victim.spec.prompt_len
    return (f"request {victim.req_id} preempted by recompute{note}: {why}; its blocks are "
            f"freed and its {lost} computed tokens dropped, its {kept} sampled tokens kept; it "
            "goes back to the front of the waiting queue")
