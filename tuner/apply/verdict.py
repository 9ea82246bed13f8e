"""Keep, roll back, or say "inconclusive": the window after a change against the window before it. Pure.

**The SLO first.** Where the target has an SLO (budgets at P99 and an objective, the share of requests that must meet
them) and both windows measured its attainment, the SLO is the first question, in every branch:

* the before window met the objective, the after window breaches it beyond the binomial noise of the two windows'
  request counts (its 95% Wilson interval lies wholly below the objective, and a two-proportion z-test is CONFIDENT
  that attainment fell), and the offered load did not rise beyond LOAD_MATCH -> **rolled_back**, whether the windows
  are below capacity, saturated, or a queue appeared;
* the before window breached the objective (beyond the noise, as above), the after window meets it, and the offered
  load did not fall beyond LOAD_MATCH -> **kept**.

Otherwise (no SLO, or its status did not flip) capacity and latency decide, comparing like with like
(tuner/signals/load.py says how each window is read); for a target with an SLO they are the second signal:

* **Before saturated** (requests waited for the server): what it served was its capacity, so capacity is the
  KPI and more is better. Capacity is finished requests/s over the busy scrape intervals (llama-server:
  generated tokens/s), with SLO goodput (requests/s within every budget) beside it, and where the SLO is per
  token (an ITL budget) SLO token goodput too (generated tokens/s x attainment).
  - after saturated too: capacity up -> kept, down -> rolled_back;
  - after no longer saturated: the queue is gone, and the new capacity is at least what it served. Served as
    much as before or more -> kept; less -> inconclusive (the load fell, so the new capacity is unknown).
* **Before below capacity, after saturated**: a queue appeared. If the after window sustained less than the before
  window was offered, the new capacity is below a load the old config handled -> rolled_back. If the offered load
  rose beyond LOAD_MATCH, the queue may be the load's doing -> inconclusive. At matched load the latency tests below
  decide (a queue that costs latency -> rolled_back), else inconclusive.
* **Both below capacity**: SLO attainment and the latency distributions (TTFT, E2E; llama-server: seconds per
  generated token) at matched offered load. If the loads differ by more than LOAD_MATCH, a verdict is given only
  where it holds whatever the load did: worse under less load -> rolled_back, better under more load -> kept;
  otherwise inconclusive, saying by how much the load differed.

**Reasons are made of facts.** Every clause of a reason ("the offered load rose", "a queue appeared", "capacity
fell", "the SLO broke") is a ``Clause`` built by one function from the numbers it cites, and carries them: its word
agrees with its numbers by construction (tests/apply/test_verdict.py holds that over generated profiles).

Every difference must be beyond the noise before it decides anything. Capacity: a bootstrap over the windows'
scrape intervals (BOOTSTRAP replicates, seeded, so the same data gives the same verdict), giving the probability
that after > before. Latency: a Mann-Whitney rank test over the histogram's buckets (ties within a bucket). An
effect counts when that probability reaches CONFIDENT and the change is at least MIN_EFFECT (capacity) or
LATENCY_EFFECT (the median): both floors are the noise of a restart of the same config, measured. A latency shift
must also be at least LATENCY_SLO_SHARE of its SLO budget, where one is set: smaller ones change nothing the SLO
measures. No data judges nothing: too little traffic (fewer than ``min_requests`` finished on either side;
llama-server: tokens) is inconclusive, never a failure, and so is a window of fewer than MIN_SCRAPES scrapes (a
daemon starved by a loaded machine, or scrapes that timed out): a bootstrap over two or three intervals is sure of
what it cannot know. What an apply does when observation ends inconclusive is the target's
``apply.on_inconclusive`` (keep | rollback). No KPI here falls by construction when concurrency rises: per-request
throughput is not one. A change that improved every KPI it could be judged on is never rolled back.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.signals.load import Interval, LoadProfile
from tuner.store.journal import ApplyOutcome

__all__ = [
    "Verdict",
    "Clause",
    "SloCheck",
    "SloSide",
    "judge",
    "slo_check",
    "slo_line",
    "wilson",
    "load_clause",
    "queue_clause",
    "effect_clause",
    "slo_clause",
    "MIN_SCRAPES",
    "CONFIDENT",
    "MIN_EFFECT",
    "LATENCY_EFFECT",
    "LATENCY_SLO_SHARE",
    "LOAD_MATCH",
    "LOAD_HELD",
    "BOOTSTRAP",
]

CONFIDENT = 0.95
# Noise floors, measured: the same vLLM config restarted under the same load on a 2-core host served 11% less and
# its median E2E rose 28% (tests/fixtures/verdict/same_restart). Smaller differences are not the flags' doing.
MIN_EFFECT = 0.15  # relative capacity change that matters
LATENCY_EFFECT = 0.25  # relative change of the median (P50) that matters, besides the rank test
# A latency shift smaller than this share of its SLO budget changes nothing the SLO measures (a TTFT median
# moving 12 -> 18 ms under a 2 s budget is significant to a rank test over 150 requests, and irrelevant).
LATENCY_SLO_SHARE = 0.05
LOAD_MATCH = 1.25  # offered loads within this ratio are "matched"
LOAD_HELD = 0.05  # a load that moved less than this share "held" (in words; LOAD_MATCH decides)
Z95 = 1.959964  # the 95% interval of an attainment (Wilson)
BOOTSTRAP = 2000
# Fewer scrapes than this in a window judge nothing: a clean-clone demo run kept a change on 3 scrapes after it (its
# daemon stalled 10-15 s under the demo's load) whose capacity had in fact fallen 12%. The apply observes on.
MIN_SCRAPES = 6
_SEED = 20261122


@dataclass(frozen=True)
class Clause:
    """One fact of a reason, with the numbers it is made of: ``word`` is read off them, never chosen apart.

    kind: load | queue | capacity | goodput | attainment | latency | slo | traffic; word: rose | fell | held
    (load, capacity, latency...), appeared | gone | stayed | none (queue), broke | cured | met | breached | unsure
    (slo)."""

    kind: str
    word: str
    text: str
    before: float | None = None
    after: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "word": self.word, "text": self.text, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class SloSide:
    attainment: float  # at least (a budget inside a histogram bucket counts that bucket as missed)
    n: float  # finished requests it is a share of
    lo: float  # 95% Wilson interval: below the least, above the most the buckets allow
    hi: float
    status: str  # met (at least the objective) | breached (hi below the objective) | unsure (within the noise)
    attainment_hi: float | None = None  # at most (the bucket a budget falls in counted as met); None: the same

    @property
    def most(self) -> float:
        return self.attainment if self.attainment_hi is None else self.attainment_hi

    def as_json(self) -> dict[str, Any]:
        return {
            "attainment": round(self.attainment, 4),
            "attainment_at_most": round(self.most, 4),
            "n": self.n,
            "interval": [round(self.lo, 4), round(self.hi, 4)],
            "status": self.status,
        }

    def text(self) -> str:
        share = (
            f"{self.attainment:.1%}"
            if self.most - self.attainment < 0.0005
            else f"{self.attainment:.1%}-{self.most:.1%} (bucket resolution)"
        )
        return f"{share} [{self.lo:.1%}, {self.hi:.1%}] of {self.n:.0f}"


@dataclass(frozen=True)
class SloCheck:
    """The SLO line: the objective, and each window's attainment with its interval."""

    objective: float
    budgets: dict[str, float]  # ttft/itl/e2e -> P99 budget, seconds
    before: SloSide
    after: SloSide
    p_worse: float  # P(after's attainment < before's), two-proportion z-test: after's most against before's least
    p_better: float = 0.5  # P(after's > before's): after's least against before's most

    @property
    def broke(self) -> bool:
        return self.before.status == "met" and self.after.status == "breached" and self.p_worse >= CONFIDENT

    @property
    def cured(self) -> bool:
        return self.before.status == "breached" and self.after.status == "met" and self.p_better >= CONFIDENT

    def line(self) -> str:
        budgets = ", ".join(f"{k.upper()} P99 {v:g}s" for k, v in self.budgets.items())

        return (
            f"SLO {self.objective:.4g} of requests within {budgets or 'its budgets'}: before "
            f"{self.before.text()} ({self.before.status}), after {self.after.text()} ({self.after.status}) (95% "
            "Wilson intervals)"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "budgets": self.budgets,
            "before": self.before.as_json(),
            "after": self.after.as_json(),
            "p_worse": round(self.p_worse, 4),
            "p_better": round(self.p_better, 4),
            "broke": self.broke,
            "cured": self.cured,
            "line": self.line(),
        }


