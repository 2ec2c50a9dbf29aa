"""What one step of the mixed-attention walk shows (lab/scenarios/mixed_attention.py), and its
caption in the guide's words: KV cache group, sliding window, null block."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.memory.kv_cache_groups import NULL_BLOCK

FULL, WINDOW = 0, 1  # group ids: the order of GROUP_LABELS


@dataclass(frozen=True)
class GroupChange:
    """What one request's block table in one group did at a step."""

    new: tuple[int, ...]  # blocks appended
    nulled: tuple[tuple[int, int], ...]  # (logical block, physical block) turned null, freed


@dataclass(frozen=True)
class Arrival:
    name: str
    prompt_len: int
    system_len: int
    hit_tokens: int  # what every group serves
    group_hits: tuple[int, ...]  # what each group alone would serve
    hit_blocks: tuple[tuple[int, ...], ...]  # per group, null before the window
    from_free: tuple[int, ...]  # hit blocks that were free (cached) and come back
    changes: tuple[GroupChange, ...]  # the prefill's new blocks


@dataclass(frozen=True)
class RequestView:
    name: str
    num_tokens: int  # with K/V in the pool
    tables: tuple[tuple[int, ...], ...]  # a block table per group (NULL_BLOCK: not held)

    @property
    def held(self) -> tuple[int, ...]:
        """Blocks held per group (null positions hold none)."""
        return tuple(sum(b != NULL_BLOCK for b in t) for t in self.tables)


@dataclass(frozen=True)
class BlockView:
    block_id: int
    state: str  # "used", "cached" (free, hash kept) or "free"
    group: int | None  # the group whose table holds (or last held) it
    first_pos: int | None  # the token position of its first slot there
    holders: tuple[str, ...]  # requests holding it
    filled: int  # slots holding a token


@dataclass(frozen=True)
class MixedFrame:
    step: int
    block_size: int
    requests: tuple[RequestView, ...]  # those in the pool after the step
    blocks: tuple[BlockView, ...]
    decoded: dict[str, int]  # request -> position decoded at this step
    arrivals: tuple[Arrival, ...]
    changes: dict[str, tuple[GroupChange, ...]]  # request -> per group, for the decodes
    left: dict[str, tuple[int, ...]]  # request -> the blocks it gave back when it left
    evicted: tuple[tuple[int, int, int], ...]  # (block, group, first position) of cached K/V
    num_free: int
    # request -> the blocks it gave back that another request still held (shared, not freed)
    kept: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _span(first: int, last: int, what: str) -> str:
    return f"{what} {first}" if first == last else f"{what}s {first}–{last}"


def _ids(blocks: tuple[int, ...] | list[int]) -> str:
    return ", ".join(map(str, blocks))


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _group_work(changes: tuple[GroupChange, ...], labels: tuple[str, ...], bs: int) -> str:
    """Each group's new blocks and the blocks that left its window, one sentence per group."""
    parts = []
    for label, change in zip(labels, changes):
        bits = []
        if change.new:
            n = len(change.new)
            bits.append(f"its block table takes physical {_plural(n, 'block', 'blocks')} "
                        f"{_ids(change.new)}")
        if change.nulled:
            logical = [i for i, _ in change.nulled]
            lo, hi, n = min(logical), max(logical), len(logical)
            span = _span(lo, hi, "logical block")
            positions = _span(lo * bs, hi * bs + bs - 1, "position")
            freed = _ids([b for _, b in change.nulled])
            bits.append(f"{span} ({positions}) {_plural(n, 'leaves', 'leave')} the window: "
                        f"{_plural(n, 'it becomes', 'each becomes')} the null block, and "
                        f"physical {_plural(n, 'block', 'blocks')} {freed} "
                        f"{_plural(n, 'goes', 'go')} back to the pool")
        if bits:
            parts.append(f"{label.capitalize()}: {'; '.join(bits)}.")
    return " ".join(parts)


