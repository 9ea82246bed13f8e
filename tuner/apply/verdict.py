"""Keep, roll back, or say "inconclusive": the window after a change against the window before it. Pure.

Like is compared with like (tuner/signals/load.py says how each window is read):

* **Before saturated** (requests waited for the server): what it served was its capacity, so capacity is the
  KPI and more is better. Capacity is finished requests/s over the busy scrape intervals (llama-server:
  generated tokens/s), with SLO goodput (requests/s within every budget) beside it.
  - after saturated too: capacity up -> kept, down -> rolled_back;
  - after no longer saturated: the queue is gone, and the new capacity is at least what it served. Served as
    much as before or more -> kept; less -> inconclusive (the load fell, so the new capacity is unknown).
* **Before below capacity, after saturated**: a queue appeared. If the after window served less than the before
  window was offered, the new capacity is below a load the old config handled -> rolled_back. If the offered load
  also rose, the queue may be the load's doing -> inconclusive, never a rollback.
* **Both below capacity**: SLO attainment and the latency distributions (TTFT, E2E; llama-server: seconds per
  generated token) at matched offered load. If the loads differ by more than LOAD_MATCH, a verdict is given only
  where it holds whatever the load did: worse under less load -> rolled_back, better under more load -> kept;
  otherwise inconclusive, saying by how much the load differed.

Every difference must be beyond the noise before it decides anything. Capacity: a bootstrap over the windows'
scrape intervals (BOOTSTRAP replicates, seeded, so the same data gives the same verdict), giving the probability
that after > before. Latency: a Mann-Whitney rank test over the histogram's buckets (ties within a bucket). An
effect counts when that probability reaches CONFIDENT and the change is at least MIN_EFFECT (capacity) or
LATENCY_EFFECT (the median): both floors are the noise of a restart of the same config, measured. A latency shift
must also be at least LATENCY_SLO_SHARE of its SLO budget, where one is set: smaller ones change nothing the SLO
measures. Too little traffic (fewer than ``min_requests`` finished on either side; llama-server:
tokens) is inconclusive, and so is a window of fewer than MIN_SCRAPES scrapes (a daemon starved by a loaded
machine, or scrapes that timed out): a bootstrap over two or three intervals is sure of what it cannot know. No KPI here falls by construction when concurrency rises: per-request throughput is not
one. A change that improved every KPI it could be judged on is never rolled back.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from tuner.signals.load import Interval, LoadProfile

__all__ = ["Verdict", "judge", "MIN_SCRAPES", "CONFIDENT", "MIN_EFFECT", "LATENCY_EFFECT", "LATENCY_SLO_SHARE", "LOAD_MATCH",
           "BOOTSTRAP"]

CONFIDENT = 0.95
# Noise floors, measured: the same vLLM config restarted under the same load on a 2-core host served 11% less and
# its median E2E rose 28% (tests/fixtures/verdict/same_restart). Smaller differences are not the flags' doing.
MIN_EFFECT = 0.15  # relative capacity change that matters
LATENCY_EFFECT = 0.25  # relative change of the median (P50) that matters, besides the rank test
# A latency shift smaller than this share of its SLO budget changes nothing the SLO measures (a TTFT median
# moving 12 -> 18 ms under a 2 s budget is significant to a rank test over 150 requests, and irrelevant).
LATENCY_SLO_SHARE = 0.05
LOAD_MATCH = 1.25  # offered loads within this ratio are "matched"
BOOTSTRAP = 2000
# Fewer scrapes than this in a window judge nothing: a clean-clone demo run kept a change on 3 scrapes after it (its
# daemon stalled 10-15 s under the demo's load) whose capacity had in fact fallen 12%. The apply observes on.
MIN_SCRAPES = 6
_SEED = 20261122


@dataclass(frozen=True)
class Verdict:
    outcome: str  # kept | rolled_back | inconclusive
    reason: str
    confidence: float  # probability that the deciding KPI moved as the outcome says (inconclusive: the best found)
    test: str  # the method that decided
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reason": self.reason, "confidence": round(self.confidence, 4),
                "test": self.test, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class _Effect:
    name: str
    before: float | None
    after: float | None
    p_up: float  # probability that after > before
    rel: float  # after / before - 1
    higher_is_better: bool
    abs_min: float = 0.0  # the smallest absolute change that matters (latency: a share of its SLO budget)

    @property
    def _large(self) -> bool:
        return self.before is None or self.after is None or abs(self.after - self.before) >= self.abs_min

    @property
    def _up(self) -> bool:  # rose, beyond the noise
        return self.p_up >= CONFIDENT and self.rel >= self._min and self._large

    @property
    def _down(self) -> bool:  # fell, beyond the noise
        return 1 - self.p_up >= CONFIDENT and self.rel <= -self._min and self._large

    @property
    def better(self) -> bool:
        return self._up if self.higher_is_better else self._down

    @property
    def worse(self) -> bool:
        return self._down if self.higher_is_better else self._up

    @property
    def _min(self) -> float:
        return MIN_EFFECT if self.higher_is_better else LATENCY_EFFECT

    @property
    def confidence(self) -> float:
        return max(self.p_up, 1 - self.p_up)

    def text(self, unit: str = "") -> str:
        def f(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.3f}{unit}"
        return f"{self.name} {f(self.before)} -> {f(self.after)} ({self.rel:+.0%}, P(up) {self.p_up:.2f})"


# ---- the statistics -------------------------------------------------------------------------------------------

def _ratio(intervals: Sequence[Interval], attr: str) -> float:
    secs = math.fsum(iv.seconds for iv in intervals)
    return math.fsum(getattr(iv, attr) for iv in intervals) / secs if secs else 0.0


def bootstrap_p_up(before: Sequence[Interval], after: Sequence[Interval], attr: str, *, before_scale: float = 1.0,
                   after_scale: float = 1.0, replicates: int = BOOTSTRAP) -> float:
    """P(after's rate > before's) by resampling each side's busy scrape intervals with replacement (each side's
    rate times its scale, e.g. its SLO attainment for goodput)."""
    if not before or not after:
        return 0.5
    rng = random.Random(_SEED)
    up = 0.0
    for _ in range(replicates):
        b = before_scale * _ratio([before[rng.randrange(len(before))] for _ in before], attr)
        a = after_scale * _ratio([after[rng.randrange(len(after))] for _ in after], attr)
        up += 1.0 if a > b else 0.5 if a == b else 0.0
    return up / replicates


def rank_p_up(bounds: Sequence[float], before_cum: Sequence[float], after_cum: Sequence[float]) -> float:
    """P(after's observations are stochastically larger), Mann-Whitney U over histogram buckets (ties within a
    bucket, normal approximation with the tie correction): Phi(z)."""
    del bounds  # only the order of the buckets matters
    x = [b - a for a, b in zip((0.0, *before_cum), before_cum)]
    y = [b - a for a, b in zip((0.0, *after_cum), after_cum)]
    nx, ny = math.fsum(x), math.fsum(y)
    if nx < 1 or ny < 1:
        return 0.5
    u, below = 0.0, 0.0
    for xk, yk in zip(x, y):
        u += yk * (below + 0.5 * xk)
        below += xk
    n = nx + ny
    ties = math.fsum((xk + yk) ** 3 - (xk + yk) for xk, yk in zip(x, y))
    var = nx * ny / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 0.5
    z = (u - nx * ny / 2) / math.sqrt(var)
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def _rel(before: float | None, after: float | None) -> float:
    if before is None or after is None:
        return 0.0
    if before == 0:
        return math.inf if after > 0 else 0.0
    return after / before - 1


def _capacity(b: LoadProfile, a: LoadProfile) -> _Effect:
    attr, name, bv, av = "finished" if b.counts_requests else "generated", f"capacity ({b.unit})", b.capacity, a.capacity
    p = bootstrap_p_up([iv for iv in b.intervals if iv.busy], [iv for iv in a.intervals if iv.busy], attr)
    return _Effect(name, bv, av, p, _rel(bv, av), True)


def _goodput(b: LoadProfile, a: LoadProfile) -> _Effect | None:
    if b.slo_goodput_rps is None or a.slo_goodput_rps is None or b.slo_attainment is None or \
            a.slo_attainment is None:
        return None
    p = bootstrap_p_up([iv for iv in b.intervals if iv.busy], [iv for iv in a.intervals if iv.busy], "finished",
                       before_scale=b.slo_attainment, after_scale=a.slo_attainment)
    return _Effect("SLO goodput (req/s)", b.slo_goodput_rps, a.slo_goodput_rps, p,
                   _rel(b.slo_goodput_rps, a.slo_goodput_rps), True)


def _latencies(b: LoadProfile, a: LoadProfile) -> list[_Effect]:
    out = []
    for key, label in (("ttft", "P50 TTFT (s)"), ("e2e", "P50 E2E (s)")):
        hb, ha = b.hists.get(key), a.hists.get(key)
        if hb is None or ha is None or hb[0] != ha[0] or not hb[1][-1] or not ha[1][-1]:
            continue
        # the effect size is the median's shift (robust); the P99s are shown beside it
        vb, va = getattr(b, f"{key}_p50"), getattr(a, f"{key}_p50")
        budget = b.slo_budgets.get(key) or a.slo_budgets.get(key)
        out.append(_Effect(label, vb, va, rank_p_up(hb[0], hb[1], ha[1]), _rel(vb, va), False,
                           abs_min=LATENCY_SLO_SHARE * budget if budget else 0.0))
    if b.seconds_per_token is not None and a.seconds_per_token is not None:
        # llama-server: mean decode seconds per token, resampled as generated tokens per busy second
        p_faster = bootstrap_p_up([iv for iv in b.intervals if iv.busy], [iv for iv in a.intervals if iv.busy],
                                  "generated")
        out.append(_Effect("seconds per generated token", b.seconds_per_token, a.seconds_per_token, 1 - p_faster,
                           _rel(b.seconds_per_token, a.seconds_per_token), False))
    return out


def _attainment(b: LoadProfile, a: LoadProfile) -> _Effect | None:
    """Two-proportion z-test on the share of requests within every SLO budget."""
    pb, pa, nb, na = b.slo_attainment, a.slo_attainment, b.finished or 0, a.finished or 0
    if pb is None or pa is None or nb < 1 or na < 1:
        return None
    pooled = (pb * nb + pa * na) / (nb + na)
    se = math.sqrt(pooled * (1 - pooled) * (1 / nb + 1 / na))
    p_up = 0.5 if se == 0 else 0.5 * (1 + math.erf((pa - pb) / se / math.sqrt(2)))
    if se == 0 and pa != pb:
        p_up = 1.0 if pa > pb else 0.0
    return _Effect("SLO attainment", pb, pa, p_up, pa - pb if pb else _rel(pb, pa), True)


# ---- the verdict ----------------------------------------------------------------------------------------------

def _traffic(p: LoadProfile) -> tuple[float, str]:
    if p.finished is not None:
        return p.finished, "requests finished"
    return p.generated_tokens or 0.0, "tokens generated (the server counts no requests)"


def judge(before: LoadProfile | None, after: LoadProfile | None, *, min_requests: int) -> Verdict:
    """The verdict on a change, from the window before it and the window after it."""
    bs = before.summary() if before else {}
    as_ = after.summary() if after else {}

    def v(outcome: str, reason: str, confidence: float, test: str) -> Verdict:
        return Verdict(outcome, reason, confidence, test, bs, as_)

    if before is None or after is None:
        side = "before" if before is None else "after"
        return v("inconclusive", f"too little traffic to judge: fewer than two scrapes {side} the change", 0.0,
                 "none")
    for side, p in (("before", before), ("after", after)):
        n, unit = _traffic(p)
        if n < min_requests:
            return v("inconclusive", f"too little traffic to judge: {n:.0f} {unit} {side} the change "
                     f"(min_requests {min_requests})", 0.0, "none")
        if p.samples < MIN_SCRAPES:
            return v("inconclusive", f"too few scrapes to judge: {p.samples} {side} the change (at least "
                     f"{MIN_SCRAPES}; scrapes were late or failed)", 0.0, "none")

    cap = _capacity(before, after)
    load = _load_text(before, after)
    if before.saturated:
        good = _goodput(before, after)
        effects = [cap] + ([good] if good else [])
        worse = [e for e in effects if e.worse]
        better = [e for e in effects if e.better]
        test = "capacity: bootstrap over busy scrape intervals"
        detail = "; ".join(e.text() for e in effects)
        if after.saturated:
            if better and not worse:
                return v("kept", f"capacity rose (both windows saturated): {detail}", cap.confidence, test)
            if worse and not better:
                return v("rolled_back", f"capacity fell (both windows saturated): {detail}", cap.confidence, test)
            return v("inconclusive", f"capacity did not change beyond the noise (both windows saturated): {detail}",
                     max((e.confidence for e in effects), default=0.5), test)
        served_now = after.served or 0.0
        capacity_before = before.capacity or 0.0
        if cap.better or (not cap.worse and served_now >= capacity_before * (1 - MIN_EFFECT)):
            return v("kept", f"the queue is gone and it serves at least as much: {detail}; queued share "
                     f"{_pct(before.queued_share)} -> {_pct(after.queued_share)}", cap.confidence, test)
        return v("inconclusive", f"the queue is gone but the load fell, so the new capacity is unknown: {detail}; "
                 f"{load}", cap.confidence, test)

    if after.saturated:
        offered_before, served_after = before.offered, after.capacity
        ratio = _load_ratio(before, after)
        if offered_before and served_after is not None and served_after < offered_before * (1 - MIN_EFFECT) and \
                (ratio is None or ratio <= LOAD_MATCH):
            return v("rolled_back", f"a queue appeared and the server now sustains {served_after:.3f} "
                     f"{before.unit}, less than the {offered_before:.3f} the "
                     f"old flags served without one; {load}", cap.confidence,
                     "capacity after vs offered load before")
        return v("inconclusive", f"a queue appeared, but the offered load rose too; {load}; {cap.text()}",
                 cap.confidence, "offered load")

    effects = [e for e in [_attainment(before, after), *_latencies(before, after)] if e is not None]
    test = "latency: Mann-Whitney U over histogram buckets; attainment: two-proportion z-test"
    if not effects:
        return v("inconclusive", f"below capacity on both sides and no latency to compare; {load}", 0.5, test)
    worse = [e for e in effects if e.worse]
    better = [e for e in effects if e.better]
    detail = "; ".join(e.text() for e in effects)
    ratio = _load_ratio(before, after)
    matched = ratio is None or 1 / LOAD_MATCH <= ratio <= LOAD_MATCH
    best = max(e.confidence for e in effects)
    if worse and (matched or (ratio is not None and ratio < 1)):
        return v("rolled_back", f"worse below capacity{'' if matched else ' under less load'}: "
                 + "; ".join(e.text() for e in worse) + f"; {load}", max(e.confidence for e in worse), test)
    if better and not worse and (matched or (ratio is not None and ratio > 1)):
        return v("kept", f"better below capacity{'' if matched else ' under more load'}: "
                 + "; ".join(e.text() for e in better) + f"; {load}", max(e.confidence for e in better), test)
    if not matched:
        return v("inconclusive", f"the offered load differed too much to compare latencies: {load}; {detail}", best,
                 test)
    return v("inconclusive", f"no difference beyond the noise at matched load: {detail}; {load}", best, test)


def _load_ratio(b: LoadProfile, a: LoadProfile) -> float | None:
    return a.offered / b.offered if b.offered and a.offered is not None else None


def _load_text(b: LoadProfile, a: LoadProfile) -> str:
    return f"{'offered load' if b.counts_requests else 'generated'} {_num(b.offered)} -> {_num(a.offered)} {b.unit}"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"
