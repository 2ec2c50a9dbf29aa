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


class RunningTable:
    def __init__(self) -> None:
        self.reqs: list[Request] = []
        self.computed = np.zeros(0, dtype=np.int64)  # tokens whose K/V is in the pool
        self.length = np.zeros(0, dtype=np.int64)  # tokens held: prompt + emitted
        self.cap = np.zeros(0, dtype=np.int64)  # slots allocated (blocks x size, or reservation)
        self.outputs = np.zeros(0, dtype=np.int64)  # tokens emitted
        self.target = np.zeros(0, dtype=np.int64)  # output length: done when outputs reach it
        self.priority = np.zeros(0, dtype=np.int64)
        self.arrival = np.zeros(0, dtype=np.int64)  # arrival rank: vLLM's arrival_time order
        self.order = np.zeros(0, dtype=np.int64)
        self.total = np.zeros(0, dtype=np.int64)  # K/V computed over its life (recompute too)
        self.first_token_s = np.zeros(0)  # NaN until the first token
        self.last_token_s = np.zeros(0)

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Request, cap: int) -> int:
        """Append a row for `req` (its fields as they are now); return the row index."""
        first = np.nan if req.first_token_s is None else req.first_token_s
        values = {"computed": req.num_computed, "length": req.length, "cap": cap,
                  "outputs": req.num_output, "target": req.spec.output_len,
                  "priority": req.spec.priority, "arrival": req.arrival,
                  "order": req.order,
                  "total": req.num_computed_total,
                  "first_token_s": first, "last_token_s": req.last_token_s}
        for name, value in values.items():
            setattr(self, name, np.append(getattr(self, name), value))
        self.reqs.append(req)
        return len(self.reqs) - 1

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
        for name in INT_COLUMNS + FLOAT_COLUMNS:
            setattr(self, name, getattr(self, name)[alive])
        self.reqs = [r for r, a in zip(self.reqs, alive) if a]

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
