"""The ``tuner`` command: a thin face over the use cases in tuner/app/. Each command module parses its
arguments, calls one use case and prints; a user error prints one line and exits with its class's code."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from tuner.app.session import DEFAULT_CONFIG
from tuner.cli import advise, alerts, apply, dashboards, observe, report, tune
from tuner.errors import TunerError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tuner", description="Watch vLLM and llama-server, derive serving signals, and tune their flags safely."
    )
    p.add_argument("--config", "-c", help=f"config file (default: $TUNER_CONFIG or ./{DEFAULT_CONFIG})")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    observe.add_parsers(sub)  # run, db, status, signals, snapshot, demo
    alerts.add_parsers(sub)  # alerts list/history/check/export/test/signals
    advise.add_parsers(sub)  # plan, recommend, recommendations
    tune.add_parsers(sub)  # workload, tune
    apply.add_parsers(sub)  # apply-recommendation, rollback, journal, judge, managed, reconcile
    dashboards.add_parsers(sub)  # dashboards generate/push
    report.add_parsers(sub)  # report -o report.html
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.log_level != "DEBUG":
        logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-command INFO lines are noise here
    try:
        return int(args.func(args))
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
