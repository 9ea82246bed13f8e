"""Which journal entries a thread of this process is carrying out.

The journal names this process as their owner, and it is alive, so only this set tells a reconcile in another
thread (auto mode reconciles before each step) that the entry is not a leftover. Taking an id in it is how a thread
claims an entry within the process; the journal's compare-and-set (``jr.claim``) does it between processes.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["drop", "take"]

_carried: set[tuple[str, int]] = set()  # (database, entry id)
_lock = threading.Lock()


def take(engine: Any, aid: int) -> bool:
    """Claim entry ``aid`` of ``engine``'s journal for this thread; False when another thread holds it."""
    with _lock:
        if (str(engine.url), aid) in _carried:
            return False
        _carried.add((str(engine.url), aid))
        return True


def drop(engine: Any, aid: int) -> None:
    """This thread is done with entry ``aid``."""
    with _lock:
        _carried.discard((str(engine.url), aid))
