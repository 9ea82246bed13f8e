"""The arrival rate `tuner workload` reads from a store, against the arrivals the benchmark client really sent.

bench/tune_corpus.py serves each shape to a managed vLLM under `tuner run` and keeps the work folder
(/tmp/corpus-<shape>-*): the store, and the client's own result file with every request's start time. The truth is
the client's: (requests - 1) / (last start - first start). Against it, for each folder:

  at draw   the workload file tune_corpus.py wrote then (bench/corpus-*/<shape>.yaml, when found), read over its
            window: the traffic plus ~25 s without any (the client's start, the margins)
  now       `tuner workload` run now by this checkout over the whole store: from the server's first scrape to the
            daemon's stop, a window that holds even more idle time than the draw's

with each reading's 95% interval and whether it holds the truth.

A second table needs no store: every drawn shape's workload file (bench/corpus-drawn*/) against what its client was
told to send (drawn.json), for the values whose truth the draw fixes: the burstiness (the gamma shape of the gaps),
the range ratio of the whole prompt (the client spreads only the part past the shared prefix: r x (input - prefix)
/ input) and the shared prefix. Each file was read by the code of its day; a file's prefix interval of [0, 0] is
from before prefixes shorter than a KV block were bounded by the prompt's length.

A third table, for the folders given, reads the burstiness of each store two ways against what its client sent:
from the requests finished per busy scrape interval (what `tuner workload` reads) and from those that arrived in it
(finished + the change in running + waiting, tuner/signals/load.py ``Interval.arrived``), each with its chi-square
interval and whether it holds the gamma shape the client was told to draw from, beside the same estimator on the
client's own start times in 5-s bins (the arrivals as sent, at about the scrapes' resolution: what a reading of the
arrivals should come near).

  python bench/workload_rate.py /tmp/corpus-drawn-*
  python bench/workload_rate.py          # the second table alone
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("burstiness", "range_ratio", "prefix_len")  # the values whose truth a draw fixes (the second table)


def realized_rate(start_times: list[float]) -> float:
    """Arrivals per second between the first and the last request the client sent."""
    st = sorted(start_times)
    if len(st) < 2 or st[-1] <= st[0]:
        raise ValueError("a rate needs two requests sent at different times")
    return (len(st) - 1) / (st[-1] - st[0])


def interval(w: dict, field: str, truth: float) -> tuple[float | None, float | None, bool]:
    """A workload file's 95% interval of ``field`` (its ``inferred`` bounds), and whether it holds ``truth``."""
    inf = (w.get("inferred") or {}).get(field) or {}
    low, high = inf.get("low"), inf.get("high")
    return low, high, low is not None and high is not None and low <= truth <= high


