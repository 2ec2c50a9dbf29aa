"""What each engine did at a step of the copy-on-write story, told in the order it happened.

Events are walked in order and told in runs: consecutive events of one kind make one line, so
a branch dropped before a copy is told before it (and a block it freed, taken again by the copy,
says so).
"""

from __future__ import annotations

from collections.abc import Iterable

from lab.memory.events import Event
from lab.scenarios.branch_engines import Admission, BranchFrame, EngineView


def _who(names: Iterable[str]) -> str:
    return ", ".join(f"**{n}**" for n in dict.fromkeys(names))


def _ids(block_ids: Iterable[int], most: int = 8) -> str:
    """Block ids, the first few of a long list and how many in all."""
    ids = list(block_ids)
    if len(ids) <= most:
        return ", ".join(map(str, ids))
    return ", ".join(map(str, ids[:most - 2])) + f", … ({len(ids)} blocks)"


def _runs(events: tuple[Event, ...]) -> list[tuple[str, list[Event]]]:
    """(kind, events) runs in order; a copy-on-write's own allocate and free (of the fresh
    block and of the shared source) belong to its copy; appends, hits and caching are left
    out (admissions are told from their requests)."""
    part_of_copy = set()
    for i, e in enumerate(events):
        if e.kind == "copy":
            part_of_copy |= {i - 1, i - 2}
    runs: list[tuple[str, list[Event]]] = []
    for i, e in enumerate(events):
        if i in part_of_copy or e.kind not in ("allocate", "free", "share", "copy"):
            continue
        if runs and runs[-1][0] == e.kind:
            runs[-1][1].append(e)
        else:
            runs.append((e.kind, [e]))
    return runs


def _released(view: EngineView, frees: list[Event], names: dict[int, str]) -> str:
    back = [e.block_id for e in frees if e.detail["ref_count"] == 0]
    if not back:
        return "all of them are still shared, none is freed"
    hashed = {b.block_id for b in view.snapshot.blocks if b.block_hash is not None}
    kept = [b for b in back if b in hashed]
    return (f"block(s) {_ids(back)} reach ref count 0 and return to the free queue"
            + (f" (full block(s) {_ids(kept)} keep their hash: still cached)" if kept else ""))


def v0_lines(view: EngineView, frame: BranchFrame, mode: str) -> list[str]:
    """vLLM V0: forks, copies, new blocks, ended branches."""
    names, lines, freed, appended = view.names, [], set(), False
    parents = {s.seq_id: s.parent_id for s in view.snapshot.sequences}
    for kind, run in _runs(view.events):
        who = _who(names[e.seq_id] for e in run)
        if kind == "free":
            verb = "finished"
            if mode == "beam" and not frame.live:
                verb = "is returned as the answer, and the request ends"
            elif mode == "beam":
                verb = ("dropped: the search is over and only the best beam is kept"
                        if not view.computed else "dropped (not among the best beams)")
            lines.append(f"{who} {verb}: each held block loses one reference; "
                         f"{_released(view, run, names)}.")
            freed |= {e.block_id for e in run if e.detail["ref_count"] == 0}
        elif kind == "share":
            forked = list(dict.fromkeys(e.seq_id for e in run))
            lines.append(f"{_who(names[s] for s in forked)} forked from "
                         f"{_who(names[parents[s]] for s in forked)}: each new block table "
                         "points at the same blocks (ref count + 1 each), nothing is copied.")
        elif kind == "copy":
            appended = True
            lines += [_copy_line(view, names, src, group, freed)
                      for src, group in _by_source(run).items()]
        else:
            appended = appended or frame.step > 0
            why = "for the prompt" if frame.step == 0 else "because the last block was full"
            reused = _reused(run, freed)
            lines.append(f"{who} took new block(s) {_ids(e.block_id for e in run)} {why}"
                         + (f" ({reused[2:]})." if reused else "."))
    return lines


def _by_source(copies: list[Event]) -> dict[int, list[Event]]:
    groups: dict[int, list[Event]] = {}
    for e in copies:
        groups.setdefault(e.detail["src"], []).append(e)
    return groups


