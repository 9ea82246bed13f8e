"""Catalogue samples → one EngineSnapshot per (engine, model_name).

vLLM serves several engines and models from one endpoint, told apart by the ``engine`` and
``model_name`` labels. A sample that lacks one of them (``cache_config_info`` has no model_name,
``admission_rejections_total`` no engine, ``process_start_time_seconds`` neither) belongs to every
engine it matches. The same assembly serves llama-server (no labels: one engine) and the
Prometheus-API source, so both produce identical snapshots.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Literal

from tuner.collect.catalogue import ENGINE_LABELS
from tuner.collect.exposition import CatalogueSample
from tuner.collect.snapshots import EngineSnapshot, Histogram, Labels, SeriesKey
from tuner.errors import ExpositionError

__all__ = ["assemble_engines", "MAX_ENGINES"]

_IGNORED_LABELS = frozenset(ENGINE_LABELS) | {"le", "instance", "job", "__name__"}
# One tuple per distinct set of histogram bounds: every target's histogram of a metric has the same, and the
# learned layouts keep one per histogram per target (10 MiB of floats at 1,000 targets otherwise). Bounded: a
# server that makes up new bounds at every scrape cannot grow it past this.
_BOUNDS: dict[tuple[float, ...], tuple[float, ...]] = {}
_MAX_BOUNDS = 4096
# Engines (engine x model_name) one target may serve: vLLM serves one per data-parallel rank and served model, a
# handful; past this a body is a server making up labels, and every one of them becomes ~36 stored series a scrape.
MAX_ENGINES = 256


def _extra(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in _IGNORED_LABELS))


def _le(value: str) -> float | None:
    """A bucket's upper bound; None when ``le`` is not a number (such a bucket is dropped, as a problem)."""
    if value in ("+Inf", "Inf", "inf"):
        return float("inf")
    try:
        bound = float(value)
    except ValueError:
        return None
    return None if bound != bound else bound  # NaN bounds nothing


def assemble_engines(
    samples: Iterable[CatalogueSample], backend: Literal["vllm", "llamacpp"], default_model: str, problems: list[str]
) -> tuple[EngineSnapshot, ...]:
    """Group samples into engines; histogram parts into Histograms. Inconsistencies go to ``problems``.
    ExpositionError when the body names more than MAX_ENGINES engines."""
    samples = list(samples)
    # An engine is named by a sample carrying both labels; a sample with one of them only joins those.
    engines: set[tuple[str, str]] = (
        {
            (s.labels["engine"], s.labels["model_name"])
            for s in samples
            if "engine" in s.labels and "model_name" in s.labels
        }
        or {
            (s.labels.get("engine", "0"), s.labels.get("model_name", default_model))
            for s in samples
            if "engine" in s.labels or "model_name" in s.labels
        }
        or {("0", default_model)}
    )
    if len(engines) > MAX_ENGINES:
        raise ExpositionError(
            f"{len(engines)} engines (distinct engine and model_name labels) in one exposition, "
            f"over tuner's cap of {MAX_ENGINES} per target: a server whose labels change at "
            "every scrape? (scrape refused)"
        )

    # Each sample's engines found by its labels, not by a walk over every engine: linear in the samples (each
    # sample against every engine cost 87 s of one core for 32k engines in a 1.9 MB body, bench/many_engines.py).
    everyone = sorted(engines)
    by_engine: dict[str, list[tuple[str, str]]] = defaultdict(list)
    by_model: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for k in everyone:
        by_engine[k[0]].append(k)
        by_model[k[1]].append(k)

    def owners(labels: dict[str, str]) -> list[tuple[str, str]]:
        e, m = labels.get("engine"), labels.get("model_name")
        if e is not None and m is not None:
            return [(e, m)] if (e, m) in engines else []
        if e is not None:
            return by_engine.get(e, [])
        if m is not None:
            return by_model.get(m, [])
        return everyone

    values: dict[tuple[str, str], dict[SeriesKey, float]] = defaultdict(dict)
    parts: dict[tuple[str, str], dict[SeriesKey, dict[str, object]]] = defaultdict(
        lambda: defaultdict(lambda: {"buckets": {}})
    )
    config: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)

    for s in samples:
        for owner in owners(s.labels):
            key: SeriesKey = (s.spec.name, _extra(s.labels))
            if s.spec.kind == "info":
                config[owner].update({k: v for k, v in s.labels.items() if k not in _IGNORED_LABELS})
            elif s.part == "value":
                values[owner][key] = s.value
            elif s.part == "bucket":
                if "le" not in s.labels:
                    problems.append(f"line {s.line_no}: {s.spec.name}_bucket has no le label; dropped")
                    continue
                le = _le(s.labels["le"])
                if le is None:
                    problems.append(
                        f"line {s.line_no}: {s.spec.name}_bucket has le={s.labels['le']!r}, not a number; dropped"
                    )
                    continue
                parts[owner][key]["buckets"][le] = s.value  # type: ignore[index]
            else:
                parts[owner][key][s.part] = s.value

    out = []
    for owner in sorted(engines):
        hists: dict[SeriesKey, Histogram] = {}
        for key, p in parts[owner].items():
            hist = _histogram(key[0], p, problems)
            if hist is not None:
                hists[key] = hist
        out.append(
            EngineSnapshot(
                backend=backend,
                engine=owner[0],
                model_name=owner[1],
                values=dict(values[owner]),
                histograms=hists,
                config=dict(config[owner]),
            )
        )
    return tuple(out)


def _histogram(name: str, p: dict[str, object], problems: list[str]) -> Histogram | None:
    buckets: dict[float, float] = p["buckets"]  # type: ignore[assignment]
    if not buckets or float("inf") not in buckets:
        problems.append(f"{name}: histogram without a +Inf bucket; dropped")
        return None
    bounds = tuple(sorted(buckets))
    bounds = _BOUNDS.get(bounds, bounds)
    if len(_BOUNDS) < _MAX_BOUNDS:
        _BOUNDS.setdefault(bounds, bounds)
    counts = tuple(buckets[b] for b in bounds)
    if any(b < a for a, b in zip(counts, counts[1:])):
        problems.append(f"{name}: bucket counts decrease with le; kept as served")
    count = float(p.get("count", counts[-1]))  # type: ignore[arg-type]
    return Histogram(
        bounds=bounds,
        counts=counts,
        sum=float(p.get("sum", 0.0)),  # type: ignore[arg-type]
        count=count,
    )
