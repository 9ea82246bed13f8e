"""The arrival rate `tuner workload` reads from a store, against the arrivals the benchmark client really sent.

bench/tune_corpus.py serves each shape to a managed vLLM under `tuner run` and keeps the work folder
(/tmp/corpus-<shape>-*): the store, and the client's own result file with every request's start time. The truth is
the client's: (requests - 1) / (last start - first start). Against it, for each folder:

  at draw   the workload file tune_corpus.py wrote then (bench/corpus-*/<shape>.yaml, when found), read over its
            window: the traffic plus ~25 s without any (the client's start, the margins)
  now       `tuner workload` run now by this checkout over the whole store: from the server's first scrape to the
            daemon's stop, a window that holds even more idle time than the draw's

with each reading's 95% interval and whether it holds the truth.

  python bench/workload_rate.py /tmp/corpus-drawn-*
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def realized_rate(start_times: list[float]) -> float:
    """Arrivals per second between the first and the last request the client sent."""
    st = sorted(start_times)
    if len(st) < 2 or st[-1] <= st[0]:
        raise ValueError("a rate needs two requests sent at different times")
    return (len(st) - 1) / (st[-1] - st[0])


def reading(w: dict, truth: float) -> dict:
    inf = (w.get("inferred") or {}).get("rate_rps") or {}
    low, high = inf.get("low"), inf.get("high")
    return {
        "rate": w.get("rate_rps"),
        "low": low,
        "high": high,
        "holds": low is not None and high is not None and low <= truth <= high,
        "error": w["rate_rps"] / truth - 1 if w.get("rate_rps") else None,
    }


def check(folder: Path) -> dict:
    shape = re.sub(r"-[^-]+$", "", folder.name.removeprefix("corpus-"))  # mkdtemp's suffix
    results = sorted(folder.glob("client/bench-results/*.json"))
    if not results:
        raise SystemExit(f"{folder}: no client result under client/bench-results (a tune_corpus.py work folder?)")
    truth = realized_rate(json.loads(results[0].read_text())["start_times"])
    out: dict = {"shape": shape, "truth": truth}
    drawn = sorted(glob.glob(str(ROOT / "bench" / "corpus*" / f"{shape}.yaml")))
    if drawn:
        out["at_draw"] = reading(yaml.safe_load(Path(drawn[-1]).read_text()), truth)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.yaml"
        got = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "-c", str(folder / "tuner.yaml"), "workload", "tiny"]
            + ["--window", "30d", "-o", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if got.returncode != 0:
            raise SystemExit(f"{folder}: tuner workload failed: {got.stderr.strip()}")
        out["now"] = reading(yaml.safe_load(path.read_text()), truth)
    return out


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    return f"{r['rate']:.3f} [{r['low']:.3f} .. {r['high']:.3f}] {r['error']:+.1%} {'yes' if r['holds'] else 'NO'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="tune_corpus.py work folders (/tmp/corpus-<shape>-*)")
    args = ap.parse_args()
    rows = [check(f) for f in args.folders if (f / "tuner.yaml").exists()]
    print("| shape | sent (client) | at draw: rate [95%] error, holds | now: rate [95%] error, holds |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['truth']:.3f} | {_cell(r.get('at_draw'))} | {_cell(r['now'])} |")
    for when in ("at_draw", "now"):
        got = [r[when] for r in rows if when in r]
        print(f"{when}: {sum(g['holds'] for g in got)} of {len(got)} intervals hold the rate sent")


if __name__ == "__main__":
    main()
