"""Read targets from a Prometheus that already scrapes them, instead of scraping the servers.

The latest values come back as an instant vector; they go through the same catalogue and
assembly as a direct scrape, so the snapshots are the same. A fleet is read in one query per
backend (and one of ``up``) per tick, whatever its size: the series are split among the targets
here, by each target's selector (``scrape_fleet``). ``raw_snapshots`` fetches the raw
samples Prometheus stored over a range (one snapshot per scrape timestamp), which lets tuner's
store hold exactly what Prometheus holds — how the test suite proves tuner's quantiles equal
PromQL's.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

from tuner.collect.assemble import assemble_engines
from tuner.collect.catalogue import ALL_SPECS, lookup
from tuner.collect.exposition import CatalogueSample
from tuner.collect.snapshots import TargetSnapshot
from tuner.config import Target, parse_selector
from tuner.errors import ExpositionError, ScrapeError

__all__ = ["scrape_via_prometheus", "scrape_fleet", "raw_snapshots", "selector_for"]


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


class _Split:
    """Series to targets by their matchers, with an index on each target's first equality matcher (a target
    whose selector is that one matcher, as the default instance="HOST:PORT" is, needs no other check)."""

    def __init__(self, targets: Sequence[Target]) -> None:
        self.matchers = [parse_selector(selector_for(t)) for t in targets]
        self.by_eq: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        self.scan: list[int] = []  # targets with no equality matcher: tried on every series
        for i, ms in enumerate(self.matchers):
            eq = next((m for m in ms if m.op == "="), None)
            if eq is None:
                self.scan.append(i)
            else:
                self.by_eq[eq.label][eq.value].append(i)
        self.alone = {i for i, ms in enumerate(self.matchers) if len(ms) == 1 and ms[0].op == "="}

    def owners(self, labels: dict[str, str]) -> list[int]:
        if len(self.matchers) == 1:  # queried with its selector: Prometheus chose the series
            return [0]
        found = [i for label, values in self.by_eq.items() for i in values.get(labels.get(label, ""), ())]
        return [i for i in found + self.scan if i in self.alone or all(m(labels) for m in self.matchers[i])]


def scrape_fleet(
    prom_url: str, targets: Sequence[Target], *, timeout_s: float, now: float | None = None
) -> dict[str, TargetSnapshot | ScrapeError]:
    """Every target's latest values as Prometheus has them at ``now``, each a snapshot or the ScrapeError that
    says why not. One query of ``up`` and one per backend, whatever the number of targets (a single target is
    queried with its selector, a fleet without: the series are split here)."""
    at = time.time() if now is None else now
    start = time.monotonic()
    client = _client(prom_url, timeout_s)
    split = _Split(targets)
    sel = f",{selector_for(targets[0])}" if len(targets) == 1 else ""
    down: dict[int, list[float]] = defaultdict(list)
    # The labels Prometheus put on the target (those of its `up`: instance, job, and what relabeling added, such as
    # kubernetes_sd's namespace and pod) are not the server's: its series are read without them.
    own: dict[int, set[str]] = defaultdict(set)
    for r in _query(client, prom_url, f"up{{{sel[1:]}}}" if sel else "up", at):
        for i in split.owners(r["metric"]):
            down[i].append(float(r["value"][1]))
            own[i].update(k for k in r["metric"] if k not in ("__name__", "instance", "job"))
    values: dict[int, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for backend in sorted({_backend(t) for t in targets}):
        for r in _query(client, prom_url, f'{{__name__=~"{_names(backend)}"{sel}}}', at):
            for i in split.owners(r["metric"]):
                if _backend(targets[i]) == backend:
                    labels = {k: v for k, v in r["metric"].items() if k not in own[i]} if own[i] else r["metric"]
                    values[i].append((labels, float(r["value"][1])))
    took = time.monotonic() - start
    out: dict[str, TargetSnapshot | ScrapeError] = {}
    for i, t in enumerate(targets):
        where = f"{{{selector_for(t)}}}"
        if down.get(i) and all(v == 0 for v in down[i]):
            out[t.name] = ScrapeError(f"Prometheus at {prom_url} reports {where} down (up == 0)")
        elif not values.get(i):
            out[t.name] = ScrapeError(
                f"Prometheus at {prom_url} has no {t.backend} series matching {where}; "
                "is it scraping the server? (set the target's prometheus_selector)"
            )
        else:
            kept, problems = _problems_for(values[i])
            try:
                engines = assemble_engines(_to_samples(kept), _backend(t), t.name, problems)
            except ExpositionError as exc:  # too many engines: this target's scrape fails, not the fleet's
                out[t.name] = ScrapeError(f"{t.name} via Prometheus at {prom_url}: {exc}")
                continue
            out[t.name] = TargetSnapshot(
                target=t.name,
                backend=_backend(t),
                ts=at,
                duration_s=took,
                engines=engines,
                problems=tuple(problems),
                healthy=None,
            )
    return out


def scrape_via_prometheus(
    prom_url: str, target: Target, *, timeout_s: float, now: float | None = None
) -> TargetSnapshot:
    """The target's latest values as Prometheus has them at ``now``; ScrapeError when it has none."""
    got = scrape_fleet(prom_url, [target], timeout_s=timeout_s, now=now)[target.name]
    if isinstance(got, ScrapeError):
        raise got
    return got


def raw_snapshots(
    prom_url: str, target: Target, *, start: float, end: float, timeout_s: float = 30.0
) -> list[TargetSnapshot]:
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
        out.append(
            TargetSnapshot(
                target=target.name,
                backend=_backend(target),
                ts=ts,
                duration_s=0.0,
                engines=engines,
                problems=tuple(problems),
            )
        )
    return out
