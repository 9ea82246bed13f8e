"""Capacity of one config: the highest request rate whose SLO attainment reaches the objective. Pure.

A bracketing search over the rate, never a linear step-down: from a start rate (the workload's, or the best
capacity found so far) it doubles while runs pass (or jumps to half the rate the server's slots could serve
unqueued, when that is further: ``slots``) and halves while they fail, until one rate passes and one fails
(or the floor/ceiling is reached), then bisects geometrically (sqrt(lo x hi)) until hi / lo <= 1 + tolerance or the
run budget is spent. Capacity is the highest rate that passed. A failing run that completed far fewer requests a
second than it was sent (its ``throughput_rps``) fell behind the server's service rate: halving goes at least that
low, and the bisection probes just below it once before it takes midpoints; while lo lies below what that run
completed, a midpoint is taken between lo and (a margin above) what it completed rather than hi. Once a rate at or
above that met, the overrun's completions bound nothing (a queue of hundreds drains slower than the server serves),
and the midpoints are lo and hi's again.

Every rate tried lies on one ladder, 2^(k/m) req/s for whole k, its steps 2^(1/m) no wider than 1 + tolerance
(m = 5 for 0.15, 8 for 0.1): the start, each doubling, halving and midpoint is the nearest rung (the floor and
ceiling excepted). Two searches of the same flags then try the same rates wherever they start, and two servers that
meet and miss the same rates read the same capacity; off a ladder, each search's rates followed from its start
(the best capacity so far), and two servers with the same threshold read up to one tolerance apart.

Noise: a run's attainment is a share of n requests, with a binomial standard error sqrt(p (1 - p) / n) if its
requests met or missed independently; requests that arrive together queue together, so where the run says
(``attainment_se``, by batch means: tuner/tune/bench.py) the larger of the two is taken. A run whose attainment lies
within ``z`` standard errors of the objective is too close to call: the same rate runs again (once) and the two
runs pool their requests. Attainment is assumed to fall as the rate rises; a pass above a
failure (noise) is recorded in ``nonmonotone`` and the bracket keeps its invariant (lo passed, hi failed).

Speed: a run met or missed at the speed the host gave the server then, and on a shared host that moves (five fresh
servers stepped 6.5-9.9 ms at eight sequences on the same run: tuner/tune/speed.py). Where the runs say how fast
the server stepped (``step_s``), the search records how far that moved (``speed_spread``), and where it stepped more
than ``tolerance`` slower at the rate it missed than at the one it met, the missed rate at the met one's speed
(``hi_same_speed_rps``: hi x the slowdown): the capacity's interval reaches that far, since the miss may be the host's.

Crossing: the capacity is the highest rate that met, a rung of the ladder, so two servers whose thresholds lie a hair
apart read a whole rung (up to ``tolerance``) apart, and one unlucky run moves it a rung more. ``crossing_rps`` reads
every run of the search instead: attainment made non-increasing in rate (runs pooled where a higher rate met more
than a lower one), and the rate where it crosses the objective interpolated (in log rate) between the two pooled
points around it. On a held-back bursty shape (bench/results/2026-12-01-1826-tune-spread.md) five fresh servers'
crossings lay within ±8% of their mean on an idle host and ±7% beside a neighbour, their bracket capacities ±18% and
±14%; on a second (2026-12-02-0044), where attainment fell from 100% to 16-70% within one rung, ±11% and ±15%, no
nearer than the bracket: a cliff inside a rung is where no run was. It is reported beside the capacity; the ranking
and the intervals stay the bracket's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tuner.tune import speed

__all__ = ["Capacity", "Measured", "Ladder", "crossing", "find_capacity", "rate_floor", "read_speed", "LONGEST_RUN"]

LONGEST_RUN = 8  # a run at the floor rate lasts at most this many times the run length
_MOST_GROWTH = 16  # a passing run's next rate is at most this many times its own (a wrong slots count costs little)


class Measured(Protocol):
    rate_rps: float
    sent: int
    good: int
    attainment: float
    ttft_p99: float | None
    e2e_p99: float | None

    def as_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Ladder:
    """The rates a capacity search may try: 2^(k / rungs) req/s for whole k (rungs a doubling)."""

    rungs: int

    @classmethod
    def for_tolerance(cls, tolerance: float) -> Ladder:
        """The coarsest ladder whose step 2^(1/rungs) is at most 1 + ``tolerance``."""
        return cls(max(1, math.ceil(math.log(2) / math.log1p(tolerance) - 1e-9)))

    def _k(self, rate: float) -> float:
        return self.rungs * math.log2(rate)

    def rate(self, k: int) -> float:
        return float(2.0 ** (k / self.rungs))

    def nearest(self, rate: float) -> float:
        return self.rate(round(self._k(rate)))

    def between(self, lo: float, hi: float, target: float) -> float | None:
        """The rung strictly between ``lo`` and ``hi`` nearest ``target``; None when no rung lies between."""
        first, last = math.floor(self._k(lo) + 1e-9) + 1, math.ceil(self._k(hi) - 1e-9) - 1
        if first > last:
            return None
        return self.rate(min(max(round(self._k(target)), first), last))


@dataclass(frozen=True)
class Step:
    rate_rps: float
    good: int
    sent: int
    attainment: float
    passed: bool
    repeated: bool


@dataclass
class Capacity:
    capacity_rps: float  # 0.0: not even the floor rate met the objective
    lo_rps: float | None  # highest rate that passed
    hi_rps: float | None  # lowest rate that failed (None: the ceiling passed)
    objective: float
    steps: list[Step] = field(default_factory=list)
    runs: list[Any] = field(default_factory=list)  # the Measured runs, in order
    nonmonotone: bool = False
    ttft_p99: float | None = None  # at the capacity rate
    e2e_p99: float | None = None
    # mean requests in flight at the capacity rate (Little's law), if the run says; where no rate met the objective,
    # at the lowest rate tried (the queue a config that served nothing still built: the demand its slots could not hold)
    in_flight: float | None = None
    note: str = ""
    # how much slower the slowest run stepped than the fastest (tuner/tune/speed.py; None: the runs do not say)
    speed_spread: float | None = None
    # hi_rps at the speed of the runs that met lo_rps: where the server stepped s times slower at the rate it missed,
    # hi x s (the capacity at lo's speed lies below that, not below hi); hi itself where it was not slower
    hi_same_speed_rps: float | None = None
    # where attainment crosses the objective, from every run (``crossing``); None: no run
    crossing_rps: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "capacity_rps": self.capacity_rps,
            "lo_rps": self.lo_rps,
            "hi_rps": self.hi_rps,
            "objective": self.objective,
            "nonmonotone": self.nonmonotone,
            "ttft_p99": self.ttft_p99,
            "e2e_p99": self.e2e_p99,
            "in_flight": self.in_flight,
            "note": self.note,
            "speed_spread": self.speed_spread,
            "hi_same_speed_rps": self.hi_same_speed_rps,
            "crossing_rps": self.crossing_rps,
            "steps": [s.__dict__ for s in self.steps],
            "runs": [r.as_json() for r in self.runs],
        }


def _close_call(good: int, sent: int, objective: float, z: float, measured_se: float | None = None) -> bool:
    """Whether good / sent lies within ``z`` standard errors of the objective: the binomial one (at the share or
    the objective, whichever is wider), or ``measured_se`` (the run's own, clumped misses) where that is wider."""
    if sent <= 0:
        return False
    p = good / sent
    se = math.sqrt(max(p * (1 - p), objective * (1 - objective)) / sent)
    if isinstance(measured_se, (int, float)) and math.isfinite(measured_se):
        se = max(se, measured_se)
    return abs(p - objective) < z * se


def find_capacity(
    measure: Callable[[float], Measured],
    objective: float,
    *,
    start_rps: float,
    floor_rps: float = 0.05,
    ceiling_rps: float = 1000.0,
    tolerance: float = 0.15,
    max_runs: int = 8,
    z: float = 1.0,
    slots: int | None = None,
    ladder: Ladder | None = None,
) -> Capacity:
    """Bracket then bisect the rate; ``measure(rate)`` runs the load once. See the module docstring.

    ``slots``: how many requests the server runs at once (max-num-seqs, --parallel), if known. A server with that
    many slots, each request taking the mean E2E latency ``W`` a passing run measured, serves at most slots / W
    requests a second before requests queue (Little's law), and batching only slows each request: so after a
    passing run far below that, the next rate is half of it rather than the double (from 1 req/s, 2 sequences of
    0.1 s requests: 10 req/s next instead of 2; never more than 16 times the rate), and a bracket that would have
    spent its runs doubling from a slow workload's rate ends near the capacity instead of below it.

    ``ladder``: the rates it may try (the module docstring); by default the coarsest whose step is within
    ``tolerance``."""
    if not 0 < objective <= 1:
        raise ValueError(f"objective must be in (0, 1], got {objective}")
    if start_rps <= 0 or floor_rps <= 0 or ceiling_rps < floor_rps:
        raise ValueError(
            f"rates must be positive with floor <= ceiling: start {start_rps}, floor {floor_rps}, ceiling {ceiling_rps}"
        )
    cap = Capacity(0.0, None, None, objective)
    rungs = ladder or Ladder.for_tolerance(tolerance)
    best_at: dict[float, Measured] = {}

    def test(rate: float) -> bool:
        run = measure(rate)
        cap.runs.append(run)
        good, sent, repeated = run.good, run.sent, False
        if _close_call(good, sent, objective, z, getattr(run, "attainment_se", None)) and len(cap.runs) < max_runs:
            again = measure(rate)
            cap.runs.append(again)
            good, sent, repeated = good + again.good, sent + again.sent, True
        passed = sent > 0 and good / sent >= objective
        cap.steps.append(Step(rate, good, sent, good / sent if sent else 0.0, passed, repeated))
        if passed:
            best_at[rate] = run
            if cap.hi_rps is not None and rate >= cap.hi_rps:
                cap.nonmonotone = True
        elif cap.lo_rps is not None and rate <= cap.lo_rps:
            cap.nonmonotone = True
        return passed

    rate = min(max(rungs.nearest(start_rps), floor_rps), ceiling_rps)
    while len(cap.runs) < max_runs:
        if test(rate):
            cap.lo_rps = max(rate, cap.lo_rps or 0.0)
            if cap.hi_rps is not None and cap.hi_rps <= cap.lo_rps:
                cap.hi_rps = None
            if cap.hi_rps is not None or rate >= ceiling_rps:
                break
            grow = max(rate * 2, min(_unqueued(cap.runs[-1], slots) / 2, rate * _MOST_GROWTH))
            rate = min(rungs.nearest(grow), ceiling_rps)
        else:
            cap.hi_rps = rate if cap.hi_rps is None else min(rate, cap.hi_rps)
            if cap.lo_rps is not None or rate <= floor_rps:
                break
            # at least halved; lower where the server completed fewer than that a second (a start far above it)
            rate = max(rungs.nearest(min(rate / 2, _served(cap.runs, rate) / (1 + tolerance))), floor_rps)
    hinted = False
    while (
        cap.lo_rps is not None
        and cap.hi_rps is not None
        and cap.hi_rps / cap.lo_rps > 1 + tolerance
        and len(cap.runs) < max_runs
    ):
        mid = rungs.between(cap.lo_rps, cap.hi_rps, math.sqrt(cap.lo_rps * cap.hi_rps))
        # once: where the run that missed at hi completed far fewer requests a second than it was sent, the capacity
        # lies near what it completed, not in the geometric middle (a 16x jump past it leaves lo-hi 16 wide)
        served = _served(cap.runs, cap.hi_rps)
        near = served * (1 + tolerance) ** 2
        if not hinted and cap.lo_rps * (1 + tolerance) ** 2 <= served <= cap.hi_rps / (1 + tolerance):
            mid, hinted = rungs.between(cap.lo_rps, cap.hi_rps, served / (1 + tolerance)), True
        elif cap.lo_rps < served and cap.lo_rps * (1 + tolerance) < near < cap.hi_rps:
            # after that probe met: the middle of lo and what hi completed (a server overrun that far completes
            # somewhat less than it can serve: hence the margin), not of lo and hi. vLLM's CPU defaults on the held-back
            # drawn-790-1 met 48.5 and missed 338 completing 52 a second: 55.7 next, not 128 (which completed 67.9).
            # Once a rate met at or above what the overrun completed, that run said nothing of the capacity: llama-server
            # drains a queue of hundreds far slower than it serves (its defaults on drawn-8289-3 completed 22 a second
            # at 84.4 and met 64), and the margin above it kept the search one rung a run (18.4, 24.3, 27.9)
            mid = rungs.between(cap.lo_rps, cap.hi_rps, math.sqrt(cap.lo_rps * near))
        if mid is None:
            break  # no rung between them: as narrow as the ladder reads
        if test(mid):
            cap.lo_rps = mid
        else:
            cap.hi_rps = mid
    if cap.lo_rps is not None:
        cap.capacity_rps = cap.lo_rps
        at = best_at.get(cap.lo_rps)
        if at is not None:
            cap.ttft_p99, cap.e2e_p99 = at.ttft_p99, at.e2e_p99
            cap.in_flight = getattr(at, "in_flight", None)
    elif cap.steps:
        # nothing met the objective: the run at the lowest rate tried still says how many requests waited there, the
        # one sign of how many slots the traffic asks for that a config with a capacity of 0 gives the search
        low = min(cap.steps, key=lambda s: s.rate_rps).rate_rps
        at_low = [r for r in cap.runs if getattr(r, "rate_rps", None) == low]
        cap.in_flight = getattr(at_low[0], "in_flight", None) if at_low else None  # its first, as at a passing rate
    read_speed(cap, tolerance)
    if cap.runs:
        cap.crossing_rps = crossing(((r.rate_rps, r.good, r.sent) for r in cap.runs), objective)
    if cap.lo_rps is None:
        cap.note = f"no rate down to {cap.steps[-1].rate_rps:g} req/s met the objective" if cap.steps else "no run"
    elif cap.hi_rps is None:
        cap.note = f"every rate up to {cap.lo_rps:g} req/s met the objective (the run budget or ceiling stopped it)"
    elif cap.hi_rps / cap.lo_rps > 1 + tolerance:
        cap.note = f"bracket {cap.lo_rps:.3g}-{cap.hi_rps:.3g} req/s left wider than {tolerance:.0%} by the run budget"
    else:
        cap.note = f"between {cap.lo_rps:.3g} (met) and {cap.hi_rps:.3g} req/s (missed)"
    same_speed = cap.hi_same_speed_rps
    if cap.hi_rps is not None and same_speed is not None and same_speed > cap.hi_rps:
        cap.note += (
            f"; the server stepped {same_speed / cap.hi_rps - 1:.0%} slower at the rate it missed than at"
            f" the one it met: at the same speed it may meet up to {same_speed:.3g}"
        )
    return cap


def crossing(runs: Iterable[tuple[float, int, int]], objective: float) -> float:
    """Where attainment crosses ``objective``, from every run of one search, each a (rate, requests within the SLO,
    requests sent): runs at one rate are one point; points whose attainment rises with the rate are pooled (pool
    adjacent violators, weighted by requests; a pooled block sits at its points' geometric mean rate) until it
    falls; the crossing is interpolated in log rate between the last block that met and the first that missed. 0.0
    where no run met the objective; the highest block that met where none above it missed."""
    points: dict[float, list[float]] = {}  # rate: [log rates, points, good, sent]
    for rate, good, sent in runs:
        if sent <= 0 or rate <= 0:
            continue
        point = points.setdefault(rate, [math.log(rate), 1.0, 0.0, 0.0])
        point[2] += good
        point[3] += sent
    blocks: list[list[float]] = []  # the same four, in order of rate
    for point in sorted(points.values()):
        blocks.append(list(point))
        while len(blocks) > 1 and blocks[-2][2] / blocks[-2][3] < blocks[-1][2] / blocks[-1][3]:
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last, strict=True)]
    xs = [log_sum / n for log_sum, n, _, _ in blocks]
    ys = [good / sent for _, _, good, sent in blocks]
    met = [x for x, y in zip(xs, ys, strict=True) if y >= objective]
    if not met:
        return 0.0
    for i in range(len(xs) - 1):
        if ys[i] >= objective > ys[i + 1]:
            return math.exp(xs[i] + (xs[i + 1] - xs[i]) * (ys[i] - objective) / (ys[i] - ys[i + 1]))
    return math.exp(max(met))


