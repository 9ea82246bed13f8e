"""Score capacity estimators after the fact on the runs a bench/tune_spread.py store kept (no new measurement).

`tuner tune` reports a config's capacity as the highest rate that met the objective (the lower end of the bracket
its search ended on). Two estimators that use every run of a search instead:

  logistic   a binomial fit of each run's requests within the SLO against its rate (logit p = a - b * rate),
             solved where p reaches the objective
  isotonic   attainment made non-increasing in rate (pool adjacent violators, weighted by requests), the
             objective's crossing interpolated between the two pooled points around it
  crossing   isotonic at one speed: each run's rate first scaled to the search's own speed (rate x how many times
             slower it stepped than all the search's runs pooled, tuner/tune/speed.py), the crossing interpolated in
             log rate; every point met: the highest rate met
  crossing-as-run  the same without the speed scaling

and one that keeps the bracket's capacity but scales it to one host speed:

  speed      the capacity x the decode step at 8 sequences (tuner/tune/speed.py) of the runs at its rate, over the
             median of that step across every search in the store: the capacity at one speed of the host

For each condition of the bench (its servers ran interleaved: with --conditions off,on the 1st, 3rd, ... search is
"off"), the capacities, their mean and the worst deviation from it, as the bench reports them.

With --pooled, every run of a condition's searches on one line, as a rate and as a load at one host speed (the rate
x the run's own decode step at 8 sequences, over the median step): the band where runs both met and missed (the
lowest rate that missed to the highest that met), as +/- its middle. A search's capacity cannot repeat closer than
that band however it is estimated; the band read at one speed says how much of it the host's speed explains.

  python bench/spread_estimators.py /tmp/tune-spread-XXXX/tuner.db --conditions off,on [--pooled]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.tune import capacity, speed  # noqa: E402

Runs = Sequence[dict[str, Any]]


def searches(db: str) -> list[tuple[float, dict[str, Any]]]:
    """(reported capacity, detail) of every measured trial, in the order they ran."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        rows = c.execute("select status, capacity_rps, detail from tune_trials order by id").fetchall()
    return [(cap, json.loads(detail)) for status, cap, detail in rows if status == "measured"]


def logistic(runs: Runs, objective: float) -> float | None:
    """Newton's method on the binomial log-likelihood of logit p = a - b * rate / s (s: the mean rate)."""
    rates = [r["rate_rps"] for r in runs]
    s = sum(rates) / len(rates)
    a = b = 0.0
    for _ in range(100):
        ga = gb = haa = hab = hbb = 0.0
        for r in runs:
            x = r["rate_rps"] / s
            p = 1 / (1 + math.exp(-(a - b * x)))
            resid, w = r["good"] - r["sent"] * p, r["sent"] * p * (1 - p)
            ga, gb = ga + resid, gb - resid * x
            haa, hab, hbb = haa + w, hab - w * x, hbb + w * x * x
        det = haa * hbb - hab * hab
        if det <= 1e-12:
            break
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if abs(da) + abs(db) < 1e-10:
            break
    return s * (a - math.log(objective / (1 - objective))) / b if b > 0 else None


def isotonic(runs: Runs, objective: float) -> float | None:
    """Attainment pooled into a non-increasing step function of rate; the crossing interpolated."""
    pooled: dict[float, list[float]] = {}  # runs at one rate (a repeated step) are one point
    for r in runs:
        point = pooled.setdefault(r["rate_rps"], [0, 0])
        point[0], point[1] = point[0] + r["good"], point[1] + r["sent"]
    blocks: list[list[float]] = []  # [lowest rate, highest rate, good, sent]
    for rate, (good, sent) in sorted(pooled.items()):
        blocks.append([rate, rate, good, sent])
        while len(blocks) > 1 and blocks[-2][2] / blocks[-2][3] < blocks[-1][2] / blocks[-1][3]:
            last = blocks.pop()
            blocks[-1][1], blocks[-1][2], blocks[-1][3] = last[1], blocks[-1][2] + last[2], blocks[-1][3] + last[3]
    xs = [(lo + hi) / 2 for lo, hi, _, _ in blocks]
    ys = [g / n for _, _, g, n in blocks]
    for i in range(len(xs) - 1):
        if ys[i] >= objective > ys[i + 1]:
            return xs[i] + (xs[i + 1] - xs[i]) * (ys[i] - objective) / (ys[i] - ys[i + 1])
    return None


def crossing(runs: Runs, objective: float, *, same_speed: bool = True) -> float:
    """Where attainment crosses ``objective``, from every run of one search (tuner/tune/capacity.py's ``crossing``,
    which `tuner tune` reports as ``crossing_rps``); 0.0 where no run met it. With ``same_speed``, each run's rate is
    first scaled to the speed of all the search's runs pooled: a run that stepped s times slower than that met or
    missed a load s times its rate (a run whose step times share fewer than two concurrencies with the pool keeps
    its rate); runs at one rate stay one point, at the geometric mean of their scaled rates."""
    ref = speed.pooled(r.get("step_s") for r in runs) if same_speed else {}
    points: dict[float, list[float]] = {}  # rate as run: [sum of log scaled rates, runs, good, sent]
    for r in runs:
        if not r.get("sent"):
            continue
        slower = speed.slowdown(ref, r.get("step_s")) if same_speed else None
        point = points.setdefault(r["rate_rps"], [0.0, 0.0, 0.0, 0.0])
        point[0] += math.log(r["rate_rps"] * (slower or 1.0))
        point[1] += 1
        point[2] += r["good"]
        point[3] += r["sent"]
    return capacity.crossing(((math.exp(s / n), good, sent) for s, n, good, sent in points.values()), objective)


