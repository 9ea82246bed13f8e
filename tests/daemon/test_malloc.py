"""The daemon's threads share two malloc arenas (tuner/daemon/malloc.py), counted by glibc's own malloc_info."""

from __future__ import annotations

import subprocess
import sys

import pytest

_COUNT = r"""
import ctypes, ctypes.util, os, sys, tempfile, threading
sys.path.insert(0, {root!r})
from tuner.daemon.malloc import limit_arenas
print(limit_arenas(env={env}))
held = []
started, done = threading.Barrier(7), threading.Barrier(7)
def work():
    started.wait()  # six threads alive at once, as the daemon's workers are
    held.append([bytes(2048) for _ in range(200)])  # above pymalloc's 512 bytes: glibc's malloc, in this thread
    done.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads: t.start()
started.wait()
done.wait()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


def _arenas(env: dict) -> tuple[str, int]:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", _COUNT.format(root=root, env=env)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return out[0], int(out[1])


def test_the_daemons_threads_share_two_arenas_unless_malloc_arena_max_is_set() -> None:
    import ctypes
    import ctypes.util

    try:
        _ = ctypes.CDLL(ctypes.util.find_library("c")).gnu_get_libc_version
    except (OSError, AttributeError, TypeError):
        pytest.skip("not glibc: tuner leaves malloc as it is")
    took, limited = _arenas({})
    assert took == "True" and limited <= 2, limited
    took, free = _arenas({"MALLOC_ARENA_MAX": "16"})  # the user's setting stands: tuner asks for nothing
    assert took == "False" and free > 2, free  # six threads, six more arenas: what the limit saves


_GC = r"""
import gc, sys, weakref
sys.path.insert(0, {root!r})
from tuner.daemon.malloc import GC_THRESHOLDS, collect_less
class Node: pass
built = [Node() for _ in range(1000)]  # what start-up built and keeps
a = Node(); a.me = a; gone = weakref.ref(a); del a  # start-up garbage in a cycle
collect_less()
print(gone() is None, gc.get_freeze_count() >= 1000, gc.get_threshold() == GC_THRESHOLDS)
b = Node(); b.me = b; later = weakref.ref(b); del b  # a cycle made while running
kept = [Node() for _ in range(GC_THRESHOLDS[0] * 2)]  # allocations alone run a young collection
print(later() is None)
"""


def test_the_daemon_freezes_what_it_built_and_still_collects_the_cycles_it_makes_later() -> None:
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", _GC.format(root=root)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out == ["True", "True", "True", "True"], out
