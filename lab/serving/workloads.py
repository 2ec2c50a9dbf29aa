"""Seeded request workloads for the scheduler: length distributions, arrivals, presets, CSV upload.

A workload is a tuple of `RequestSpec`s: prompt length, output length, arrival time, priority,
`max_tokens`, the output ceiling a client asks for (what a contiguous allocator must reserve),
and optionally the token ids themselves (a scenario whose requests share a system prompt).
The two presets are *synthetic*: lognormal lengths whose means match the published means of the
ShareGPT (prompt ~161, output ~338 tokens) and Alpaca (~19 / ~58) datasets; no dataset is used.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

MAX_LEN = 32_768  # longest prompt or output a workload may hold
MAX_REQUESTS = 20_000
MAX_CSV_BYTES = 2 << 20  # 2 MiB
MAX_CSV_ERRORS = 10  # rows reported before the message stops listing them

DistKind = Literal["fixed", "uniform", "lognormal"]


class WorkloadError(ValueError):
    """A workload that cannot be built: the message lists what is wrong (row by row for CSV)."""


@dataclass(frozen=True)
class RequestSpec:
    req_id: int
    prompt_len: int
    output_len: int
    arrival_s: float = 0.0
    priority: int = 0  # lower value = more important (vLLM's convention)
    max_tokens: int = 0  # output ceiling the client asked for; 0 = output_len
    tokens: tuple[int, ...] = ()  # prompt then output token ids; () = the scheduler draws them

    def __post_init__(self) -> None:
        if self.tokens and len(self.tokens) != self.prompt_len + self.output_len:
            raise WorkloadError(f"request {self.req_id}: {len(self.tokens)} token ids for a "
                                f"{self.prompt_len}-token prompt and {self.output_len} outputs")

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class LengthDist:
    """fixed: always `mean`; uniform: low..high; lognormal: mean `mean`, log-space sigma `sigma`."""

    kind: DistKind = "lognormal"
    mean: float = 128.0
    sigma: float = 1.0
    low: int = 1
    high: int = 256

    def sample(self, rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
        if self.kind == "fixed":
            values = np.full(n, round(self.mean))
        elif self.kind == "uniform":
            if not 1 <= self.low <= self.high:
                raise WorkloadError(f"uniform lengths need 1 <= low <= high, got "
                                    f"{self.low}..{self.high}")
            values = rng.integers(self.low, self.high + 1, n)
        elif self.kind == "lognormal":
            if self.mean < 1 or self.sigma < 0:
                raise WorkloadError("lognormal lengths need mean >= 1 and sigma >= 0")
            # E[exp(N(mu, s^2))] = exp(mu + s^2 / 2): choose mu so the mean is `mean`.
            mu = math.log(self.mean) - self.sigma**2 / 2
            values = np.rint(rng.lognormal(mu, self.sigma, n))
        else:
            raise WorkloadError(f"unknown length distribution {self.kind!r}")
        return np.clip(values, 1, cap).astype(np.int64)


@dataclass(frozen=True)
class Preset:
    label: str
    prompt: LengthDist
    output: LengthDist
    max_tokens: int
    note: str


PRESETS: dict[str, Preset] = {
    "sharegpt": Preset("ShareGPT-like (synthetic)", LengthDist("lognormal", 161, 1.0),
                       LengthDist("lognormal", 338, 0.8), 2048,
                       "synthetic lognormal lengths with ShareGPT's published means "
                       "(prompt ~161, output ~338 tokens); not the dataset"),
    "alpaca": Preset("Alpaca-like (synthetic)", LengthDist("lognormal", 19, 0.6),
                     LengthDist("lognormal", 58, 0.8), 512,
                     "synthetic lognormal lengths with Alpaca's published means "
                     "(prompt ~19, output ~58 tokens); not the dataset"),
}


def arrivals(rng: np.random.Generator, n: int, rate: float | None) -> np.ndarray:
    """Arrival times in seconds: all at 0 (rate None or 0), else a Poisson process at `rate`/s."""
    if not rate:
        return np.zeros(n)
    if rate < 0 or not math.isfinite(rate):
        raise WorkloadError(f"arrival rate must be a positive number of requests/s, got {rate}")
    return np.cumsum(rng.exponential(1.0 / rate, n))


def generate(num_requests: int, prompt: LengthDist, output: LengthDist, *, seed: int = 0,
             rate: float | None = None, max_tokens: int = 2048,
             num_priorities: int = 1) -> tuple[RequestSpec, ...]:
    """Seeded requests; outputs are clipped to `max_tokens`, priorities drawn in 0..n-1."""
    if not 1 <= num_requests <= MAX_REQUESTS:
        raise WorkloadError(f"number of requests must be 1..{MAX_REQUESTS:,}, got {num_requests}")
    if not 1 <= max_tokens <= MAX_LEN:
        raise WorkloadError(f"max_tokens must be 1..{MAX_LEN:,}, got {max_tokens}")
    rng = np.random.default_rng(seed)
    prompts = prompt.sample(rng, num_requests, MAX_LEN)
    outputs = output.sample(rng, num_requests, max_tokens)
    times = arrivals(rng, num_requests, rate)
    prios = rng.integers(0, max(1, num_priorities), num_requests)
    return tuple(RequestSpec(i, int(p), int(o), float(t), int(q), max_tokens)
                 for i, (p, o, t, q) in enumerate(zip(prompts, outputs, times, prios)))


def from_preset(name: str, num_requests: int, *, seed: int = 0, rate: float | None = None,
                max_tokens: int | None = None) -> tuple[RequestSpec, ...]:
    if name not in PRESETS:
        raise WorkloadError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[name]
    return generate(num_requests, p.prompt, p.output, seed=seed, rate=rate,
                    max_tokens=max_tokens or p.max_tokens)


def with_priorities(requests: tuple[RequestSpec, ...], urgent_share: float, *,
                    seed: int = 0) -> tuple[RequestSpec, ...]:
    """Two classes of requests: a seeded `urgent_share` of them interactive (priority 0), the
    rest batch work (priority 1); vLLM's convention, lower is more important."""
    if not 0 <= urgent_share <= 1:
        raise WorkloadError(f"the urgent share must be in [0, 1], got {urgent_share}")
    rng = np.random.default_rng([seed, 7])  # its own stream: the lengths stay the same
    urgent = rng.random(len(requests)) < urgent_share
    return tuple(replace(r, priority=0 if u else 1) for r, u in zip(requests, urgent))