@dataclass(frozen=True)
class Verdict:
    outcome: ApplyOutcome  # kept | rolled_back | inconclusive
    reason: str
    confidence: float  # probability that the deciding KPI moved as the outcome says (inconclusive: the best found)
    test: str  # the method that decided
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    clauses: tuple[Clause, ...] = ()  # the facts the reason is made of, deciding ones first
    slo: SloCheck | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "reason": self.reason,
            "confidence": round(self.confidence, 4),
            "test": self.test,
            "slo": self.slo.as_json() if self.slo else None,
            "before": self.before,
            "after": self.after,
            "clauses": [c.as_json() for c in self.clauses],
        }


@dataclass(frozen=True)
class _Bounds:
    """What the buckets alone bound a KPI's two sides to, where its value is an estimate within them."""

    before_lo: float
    before_hi: float
    after_lo: float
    after_hi: float


@dataclass(frozen=True)
class _Effect:
    name: str
    before: float | None
    after: float | None
    p_up: float  # probability that after > before
    rel: float  # after / before - 1
    higher_is_better: bool
    abs_min: float = 0.0  # the smallest absolute change that matters (latency: a share of its SLO budget)
    bounds: _Bounds | None = None  # where a side is known only to a range (SLO attainment at bucket resolution)

    @property
    def _large(self) -> bool:
        return self.before is None or self.after is None or abs(self.after - self.before) >= self.abs_min

    @property
    def rose(self) -> bool:  # rose, beyond the noise
        return self.p_up >= CONFIDENT and self.rel >= self._min and self._large

    @property
    def fell(self) -> bool:  # fell, beyond the noise
        return 1 - self.p_up >= CONFIDENT and self.rel <= -self._min and self._large

    @property
    def better(self) -> bool:
        return self.rose if self.higher_is_better else self.fell

    @property
    def worse(self) -> bool:
        return self.fell if self.higher_is_better else self.rose

    @property
    def _min(self) -> float:
        return MIN_EFFECT if self.higher_is_better else LATENCY_EFFECT

    @property
    def confidence(self) -> float:
        return max(self.p_up, 1 - self.p_up)

    def text(self, unit: str = "") -> str:
        def f(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.3f}{unit}"

        return f"{self.name} {f(self.before)} -> {f(self.after)} ({_change(self.rel)}, P(up) {self.p_up:.2f})"


