"""The running requests as numpy columns, so one iteration over hundreds of sequences is a few
array operations instead of a Python loop per sequence (a 10,000-request replay runs ~3 million
decode tokens).

Rows are kept in admission order (new rows at the end; rows that leave are compacted away).
While a request runs, its row is the truth; `store` copies a row back into its `Request`.
"""

from __future__ import annotations

import numpy as np

from lab.serving.request import Request, ScheduledEntry, StepDetail

INT_COLUMNS = ("computed", "length", "cap", "outputs", "target", "priority", "arrival", "order",
               "total")
FLOAT_COLUMNS = ("first_token_s", "last_token_s")


def budget_shares(want: np.ndarray, budget: int) -> np.ndarray:
    """Each row's tokens when rows take their wish in turn from the budget (cumsum - want: what
    the rows before it wished, all of which they got until the budget ran out); a new array."""
    wished = want.cumsum()
    if not len(want) or wished[-1] <= budget:  # every wish fits (most steps)
        return want.copy()
    return np.minimum(want, np.maximum(budget - (wished - want), 0))


class RunningTable:
    """Columns (one row per running request):
    computed: tokens whose K/V is in the pool; length: tokens held, prompt + emitted;
    cap: slots allocated (blocks x size, or reservation); outputs: tokens emitted;
    target: output length (done when outputs reach it); priority; arrival: arrival rank
    (vLLM's arrival_time order); order: admission rank; total: K/V computed over its life
    (recompute too); first_token_s: NaN until the first token; last_token_s.

    The int columns are the rows of one 2D array and the float ones of another, each column a
    view of its row: adding or dropping requests is then one numpy call per array, not one per
    column (a replay admits and finishes thousands of requests)."""

    def __init__(self) -> None:
        self.reqs: list[Request] = []
        self._ints = np.zeros((len(INT_COLUMNS), 0), dtype=np.int64)
        self._floats = np.zeros((len(FLOAT_COLUMNS), 0))
        self._bind()

    def _bind(self) -> None:
        """Name each column: a view of its row, so in-place updates reach the 2D arrays."""
        (self.computed, self.length, self.cap, self.outputs, self.target, self.priority,
         self.arrival, self.order, self.total) = self._ints
        self.first_token_s, self.last_token_s = self._floats

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, admitted: list[tuple[Request, int]]) -> None:
        """Append a row for each (request, slot capacity), its fields as they are now."""
        ints = [(r.num_computed, r.length, cap, r.num_output, r.spec.output_len, r.spec.priority,
                 r.arrival, r.order, r.num_computed_total) for r, cap in admitted]
        floats = [(np.nan if r.first_token_s is None else r.first_token_s, r.last_token_s)
                  for r, _ in admitted]
        self._ints = np.concatenate([self._ints, np.array(ints, dtype=np.int64).T], axis=1)
        self._floats = np.concatenate([self._floats, np.array(floats).T], axis=1)
        self._bind()
        self.reqs += [r for r, _ in admitted]

    def store(self, row: int) -> Request:
        """Copy a row's progress back into its Request."""
        req = self.reqs[row]
        req.num_computed = int(self.computed[row])
        req.length = int(self.length[row])
        req.num_output = int(self.outputs[row])
        req.num_computed_total = int(self.total[row])
        first = float(self.first_token_s[row])
        req.first_token_s = None if np.isnan(first) else first
        req.last_token_s = float(self.last_token_s[row])
        return req

    def store_all(self) -> None:
        for row in range(len(self.reqs)):
            self.store(row)

    def keep(self, alive: np.ndarray) -> None:
        """Drop the rows where `alive` is False, keeping the others' order."""
        rows = alive.nonzero()[0]
        self._ints, self._floats = self._ints.take(rows, axis=1), self._floats.take(rows, axis=1)
        self._bind()
        for row in (~alive).nonzero()[0][::-1].tolist():  # a few rows leave in a step
            del self.reqs[row]

    def needs_blocks(self, alloc: np.ndarray, block_size: int, hashes: bool) -> np.ndarray:
        """Per row: do its `alloc` tokens of this step need a block (or, hashing, fill one)?"""
        end = self.computed + alloc
        calls = end > self.cap
        if hashes:  # a block this step fills is hashed now
            calls |= end // block_size > self.computed // block_size
        return calls

    def process_order(self, by_priority: bool) -> np.ndarray | None:
        """Rows in the order vLLM V0 served them: (priority, admission) under the priority
        policy, else None: admission order, the rows as they are (vLLM V1's running list, under
        either policy)."""
        if by_priority:
            return np.lexsort((self.order, self.priority))
        return None

    def lowest_priority(self, alive: np.ndarray) -> int:
        """vLLM V1's priority victim: the live row with the largest (priority, arrival)."""
        rows = np.flatnonzero(alive)
        return int(rows[np.lexsort((self.arrival[rows], self.priority[rows]))[-1]])


def step_detail(table: RunningTable, alloc: np.ndarray, alive: np.ndarray, running_rows: int,
                new_blocks: dict, victims: list, lookups: list, num_free: int) -> StepDetail:
    """What a step scheduled, in the golden traces' terms: each row that got tokens (running
    rows first, then the admitted ones), with its kind, computed tokens, tokens and new blocks."""
    entries = []
    for row in np.flatnonzero(alive & (alloc > 0)):
        req = table.reqs[row]
        kind = "running" if row < running_rows else "resumed" if req.num_preemptions else "new"
        entries.append(ScheduledEntry(req.req_id, kind, int(table.computed[row]),
                                      int(alloc[row]), tuple(new_blocks.get(req.req_id, ()))))
    return StepDetail(tuple(entries), tuple(victims), tuple(lookups), num_free)