def reading(w: dict, truth: float) -> dict:
    low, high, holds = interval(w, "rate_rps", truth)
    return {
        "rate": w.get("rate_rps"),
        "low": low,
        "high": high,
        "holds": holds,
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


def drawn_truths(root: Path = ROOT / "bench") -> list[dict]:
    """Each drawn shape's file against its draw: (field, sent, read, low, high, holds) per field."""
    rows = []
    for drawn in sorted(root.glob("corpus-drawn*/drawn.json")):
        for shape, sent in sorted(json.loads(drawn.read_text())["shapes"].items()):
            path = drawn.parent / f"{shape}.yaml"
            if not path.exists():
                continue
            w = yaml.safe_load(path.read_text())
            prefix = sent.get("prefix_len", 0)
            truth = {
                "burstiness": sent["burstiness"],
                "range_ratio": sent["range_ratio"] * (sent["input_len"] - prefix) / sent["input_len"],
                "prefix_len": prefix,
            }
            for field, true in truth.items():
                low, high, holds = interval(w, field, true)
                rows.append(
                    {
                        "shape": shape,
                        "field": field,
                        "sent": true,
                        "read": w.get(field),
                        "low": low,
                        "high": high,
                        "holds": holds,
                    }
                )
    return rows


Shape = tuple[float, float, float] | None  # a gamma shape with its 95% interval


def _bins(start_times: list[float], width: float = 5.0) -> list:
    """The client's arrivals counted in ``width``-second bins from its first to its last, as scrape intervals."""
    from tuner.signals.load import Interval

    st = sorted(start_times)
    n = max(1, int((st[-1] - st[0]) // width))
    counts = [0] * n
    for t in st:
        counts[min(n - 1, int((t - st[0]) // width))] += 1
    last = max(width, st[-1] - st[0] - width * (n - 1))  # the partial bin at the end joins the one before it
    return [Interval(width if i < n - 1 else last, float(c), 0.0, True) for i, c in enumerate(counts)]


def burstiness_readings(folder: Path) -> dict:
    """The burstiness of ``folder``'s store over its whole window read from finishes and from arrivals, and of its
    client's start times in 5-s bins: each a (shape, low, high) by `tuner workload`'s own estimator."""
    from tuner.app.session import Session
    from tuner.signals.load import profile
    from tuner.signals.workload import _burstiness

    shape = re.sub(r"-[^-]+$", "", folder.name.removeprefix("corpus-"))
    results = sorted(folder.glob("client/bench-results/*.json"))
    start_times = json.loads(results[0].read_text())["start_times"] if results else []
    store = Session.load(str(folder / "tuner.yaml")).store
    now = time.time()
    p = profile(store.window("tiny", now - 30 * 86400, now))
    ivs = p.intervals if p is not None else ()
    return {
        "shape": shape,
        "finishes": _burstiness(ivs)[1],
        "arrivals": _burstiness([replace(iv, finished=iv.arrived or 0.0) for iv in ivs])[1],
        "client": _burstiness(_bins(start_times))[1] if len(start_times) > 1 else None,
    }


def _shape(est: Shape) -> str:
    return "-" if est is None else f"{est[0]:.3g} [{est[1]:.3g} .. {est[2]:.3g}]"


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    return f"{r['rate']:.3f} [{r['low']:.3f} .. {r['high']:.3f}] {r['error']:+.1%} {'yes' if r['holds'] else 'NO'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", type=Path, help="tune_corpus.py work folders (/tmp/corpus-<shape>-*)")
    args = ap.parse_args()
    truths = drawn_truths()
    print("| shape | " + " | ".join(f"{f}: sent -> read [95%]" for f in FIELDS) + " |")
    print("|---|---|---|---|")
    for shape in dict.fromkeys(t["shape"] for t in truths):
        cells = [
            f"{t['sent']:.3g} -> {t['read']} [{t['low']} .. {t['high']}]{'' if t['holds'] else ' **miss**'}"
            for t in truths
            if t["shape"] == shape
        ]
        print(f"| {shape} | " + " | ".join(cells) + " |")
    for field in FIELDS:
        got = [t for t in truths if t["field"] == field]
        print(f"{field}: {sum(t['holds'] for t in got)} of {len(got)} intervals hold what the client was told to send")
    if not args.folders:
        return
    print()
    rows = [check(f) for f in args.folders if (f / "tuner.yaml").exists()]
    print("| shape | sent (client) | at draw: rate [95%] error, holds | now: rate [95%] error, holds |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['truth']:.3f} | {_cell(r.get('at_draw'))} | {_cell(r['now'])} |")
    for when in ("at_draw", "now"):
        got = [r[when] for r in rows if when in r]
        print(f"{when}: {sum(g['holds'] for g in got)} of {len(got)} intervals hold the rate sent")
    sent = {t["shape"]: t["sent"] for t in truths if t["field"] == "burstiness"}
    print()
    print("| shape | told to send | client's start times, 5-s bins | store: finishes | store: arrivals |")
    print("|---|---|---|---|---|")
    tally = {"finishes": 0, "arrivals": 0}
    for f in args.folders:
        if not (f / "tuner.yaml").exists():
            continue
        b = burstiness_readings(f)
        told = sent.get(b["shape"])
        cells = []
        for how in ("finishes", "arrivals"):
            est, client = b[how], b["client"]
            holds = est is not None and told is not None and est[1] <= told <= est[2]
            tally[how] += holds
            off = f" ({est[0] / client[0] - 1:+.0%} of the client's)" if est is not None and client is not None else ""
            cells.append(_shape(est) + off + ("" if holds else " **miss**"))
        told_text = "-" if told is None else f"{told:g}"
        print(f"| {b['shape']} | {told_text} | {_shape(b['client'])} | {cells[0]} | {cells[1]} |")
    n = sum((f / "tuner.yaml").exists() for f in args.folders)
    for how, held in tally.items():
        print(f"burstiness from {how}: {held} of {n} intervals hold the shape the client was told to send")


if __name__ == "__main__":
    main()
