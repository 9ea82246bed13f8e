"""What one window of a target really saw: offered load, served capacity, saturation, SLO attainment. Pure.

Everything here is read from what no missed scrape loses: counters and histograms, as raw differences between
the window's first and last stored sample (no extrapolation), and gauges only at the window's two ends or as a
share of samples. A loaded CPU vLLM answers /metrics late exactly while its queue is longest, so a sampled gauge
alone can miss a queue that was there.

vLLM, per window (summed over engines):
  served_rps      finished requests per second (``request_success_total``, every finished_reason)
  offered_rps     arrivals per second: finished + the change in running + waiting between the two ends
  capacity_rps    finished requests per second over the *busy* scrape intervals only (something ran, waited or
                  finished in them): what the server sustains while it has work, idle gaps left out
  queued_share    share of finished requests that waited longer than the queue histogram's first bound (0.3 s)
  queue_time_share  share of all request time spent waiting for the scheduler: the queue histogram's sum over
                  the E2E histogram's (0.00 below capacity here; 0.19-0.82 with more clients than sequences)
  saturated       queue_time_share >= SATURATED_QUEUE_TIME_SHARE, or queued_share >= SATURATED_QUEUED_SHARE, or
                  waiting > 0 in >= SATURATED_WAITING_SHARE of the samples: requests wait for the server, so
                  what it serves is its capacity, not the load. (The gauges alone would not do: vLLM answers
                  /metrics between engine steps, and most samples of a saturated server showed 0 running.)
  slo_attainment  share of finished requests within every SLO budget (a lower bound at bucket resolution;
                  aborted or failed requests count as misses; slo_attainment_hi the upper bound, slo_attainment_est
                  the buckets taken as evenly filled, between the two); slo_goodput_rps = served_rps x slo_attainment,
                  slo_token_goodput_tps = tokens_per_s x slo_attainment (a request within the SLO taken to generate
                  as many tokens as any other: vLLM does not link a request's tokens to its latency)
llama-server exports no request counter and no latency histogram: its capacity is generated tokens per second
over busy intervals, saturation is ``requests_deferred`` > 0 in that share of samples, and its latency is the
mean seconds per generated token from its two time counters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.backends import backend
from tuner.config import Slo
from tuner.signals.promql import fraction_le, fraction_le_linear, histogram_quantile
from tuner.store.window import EngineWindow, HistSeries, TargetWindow

__all__ = [
    "LoadProfile",
    "Interval",
    "profile",
    "group_profile",
    "SATURATED_QUEUED_SHARE",
    "SATURATED_WAITING_SHARE",
    "SATURATED_QUEUE_TIME_SHARE",
]

SATURATED_QUEUE_TIME_SHARE = 0.10
SATURATED_QUEUED_SHARE = 0.10
SATURATED_WAITING_SHARE = 0.25


@dataclass(frozen=True)
class Interval:
    """Between two consecutive stored scrapes: the resampling unit of the verdict."""

    seconds: float
    finished: float  # requests (vLLM); 0 for llama-server
    generated: float  # tokens
    busy: bool  # something ran, waited or finished in it
    # requests that arrived in it (vLLM): finished + the change in running + waiting between its two scrapes, the
    # offered load's count per interval; None where the server counts no requests
    arrived: float | None = None


@dataclass(frozen=True)
class LoadProfile:
    backend: str
    start: float  # unix seconds of the first and last stored sample used
    end: float
    samples: int
    finished: float | None  # requests finished in the window (None: the server counts no requests)
    aborted: float | None  # finished as abort or error: SLO misses
    generated_tokens: float | None
    served_rps: float | None
    offered_rps: float | None
    capacity_rps: float | None
    tokens_per_s: float | None
    capacity_tokens_per_s: float | None
    queued_share: float | None
    mean_in_flight: float | None  # requests in the server on average (Little's law: E2E seconds served / window)
    queue_time_share: float | None
    waiting_share: float | None  # share of samples with requests waiting (deferred on llama-server)
    saturated: bool
    slo_attainment: float | None
    slo_goodput_rps: float | None
    ttft_p99: float | None
    e2e_p99: float | None
    ttft_p50: float | None
    e2e_p50: float | None
    seconds_per_token: float | None  # llama-server's mean decode time per generated token
    slo_token_goodput_tps: float | None = None  # generated tokens/s x slo_attainment: tokens of requests within the SLO
    intervals: tuple[Interval, ...] = field(default=(), repr=False)
    slo_budgets: dict[str, float] = field(default_factory=dict, repr=False)  # ttft/itl/e2e -> P99 budget, seconds
    slo_objective: float | None = None  # the share of requests that must meet every budget (None: no SLO)
    # slo_attainment is a lower bound at bucket resolution (a budget inside a bucket counts that bucket as missed);
    # this is the upper bound (it counts it as met): the two are equal when every budget is a bucket bound
    slo_attainment_hi: float | None = None
    # within those bounds, the estimate: each budget's share with the observations spread evenly within the bucket
    # it falls in (histogram_quantile's assumption), the budgets' misses taken as the same requests (a request late
    # to its first token is late to its last: TTFT is part of E2E)
    slo_attainment_est: float | None = None
    hists: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = field(default_factory=dict, repr=False)

    # The window's rates in the unit its backend counts: requests where it counts them (vLLM), else tokens.
    @property
    def counts_requests(self) -> bool:
        return backend(self.backend).counts_requests

    @property
    def unit(self) -> str:
        return backend(self.backend).capacity_unit

    @property
    def capacity(self) -> float | None:
        return self.capacity_rps if self.counts_requests else self.capacity_tokens_per_s

    @property
    def served(self) -> float | None:
        return self.served_rps if self.counts_requests else self.tokens_per_s

    @property
    def offered(self) -> float | None:
        """Offered load; llama-server counts no arrivals, so its generated tokens/s stand in for it."""
        return self.offered_rps if self.counts_requests else self.tokens_per_s

    def summary(self) -> dict[str, Any]:
        """The numbers a person and the journal read (JSON-ready)."""
        keys = (
            "start",
            "end",
            "samples",
            "saturated",
            "offered_rps",
            "served_rps",
            "capacity_rps",
            "slo_goodput_rps",
            "slo_token_goodput_tps",
            "slo_attainment",
            "ttft_p99",
            "e2e_p99",
            "tokens_per_s",
            "capacity_tokens_per_s",
            "queued_share",
            "queue_time_share",
            "waiting_share",
            "mean_in_flight",
            "ttft_p50",
            "e2e_p50",
            "finished",
            "aborted",
            "generated_tokens",
            "seconds_per_token",
            "slo_objective",
            "slo_attainment_hi",
            "slo_attainment_est",
        )
        out = {k: _finite(getattr(self, k)) for k in keys}
        if self.slo_budgets:
            out["slo_budgets"] = dict(self.slo_budgets)
        return out


def _budgets(slo: Slo | None) -> dict[str, float]:
    if slo is None:
        return {}
    return {
        key: budget.total_seconds()
        for key in ("ttft", "itl", "e2e")
        if (budget := getattr(slo, f"{key}_p99", None)) is not None
    }


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else None
    return v


def _by_ts(e: EngineWindow, metric: str) -> dict[int, float]:
    """The metric summed over its label sets, per scrape timestamp."""
    out: dict[int, float] = {}
    for (name, _), pts in e.series.items():
        if name == metric:
            for ts, v in pts:
                out[ts] = out.get(ts, 0.0) + v
    return out


def deltas(values: Sequence[float]) -> list[float]:
    """Counter increases between consecutive samples; a decrease is a reset (the new value counts whole)."""
    return [b - a if b >= a else b for a, b in zip(values, values[1:])]


def hist_increase(h: HistSeries) -> tuple[float, ...] | None:
    if len(h.points) < 2:
        return None
    first, last = h.points[0], h.points[-1]
    if last.count < first.count:  # reset inside the window: what the new process counted
        return last.counts
    return tuple(max(0.0, b - a) for a, b in zip(first.counts, last.counts))


def _quantile(bounds: Sequence[float], cum: Sequence[float], q: float) -> float | None:
    if not cum or not cum[-1]:
        return None
    v = histogram_quantile(q, bounds, cum)
    return None if math.isnan(v) else v


def _within(bounds: Sequence[float], cum: Sequence[float], budget: float) -> tuple[float, float] | None:
    """The share of observations within ``budget`` as far as the buckets tell: (at least, at most)."""
    return fraction_le(budget, bounds, cum)


def _sum_hists(engines: Sequence[EngineWindow], metric: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    total: list[float] | None = None
    bounds: tuple[float, ...] = ()
    for e in engines:
        h = e.hists.get((metric, ()))
        inc = hist_increase(h) if h is not None else None
        if inc is None:
            continue
        if total is None:
            total, bounds = list(inc), h.bounds  # type: ignore[union-attr]
        elif h.bounds == bounds:  # type: ignore[union-attr]
            total = [a + b for a, b in zip(total, inc)]
    return (bounds, tuple(total)) if total is not None else None


def _sum_seconds(engines: Sequence[EngineWindow], metric: str) -> float | None:
    """Seconds observed by a histogram over the window (its _sum's increase), summed over engines."""
    total, found = 0.0, False
    for e in engines:
        h = e.hists.get((metric, ()))
        if h is None or len(h.points) < 2:
            continue
        first, last = h.points[0], h.points[-1]
        total += last.sum if last.count < first.count else max(0.0, last.sum - first.sum)
        found = True
    return total if found else None


def profile(window: TargetWindow, *, slo: Slo | None = None) -> LoadProfile | None:
    """The window's load profile; None when it holds fewer than two scrapes of the server."""
    names = backend(window.backend).load_metrics
    engines = [e for e in window.engines if e.series]
    stamps = sorted({ts for e in engines for ts in _by_ts(e, names["generated"])})
    if len(stamps) < 2:
        return None
    t0, t1 = stamps[0], stamps[-1]
    secs = (t1 - t0) / 1000

    def per_engine(key: str) -> list[list[float]]:
        """Each engine's values at every timestamp of the window: its own where it was scraped then (a server's
        scrape stores all its engines at once), else its latest before (its first, before it was first seen).
        A replica group's window holds each replica's engines, scraped at their own moments."""
        out = []
        for e in engines:
            own = _by_ts(e, names[key]) if key in names else {}
            if not own:
                continue
            mine, last, vals = sorted(own), None, []
            i = 0
            for ts in stamps:
                while i < len(mine) and mine[i] <= ts:
                    last, i = own[mine[i]], i + 1
                vals.append(own[mine[0]] if last is None else last)
            out.append(vals)
        return out

    def series(key: str) -> list[float]:
        """A gauge summed over engines at each timestamp."""
        per = per_engine(key)
        return [math.fsum(col) for col in zip(*per)] if per else [0.0] * len(stamps)

    def increases(key: str) -> list[float]:
        """A counter's increase per interval, summed over engines (each engine's resets its own)."""
        per = [deltas(vals) for vals in per_engine(key)]
        return [math.fsum(col) for col in zip(*per)] if per else [0.0] * (len(stamps) - 1)

    gen_d = increases("generated")
    finished_d = increases("finished")
    running, waiting = series("running"), series("waiting")
    in_flight = [r + w for r, w in zip(running, waiting)]
    counts = backend(window.backend).counts_requests
    intervals = tuple(
        Interval(
            (b - a) / 1000,
            f,
            g,
            bool(f or g or in_flight[i] or in_flight[i + 1]),
            max(0.0, f + in_flight[i + 1] - in_flight[i]) if counts else None,
        )
        for i, (a, b, f, g) in enumerate(zip(stamps, stamps[1:], finished_d, gen_d))
    )
    busy = [iv for iv in intervals if iv.busy]
    busy_s = math.fsum(iv.seconds for iv in busy)
    gen_total = math.fsum(gen_d)
    waiting_share = sum(1 for w in waiting if w > 0) / len(waiting)

    if not counts:
        gen_seconds = math.fsum(increases("gen_seconds"))
        return LoadProfile(
            backend=window.backend,
            start=t0 / 1000,
            end=t1 / 1000,
            samples=len(stamps),
            finished=None,
            aborted=None,
            generated_tokens=gen_total,
            served_rps=None,
            offered_rps=None,
            capacity_rps=None,
            tokens_per_s=gen_total / secs if secs else None,
            capacity_tokens_per_s=math.fsum(iv.generated for iv in busy) / busy_s if busy_s else None,
            queued_share=None,
            mean_in_flight=None,
            queue_time_share=None,
            waiting_share=waiting_share,
            saturated=waiting_share >= SATURATED_WAITING_SHARE,
            slo_attainment=None,
            slo_goodput_rps=None,
            slo_token_goodput_tps=None,
            ttft_p99=None,
            e2e_p99=None,
            ttft_p50=None,
            e2e_p50=None,
            seconds_per_token=gen_seconds / gen_total if gen_total else None,
            intervals=intervals,
        )

    finished = math.fsum(finished_d)
    aborted = 0.0
    for e in engines:
        for (name, labels), pts in e.series.items():
            reason = dict(labels or ()).get("finished_reason")
            if name == names["finished"] and reason in ("abort", "error") and len(pts) >= 2:
                aborted += math.fsum(deltas([v for _, v in pts]))
    hists = {k: h for k in ("ttft", "e2e", "itl", "queue") if (h := _sum_hists(engines, names[k])) is not None}
    queue_s, e2e_s = _sum_seconds(engines, names["queue"]), _sum_seconds(engines, names["e2e"])
    queue_time_share = queue_s / e2e_s if queue_s is not None and e2e_s else None
    queued_share = None
    if "queue" in hists and hists["queue"][1][-1]:
        bounds, cum = hists["queue"]
        queued_share = 1.0 - cum[0] / cum[-1]
    attainment = attainment_hi = attainment_est = None
    if slo is not None and finished:
        shares, even = [], []
        for key in ("ttft", "itl", "e2e"):
            budget = getattr(slo, f"{key}_p99")
            if budget is not None and key in hists:
                share = _within(*hists[key], budget.total_seconds())
                if share is not None:
                    shares.append(share)
                    est = fraction_le_linear(budget.total_seconds(), *hists[key])
                    even.append(share[0] if est is None else est)
        if shares:  # requests are not linked across histograms: at least sum(shares) - (n - 1) met them all
            joint = max(0.0, math.fsum(lo for lo, _ in shares) - (len(shares) - 1))
            done = max(0.0, finished - aborted) / finished
            attainment = joint * done
            attainment_hi = min(hi for _, hi in shares) * done  # at most: every bucket a budget falls in met it
            attainment_est = min(attainment_hi, max(attainment, min(even) * done))
    served = finished / secs if secs else None
    return LoadProfile(
        backend=window.backend,
        start=t0 / 1000,
        end=t1 / 1000,
        samples=len(stamps),
        finished=finished,
        aborted=aborted,
        generated_tokens=gen_total,
        served_rps=served,
        offered_rps=(finished + in_flight[-1] - in_flight[0]) / secs if secs else None,
        capacity_rps=math.fsum(iv.finished for iv in busy) / busy_s if busy_s else None,
        tokens_per_s=gen_total / secs if secs else None,
        capacity_tokens_per_s=math.fsum(iv.generated for iv in busy) / busy_s if busy_s else None,
        queued_share=queued_share,
        mean_in_flight=e2e_s / secs if e2e_s is not None and secs else None,
        queue_time_share=queue_time_share,
        waiting_share=waiting_share,
        saturated=(queue_time_share or 0.0) >= SATURATED_QUEUE_TIME_SHARE
        or (queued_share or 0.0) >= SATURATED_QUEUED_SHARE
        or waiting_share >= SATURATED_WAITING_SHARE,
        slo_attainment=attainment,
        slo_attainment_hi=attainment_hi,
        slo_attainment_est=attainment_est,
        slo_goodput_rps=served * attainment if served is not None and attainment is not None else None,
        slo_token_goodput_tps=gen_total / secs * attainment if secs and attainment is not None else None,
        ttft_p99=_quantile(*hists["ttft"], 0.99) if "ttft" in hists else None,
        e2e_p99=_quantile(*hists["e2e"], 0.99) if "e2e" in hists else None,
        ttft_p50=_quantile(*hists["ttft"], 0.5) if "ttft" in hists else None,
        e2e_p50=_quantile(*hists["e2e"], 0.5) if "e2e" in hists else None,
        seconds_per_token=None,
        intervals=intervals,
        hists=hists,
        slo_budgets=_budgets(slo),
        slo_objective=slo.objective if slo is not None and _budgets(slo) else None,
    )


def group_profile(name: str, windows: Sequence[TargetWindow], *, slo: Slo | None = None) -> LoadProfile | None:
    """A replica group's load profile over its replicas' windows of one range: the replicas' engines read as one
    server's. The group's intervals run between every replica's scrape moments, each replica's counters carried
    onto them (so every request and token lands in the interval its replica's scrape counted it in, and the sums
    over the window are the replicas' sums); histograms are summed bucket by bucket; a restart is each replica's
    own. None when the replicas' windows cover different ranges or hold fewer than two scrapes in all."""
    if not windows or len({(w.start_ms, w.end_ms, w.backend) for w in windows}) != 1:
        return None
    engines = tuple(replace(e, engine=f"{w.target}/{e.engine}") for w in windows for e in w.engines)
    return profile(
        TargetWindow(
            target=name,
            backend=windows[0].backend,
            start_ms=windows[0].start_ms,
            end_ms=windows[0].end_ms,
            engines=engines,
            health=None,
        ),
        slo=slo,
    )