def _copy_line(view: EngineView, names: dict[int, str], src: int, copies: list[Event],
               freed: set[int]) -> str:
    keeper = [names[s.seq_id] for s in view.snapshot.sequences if src in s.block_table]
    return (f"{_who(names[e.seq_id] for e in copies)} must write into shared, partly filled "
            f"block {src}: copy-on-write copies it to block(s) "
            f"**{_ids(e.detail['dst'] for e in copies)}** first (one each"
            f"{_reused(copies, freed, key='dst')})"
            + (f"; {_who(keeper)} keeps block {src} and writes in place." if keeper else "."))


def _reused(events: list[Event], freed: set[int], key: str | None = None) -> str:
    """A note when a block freed earlier in this step is taken again."""
    again = [b for b in ((e.detail[key] if key else e.block_id) for e in events) if b in freed]
    return f"; block(s) {_ids(again)} freed just before, taken again" if again else ""


def v1_lines(view: EngineView, frame: BranchFrame, mode: str) -> list[str]:
    """vLLM V1 (0.33): requests ended, requests admitted with their prefix-cache hits, new
    blocks, ended requests, in that order."""
    names, lines, admitted = view.names, [], False
    for kind, run in _runs(view.events):
        who = _who(names[e.seq_id] for e in run)
        if kind == "free" and mode == "beam":
            lines.append(f"Last step's one-token requests ({who}) have finished: each frees "
                         f"its blocks; {_released(view, run, names)}.")
        elif kind == "free":
            lines.append(f"{who} finished: each held block loses one reference; "
                         f"{_released(view, run, names)}.")
        elif view.admitted and not admitted:
            lines += _admission_lines(view, mode)
            admitted = True
        elif not view.admitted:
            lines.append(f"{who} took new block(s) {_ids(e.block_id for e in run)} because "
                         "the last block was full.")
    if mode == "beam" and frame.step > 0 and not view.admitted:
        lines.append("The search has its final beams: vLLM sends no request at this step (a "
                     "beam's last token needs no forward pass)." if frame.v0.computed else
                     "This story keeps only the best beam (`LLM.beam_search` returns the "
                     "best beam-width sequences, ranked): the search's requests have all ended, "
                     "nothing in the engine changes." if frame.live else
                     "The best beam is the answer: no request of the search is left in the "
                     "engine.")
    return lines


def _again(a: Admission) -> str:
    if a.recomputed == a.computed:
        return f"all {a.computed} computed before, by another request"
    return (f"{a.recomputed} of them computed before, by earlier requests" if a.recomputed
            else "none of them computed before")


def _admission_lines(view: EngineView, mode: str) -> list[str]:
    tables = {s.seq_id: s.block_table for s in view.snapshot.sequences}
    count, block_size = len(view.admitted), view.snapshot.block_size
    lines = [f"The {count} samples are {count} separate child requests of one prompt, added "
             "together and scheduled in one step (the token budget allows it here)."
             if mode == "parallel" else
             f"The search sends its {count} beam(s) as {count} new request(s), each with its "
             "tokens so far and max_tokens=1."]
    for a in view.admitted:
        table = tables[a.seq_id]
        hit = a.hit_tokens // block_size
        name = f"**{view.names[a.seq_id]}**"
        if a.hit_tokens:
            lines.append(f"{name} finds block(s) {_ids(table[:hit])} in the prefix cache "
                         f"({a.hit_tokens} tokens, ref count + 1) and computes its other "
                         f"{a.computed} token(s) into block(s) {_ids(table[hit:])} of its own: "
                         f"{_again(a)}" + ("; its last block is full, and a hit never covers a "
                                           "request's last token."
                                           if a.computed == block_size else "."))
        else:
            lines.append(f"{name} finds nothing cached: it computes all {a.computed} tokens "
                         f"into new block(s) {_ids(table)}. V1 hashes full blocks as it "
                         "allocates them, so requests after it in this step can hit them.")
    return lines
