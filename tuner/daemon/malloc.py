"""How many malloc arenas the daemon's threads share.

glibc gives every thread that allocates its own arena, up to 8 per core, and an arena keeps the memory its thread
freed: a daemon whose few dozen worker threads each read and free windows and snapshots holds several arenas'
worth of freed memory. At 1,000 targets every 5 s that was 312 MiB of RSS against 251 MiB with two arenas, for
the same CPU (bench/RESULTS.md 2026-11-24 15:20 and 15:31). The daemon asks for two before it starts its threads,
unless MALLOC_ARENA_MAX is set (glibc read it at start: the user's choice stands). Not glibc (musl, macOS): left
as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Mapping

__all__ = ["limit_arenas", "ARENAS"]

ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_arenas(n: int = ARENAS, env: Mapping[str, str] = os.environ) -> bool:
    """Ask glibc for at most ``n`` arenas from now on; True when it took it."""
    if "MALLOC_ARENA_MAX" in env:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: musl has a mallopt that does nothing
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_ARENA_MAX, n) == 1