ESTIMATORS: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "bracket": lambda d: d["capacity_rps"],
    "logistic": lambda d: logistic(d["runs"], d["objective"]),
    "isotonic": lambda d: isotonic(d["runs"], d["objective"]),
    "crossing": lambda d: crossing(d["runs"], d["objective"]),
    "crossing-as-run": lambda d: crossing(d["runs"], d["objective"], same_speed=False),
}


def step_at_capacity(d: dict[str, Any], concurrency: int = 8) -> float | None:
    """The median decode step at ``concurrency`` of the runs at the search's capacity rate (None: they do not say)."""
    steps = [
        (r.get("step_s") or {}).get(str(concurrency))
        for r in d["runs"]
        if d.get("lo_rps") and math.isclose(r["rate_rps"], d["lo_rps"])
    ]
    steps = [s for s in steps if isinstance(s, (int, float))]
    return sorted(steps)[len(steps) // 2] if steps else None


def at_speed(d: dict[str, Any], ref: float | None) -> float | None:
    """The search's capacity at the step time ``ref`` (a server that stepped slower would have served more)."""
    s = step_at_capacity(d)
    return d["capacity_rps"] * s / ref if ref and s is not None else None


def band(points: Sequence[tuple[float, bool]]) -> tuple[float, float] | None:
    """(lowest load that missed, highest that met) where the two overlap; None where every miss lies above every
    met run (a clean threshold)."""
    missed = [x for x, met in points if not met]
    met = [x for x, ok in points if ok]
    if not missed or not met or min(missed) >= max(met):
        return None
    return min(missed), max(met)


def pooled(trials: list[tuple[float, dict[str, Any]]], ref: float, label: str) -> None:
    """Print the band of met and missed runs of these searches, in req/s and at the step ``ref``."""
    raw, scaled = [], []
    for _, d in trials:
        for r in d["runs"]:
            met = r["good"] / r["sent"] >= d["objective"]
            raw.append((r["rate_rps"], met))
            s = (r.get("step_s") or {}).get("8")
            if isinstance(s, (int, float)):
                scaled.append((r["rate_rps"] * s / ref, met))
    for name, points in (("as run", raw), ("at one speed", scaled)):
        b = band(points)
        if b is None:
            print(f"  {label} {name:12} {len(points)} runs: no overlap (one threshold)")
            continue
        mid = (b[0] + b[1]) / 2
        inside = sum(1 for x, _ in points if b[0] <= x <= b[1])
        print(
            f"  {label} {name:12} {len(points)} runs: met and missed between {b[0]:.2f} and {b[1]:.2f} req/s "
            f"(±{(b[1] - b[0]) / 2 / mid:.0%} of {mid:.2f}; {inside} runs inside)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", nargs="+", help="a bench/tune_spread.py workdir's tuner.db")
    ap.add_argument("--conditions", default="all", help="the bench's conditions in the order they interleaved")
    ap.add_argument("--pooled", action="store_true", help="also the band of met and missed runs, per condition")
    args = ap.parse_args()
    conditions = args.conditions.split(",")
    for db in args.db:
        trials = searches(db)
        known = sorted(s for _, d in trials if (s := step_at_capacity(d)) is not None)
        ref = known[len(known) // 2] if known else None
        scaled = {"speed": lambda d, ref=ref: at_speed(d, ref)}
        for name, estimate in {**ESTIMATORS, **scaled}.items():
            for i, cond in enumerate(conditions):
                got = [estimate(d) for _, d in trials[i :: len(conditions)]]
                vals = [v for v in got if v is not None and v > 0]
                if not vals:
                    continue
                m = sum(vals) / len(vals)
                worst = max(abs(v / m - 1) for v in vals)
                print(
                    f"{db} {name:9} {cond:4} {' '.join(f'{v:5.2f}' for v in vals)}  mean {m:.2f} "
                    f"worst ±{worst:.0%}"
                    + (f" ({len(got) - len(vals)} without a crossing)" if len(vals) < len(got) else "")
                )
        if args.pooled and ref:
            steps = sorted(
                s for _, d in trials for r in d["runs"] if isinstance(s := (r.get("step_s") or {}).get("8"), float)
            )
            at = steps[len(steps) // 2]
            print(f"{db} pooled (one speed: a decode step of {at * 1000:.2f} ms at 8 sequences, the runs' median)")
            for i, cond in enumerate(conditions):
                pooled(trials[i :: len(conditions)], at, cond)
            if len(conditions) > 1:
                pooled(trials, at, "all")


if __name__ == "__main__":
    main()
