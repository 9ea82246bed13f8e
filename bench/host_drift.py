"""Did the host's speed move while `tuner tune` measured the same flags on fresh servers? Read from a
bench/tune_spread.py workdir afterwards, from the benchmark client's own saved results: no server is started.

For every run of every trial: the rate, how many requests met the SLO, and the server's decode step time at each
concurrency (tuner/tune/speed.py `step_times`), as a slowdown against the fastest run of the workdir (`slowdown`:
the median ratio over the concurrencies both saw). Then, per trial, what tuner says now: its capacity, the interval
[met, missed] as the search left it and the missed rate at the speed of the met one (tuner/tune/capacity.py
`read_speed`), and the rate each run's
outcome stands for at the fastest run's speed (its rate x its slowdown): if the host's speed is what separates the
servers, those agree across servers where the raw rates do not.

  python bench/host_drift.py /tmp/ts3 [--level 8] [--tolerance 0.1]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from tuner.store import tuning as tj  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402
from tuner.tune import speed  # noqa: E402
from tuner.tune.capacity import Capacity, read_speed  # noqa: E402


def trials(work: Path) -> list[tuple[dict, list[dict]]]:
    """(the trial's stored detail, its runs with their step times read from the saved client results) for every
    trial of the workdir."""
    engine = open_engine(f"sqlite:///{work / 'tuner.db'}")
    with engine.connect() as c:
        ids = [r[0] for r in c.execute(text("select id from tune_runs order by id"))]
    out = []
    for rid in ids:
        for t in tj.trials(engine, rid):
            runs = []
            for r in t.detail.get("runs", []):
                try:
                    result = json.loads(Path(r["result_file"]).read_text())
                except (OSError, ValueError, KeyError):
                    continue
                runs.append({**r, "steps": speed.step_times(result)})
            if runs:
                out.append((t.detail, runs))
    engine.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--level", type=int, default=8, help="the concurrency whose step time is printed")
    ap.add_argument("--objective", type=float, default=0.95)
    ap.add_argument("--tolerance", type=float, default=0.1, help="the tune's --tolerance")
    args = ap.parse_args()

    found = trials(args.workdir)
    every = [r for _, runs in found for r in runs if r["steps"]]
    # the fastest run: the least slowdown against any one run (medians over different concurrencies would not compare)
    fastest = min(every, key=lambda r: speed.slowdown(every[0]["steps"], r["steps"]) or math.inf)["steps"]
    print(f"workdir {args.workdir}; {len(found)} trials; step times at {args.level} requests decoding, ms")
    rows = []
    for n, (detail, runs) in enumerate(found, 1):
        for r in runs:
            r["slowdown"] = speed.slowdown(fastest, r["steps"]) or math.nan
        # what tuner says of the same runs now: the bracket as the search left it, read with the runs' speeds
        cap = Capacity(
            detail.get("capacity_rps") or 0.0,
            detail.get("lo_rps"),
            detail.get("hi_rps"),
            args.objective,
            runs=[SimpleNamespace(rate_rps=r["rate_rps"], step_s=r["steps"]) for r in runs],
        )
        read_speed(cap, args.tolerance)
        for r in runs:
            at = r["steps"].get(args.level)
            print(
                f"  server {n}: {r['rate_rps']:6.2f} req/s  {r['good']:3d}/{r['sent']:3d} "
                f"({r['good'] / r['sent']:6.1%})  step {'-' if at is None else format(at * 1000, '.2f')} ms  "
                f"slowdown {r['slowdown']:.2f}  -> {r['rate_rps'] * r['slowdown']:5.2f} at the fastest speed"
            )
        met = [r["rate_rps"] * r["slowdown"] for r in runs if r["good"] / r["sent"] >= args.objective]
        missed = [r["rate_rps"] * r["slowdown"] for r in runs if r["good"] / r["sent"] < args.objective]
        row = {
            "server": n,
            "capacity_rps": round(cap.capacity_rps, 2),
            "interval": [cap.lo_rps and round(cap.lo_rps, 2), cap.hi_rps and round(cap.hi_rps, 2)],
            "hi_same_speed_rps": cap.hi_same_speed_rps and round(cap.hi_same_speed_rps, 2),
            "speed_spread": cap.speed_spread and round(cap.speed_spread, 2),
            "at_fastest_speed": [round(max(met), 2) if met else None, round(min(missed), 2) if missed else None],
        }
        rows.append(row)
        print(json.dumps(row))
    caps = [r["capacity_rps"] for r in rows]
    mean = statistics.fmean(caps)
    print(f"capacities {caps}: worst deviation ±{max(abs(c - mean) for c in caps) / mean:.0%}")
    lows = [r["interval"][0] for r in rows if r["interval"][0]]
    highs = [r["hi_same_speed_rps"] or r["interval"][1] for r in rows]
    raw_highs = [r["interval"][1] for r in rows]
    print(
        f"raw intervals share a rate: {max(lows) < min(h for h in raw_highs if h)}; "
        f"intervals with the missed rate at the met one's speed share a rate: {max(lows) < min(h for h in highs if h)}"
    )
    met_at = [r["at_fastest_speed"][0] for r in rows if r["at_fastest_speed"][0]]
    missed_at = [r["at_fastest_speed"][1] for r in rows if r["at_fastest_speed"][1]]
    if met_at and missed_at:
        print(
            f"at the fastest run's speed: the highest rate met per server {met_at}, the lowest missed {missed_at}; "
            f"every met below every missed: {max(met_at) < min(missed_at)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