# ---- the statistics -------------------------------------------------------------------------------------------


def _ratio(intervals: Sequence[Interval], attr: str) -> float:
    secs = math.fsum(iv.seconds for iv in intervals)
    return math.fsum(getattr(iv, attr) for iv in intervals) / secs if secs else 0.0


def bootstrap_p_up(
    before: Sequence[Interval],
    after: Sequence[Interval],
    attr: str,
    *,
    before_scale: float = 1.0,
    after_scale: float = 1.0,
    replicates: int = BOOTSTRAP,
) -> float:
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
    attr, name, bv, av = (
        "finished" if b.counts_requests else "generated",
        f"capacity ({b.unit})",
        b.capacity,
        a.capacity,
    )
    p = bootstrap_p_up([iv for iv in b.intervals if iv.busy], [iv for iv in a.intervals if iv.busy], attr)
    return _Effect(name, bv, av, p, _rel(bv, av), True)


def _within_slo(name: str, b: LoadProfile, a: LoadProfile, attr: str, b_rate: float, a_rate: float) -> _Effect:
    """A rate times each side's SLO attainment (goodput), rose or fell beyond the noise by the bootstrap over busy
    intervals. Where a budget falls inside a bucket, the histograms bound an attainment only to [slo_attainment,
    slo_attainment_hi]; the change is judged on ``slo_attainment_est`` (the observations spread evenly within the
    bucket, as histogram_quantile takes them), and the ranges are said beside it. (The lower bound alone once read
    the demo's after-window, all of whose requests had a TTFT between 1 and 2.5 s against a 2 s budget, as 0% within
    the SLO: goodput "fell 0.272 -> 0.000 (-100%)", and the verdict was inconclusive beside a capacity up 76%.)"""
    busy_b, busy_a = [iv for iv in b.intervals if iv.busy], [iv for iv in a.intervals if iv.busy]

    def at(p: LoadProfile) -> tuple[float, float, float]:  # (at least, the estimate, at most): profile() orders them
        lo = p.slo_attainment or 0.0
        est, hi = p.slo_attainment_est, p.slo_attainment_hi
        return lo, lo if est is None else est, lo if hi is None else hi

    (b_lo, b_est, b_hi), (a_lo, a_est, a_hi) = at(b), at(a)
    p = bootstrap_p_up(busy_b, busy_a, attr, before_scale=b_est, after_scale=a_est)
    bounds = None
    if b_hi > b_lo or a_hi > a_lo:
        bounds = _Bounds(b_rate * b_lo, b_rate * b_hi, a_rate * a_lo, a_rate * a_hi)
    return _Effect(name, b_rate * b_est, a_rate * a_est, p, _rel(b_rate * b_est, a_rate * a_est), True, bounds=bounds)


