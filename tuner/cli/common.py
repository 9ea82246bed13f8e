"""What every command module shares: the session from --config, argparse types, tables, times."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from tuner.app.session import Session
from tuner.config import parse_duration
from tuner.errors import ApplyError

__all__ = [
    "session",
    "optional_session",
    "duration",
    "unix_time",
    "int_in",
    "float_in",
    "RECORD_ID",
    "COUNT",
    "table",
    "when",
    "fmt",
    "confirm",
]


def session(args: argparse.Namespace, *, pods: bool = True) -> Session:
    """The session of --config; Kubernetes pods listed in place of their templates unless ``pods`` is False."""
    return Session.load(args.config, pods=pods)


def optional_session(args: argparse.Namespace) -> Session | None:
    """For commands that work without a config: None when none was named and ./tuner.yaml is absent."""
    return Session.optional(args.config)


def duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_LAST_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: past it a time in milliseconds no longer fits where it goes


def unix_time(text: str) -> float:
    """Unix seconds (``--at``, ``--until``): finite, from 1970 to the year 9999."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected unix seconds, got {text!r}") from None
    if not 0 <= value <= _LAST_TIME:  # also NaN
        raise argparse.ArgumentTypeError(f"expected unix seconds from 0 to {_LAST_TIME:.0f} (year 9999), got {text!r}")
    return value


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [lo, hi] (ids and counts: SQLite's integers stop at 2**63 - 1)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected a whole number from {lo} to {hi}, got {text!r}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its own messages
    return parse


def float_in(lo: float, hi: float, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] with ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (lo < value if low_open else lo <= value) or not value <= hi:  # also NaN
            raise argparse.ArgumentTypeError(
                f"expected a number {'above' if low_open else 'from'} {lo:g} "
                f"{'and at most' if low_open else 'to'} {hi:g}, got {text!r}"
            )
        return value

    parse.__name__ = "number"
    return parse


RECORD_ID = int_in(1, 2**63 - 1)  # a recommendation's or an apply's id
COUNT = int_in(1, 1_000_000)  # --limit, --points and the like


def table(rows: list[list[str]], *, tty: bool | None = None) -> str:
    """The first row is the header. On a terminal, a rich table (box-drawn, fitted to the terminal's width);
    piped, plain columns that scripts and tests can split on whitespace."""
    if tty if tty is not None else sys.stdout.isatty():
        import io
        import shutil

        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        t = Table(*rows[0], header_style="bold", show_lines=False)
        for r in rows[1:]:
            t.add_row(*(Text(c) for c in r))  # as text: a cell's "[...]" is not markup
        buf = io.StringIO()
        Console(file=buf, force_terminal=tty is None, width=shutil.get_terminal_size((120, 40)).columns).print(t)
        return buf.getvalue().rstrip("\n")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def when(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt(v: Any, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v * scale:.{digits}f}{unit}"


def confirm(args: argparse.Namespace, what: str) -> None:
    """Ask on the terminal unless --yes; without a terminal, refuse (never act unasked)."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise ApplyError(f"{what}: no terminal to confirm on; pass --yes to go ahead")
    if input(f"{what}? [y/N] ").strip().lower() not in ("y", "yes"):
        raise ApplyError(f"{what}: not confirmed")