def _arrival(a: Arrival, bs: int, window: int, labels: tuple[str, ...]) -> list[str]:
    own = a.prompt_len - a.system_len
    article = "an" if str(a.prompt_len).startswith("8") or a.prompt_len in (11, 18) else "a"
    lines = [f"**{a.name}** arrives with {article} {a.prompt_len}-token prompt: the "
             f"{a.system_len}-token system prompt, then {own} "
             f"{_plural(own, 'token', 'tokens')} of its own."]
    full, windowed = a.group_hits[FULL], a.group_hits[WINDOW]
    if a.hit_tokens < max(a.group_hits):
        first = max(full - window + 1, 0)
        lines.append(
            f"Full attention alone would serve {full} tokens from the prefix cache, the sliding "
            f"window only {windowed}: it needs its blocks of {_span(first, full - 1, 'position')}"
            f" (the window before position {full}), and they are no longer cached: evicted. "
            f"A prefix hit must hold in every KV cache group, so it is **{a.hit_tokens} tokens**.")
    elif a.hit_tokens:
        nulls = sum(b == NULL_BLOCK for b in a.hit_blocks[WINDOW])
        line = (f"The prefix cache serves its first **{a.hit_tokens} tokens** in both groups "
                f"(full attention finds {full}, the sliding window {windowed}).")
        if nulls:
            line += (f" In the sliding-window group {_span(0, nulls - 1, 'logical block')} "
                     f"{'is' if nulls == 1 else 'are'} the null block from the start: the "
                     f"window of position {a.hit_tokens} never reaches "
                     f"{_span(0, nulls * bs - 1, 'position')}.")
        if a.from_free:
            n = len(a.from_free)
            line += (f" Physical {_plural(n, 'block', 'blocks')} {_ids(a.from_free)} "
                     f"{_plural(n, 'was', 'were')} free in the pool but still cached: "
                     f"{_plural(n, 'it is', 'they are')} taken back, not computed again.")
        lines.append(line)
    else:
        lines.append("Nothing of it is in the prefix cache yet.")
    work = _group_work(a.changes, labels, bs)
    rest = a.prompt_len - a.hit_tokens
    others = _plural(rest, "The other prompt token is", f"The other {rest} prompt tokens are")
    lines.append(f"{others} prefilled. {work}" if a.hit_tokens
                 else f"All {rest} are prefilled. {work}")
    return lines


def returned(frame: MixedFrame, name: str) -> tuple[list[int], list[int]]:
    """A leaving request's blocks: (back in the pool, still held by another request)."""
    kept = frame.kept.get(name, ())
    return [b for b in frame.left[name] if b not in kept], list(kept)


def caption(frame: MixedFrame, num_blocks: int, bs: int, window: int,
            labels: tuple[str, ...]) -> list[str]:
    """What happened at this step, one sentence per request that did something."""
    if frame.step == 0:
        return [f"The pool is empty: {num_blocks} free blocks of {bs} slots, one pool for both "
                "KV cache groups. Press Step: request A arrives."]
    lines = []
    for name in frame.left:
        freed, shared = returned(frame, name)
        line = (f"**{name}** has finished and left: its physical "
                f"{_plural(len(freed), 'block', 'blocks')} {_ids(freed)} "
                f"{_plural(len(freed), 'goes', 'go')} back to the pool; the full ones stay "
                "cached (they keep their hash) until the pool hands them out again.")
        if shared:
            holders = sorted({h for b in frame.blocks if b.block_id in shared for h in b.holders
                              if h not in frame.left})
            line += (f" {_plural(len(shared), 'Block', 'Blocks')} {_ids(shared)} "
                     f"{_plural(len(shared), 'stays', 'stay')} in use: "
                     f"{' and '.join(holders)} still {_plural(len(holders), 'holds', 'hold')} "
                     f"{_plural(len(shared), 'it', 'them')} (a shared block goes back only "
                     "when its last holder leaves).")
        lines.append(line)
    for name, pos in frame.decoded.items():
        work = _group_work(frame.changes[name], labels, bs)
        lines.append(f"**{name}** decodes position {pos}. "
                     + (work or "Both groups write it into blocks they already hold."))
    for arrival in frame.arrivals:
        lines += _arrival(arrival, bs, window, labels)
    if frame.evicted:
        n = len(frame.evicted)
        per_group = "; ".join(
            f"{label}: {_ids(blocks)}" for g, label in enumerate(labels)
            if (blocks := [b for b, group, _ in frame.evicted if group == g]))
        which = _plural(n, "A free but cached block was", f"{n} free but cached blocks were")
        lines.append(f"{which} handed out again, so {_plural(n, 'its', 'their')} cached K/V "
                     f"is overwritten: evicted from the prefix cache ({per_group}).")
    if not frame.requests:
        cached = sum(b.state == "cached" for b in frame.blocks)
        lines.append(f"Every request has finished: all {num_blocks} physical blocks are back in "
                     "the pool, free" + (f"; {cached} of them still cached, their K/V kept "
                     "for a later prompt that starts the same way." if cached else "."))
    return lines
