"""Read a real vLLM server: its Prometheus `/metrics` text, and the KV lines of its startup log.

`parse_prometheus` reads the text exposition format (HELP/TYPE comments, samples with labels,
+Inf/NaN values); `engine_view` picks out what the guide says to watch, under the current
metric names and the older ones (vllm:gpu_cache_usage_perc before vllm:kv_cache_usage_perc,
vllm:time_per_output_token_seconds before vllm:inter_token_latency_seconds).

`fetch_metrics` fetches a URL *from the server the lab runs on*: http(s) only, a short timeout,
a size cap, and it is refused entirely when PAGED_LAB_DISABLE_URL_FETCH=1 is set.
"""

from __future__ import annotations

import math
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_TEXT_BYTES = 4 << 20  # 4 MiB: a busy server's /metrics is tens of KiB
FETCH_TIMEOUT_S = 3.0
DISABLE_ENV = "PAGED_LAB_DISABLE_URL_FETCH"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class MetricsError(ValueError):
    """Text that is not in the Prometheus format, or a URL that cannot be fetched."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


def _value(text: str) -> float:
    special = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    return float(text)


def _labels(text: str, line_no: int) -> dict[str, str]:
    inner, labels, pos = text[1:-1], {}, 0
    while pos < len(inner):
        m = _LABEL.match(inner, pos)
        if m is None:
            raise MetricsError(f"line {line_no}: cannot read the labels {text[:60]!r}")
        labels[m.group(1)] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
        pos = m.end()
    return labels


def _family_of(name: str, families: dict[str, Family]) -> Family:
    """Histogram and summary samples (_bucket, _sum, _count) belong to their base family."""
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        base = name.removesuffix(suffix)
        if base != name and (base in families or suffix == "_bucket"):
            return families.setdefault(base, Family(base, "histogram"))
    return families.setdefault(name, Family(name))


def parse_prometheus(text: str) -> dict[str, Family]:
    """Families by name. Raises MetricsError naming the first line it cannot read."""
    if len(text.encode("utf-8", "replace")) > MAX_TEXT_BYTES:
        raise MetricsError(f"the text is larger than {MAX_TEXT_BYTES >> 20} MiB")
    families: dict[str, Family] = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 2)
            if len(parts) >= 2 and parts[0] in ("HELP", "TYPE"):
                fam = families.setdefault(parts[1], Family(parts[1]))
                rest = parts[2] if len(parts) > 2 else ""
                if parts[0] == "TYPE":
                    fam.type = rest.strip()
                else:
                    fam.help = rest
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise MetricsError(f"line {line_no} is not a Prometheus sample: {line[:80]!r}")
        try:
            value = _value(m.group(3))
        except ValueError:
            raise MetricsError(f"line {line_no}: {m.group(3)[:30]!r} is not a number") from None
        labels = _labels(m.group(2), line_no) if m.group(2) else {}
        _family_of(m.group(1), families).samples.append(Sample(m.group(1), labels, value))
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
                bound = _value(s.labels["le"])
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


# -- fetching a URL (a server-side request) -----------------------------------------------
class _SameSchemes(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme not in ("http", "https"):
            raise MetricsError(f"refused a redirect to {newurl[:80]!r}: http(s) only")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_metrics(url: str, timeout: float = FETCH_TIMEOUT_S,
                  max_bytes: int = MAX_TEXT_BYTES) -> str:
    """GET the URL from this server and return its text; MetricsError says why not."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        raise MetricsError(f"fetching URLs is turned off on this server ({DISABLE_ENV} is set): "
                           "paste the /metrics text instead")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MetricsError("give an http:// or https:// URL with a host, e.g. "
                           "http://localhost:8000/metrics")
    opener = urllib.request.build_opener(_SameSchemes)
    try:
        with opener.open(urllib.request.Request(url.strip(), headers={"Accept": "text/plain"}),
                         timeout=timeout) as response:
            body = response.read(max_bytes + 1)
    except urllib.error.HTTPError as err:
        raise MetricsError(f"{parts.hostname} answered HTTP {err.code} ({err.reason})") from None
    except TimeoutError:
        raise MetricsError(f"{parts.hostname} did not answer within {timeout:g} s") from None
    except urllib.error.URLError as err:
        raise MetricsError(f"could not reach {parts.hostname}: {err.reason}") from None
    except (OSError, ValueError) as err:
        raise MetricsError(f"could not fetch {parts.hostname}: {err}") from None
    if len(body) > max_bytes:
        raise MetricsError(f"the response is larger than {max_bytes:,} bytes; "
                           "is this a /metrics endpoint?")
    return body.decode("utf-8", "replace")
