"""A window of stored points → the signals operators read: rates, latency quantiles, KV use, goodput.

Pure: the window and the evaluation time come in as arguments; nothing here reads a clock or a database.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from tuner.backends import backend as backend_of
from tuner.collect.snapshots import SeriesKey
from tuner.config import Slo
from tuner.names import (
    LLAMACPP_N_DECODE_TOTAL,
    LLAMACPP_PROMPT_TOKENS_TOTAL,
    LLAMACPP_REQUESTS_DEFERRED,
    LLAMACPP_REQUESTS_PROCESSING,
    LLAMACPP_TOKENS_PREDICTED_TOTAL,
    VLLM_E2E_REQUEST_LATENCY_SECONDS,
    VLLM_GENERATION_TOKENS_TOTAL,
    VLLM_INTER_TOKEN_LATENCY_SECONDS,
    VLLM_KV_CACHE_USAGE_PERC,
    VLLM_NUM_PREEMPTIONS_TOTAL,
    VLLM_NUM_REQUESTS_RUNNING,
    VLLM_NUM_REQUESTS_WAITING,
    VLLM_PREFIX_CACHE_HITS_TOTAL,
    VLLM_PREFIX_CACHE_QUERIES_TOTAL,
    VLLM_PROMPT_TOKENS_TOTAL,
    VLLM_REQUEST_QUEUE_TIME_SECONDS,
    VLLM_REQUEST_SUCCESS_TOTAL,
    VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
)
from tuner.signals.promql import bucket_increase, fraction_le, histogram_quantiles, increase, rate
from tuner.store.window import EngineWindow, HistPoint, HistSeries, Point, Points, TargetHealth, TargetWindow

__all__ = [
    "EngineSignals",
    "TargetSignals",
    "compute_signals",
    "ALWAYS_DERIVED",
    "group_signals",
    "queue_ratio",
    "QUANTILES",
    "LATENCY_HISTOGRAMS",
    "SIGNAL_METRICS",
    "PROGRESS_COUNTERS",
    "metrics_for",
    "stall_reason",
]

QUANTILES = (0.5, 0.95, 0.99)
# signal prefix → histogram (seconds)
LATENCY_HISTOGRAMS = {
    "ttft": VLLM_TIME_TO_FIRST_TOKEN_SECONDS,
    "itl": VLLM_INTER_TOKEN_LATENCY_SECONDS,
    "e2e": VLLM_E2E_REQUEST_LATENCY_SECONDS,
    "queue": VLLM_REQUEST_QUEUE_TIME_SECONDS,
}
_RATES = {  # signal → counter, per backend
    "vllm": {
        "prompt_tokens_per_s": VLLM_PROMPT_TOKENS_TOTAL,
        "generation_tokens_per_s": VLLM_GENERATION_TOKENS_TOTAL,
        "requests_per_s": VLLM_REQUEST_SUCCESS_TOTAL,
        "preemptions_per_s": VLLM_NUM_PREEMPTIONS_TOTAL,
    },
    "llamacpp": {
        "prompt_tokens_per_s": LLAMACPP_PROMPT_TOKENS_TOTAL,
        "generation_tokens_per_s": LLAMACPP_TOKENS_PREDICTED_TOTAL,
    },
}
_GAUGES = {  # signal → gauge, per backend
    "vllm": {
        "kv_cache_usage": VLLM_KV_CACHE_USAGE_PERC,
        "requests_running": VLLM_NUM_REQUESTS_RUNNING,
        "requests_waiting": VLLM_NUM_REQUESTS_WAITING,
    },
    "llamacpp": {
        "kv_cache_usage": "tuner:kv_cache_usage",
        "requests_running": LLAMACPP_REQUESTS_PROCESSING,
        "requests_waiting": LLAMACPP_REQUESTS_DEFERRED,
        "slots_total": "tuner:slots_total",
        "slots_busy": "tuner:slots_busy",
    },
}
# What moves while an engine serves, per backend: in flight and none of these moved means it is stalled
# (stalled_requests). vLLM counts tokens as the engine emits them. llama-server's tokens_predicted_total moves only
# when a request finishes (a 400-token generation showed 0 until its end), but n_decode_total counts every
# llama_decode call as it happens (tests/fixtures/stall/README.md).
PROGRESS_COUNTERS = {
    "vllm": (VLLM_GENERATION_TOKENS_TOTAL, VLLM_REQUEST_SUCCESS_TOTAL),
    "llamacpp": (LLAMACPP_N_DECODE_TOTAL,),
}

# Every series compute_signals reads: the signal book asks the store for these only (a vLLM window has twice as
# many histogram rows in series no signal uses). tests/signals/test_derive.py holds the two windows' signals equal.
SIGNAL_METRICS = frozenset(
    [
        *LATENCY_HISTOGRAMS.values(),
        *(m for b in _RATES.values() for m in b.values()),
        *(m for b in _GAUGES.values() for m in b.values()),
        VLLM_PREFIX_CACHE_HITS_TOTAL,
        VLLM_PREFIX_CACHE_QUERIES_TOTAL,
        *(m for b in PROGRESS_COUNTERS.values() for m in b),
        "process_start_time_seconds",
    ]
)


@dataclass(frozen=True)
class EngineSignals:
    """One engine over one window. None means "not enough data in the window", never zero."""

    engine: str
    model_name: str
    samples: int  # stored points in the window (all series)
    kv_cache_usage: float | None = None  # fraction 0-1, latest
    kv_cache_usage_max: float | None = None  # fraction 0-1, highest in the window
    requests_running: float | None = None  # latest
    requests_running_max: float | None = None  # highest in the window (a loaded server's scrapes miss the latest)
    requests_waiting: float | None = None  # latest (llama-server: deferred)
    requests_waiting_max: float | None = None
    slots_total: float | None = None  # llama-server only
    slots_busy: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    requests_per_s: float | None = None  # finished requests, any reason
    preemptions_per_s: float | None = None
    prefix_cache_hit_ratio: float | None = None  # fraction 0-1 of queried prompt tokens found cached
    ttft_p50: float | None = None  # seconds
    ttft_p95: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    itl_p99: float | None = None
    e2e_p50: float | None = None
    e2e_p95: float | None = None
    e2e_p99: float | None = None
    queue_p50: float | None = None
    queue_p95: float | None = None
    queue_p99: float | None = None
    requests_in_window: float | None = None  # observations of the E2E histogram
    requests_queued: float | None = None  # requests that waited longer than the queue histogram's first bound
    queued_over_s: float | None = None  # that bound in seconds (0.3 on vLLM 0.32)
    goodput_ratio: float | None = None  # fraction 0-1 of requests within every SLO budget (lower bound)
    goodput_ratio_upper: float | None = None  # the same, upper bound (bucket resolution)
    # generated tokens per second x goodput_ratio: the tokens of requests within the SLO (lower bound; vLLM does not
    # link a request's tokens to its latency, so a request within the SLO is taken to generate as many as any other)
    token_goodput_per_s: float | None = None
    # requests in flight (running + waiting, latest) when no token was generated and no request finished in the
    # window (llama-server: no llama_decode call); 0 when the engine moved or had nothing to do
    stalled_requests: float | None = None
    restarts: int = 0  # process start time changed within the window

    def as_json(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class TargetSignals:
    target: str
    backend: str
    window_s: float
    at: float  # unix seconds: the end of the window
    health: TargetHealth | None
    engines: tuple[EngineSignals, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "backend": self.backend,
            "window_s": self.window_s,
            "at": self.at,
            "health": asdict(self.health) if self.health else None,
            "engines": [e.as_json() for e in self.engines],
        }


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _summed(series: Mapping[tuple[str, Any], Sequence[Point]], metric: str) -> list[Sequence[Point]]:
    return [pts for (name, _), pts in series.items() if name == metric]


def _sum_rate(e: EngineWindow, metric: str, lo: int, hi: int) -> float | None:
    """``sum(rate(metric[w]))`` over the metric's label sets (e.g. finished_reason)."""
    rates = [r for pts in _summed(e.series, metric) if (r := rate(pts, lo, hi)) is not None]
    return math.fsum(rates) if rates else None


