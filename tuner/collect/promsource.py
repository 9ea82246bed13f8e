"""Read a target from a Prometheus that already scrapes it, instead of scraping the server.

The latest values come back as an instant vector; they go through the same catalogue and
assembly as a direct scrape, so the snapshots are the same. ``raw_snapshots`` fetches the raw
samples Prometheus stored over a range (one snapshot per scrape timestamp), which lets tuner's
store hold exactly what Prometheus holds — how the test suite proves tuner's quantiles equal
PromQL's.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any, Iterable, Literal

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

from tuner.collect.assemble import assemble_engines
from tuner.collect.catalogue import ALL_SPECS, lookup
from tuner.collect.exposition import CatalogueSample
from tuner.collect.snapshots import TargetSnapshot
from tuner.config import Target
from tuner.errors import ScrapeError

__all__ = ["scrape_via_prometheus", "raw_snapshots", "selector_for"]


def _names(backend: str) -> str:
    wire = []
    for s in ALL_SPECS:
        if s.backend != backend:
            continue
        for name in (s.name, *s.aliases):
            wire += [f"{name}_bucket", f"{name}_count", f"{name}_sum"] if s.kind == "histogram" else [name]
    return "|".join(sorted(set(wire)))


def selector_for(target: Target) -> str:
    """The label matchers that pick this target's series out of Prometheus (without braces)."""
    if target.prometheus_selector:
        return target.prometheus_selector.strip().strip("{}")
    host = target.url.split("://", 1)[1].split("/", 1)[0]
    return f'instance="{host}"'


def _client(url: str, timeout_s: float) -> PrometheusConnect:
    return PrometheusConnect(url=url, disable_ssl=True, timeout=max(1, math.ceil(timeout_s)))


def _query(client: PrometheusConnect, url: str, query: str, at: float) -> list[dict[str, Any]]:
    try:
        return client.custom_query(query=query, params={"time": f"{at:.3f}"})
    except requests.RequestException as exc:
        raise ScrapeError(f"Prometheus at {url} unreachable: {type(exc).__name__}; is it running?") from None
    except PrometheusApiClientException as exc:
        raise ScrapeError(f"Prometheus at {url} rejected query {query!r}: {exc}") from None


def _to_samples(series: Iterable[tuple[dict[str, str], float]]) -> list[CatalogueSample]:
    out = []
    for labels, value in series:
        hit = lookup(labels.get("__name__", ""))
        if hit is not None:
            out.append(CatalogueSample(hit[0], hit[1], labels, value, 0))
    return out


def _problems_for(values: list[tuple[dict[str, str], float]]) -> tuple[list[tuple[dict[str, str], float]], list[str]]:
    kept, problems = [], []
    for labels, v in values:
        if math.isfinite(v):
            kept.append((labels, v))
        else:
            problems.append(f"{labels.get('__name__')} is {v}; sample dropped")
    return kept, problems


def _backend(target: Target) -> Literal["vllm", "llamacpp"]:
    assert target.backend != "auto"  # a validated config has resolved auto from managed.model
    return target.backend


def scrape_via_prometheus(prom_url: str, target: Target, *, timeout_s: float, now: float | None = None) -> TargetSnapshot:
    """The target's latest values as Prometheus has them at ``now``."""
    at = time.time() if now is None else now
    start = time.monotonic()
    client = _client(prom_url, timeout_s)
    sel = selector_for(target)
    up = _query(client, prom_url, f"up{{{sel}}}", at)
    if up and all(float(r["value"][1]) == 0 for r in up):
        raise ScrapeError(f"Prometheus at {prom_url} reports {{{sel}}} down (up == 0)")
    result = _query(client, prom_url, f'{{__name__=~"{_names(target.backend)}",{sel}}}', at)
    if not result:
        raise ScrapeError(f"Prometheus at {prom_url} has no {target.backend} series matching {{{sel}}}; "
                          "is it scraping the server? (set the target's prometheus_selector)")
    values, problems = _problems_for([(r["metric"], float(r["value"][1])) for r in result])
    engines = assemble_engines(_to_samples(values), _backend(target), target.name, problems)
    return TargetSnapshot(target=target.name, backend=_backend(target), ts=at, duration_s=time.monotonic() - start,
                          engines=engines, problems=tuple(problems), healthy=None)


def raw_snapshots(prom_url: str, target: Target, *, start: float, end: float,
                  timeout_s: float = 30.0) -> list[TargetSnapshot]:
    """Every sample Prometheus stored for the target in [start, end], one snapshot per scrape timestamp."""
    client = _client(prom_url, timeout_s)
    sel = selector_for(target)
    range_s = max(1, math.ceil(end - start))
    result = _query(client, prom_url, f'{{__name__=~"{_names(target.backend)}",{sel}}}[{range_s}s]', end)
    by_ts: dict[float, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for r in result:
        for ts, v in r.get("values", []):
            if float(ts) >= start:
                by_ts[float(ts)].append((r["metric"], float(v)))
    out = []
    for ts in sorted(by_ts):
        values, problems = _problems_for(by_ts[ts])
        engines = assemble_engines(_to_samples(values), _backend(target), target.name, problems)
        out.append(TargetSnapshot(target=target.name, backend=_backend(target), ts=ts, duration_s=0.0,
                                  engines=engines, problems=tuple(problems)))
    return out