def _goodput(b: LoadProfile, a: LoadProfile) -> _Effect | None:
    if b.served_rps is None or a.served_rps is None or b.slo_attainment is None or a.slo_attainment is None:
        return None
    return _within_slo("SLO goodput (req/s)", b, a, "finished", b.served_rps, a.served_rps)


def _token_goodput(b: LoadProfile, a: LoadProfile) -> _Effect | None:
    """Generated tokens/s of requests within the SLO, where the SLO is per token (an ITL budget): the capacity
    branch's KPI beside request goodput, as ``_goodput`` (each side's tokens over its busy intervals, times its
    attainment)."""
    if (
        "itl" not in (b.slo_budgets or a.slo_budgets)
        or b.tokens_per_s is None
        or a.tokens_per_s is None
        or b.slo_attainment is None
        or a.slo_attainment is None
    ):
        return None
    return _within_slo("SLO token goodput (tokens/s)", b, a, "generated", b.tokens_per_s, a.tokens_per_s)


def _latencies(b: LoadProfile, a: LoadProfile) -> list[_Effect]:
    out = []
    for key, label in (("ttft", "P50 TTFT (s)"), ("e2e", "P50 E2E (s)")):
        hb, ha = b.hists.get(key), a.hists.get(key)
        if hb is None or ha is None or hb[0] != ha[0] or not hb[1][-1] or not ha[1][-1]:
            continue
        # the effect size is the median's shift (robust); the P99s are shown beside it
        vb, va = getattr(b, f"{key}_p50"), getattr(a, f"{key}_p50")
        budget = b.slo_budgets.get(key) or a.slo_budgets.get(key)
        out.append(
            _Effect(
                label,
                vb,
                va,
                rank_p_up(hb[0], hb[1], ha[1]),
                _rel(vb, va),
                False,
                abs_min=LATENCY_SLO_SHARE * budget if budget else 0.0,
            )
        )
    if b.seconds_per_token is not None and a.seconds_per_token is not None:
        # llama-server: mean decode seconds per token, resampled as generated tokens per busy second
        p_faster = bootstrap_p_up(
            [iv for iv in b.intervals if iv.busy], [iv for iv in a.intervals if iv.busy], "generated"
        )
        out.append(
            _Effect(
                "seconds per generated token",
                b.seconds_per_token,
                a.seconds_per_token,
                1 - p_faster,
                _rel(b.seconds_per_token, a.seconds_per_token),
                False,
            )
        )
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


# ---- the SLO line ---------------------------------------------------------------------------------------------