def _sum_increase(e: EngineWindow, metric: str, lo: int, hi: int) -> float | None:
    incs = [i for pts in _summed(e.series, metric) if (i := increase(pts, lo, hi)) is not None]
    return math.fsum(incs) if incs else None


def _latest(e: EngineWindow, metric: str) -> float | None:
    found = _summed(e.series, metric)
    return math.fsum(pts[-1][1] for pts in found if pts) if found else None


def _max(e: EngineWindow, metric: str) -> float | None:
    found = [
        max(pts.values) if isinstance(pts, Points) else max(v for _, v in pts)
        for pts in _summed(e.series, metric)
        if pts
    ]
    return max(found) if found else None


class _Increases:
    """Per-bucket increases of one window's histograms, each worked out once: an engine's quantiles, goodput and
    request counts ask for the same histogram up to five times."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi
        self._done: dict[int, tuple[HistSeries, tuple[float, ...] | None]] = {}

    def __call__(self, hist: HistSeries) -> tuple[float, ...] | None:
        held = self._done.get(id(hist))
        if held is None or held[0] is not hist:
            held = self._done[id(hist)] = (hist, bucket_increase(hist, self.lo, self.hi))
        return held[1]


def quantile(
    e: EngineWindow, metric: str, q: float, lo: int, hi: int, increases: _Increases | None = None
) -> float | None:
    """``histogram_quantile(q, increase(metric_bucket[w]))`` for one engine; None without observations."""
    return quantiles(e, metric, (q,), lo, hi, increases)[0]


def quantiles(
    e: EngineWindow, metric: str, qs: Sequence[float], lo: int, hi: int, increases: _Increases | None = None
) -> list[float | None]:
    """``quantile`` at each of ``qs``."""
    hist = e.hists.get((metric, ()))
    inc = (increases or _Increases(lo, hi))(hist) if hist is not None else None
    if hist is None or inc is None:
        return [None] * len(qs)
    return [None if math.isnan(v) else v for v in histogram_quantiles(qs, hist.bounds, inc)]


def _goodput(
    e: EngineWindow, slo: Slo | None, lo: int, hi: int, increases: _Increases
) -> tuple[float | None, float | None]:
    """Share of requests within every SLO budget, bounded by bucket resolution.

    Each budget gives (at least, at most) from its histogram. Requests are not linked across
    histograms, so the joint share is at least sum(lows) - (n - 1) and at most min(highs).
    """
    if slo is None:
        return None, None
    budgets = [(LATENCY_HISTOGRAMS[k], getattr(slo, f"{k}_p99")) for k in ("ttft", "itl", "e2e")]
    lows, highs = [], []
    for metric, budget in budgets:
        if budget is None:
            continue
        hist = e.hists.get((metric, ()))
        inc = increases(hist) if hist else None
        frac = fraction_le(budget.total_seconds(), hist.bounds, inc) if hist and inc else None
        if frac is None:
            return None, None
        lows.append(frac[0])
        highs.append(frac[1])
    if not lows:
        return None, None
    upper = min(highs)
    # min(): the two bounds come from different float sums and may differ by an ulp the wrong way
    return min(upper, max(0.0, math.fsum(lows) - (len(lows) - 1))), upper


def _restarts(e: EngineWindow) -> int:
    pts = e.series.get(("process_start_time_seconds", ()), ())
    values = pts.values if isinstance(pts, Points) else [v for _, v in pts]
    return sum(map(operator.ne, values, values[1:]))


# What every derivation works out, whatever ``only`` says (compute_signals): they cost next to nothing.
ALWAYS_DERIVED = frozenset(
    [
        "engine",
        "model_name",
        "samples",
        "restarts",
        "kv_cache_usage",
        "kv_cache_usage_max",
        "requests_running",
        "requests_running_max",
        "requests_waiting",
        "requests_waiting_max",
        "slots_total",
        "slots_busy",
    ]
)


# What the fields beyond ALWAYS_DERIVED read (metrics_for): a field not named here reads only what those do.
_ALWAYS_READ = frozenset([*(m for b in _GAUGES.values() for m in b.values()), "process_start_time_seconds"])
_FIELD_METRICS: dict[str, frozenset[str]] = {
    **{name: frozenset([b[name] for b in _RATES.values() if name in b]) for r in _RATES.values() for name in r},
    "prefix_cache_hit_ratio": frozenset([VLLM_PREFIX_CACHE_HITS_TOTAL, VLLM_PREFIX_CACHE_QUERIES_TOTAL]),
    **{f"{p}_p{round(q * 100)}": frozenset([m]) for p, m in LATENCY_HISTOGRAMS.items() for q in QUANTILES},
    "requests_in_window": frozenset([LATENCY_HISTOGRAMS["e2e"]]),
    "requests_queued": frozenset([LATENCY_HISTOGRAMS["queue"]]),
    "queued_over_s": frozenset([LATENCY_HISTOGRAMS["queue"]]),
    "goodput_ratio": frozenset(LATENCY_HISTOGRAMS[k] for k in ("ttft", "itl", "e2e")),
    "goodput_ratio_upper": frozenset(LATENCY_HISTOGRAMS[k] for k in ("ttft", "itl", "e2e")),
    "token_goodput_per_s": frozenset(
        [
            *(LATENCY_HISTOGRAMS[k] for k in ("ttft", "itl", "e2e")),
            *(b["generation_tokens_per_s"] for b in _RATES.values()),
        ]
    ),
    "stalled_requests": frozenset(m for b in PROGRESS_COUNTERS.values() for m in b),
}


def metrics_for(only: Collection[str] | None) -> frozenset[str]:
    """The stored series a derivation of ``only`` (compute_signals's) reads, for every backend: a window of these
    alone derives those fields, and ALWAYS_DERIVED's but ``samples`` (it counts the points read), as a window of
    SIGNAL_METRICS does (tests/signals/test_derive.py). SIGNAL_METRICS for None (every field)."""
    if only is None:
        return SIGNAL_METRICS
    return _ALWAYS_READ.union(*(_FIELD_METRICS.get(f, ()) for f in only))


def _wants(only: Collection[str] | None, *fields: str) -> bool:
    return only is None or any(f in only for f in fields)


def _engine_signals(
    e: EngineWindow, backend: str, slo: Slo | None, lo: int, hi: int, only: Collection[str] | None = None
) -> EngineSignals:
    values: dict[str, Any] = {}
    for name, metric in _GAUGES.get(backend, {}).items():
        values[name] = _latest(e, metric)
    kv_metric = _GAUGES.get(backend, {}).get("kv_cache_usage")
    values["kv_cache_usage_max"] = _max(e, kv_metric) if kv_metric else None
    waiting = _GAUGES.get(backend, {}).get("requests_waiting")
    values["requests_waiting_max"] = _max(e, waiting) if waiting else None
    running = _GAUGES.get(backend, {}).get("requests_running")
    values["requests_running_max"] = _max(e, running) if running else None
    for name, metric in _RATES.get(backend, {}).items():
        if _wants(only, name):
            values[name] = _sum_rate(e, metric, lo, hi)
    if backend_of(backend).counts_requests:  # request counters and latency histograms
        if _wants(only, "prefix_cache_hit_ratio"):
            hits = _sum_increase(e, VLLM_PREFIX_CACHE_HITS_TOTAL, lo, hi)
            queries = _sum_increase(e, VLLM_PREFIX_CACHE_QUERIES_TOTAL, lo, hi)
            values["prefix_cache_hit_ratio"] = hits / queries if hits is not None and queries else None
        increases = _Increases(lo, hi)
        for prefix, metric in LATENCY_HISTOGRAMS.items():
            names = [f"{prefix}_p{round(q * 100)}" for q in QUANTILES]
            if _wants(only, *names):
                values.update(zip(names, quantiles(e, metric, QUANTILES, lo, hi, increases)))
        if _wants(only, "requests_in_window"):
            e2e = e.hists.get((LATENCY_HISTOGRAMS["e2e"], ()))
            inc = increases(e2e) if e2e else None
            values["requests_in_window"] = inc[-1] if inc else None
        # Queueing from the queue-time histogram: its counts are cumulative, so no missed scrape loses them
        # (the waiting gauge is only a sample, and a loaded server answers /metrics late exactly then).
        queue = e.hists.get((LATENCY_HISTOGRAMS["queue"], ()))
        q_inc = increases(queue) if queue and _wants(only, "requests_queued", "queued_over_s") else None
        if queue is not None and q_inc:
            values["requests_queued"] = max(0.0, q_inc[-1] - q_inc[0])
            values["queued_over_s"] = queue.bounds[0]
        if _wants(only, "goodput_ratio", "goodput_ratio_upper", "token_goodput_per_s"):
            values["goodput_ratio"], values["goodput_ratio_upper"] = _goodput(e, slo, lo, hi, increases)
        if _wants(only, "token_goodput_per_s"):
            tokens = values.get("generation_tokens_per_s")
            if tokens is None:
                tokens = _sum_rate(e, _RATES[backend]["generation_tokens_per_s"], lo, hi)
            good = values["goodput_ratio"]
            values["token_goodput_per_s"] = tokens * good if tokens is not None and good is not None else None
    if _wants(only, "stalled_requests"):
        values["stalled_requests"] = _stalled(
            e, backend, values.get("requests_running"), values.get("requests_waiting"), lo, hi
        )
    return EngineSignals(engine=e.engine, model_name=e.model_name, samples=_samples(e), restarts=_restarts(e), **values)


def _stalled(
    e: EngineWindow, backend: str, running: float | None, waiting: float | None, lo: int, hi: int
) -> float | None:
    """Requests in flight when none of the backend's progress counters moved over the window, else 0; None when
    the window cannot tell (no gauge, or fewer than two points of a counter). As PromQL (rules/signals.py):
    ``(running + waiting) * on (...) (sum(increase(progress[w])) == bool 0)``."""
    counters = PROGRESS_COUNTERS.get(backend)
    if not counters or (running is None and waiting is None):
        return None
    moved = 0.0
    for metric in counters:
        inc = _sum_increase(e, metric, lo, hi)
        if inc is None:
            return None
        moved += inc
    return (running or 0.0) + (waiting or 0.0) if moved == 0 else 0.0


def _samples(e: EngineWindow) -> int:
    """Stored points in an engine's window, all series."""
    return sum(len(p) for p in e.series.values()) + sum(len(h.points) for h in e.hists.values())


def stall_reason(sig: TargetSignals) -> str | None:
    """Why the target's engine is up but not serving, in one line; None when it is not: requests in flight and no
    progress over the window (stalled_requests), or /health answering 200 while the last scrape failed (llama-server
    answers /metrics from the loop that runs its slots)."""
    for e in sig.engines:
        if e.stalled_requests:
            return (
                f"{e.stalled_requests:g} requests in flight on engine {e.engine} ({e.model_name}) and no token "
                f"generated, no request finished in {sig.window_s:g}s"
            )
    h = sig.health
    if h is not None and h.health == "down" and h.server_healthy:
        return f"/health answers 200 while /metrics does not ({h.last_error[:160]})"
    return None


def queue_ratio(e: EngineSignals, max_num_seqs: float | None) -> float | None:
    """Requests waiting / the max-num-seqs the server runs with (the flags in force, not the config's key)."""
    if e.requests_waiting is None or not max_num_seqs:
        return None
    return e.requests_waiting / float(max_num_seqs)


def compute_signals(
    window: TargetWindow, *, slo: Slo | None = None, only: Collection[str] | None = None
) -> TargetSignals:
    """Signals for every engine of a target over ``window`` (evaluated at its end).

    ``only``: the EngineSignals fields the caller reads (an alert group's rules over a window of their own); the
    rates, quantiles, prefix-cache ratio, request counts and goodput no one asked for are left None, and the
    rest are the same figures as a full derivation's (tests/signals/test_derive.py). Gauges, restarts and the
    sample count are always there (they cost next to nothing)."""
    lo, hi = window.start_ms, window.end_ms
    return TargetSignals(
        target=window.target,
        backend=window.backend,
        window_s=(hi - lo) / 1000,
        at=hi / 1000,
        health=window.health,
        engines=tuple(_engine_signals(e, window.backend, slo, lo, hi, only) for e in window.engines),
    )


_COUNTERS = frozenset(
    [
        *(m for b in _RATES.values() for m in b.values()),
        VLLM_PREFIX_CACHE_HITS_TOTAL,
        VLLM_PREFIX_CACHE_QUERIES_TOTAL,
        *(m for b in PROGRESS_COUNTERS.values() for m in b),
    ]
)
_HOTTEST = frozenset([VLLM_KV_CACHE_USAGE_PERC, "tuner:kv_cache_usage"])  # a group's KV use: its fullest replica


def _group_window(name: str, windows: Sequence[TargetWindow]) -> TargetWindow:
    """The replicas' windows as one server's, over the same range [lo, hi]: each counter's and each histogram's
    increase over the window (Prometheus's, per replica and label set, resets and all) summed over the replicas
    and set as two points, 0 at lo and the sum at hi, so that compute_signals reads back exactly that increase;
    the gauges' latest values summed (running, waiting, slots) or, for KV use, the fullest replica's, and their
    peaks likewise (a point just before hi). One engine, "all"."""
    lo, hi = windows[0].start_ms, windows[0].end_ms
    counters: dict[SeriesKey, list[float]] = {}
    gauges: dict[SeriesKey, tuple[list[float], list[float]]] = {}
    hists: dict[SeriesKey, tuple[tuple[float, ...], list[tuple[float, ...]], list[float], list[float]]] = {}
    models = set()
    for w in windows:
        for e in w.engines:
            models.add(e.model_name)
            for key, pts in e.series.items():
                if key[0] not in SIGNAL_METRICS:
                    continue
                if key[0] in _COUNTERS:
                    inc = increase(pts, lo, hi)
                    if inc is not None:
                        counters.setdefault(key, []).append(inc)
                elif key[0] != "process_start_time_seconds" and pts:
                    latest, peak = gauges.setdefault(key, ([], []))
                    latest.append(pts[-1][1])
                    peak.append(max(v for _, v in pts))
            for key, h in e.hists.items():
                inc_b = bucket_increase(h, lo, hi) if key[0] in SIGNAL_METRICS else None
                if inc_b is None:
                    continue
                held = hists.setdefault(key, (h.bounds, [], [], []))
                if held[0] != h.bounds:  # a replica with another bucket layout cannot be summed with the first
                    continue
                held[1].append(inc_b)
                held[2].append(increase([(p.ts_ms, p.sum) for p in h.points], lo, hi) or 0.0)
                held[3].append(increase([(p.ts_ms, p.count) for p in h.points], lo, hi) or 0.0)
    series: dict[SeriesKey, tuple[Point, ...]] = {}
    for key, incs in counters.items():
        series[key] = ((lo, 0.0), (hi, math.fsum(incs)))
    for key, (latest, peak) in gauges.items():
        agg = max if key[0] in _HOTTEST else math.fsum
        series[key] = ((hi - 1, agg(peak)), (hi, agg(latest)))
    hist_series = {}
    for key, (bounds, per_replica, sums, counts) in hists.items():
        summed = tuple(math.fsum(col) for col in zip(*per_replica))
        hist_series[key] = HistSeries(
            bounds,
            (HistPoint(lo, (0.0,) * len(bounds), 0.0, 0.0), HistPoint(hi, summed, math.fsum(sums), math.fsum(counts))),
        )
    engine = EngineWindow(engine="all", model_name=", ".join(sorted(models)), series=series, hists=hist_series)
    return TargetWindow(
        target=name,
        backend=windows[0].backend,
        start_ms=lo,
        end_ms=hi,
        engines=(engine,) if series or hist_series else (),
        health=None,
    )


def group_signals(name: str, windows: Sequence[TargetWindow], *, slo: Slo | None = None) -> TargetSignals:
    """A replica group's signals over its replicas' windows (one range, the same for all): what the group served,
    as if one server had served it. Rates and token rates add up; latency quantiles and goodput come from the
    replicas' histogram increases summed bucket by bucket (never an average of quantiles); running and waiting
    requests add up; KV use is the fullest replica's; restarts add up. Health is left to each replica."""
    if not windows:
        raise ValueError(f"group {name}: no replica windows")
    if len({(w.start_ms, w.end_ms) for w in windows}) != 1:
        raise ValueError(f"group {name}: the replicas' windows cover different ranges")
    sig = compute_signals(_group_window(name, windows), slo=slo)
    samples = sum(_samples(e) for w in windows for e in w.engines)
    restarts = sum(_restarts(e) for w in windows for e in w.engines)
    return replace(sig, engines=tuple(replace(e, samples=samples, restarts=restarts) for e in sig.engines))
