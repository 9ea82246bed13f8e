"""What one scrape costs the store to write as the store fills: Store.write's CPU per scrape, minute by minute.

The daemon writes each quarter second's scrapes in one transaction (Store.write). Here ``--targets`` targets are
scraped every 5 s of simulated time from a recorded vLLM exposition with its counters advancing
(ReplayExposition), parsed outside the timed part, and written 50 at a time (1,000 targets every 5 s is 200
scrapes a second: 50 a quarter second). Only Store.write is timed, on this process's CPU clock.

Why it matters: ``samples`` and ``hist_samples`` are kept in (series, time) order, so a scrape's ~36 rows land on
~36 different pages, and each is written to the WAL and later checkpointed into the database. The bench's
ingest-only run measured on a store seconds old would understate what a store that has run for minutes costs.

    python bench/store_growth.py --targets 1000 --minutes 7
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.collect.layout import Layouts  # noqa: E402
from tuner.collect.vllm import snapshot_from_text  # noqa: E402
from tuner.lab.replay import ReplayExposition  # noqa: E402
from tuner.store.db import open_engine, upgrade  # noqa: E402
from tuner.store.store import Scraped, Store  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "metrics_under_load.txt"
BATCH = 50
INTERVAL_S = 5.0


def grow(targets: int, minutes: float, workdir: Path) -> list[dict[str, float]]:
    """One row per simulated minute: the store's size and Store.write's CPU and wall time per scrape."""
    replay = ReplayExposition(FIXTURE.read_text(encoding="utf-8"))
    bodies = [replay.render().decode() for _ in range(12)]  # a minute of a target's bodies, counters advancing
    engine = open_engine(f"sqlite:///{workdir / 'tuner.db'}")
    upgrade(engine)
    store = Store(engine)
    layouts = Layouts()
    now = 1_800_000_000.0
    per_minute = int(60 / INTERVAL_S)
    rows: list[dict[str, float]] = []
    cpu = wall = 0.0
    for tick in range(int(minutes * per_minute)):
        items = [
            Scraped(
                snapshot_from_text(
                    bodies[tick % len(bodies)], target=f"t{i:04d}", ts=now + i * INTERVAL_S / targets, layouts=layouts
                ),
                f"http://127.0.0.1:{10000 + i}",
                {},
            )
            for i in range(targets)
        ]
        now += INTERVAL_S
        c0, w0 = time.process_time(), time.perf_counter()
        for j in range(0, targets, BATCH):
            store.write(items[j : j + BATCH])
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        if (tick + 1) % per_minute == 0:
            scrapes = targets * per_minute
            size = sum(f.stat().st_size for f in workdir.iterdir() if f.name.startswith("tuner.db"))
            rows.append(
                {
                    "minute": (tick + 1) / per_minute,
                    "mib": size / 2**20,
                    "cpu_us": cpu / scrapes * 1e6,
                    "wall_us": wall / scrapes * 1e6,
                }
            )
            print(
                f"minute {rows[-1]['minute']:.0f}: {rows[-1]['cpu_us']:.0f} µs CPU per scrape, "
                f"store {rows[-1]['mib']:.0f} MiB",
                flush=True,
            )
            cpu = wall = 0.0
    engine.dispose()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=7.0, help="simulated minutes of scrapes (every 5 s)")
    args = ap.parse_args()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tuner-store-growth-") as tmp:
        rows = grow(args.targets, args.minutes, Path(tmp))
    print()
    print(
        f"{args.targets} targets; load average at start: {' '.join(f'{x:.2f}' for x in load_start)}, "
        f"at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print()
    print("| minute | store (DB + WAL) | Store.write CPU µs per scrape | wall µs per scrape |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['minute']:.0f} | {r['mib']:.0f} MiB | {r['cpu_us']:.0f} | {r['wall_us']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
