"""``tuner report [--target T] [--since 24h] -o report.html`` (use case: tuner/app/report.py)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from tuner.app.report import write_report
from tuner.cli.common import duration, int_in, session, unix_time
from tuner.config import parse_duration

__all__ = ["add_parsers"]


def cmd_report(args: argparse.Namespace) -> int:
    now = args.until if args.until is not None else time.time()
    w = write_report(
        session(args),
        Path(args.output),
        target=args.target,
        start=now - args.since.total_seconds(),
        end=now,
        points=args.points,
        window_s=args.window.total_seconds() if args.window else None,
    )
    print(
        f"{w.path}: {w.targets} target(s), {w.plots} plots, {w.alert_events} alert events, {w.applies} applies, "
        f"{w.size_bytes / 1024:.0f} KiB"
    )
    return 0


def add_parsers(sub: Any) -> None:
    r = sub.add_parser(
        "report",
        help="write one self-contained HTML report: latency, KV use, queue and throughput "
        "over time, alerts and applies marked, before/after per apply",
    )
    r.add_argument("--target", help="one target (default: every target in the store)")
    r.add_argument("--since", type=duration, default=parse_duration("24h"), help="how far back (default 24h)")
    r.add_argument("--until", type=unix_time, help="end at this unix time instead of now")
    r.add_argument("--points", type=int_in(2, 10_000), default=120, help="evaluation times per plot (default 120)")
    r.add_argument("--window", type=duration, help="signal window at each point (default: 2 x the step, at least 10s)")
    r.add_argument("-o", "--output", required=True, help="the HTML file to write")
    r.set_defaults(func=cmd_report)