def read_speed(cap: Capacity, tolerance: float) -> None:
    """Read from the runs' step times (``step_s``, tuner/tune/speed.py) how far the host's speed moved during the
    search, and the missed rate at the speed of the met one. A slowdown within ``tolerance`` is noise of the gauge
    itself and leaves ``hi`` as it is."""
    steps = [getattr(r, "step_s", None) for r in cap.runs]
    cap.speed_spread = speed.spread(steps)
    if cap.lo_rps is None or cap.hi_rps is None:
        return
    at = {
        rate: speed.pooled(s for r, s in zip(cap.runs, steps, strict=True) if r.rate_rps == rate)
        for rate in (cap.lo_rps, cap.hi_rps)
    }
    slower = speed.slowdown(at[cap.lo_rps], at[cap.hi_rps])
    cap.hi_same_speed_rps = cap.hi_rps * (slower if slower is not None and slower > 1 + tolerance else 1.0)


def _served(runs: list[Any], rate: float) -> float:
    """The requests a second the runs at ``rate`` completed (their mean; the run's throughput), or ``math.inf``
    where they do not say. A run that missed because the server could not keep up completed about as many as the
    server serves; one that missed on latency alone completed about what it was sent."""
    done = [
        r.throughput_rps
        for r in runs
        if r.rate_rps == rate and isinstance(getattr(r, "throughput_rps", None), (int, float))
    ]
    done = [t for t in done if math.isfinite(t) and t > 0]
    return sum(done) / len(done) if done else math.inf


def _unqueued(run: Any, slots: int | None) -> float:
    """slots / mean E2E of ``run``: the most requests a second it could have served with none waiting; 0 unknown."""
    w = getattr(run, "mean_e2e_s", None)
    if not slots or slots < 1 or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
        return 0.0
    return slots / w


def rate_floor(min_prompts: int, run_s: float, workload_rps: float | None = None) -> float:
    """The lowest rate a capacity search tries. A run sends at least ``min_prompts`` requests, so at a low rate it
    lasts min_prompts / rate seconds: 30 requests at 0.0625 req/s is 8 minutes. Below the rate at which a run
    would last LONGEST_RUN x ``run_s`` a config counts as serving nothing within the SLO (its capacity is 0,
    "no rate down to the floor met the objective"), unless the workload itself arrives slower than that: then the
    floor is half the workload's rate, whatever a run costs there."""
    if min_prompts < 1 or run_s <= 0:
        raise ValueError(f"min_prompts must be >= 1 and run_s > 0, got {min_prompts}, {run_s}")
    floor = min_prompts / (LONGEST_RUN * run_s)
    if workload_rps is not None and workload_rps > 0:
        floor = min(floor, workload_rps / 2)
    return floor
