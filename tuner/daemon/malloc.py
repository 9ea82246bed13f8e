"""How the daemon's process keeps its memory: how many malloc arenas its threads share, and how often Python's
cyclic garbage collector runs.

glibc gives every thread that allocates its own arena, up to 8 per core, and an arena keeps the memory its thread
freed: a daemon whose few dozen worker threads each read and free windows and snapshots holds several arenas'
worth of freed memory. At 1,000 targets every 5 s that was 312 MiB of RSS against 251 MiB with two arenas, for
the same CPU (bench/results/2026-11-24-1520-whole-run.md and -1531-whole-run.md). The daemon asks for two before
it starts its threads, unless MALLOC_ARENA_MAX is set (glibc read it at start: the user's choice stands). Not glibc
(musl, macOS): left as it is.

The collector: with the defaults (a young collection every 700 net allocations, a full one every 100 of those) a
daemon holding a million objects (1,000 targets' layouts, heads, series and alert state) spends 8% of its CPU
walking objects that live for its whole life, to find the few cycles its code makes (in process, 300 targets:
0.29 s of 3.81 s; bench/results/2026-11-25-0443-whole-run.md). After start-up the daemon moves what it has built
so far out of the collector's sight (gc.freeze: its start-up objects are never garbage) and collects young objects
every 10,000 allocations, which found the same cycles for 0.08 s.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Mapping

__all__ = ["limit_arenas", "ARENAS", "collect_less", "GC_THRESHOLDS"]

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h
GC_THRESHOLDS = (10_000, 20, 100)  # Python's own: (700, 10, 10)


def limit_arenas(n: int = ARENAS, env: Mapping[str, str] = os.environ) -> bool:
    """Ask glibc for at most ``n`` arenas from now on; True when it took it."""
    if "MALLOC_ARENA_MAX" in env:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        _ = libc.gnu_get_libc_version  # glibc only: musl has a mallopt that does nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_ARENA_MAX, n) == 1


def collect_less(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Once the daemon is built: freeze what exists (never collected again) and collect the young less often. For
    the daemon's process only (`tuner run`): a test or a one-shot command keeps Python's defaults."""
    gc.collect()  # start-up's own garbage goes first, not into the frozen generation
    gc.freeze()
    gc.set_threshold(*thresholds)