def parse_csv(data: str | bytes, *, max_tokens: int | None = None,
              max_requests: int = MAX_REQUESTS) -> tuple[RequestSpec, ...]:
    """Requests from `prompt_len,output_len[,arrival_s]` rows (an optional header row).

    Every bad row is reported (up to MAX_CSV_ERRORS) in one WorkloadError, and so is text the
    csv module cannot read (a NUL, a field past its limit). Reading stops at the first row past
    `max_requests`. Requests are ordered by arrival; max_tokens defaults to the longest output
    in the file. A UTF-8 byte-order mark (bytes or text) is dropped.
    """
    if len(data) > MAX_CSV_BYTES:
        raise WorkloadError(f"the file has {len(data):,} bytes; the limit is {MAX_CSV_BYTES:,}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise WorkloadError(f"the file is not UTF-8 text (byte {err.start})") from None
    rows = _rows(data.removeprefix("\ufeff"), max_requests)
    if not rows:
        raise WorkloadError("no rows: expected lines of prompt_len,output_len[,arrival_s]")
    parsed, errors = [], []
    for number, row in enumerate(rows, start=1):
        try:
            parsed.append(_parse_row(row))
        except ValueError as err:
            errors.append(f"row {number}: {err}")
    if errors:
        more = len(errors) - MAX_CSV_ERRORS
        listed = errors[:MAX_CSV_ERRORS] + ([f"... and {more} more bad rows"] if more > 0 else [])
        raise WorkloadError("; ".join(listed))
    ceiling = max_tokens or max(o for _, o, _ in parsed)
    if any(o > ceiling for _, o, _ in parsed):
        raise WorkloadError(f"an output_len exceeds max_tokens = {ceiling}")
    parsed.sort(key=lambda r: r[2])
    return tuple(RequestSpec(i, p, o, t, 0, ceiling) for i, (p, o, t) in enumerate(parsed))


def _rows(text: str, max_requests: int) -> list[list[str]]:
    """The non-empty rows after an optional header, or WorkloadError; newline="" lets the csv
    module read \r, \n and \r\n endings itself, a lone \r inside a field included."""
    reader, rows = csv.reader(io.StringIO(text, newline="")), []
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if not rows and row and row[0].strip().lower() == "prompt_len":
                rows.append(None)  # the header: kept out of the count below
                continue
            rows.append(row)
            if len(rows) - (rows[0] is None) > max_requests:
                raise WorkloadError(f"more than {max_requests:,} rows; the limit is "
                                    f"{max_requests:,} requests")
    except csv.Error as err:
        raise WorkloadError(f"row {len(rows) + 1} (line {reader.line_num}) cannot be read as "
                            f"CSV: {err}") from None
    return [r for r in rows if r is not None]


_SECONDS = re.compile(r"[+]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?", re.ASCII)


def _parse_row(row: list[str]) -> tuple[int, int, float]:
    if len(row) not in (2, 3):
        raise ValueError(f"expected 2 or 3 values (prompt_len,output_len[,arrival_s]), "
                         f"got {len(row)}")
    lengths = []
    for name, cell in zip(("prompt_len", "output_len"), row):
        text = cell.strip()
        # ASCII digits only ("²" and "١٢" are digits to str.isdigit), and few enough of them.
        if not (text.isascii() and text.isdigit() and len(text) <= 6
                and 1 <= int(text) <= MAX_LEN):
            raise ValueError(f"{name} must be a whole number from 1 to {MAX_LEN:,}, "
                             f"got {text[:20]!r}")
        lengths.append(int(text))
    arrival = 0.0
    if len(row) == 3:
        text = row[2].strip()
        if not (len(text) <= 40 and _SECONDS.fullmatch(text)):
            raise ValueError(f"arrival_s must be a number of seconds, got {text[:20]!r}")
        arrival = float(text)
        if not math.isfinite(arrival) or not 0 <= arrival <= 1e7:
            raise ValueError(f"arrival_s must be between 0 and 10,000,000, got {arrival}")
    return lengths[0], lengths[1], arrival


def workload_stats(requests: tuple[RequestSpec, ...]) -> dict[str, float]:
    """Mean and max lengths, request count and arrival span, for captions."""
    prompts = np.array([r.prompt_len for r in requests])
    outputs = np.array([r.output_len for r in requests])
    return {"requests": len(requests), "prompt_mean": float(prompts.mean()),
            "prompt_max": int(prompts.max()), "output_mean": float(outputs.mean()),
            "output_max": int(outputs.max()),
            "span_s": float(max(r.arrival_s for r in requests))}
