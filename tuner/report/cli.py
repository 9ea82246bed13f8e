"""``tuner report [--target T] [--since 24h] -o report.html``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from tuner.errors import ConfigError, UnknownTargetError

__all__ = ["add_parsers"]


def add_parsers(sub: argparse._SubParsersAction, helpers: dict[str, Callable[..., Any]],
                duration: Callable[[str], Any], default_since: Any) -> None:
    def cmd_report(args: argparse.Namespace) -> int:
        from tuner.report.data import collect
        from tuner.report.html import render_html

        cfg = helpers["load"](args)
        store = helpers["open_store"](cfg)
        known = store.target_names()
        if args.target and args.target not in known:
            raise UnknownTargetError(args.target, known)
        out = Path(args.output)
        if out.is_dir() or not out.parent.is_dir():
            raise ConfigError(str(out), "-o", "give a file path in an existing directory, e.g. report.html")
        now = args.until if args.until is not None else time.time()
        start = now - args.since.total_seconds()
        slos = {t.name: t.slo for t in cfg.targets}
        reports = [collect(store, name, start=start, end=now, points=args.points,
                           window_s=args.window.total_seconds() if args.window else None, slo=slos.get(name))
                   for name in ([args.target] if args.target else known)]
        html = render_html(reports, title=f"tuner report — {args.target or 'all targets'}", generated_at=time.time())
        out.write_text(html, encoding="utf-8")
        n_plots = html.count('<svg class="plot"')
        print(f"{out}: {len(reports)} target(s), {n_plots} plots, "
              f"{sum(len(r.alerts) for r in reports)} alert events, {sum(len(r.applies) for r in reports)} applies, "
              f"{len(html.encode()) / 1024:.0f} KiB")
        return 0

    r = sub.add_parser("report", help="write one self-contained HTML report: latency, KV use, queue and throughput "
                       "over time, alerts and applies marked, before/after per apply")
    r.add_argument("--target", help="one target (default: every target in the store)")
    r.add_argument("--since", type=duration, default=default_since, help="how far back (default 24h)")
    r.add_argument("--until", type=float, help="end at this unix time instead of now")
    r.add_argument("--points", type=int, default=120, help="evaluation times per plot (default 120)")
    r.add_argument("--window", type=duration, help="signal window at each point (default: 2 x the step, "
                   "at least 10s)")
    r.add_argument("-o", "--output", required=True, help="the HTML file to write")
    r.set_defaults(func=cmd_report)
