"""Prometheus text format: parse a ``/metrics`` scrape and take deltas between two scrapes.

vLLM exports request-level histograms (``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:request_prefill_time_seconds``, ...) and counters
(``vllm:prompt_tokens_total``, ...).  A probe phase scrapes before and after and stores, per
series, the difference: the histogram of exactly the requests of that phase (provided nothing
else used the server meanwhile).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return {"+Inf": math.inf, "-Inf": -math.inf}.get(s, math.nan)


def _labels(s: str | None) -> tuple[tuple[str, str], ...]:
    if not s:
        return ()
    out = [
        (m.group(1), m.group(2).replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n"))
        for m in _LABEL.finditer(s)
    ]
    return tuple(sorted(out))


@dataclass
class Scrape:
    """One scrape: ``types[family]`` and ``samples[(name, labels)] = value``."""

    types: dict[str, str] = field(default_factory=dict)
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def value(self, name: str, **labels) -> float:
        """Sum of the samples named ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, lab), v in self.samples.items() if n == name and want <= set(lab))

    def info(self, name: str) -> dict[str, str]:
        """Labels of an ``*_info`` gauge (e.g. ``vllm:cache_config_info``), or {}."""
        for (n, lab), _ in self.samples.items():
            if n == name:
                return dict(lab)
        return {}


def parse_prometheus(text: str) -> Scrape:
    sc = Scrape()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                sc.types[parts[2]] = parts[3].strip()
            continue
        m = _SAMPLE.match(line)
        if m:
            sc.samples[(m.group(1), _labels(m.group(3)))] = _float(m.group(4))
    return sc


def _series_key(labels: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels)


def histogram_deltas(before: Scrape, after: Scrape, prefix: str = "vllm:") -> dict[str, list[dict]]:
    """For every histogram family with ``prefix``: per label set, the change of count, sum and
    of each cumulative bucket.  Families or series missing from ``before`` count from zero."""
    out: dict[str, list[dict]] = {}
    for fam, typ in after.types.items():
        if typ != "histogram" or not fam.startswith(prefix):
            continue
        series: dict[tuple, dict] = {}
        for (name, lab), v in after.samples.items():
            if name not in (fam + "_bucket", fam + "_count", fam + "_sum"):
                continue
            base = tuple(kv for kv in lab if kv[0] != "le")
            d = v - before.samples.get((name, lab), 0.0)
            s = series.setdefault(base, {"labels": dict(base), "count": 0.0, "sum": 0.0, "buckets": []})
            if name.endswith("_bucket"):
                s["buckets"].append([_float(dict(lab)["le"]), d])
            elif name.endswith("_count"):
                s["count"] = d
            else:
                s["sum"] = d
        rows = []
        for s in series.values():
            s["buckets"].sort(key=lambda b: b[0])
            s["buckets"] = [[("+Inf" if math.isinf(le) else le), c] for le, c in s["buckets"]]
            rows.append(s)
        out[fam] = rows
    return out


def counter_deltas(before: Scrape, after: Scrape, prefix: str = "vllm:") -> dict[str, float]:
    """Change of every counter sample with ``prefix`` (key: ``name{labels}``, non-zero only)."""
    out: dict[str, float] = {}
    for fam, typ in after.types.items():
        if typ != "counter" or not fam.startswith(prefix):
            continue
        for (name, lab), v in after.samples.items():
            if name in (fam, fam + "_total") or (name.startswith(fam) and name.endswith("_total")):
                d = v - before.samples.get((name, lab), 0.0)
                if d:
                    key = name + ("{" + _series_key(tuple(kv for kv in lab if kv[0] != "engine")) + "}" if lab else "")
                    out[key] = out.get(key, 0.0) + d
    return out


def histogram_quantile(q: float, buckets: list[list]) -> float:
    """Prometheus-style quantile estimate from cumulative buckets ``[[le, count], ...]``."""
    bs = [(math.inf if le == "+Inf" else float(le), float(c)) for le, c in buckets]
    if not bs or bs[-1][1] <= 0:
        return math.nan
    rank = q * bs[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return bs[-1][0]
