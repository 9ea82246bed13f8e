"""How steady is this host's CPU? A fixed loop on every core, counted each second, summed over 30-s windows.

Issue 40 asks five fresh vLLM servers with the same flags to measure within ±10% of their mean, and each capacity
`tuner tune` measures rests on 30-s runs. If the host itself computes faster in one 30-s window than in another by
more than that, no search or estimator on top of it can meet the goal; only measuring side by side in turns can
(tuner/tune/compare.py). This measures the host alone: one process per core spinning a fixed loop, nothing else
started, and the kernel's steal time (/proc/stat) over the same span, which says how much of any slowdown the
hypervisor owned up to.

  python bench/host_speed.py                # 300 s
  python bench/host_speed.py --seconds 60 --write   # also bench/results/<stamp>-host-speed.md
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WINDOW_S = 30  # a tune run's length (--run-seconds in bench/tune_spread.py)


def spin(seconds: float, core: int, out: mp.Queue) -> None:
    """Loops of a fixed size completed in each second, on ``core``."""
    os.sched_setaffinity(0, {core})
    counts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(10_000):
                pass
            n += 1
        counts.append(n)
    out.put((core, counts))


def cpu_ticks() -> dict[str, int]:
    f = open("/proc/stat").readline().split()
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    return dict(zip(names, map(int, f[1:9])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    load0 = os.getloadavg()[0]
    started = datetime.now(timezone.utc)
    ticks0 = cpu_ticks()
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=spin, args=(args.seconds, c, q)) for c in cores]
    for p in procs:
        p.start()
    got = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    ticks1 = cpu_ticks()
    total = sum(ticks1.values()) - sum(ticks0.values())
    steal = (ticks1["steal"] - ticks0["steal"]) / total if total else 0.0
    lines = [
        f"## This host's CPU speed over {WINDOW_S}-s windows ({started:%Y-%m-%d %H:%M} UTC)",
        "",
        f"`python bench/host_speed.py --seconds {args.seconds:g}`: one process per core ({len(cores)} cores) spinning "
        f"a fixed loop for {args.seconds:g} s, nothing else started by it; load average {load0:.2f} at the start. "
        f"Steal time over the span: {steal:.2%} of all CPU time.",
        "",
        f"| core | per second: min / max of the mean | {WINDOW_S}-s windows, each as a share of the mean | "
        f"windows' spread (max-min)/mean |",
        "|---|---|---|---|",
    ]
    for core in cores:
        xs = got[core]
        m = statistics.mean(xs)
        windows = [statistics.mean(xs[i : i + WINDOW_S]) / m for i in range(0, len(xs) - WINDOW_S + 1, WINDOW_S)]
        lines.append(
            f"| {core} | {min(xs) / m:.0%} / {max(xs) / m:.0%} | {', '.join(f'{w:.3f}' for w in windows)} | "
            f"{(max(windows) - min(windows)):.0%} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        out = ROOT / "bench" / "results" / f"{started:%Y-%m-%d-%H%M}-host-speed.md"
        out.write_text(text)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