def wilson(p: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a share ``p`` of ``n`` trials."""
    if n <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, p))
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _slo_side(attainment: float, n: float, objective: float, most: float | None = None) -> SloSide:
    top = attainment if most is None else max(attainment, most)
    lo, hi = wilson(attainment, n)[0], wilson(top, n)[1]
    status = "met" if attainment >= objective else "breached" if hi < objective else "unsure"
    return SloSide(attainment, n, lo, hi, status, None if most is None else top)


def _p_up(pb: float, nb: float, pa: float, na: float) -> float:
    """P(a share of na above a share of nb), a two-proportion z-test."""
    if nb < 1 or na < 1:
        return 0.5
    pooled = (pb * nb + pa * na) / (nb + na)
    se = math.sqrt(pooled * (1 - pooled) * (1 / nb + 1 / na))
    if se == 0:
        return 1.0 if pa > pb else 0.0 if pa < pb else 0.5
    return 0.5 * (1 + math.erf((pa - pb) / se / math.sqrt(2)))


def _check(objective: float, budgets: dict[str, float], b: SloSide, a: SloSide) -> SloCheck:
    # fell: after's most against before's least; rose: after's least against before's most (the buckets' doubt
    # counts against the change either way)
    return SloCheck(
        objective, budgets, b, a, 1 - _p_up(b.attainment, b.n, a.most, a.n), _p_up(b.most, b.n, a.attainment, a.n)
    )


def slo_check(b: LoadProfile, a: LoadProfile) -> SloCheck | None:
    """Each window's SLO attainment against the objective; None without an SLO or an attainment on both sides."""
    objective = b.slo_objective if b.slo_objective is not None else a.slo_objective
    if objective is None or b.slo_attainment is None or a.slo_attainment is None or not b.finished or not a.finished:
        return None
    return _check(
        objective,
        dict(b.slo_budgets or a.slo_budgets),
        _slo_side(b.slo_attainment, b.finished, objective, b.slo_attainment_hi),
        _slo_side(a.slo_attainment, a.finished, objective, a.slo_attainment_hi),
    )


def slo_line(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """The SLO line from two windows' summaries (LoadProfile.summary(), as the journal keeps them); None without an
    SLO on record."""
    objective = before.get("slo_objective") or after.get("slo_objective")
    if not isinstance(objective, (int, float)):
        return None
    budgets = before.get("slo_budgets") or after.get("slo_budgets") or {}

    def side(k: dict[str, Any]) -> SloSide | None:
        p, n, most = k.get("slo_attainment"), k.get("finished"), k.get("slo_attainment_hi")
        if not isinstance(p, (int, float)) or not isinstance(n, (int, float)) or n <= 0:
            return None
        return _slo_side(float(p), float(n), float(objective), float(most) if isinstance(most, (int, float)) else None)

    sb, sa = side(before), side(after)
    if sb is None or sa is None:
        have = sb or sa
        which = "before" if sb else "after" if sa else None
        return (
            f"SLO {objective:.4g} of requests within their budgets: attainment measured "
            f"{'on neither side' if which is None else 'only ' + which + f' ({have.attainment:.1%})'}"  # type: ignore[union-attr]
        )
    return _check(float(objective), dict(budgets), sb, sa).line()


# ---- the clauses: one function each, the word read off the numbers the clause cites ---------------------------


def load_clause(b: LoadProfile, a: LoadProfile) -> Clause:
    """The offered load before and after (llama-server: generated tokens/s stand in for it)."""
    bv, av = b.offered, a.offered
    what = "offered load" if b.counts_requests else "generated load"
    if bv is None or av is None:
        return Clause("load", "unknown", f"the {what} is not known ({_num(bv)} -> {_num(av)} {b.unit})", bv, av)
    if bv <= 0:
        word = "rose" if av > 0 else "held"
        return Clause("load", word, f"the {what} {word}: {bv:.3f} -> {av:.3f} {b.unit}", bv, av)
    ratio = av / bv
    word = "rose" if ratio > 1 + LOAD_HELD else "fell" if ratio < 1 - LOAD_HELD else "held"
    same = 1 / LOAD_MATCH <= ratio <= LOAD_MATCH
    return Clause(
        "load",
        word,
        f"the {what} {word}: {bv:.3f} -> {av:.3f} {b.unit} ({ratio - 1:+.0%}, "
        f"{'within' if same else 'beyond'} the {LOAD_MATCH:g}x that counts as the same load)",
        bv,
        av,
    )


def queue_clause(b: LoadProfile, a: LoadProfile) -> Clause:
    """Whether requests waited for the server, before and after (signals/load.py's ``saturated``)."""
    bv, av = b.queue_time_share, a.queue_time_share
    if bv is None or av is None:
        bv, av = b.waiting_share, a.waiting_share
        shares = f"samples with requests waiting {_pct(bv)} -> {_pct(av)}"
    else:
        shares = (
            f"time queued {_pct(bv)} -> {_pct(av)} of request time, queued share {_pct(b.queued_share)} -> "
            f"{_pct(a.queued_share)}"
        )
    if not b.saturated and a.saturated:
        return Clause("queue", "appeared", f"a queue appeared ({shares})", bv, av)
    if b.saturated and not a.saturated:
        return Clause("queue", "gone", f"the queue is gone ({shares})", bv, av)
    if b.saturated:
        return Clause("queue", "stayed", f"requests waited on both sides: both windows saturated ({shares})", bv, av)
    return Clause("queue", "none", f"below capacity on both sides ({shares})", bv, av)


def effect_clause(e: _Effect, kind: str) -> Clause:
    """A KPI before and after with its test: rose or fell only beyond the noise, else held."""
    word = "rose" if e.rose else "fell" if e.fell else "held"
    verb = word if word != "held" else "did not change beyond the noise"
    said = f"{_num(e.before)} -> {_num(e.after)} ({_change(e.rel)}, P(up) {e.p_up:.2f}"
    if e.bounds is not None:
        r = e.bounds
        said += (
            f"; the SLO attainment interpolated within its buckets, which alone bound it to {_num(r.before_lo)}-"
            f"{_num(r.before_hi)} -> {_num(r.after_lo)}-{_num(r.after_hi)}"
        )
    return Clause(kind, word, f"{e.name} {verb}: {said})", e.before, e.after)


def slo_clause(c: SloCheck) -> Clause:
    """The SLO's status before and after: broke, cured, or what it was on both sides."""
    b, a = c.before, c.after
    if c.broke:
        word, text = "broke", "the SLO broke"
    elif c.cured:
        word, text = "cured", "the SLO was cured"
    elif b.status == a.status:
        word, text = b.status, f"the SLO {'held' if b.status == 'met' else 'was ' + b.status + ' on both sides'}"
    else:
        word, text = "unsure", "the SLO's status changed within the noise"
    return Clause(
        "slo",
        word,
        f"{text}: attainment {b.text()} -> {a.text()} against its objective "
        f"{c.objective:.4g} (P(fell) {c.p_worse:.2f}, P(rose) {c.p_better:.2f})",
        b.attainment,
        a.attainment,
    )


def _served_clause(b: LoadProfile, a: LoadProfile) -> Clause:
    """After a queue went: what the server serves now against the capacity it sustained with the queue."""
    bv, av = b.capacity or 0.0, a.served or 0.0
    word = "held" if av >= bv * (1 - MIN_EFFECT) else "fell"
    return Clause(
        "served",
        word,
        f"it serves {av:.3f} {b.unit}, {'at least' if word == 'held' else 'less than'} "
        f"{1 - MIN_EFFECT:.0%} of the {bv:.3f} it sustained with a queue",
        bv,
        av,
    )


def _sustained_clause(b: LoadProfile, a: LoadProfile) -> Clause:
    """After a queue appeared: what the server sustains now against the load the old flags served."""
    bv, av = b.offered or 0.0, a.capacity or 0.0
    word = "below" if av < bv * (1 - MIN_EFFECT) else "near"
    return Clause(
        "sustained",
        word,
        f"the server now sustains {av:.3f} {b.unit}, "
        f"{'less than' if word == 'below' else 'within ' + format(MIN_EFFECT, '.0%') + ' of or above'} "
        f"the {bv:.3f} the old flags served without a queue",
        bv,
        av,
    )


def _traffic_clause(side: str, what: str) -> Clause:
    return Clause("traffic", "too_little", what)


# ---- the verdict ----------------------------------------------------------------------------------------------


def _traffic(p: LoadProfile) -> tuple[float, str]:
    if p.finished is not None:
        return p.finished, "requests finished"
    return p.generated_tokens or 0.0, "tokens generated (the server counts no requests)"


_SLO_TEST = "SLO attainment: two-proportion z-test, 95% Wilson intervals"
_CAP_TEST = "capacity: bootstrap over busy scrape intervals"
_LAT_TEST = "latency: Mann-Whitney U over histogram buckets; attainment: two-proportion z-test"


def judge(before: LoadProfile | None, after: LoadProfile | None, *, min_requests: int) -> Verdict:
    """The verdict on a change, from the window before it and the window after it."""
    bs = before.summary() if before else {}
    as_ = after.summary() if after else {}
    slo: SloCheck | None = None

    def v(outcome: ApplyOutcome, clauses: Sequence[Clause], confidence: float, test: str) -> Verdict:
        return Verdict(outcome, "; ".join(c.text for c in clauses), confidence, test, bs, as_, tuple(clauses), slo)

    if before is None or after is None:
        side = "before" if before is None else "after"
        return v(
            ApplyOutcome.INCONCLUSIVE,
            [_traffic_clause(side, f"too little traffic to judge: fewer than two scrapes {side} the change")],
            0.0,
            "none",
        )
    for side, p in (("before", before), ("after", after)):
        n, unit = _traffic(p)
        if n < min_requests:
            return v(
                ApplyOutcome.INCONCLUSIVE,
                [
                    _traffic_clause(
                        side,
                        f"too little traffic to judge: {n:.0f} {unit} {side} the change (min_requests {min_requests})",
                    )
                ],
                0.0,
                "none",
            )
        if p.samples < MIN_SCRAPES:
            return v(
                ApplyOutcome.INCONCLUSIVE,
                [
                    _traffic_clause(
                        side,
                        f"too few scrapes to judge: {p.samples} {side} the change (at least {MIN_SCRAPES}; scrapes were "
                        "late or failed)",
                    )
                ],
                0.0,
                "none",
            )

    cap = _capacity(before, after)
    load, queue = load_clause(before, after), queue_clause(before, after)
    ratio = _load_ratio(before, after)
    not_risen = ratio is None or ratio <= LOAD_MATCH
    not_fallen = ratio is None or ratio >= 1 / LOAD_MATCH
    slo = slo_check(before, after)
    slo_said: list[Clause] = []
    if slo is not None:
        said = slo_clause(slo)
        if slo.broke and not_risen:
            return v(
                ApplyOutcome.ROLLED_BACK, [said, load, queue, effect_clause(cap, "capacity")], slo.p_worse, _SLO_TEST
            )
        if slo.cured and not_fallen:
            return v(ApplyOutcome.KEPT, [said, load, queue, effect_clause(cap, "capacity")], slo.p_better, _SLO_TEST)
        slo_said = [said]  # no flip to decide on: the SLO's status is said after what decided

    # Both windows breaching the SLO while requests queue on both sides: attainment (and so goodput) measures how
    # long the queue has been growing, not the flags (the same flags restarted under the same open-loop load read
    # 11% -> 0% on the server's side while the clients saw 15.6% -> 14.7%): capacity alone judges then.
    queue_sets_slo = (
        slo is not None
        and before.saturated
        and after.saturated
        and slo.before.status == "breached"
        and slo.after.status == "breached"
    )
    out = _second_signal(before, after, cap, load, queue, not_risen, goodput=not queue_sets_slo)
    outcome, clauses, confidence, test = out
    if outcome == ApplyOutcome.ROLLED_BACK and slo is not None and slo.cured:
        # attainment went from breached to met (under a load that fell): never rolled back for it
        outcome, confidence = ApplyOutcome.INCONCLUSIVE, slo.p_better
    return v(outcome, [*clauses, *slo_said], confidence, test)


def _second_signal(
    before: LoadProfile,
    after: LoadProfile,
    cap: _Effect,
    load: Clause,
    queue: Clause,
    not_risen: bool,
    *,
    goodput: bool = True,
) -> tuple[ApplyOutcome, list[Clause], float, str]:
    """Capacity and latency: the judgement without an SLO, the second signal with one. ``goodput``: whether SLO
    goodput is a KPI beside capacity (not where the queue, not the flags, sets the attainment)."""
    if before.saturated:
        good, token_good = (_goodput(before, after), _token_goodput(before, after)) if goodput else (None, None)
        effects = (
            [(cap, "capacity")]
            + ([(good, "goodput")] if good else [])
            + ([(token_good, "goodput")] if token_good else [])
        )
        down = [e for e, _ in effects if e.worse]
        up = [e for e, _ in effects if e.better]
        said = [effect_clause(e, kind) for e, kind in effects]
        if after.saturated:
            # the confidence of what decided (capacity, or a goodput when capacity held)
            if up and not down:
                return ApplyOutcome.KEPT, [*said, queue, load], max(e.confidence for e in up), _CAP_TEST
            if down and not up:
                return ApplyOutcome.ROLLED_BACK, [*said, queue, load], max(e.confidence for e in down), _CAP_TEST
            return (
                ApplyOutcome.INCONCLUSIVE,
                [*said, queue, load],
                max((e.confidence for e, _ in effects), default=0.5),
                _CAP_TEST,
            )
        served = _served_clause(before, after)
        if cap.better or (not cap.worse and served.word == "held"):
            return ApplyOutcome.KEPT, [queue, served, *said, load], cap.confidence, _CAP_TEST
        return ApplyOutcome.INCONCLUSIVE, [queue, served, load, *said], cap.confidence, _CAP_TEST

    if after.saturated:
        sustained = _sustained_clause(before, after)
        if sustained.word == "below" and not_risen:
            return (
                ApplyOutcome.ROLLED_BACK,
                [queue, sustained, load, effect_clause(cap, "capacity")],
                cap.confidence,
                "capacity after vs offered load before",
            )
        if not not_risen:
            return (
                ApplyOutcome.INCONCLUSIVE,
                [queue, load, sustained, effect_clause(cap, "capacity")],
                cap.confidence,
                "offered load",
            )
        lat = [e for e in _latencies(before, after)]
        worse_lat = [e for e in lat if e.worse]
        if worse_lat:
            return (
                ApplyOutcome.ROLLED_BACK,
                [queue, *(effect_clause(e, "latency") for e in worse_lat), load, sustained],
                max(e.confidence for e in worse_lat),
                _LAT_TEST,
            )
        return (
            ApplyOutcome.INCONCLUSIVE,
            [queue, sustained, load, *(effect_clause(e, "latency") for e in lat)],
            max((e.confidence for e in lat), default=cap.confidence),
            _LAT_TEST,
        )

    kinds = [(e, "attainment") for e in [_attainment(before, after)] if e is not None] + [
        (e, "latency") for e in _latencies(before, after)
    ]
    if not kinds:
        return ApplyOutcome.INCONCLUSIVE, [queue, load], 0.5, _LAT_TEST
    worse_k = [(e, k) for e, k in kinds if e.worse]
    better_k = [(e, k) for e, k in kinds if e.better]
    ratio = _load_ratio(before, after)
    matched = ratio is None or 1 / LOAD_MATCH <= ratio <= LOAD_MATCH
    best = max(e.confidence for e, _ in kinds)
    said = [effect_clause(e, k) for e, k in kinds]
    if worse_k and (matched or (ratio is not None and ratio < 1)):
        return (
            ApplyOutcome.ROLLED_BACK,
            [*(effect_clause(e, k) for e, k in worse_k), queue, load],
            max(e.confidence for e, _ in worse_k),
            _LAT_TEST,
        )
    if better_k and not worse_k and (matched or (ratio is not None and ratio > 1)):
        return (
            ApplyOutcome.KEPT,
            [*(effect_clause(e, k) for e, k in better_k), queue, load],
            max(e.confidence for e, _ in better_k),
            _LAT_TEST,
        )
    return ApplyOutcome.INCONCLUSIVE, [queue, load, *said], best, _LAT_TEST


def _load_ratio(b: LoadProfile, a: LoadProfile) -> float | None:
    return a.offered / b.offered if b.offered and a.offered is not None else None


def _change(rel: float) -> str:
    """A relative change as a person reads it: "+72%", and "up from 0" where the before was 0 (no "+inf%")."""
    return f"{rel:+.0%}" if math.isfinite(rel) else "up from 0"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"
