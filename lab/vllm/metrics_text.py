"""Read a real vLLM server's Prometheus `/metrics` text, treating it as hostile.

`parse_prometheus` reads the text exposition format (HELP/TYPE comments, samples with labels,
+Inf/NaN values) in one pass, linear in the text: numbers must be Prometheus numbers (ASCII
digits, `+Inf`, `NaN`; Python's wider float() syntax is refused), a histogram bucket's `le` bound
must be one, and the first line it cannot read is named. `engine_view` picks out what the guide
says to watch, under the current metric names and the older ones (vllm:gpu_cache_usage_perc
before vllm:kv_cache_usage_perc, vllm:time_per_output_token_seconds before
vllm:inter_token_latency_seconds). Fetching the text from a URL is `lab.vllm.fetch`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

MAX_TEXT_BYTES = 4 << 20  # 4 MiB: a busy server's /metrics is tens of KiB

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*")
# A label value's characters are matched possessively: a value of a million escapes is read
# in one pass, with nothing to backtrack into.
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:\\.|[^"\\])*+)"\s*,?')
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_SPECIAL = {"+inf": math.inf, "inf": math.inf, "-inf": -math.inf, "nan": math.nan,
            "+nan": math.nan, "-nan": math.nan}
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


class MetricsError(ValueError):
    """Text that is not in the Prometheus format (or, from lab.vllm.fetch, a URL that gave
    none)."""


class Sample(NamedTuple):  # a tuple: a million samples build fast and hold ~100 B each
    name: str
    labels: Mapping[str, str]
    value: float


_NO_LABELS: Mapping[str, str] = MappingProxyType({})  # shared by every sample without labels


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


def prometheus_number(text: str) -> float:
    """A sample value or bucket bound as Prometheus writes it; ValueError otherwise."""
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return float(text)  # 1e400 is +Inf, as Prometheus reads it


def _is_bound(text: str) -> bool:
    """A histogram bucket's upper bound: a number or +Inf (NaN bounds nothing)."""
    try:
        return not math.isnan(prometheus_number(text))
    except ValueError:
        return False


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _labels(text: str, line_no: int) -> dict[str, str]:
    inner, labels, pos = text[1:-1], {}, 0
    while pos < len(inner):
        m = _LABEL.match(inner, pos)
        if m is None:
            raise MetricsError(f"line {line_no}: cannot read the labels {_shown(text)}")
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def _unescape(value: str) -> str:
    """Prometheus label escapes (\\\\, \\", \\n), left to right: splitting at the escaped
    backslashes first leaves the other two unambiguous."""
    if "\\" not in value:
        return value
    return "\\".join(part.replace('\\"', '"').replace("\\n", "\n")
                     for part in value.split("\\\\"))


def _is_name(text: str) -> bool:
    return text.isascii() and text.replace(":", "_").isidentifier()


def _fields(line: str, line_no: int) -> tuple[str, str | None, str]:
    """(name, label text or None, value text) of a sample line; plain lines skip the regex."""
    if "{" not in line:
        parts = line.split()
        if 2 <= len(parts) <= 3 and _is_name(parts[0]) and (
                len(parts) == 2 or (parts[2].isascii() and parts[2].removeprefix("-").isdigit())):
            return parts[0], None, parts[1]
    m = _SAMPLE.fullmatch(line)
    if m is None:
        raise MetricsError(f"line {line_no} is not a Prometheus sample: {_shown(line)}")
    return m.group(1), m.group(2), m.group(3)


