"""How the store's rows hold what a scrape holds: millisecond times, a histogram's bounds and a series' labels as
text; and the driver's connection under SQLAlchemy's, which the per-scrape writes and the window reads use
directly (SQLAlchemy's per-row work cost more than SQLite's, bench/results/)."""

from __future__ import annotations

import json
import sqlite3
from functools import lru_cache

__all__ = ["driver_connection", "ms", "bounds_json", "bounds_parse", "labels_parse"]


def driver_connection(conn) -> sqlite3.Connection:
    """The sqlite3 connection under a SQLAlchemy one, for the per-scrape writes and the window reads."""
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection), "tuner's store is SQLite"
    return raw


def ms(ts: float) -> int:
    """Unix seconds as the store's integer milliseconds."""
    return int(round(ts * 1000))


def bounds_json(bounds: tuple[float, ...]) -> str:
    return json.dumps([b if b != float("inf") else "+Inf" for b in bounds])


@lru_cache(maxsize=65536)
def bounds_parse(text: str) -> tuple[float, ...]:
    """A histogram's stored bounds (memoized: every target's histogram of a metric has the same ones, and the
    head holds one tuple for all of them, bench/results/)."""
    return tuple(float("inf") if b == "+Inf" else float(b) for b in json.loads(text))


@lru_cache(maxsize=65536)
def labels_parse(text: str) -> tuple[tuple[str, str], ...]:
    """A series' stored labels as the window's key holds them (the same text is the same key: memoized, as every
    window read of every target parses the same few label sets)."""
    return tuple(tuple(p) for p in json.loads(text))