def _lines(text: str) -> Iterator[str]:
    """The text's lines one at a time (str.splitlines would hold a million strings at once)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        yield text[start:end]
        start = end + 1


def _family_of(name: str, families: dict[str, Family]) -> Family:
    """Histogram and summary samples (_bucket, _sum, _count) belong to their base family."""
    for suffix in _SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and (base in families or suffix == "_bucket"):
            return families.setdefault(base, Family(base, "histogram"))
    return families.setdefault(name, Family(name))


def parse_prometheus(text: str) -> dict[str, Family]:
    """Families by name. Raises MetricsError naming the first line it cannot read."""
    if len(text) > MAX_TEXT_BYTES or len(text.encode("utf-8", "replace")) > MAX_TEXT_BYTES:
        raise MetricsError(f"the text is larger than {MAX_TEXT_BYTES >> 20} MiB")
    families: dict[str, Family] = {}
    # sample name -> (its family, the name's one string object), while no family is added
    family_of: dict[str, tuple[Family, str]] = {}
    for line_no, raw in enumerate(_lines(text), start=1):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line[1:].split(None, 2)
            if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
                if parts[1] not in families:
                    family_of.clear()  # a new base family may own samples named before it
                fam = families.setdefault(parts[1], Family(parts[1]))
                rest = parts[2] if len(parts) > 2 else ""
                if parts[0] == "TYPE":
                    fam.type = rest.strip()
                else:
                    fam.help = rest
            continue
        name, label_text, value_text = _fields(line, line_no)
        try:
            value = prometheus_number(value_text)
        except ValueError:
            raise MetricsError(f"line {line_no}: {_shown(value_text, 30)} is not a "
                               "number") from None
        labels = _labels(label_text, line_no) if label_text else _NO_LABELS
        if "le" in labels and name.endswith("_bucket") and not _is_bound(labels["le"]):
            raise MetricsError(f"line {line_no}: the bucket bound le={_shown(labels['le'], 30)} "
                               "is not a number or +Inf")
        known = family_of.get(name)
        if known is None:
            before = len(families)
            known = (_family_of(name, families), name)
            if len(families) != before:
                family_of.clear()
            family_of[name] = known
        fam, name = known
        fam.samples.append(Sample(name, labels, value))
    if not any(f.samples for f in families.values()):
        raise MetricsError("no samples found: is this a Prometheus /metrics page?")
    return families


# -- what the guide says to watch ---------------------------------------------------------------
@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last
    total: float  # sum of observations
    count: float

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding the q-th observation (as Prometheus's
        histogram_quantile does); NaN when empty."""
        if self.count <= 0 or not self.buckets:
            return math.nan
        rank, lower, below = q * self.count, 0.0, 0.0
        for upper, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    return lower  # past the last finite bound: the bound is all we know
                inside = cumulative - below
                return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = upper, cumulative
        return lower

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan


@dataclass(frozen=True)
class EngineView:
    kv_cache_usage: float | None  # fraction 0..1
    kv_usage_metric: str | None  # which name it came from
    running: float | None
    waiting: float | None
    preemptions: float | None
    prefix_queries: float | None  # tokens looked up in the prefix cache
    prefix_hits: float | None
    ttft: Histogram | None
    itl: Histogram | None
    itl_metric: str | None
    model_names: tuple[str, ...]

    @property
    def prefix_hit_rate(self) -> float | None:
        if self.prefix_queries and self.prefix_hits is not None:
            return self.prefix_hits / self.prefix_queries
        return None


def _total(families: dict[str, Family], *names: str) -> tuple[float | None, str | None]:
    """Sum over label sets of the first metric name present (counters with or without _total)."""
    for name in names:
        for key in (name, name.removesuffix("_total")):
            fam = families.get(key)
            samples = fam.samples if fam else []
            values = [s.value for s in samples if not s.name.endswith("_created")]
            if values:
                return float(sum(values)), name
    return None, None


def _histogram(families: dict[str, Family], *names: str) -> tuple[Histogram | None, str | None]:
    for name in names:
        fam = families.get(name)
        if fam is None:
            continue
        merged: dict[float, float] = {}
        for s in fam.samples:
            if s.name == f"{name}_bucket" and "le" in s.labels:
                bound = prometheus_number(s.labels["le"])  # checked by the parser
                merged[bound] = merged.get(bound, 0.0) + s.value
        if merged:
            total = sum(s.value for s in fam.samples if s.name == f"{name}_sum")
            count = sum(s.value for s in fam.samples if s.name == f"{name}_count")
            return Histogram(tuple(sorted(merged.items())), total, count), name
    return None, None


def engine_view(families: dict[str, Family]) -> EngineView:
    usage_fam = next((families[n] for n in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
                      if n in families and families[n].samples), None)
    usage = (sum(s.value for s in usage_fam.samples) / len(usage_fam.samples)
             if usage_fam else None)  # several engines: their mean
    ttft, _ = _histogram(families, "vllm:time_to_first_token_seconds")
    itl, itl_name = _histogram(families, "vllm:inter_token_latency_seconds",
                               "vllm:time_per_output_token_seconds")
    names = sorted({s.labels["model_name"] for f in families.values() for s in f.samples
                    if "model_name" in s.labels})
    return EngineView(
        usage, usage_fam.name if usage_fam else None,
        _total(families, "vllm:num_requests_running")[0],
        _total(families, "vllm:num_requests_waiting")[0],
        _total(families, "vllm:num_preemptions_total")[0],
        _total(families, "vllm:prefix_cache_queries_total")[0],
        _total(families, "vllm:prefix_cache_hits_total")[0],
        ttft, itl, itl_name, tuple(names))
