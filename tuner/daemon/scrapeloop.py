"""The daemon's scrape schedule: every direct target on its own interval, timed by the monotonic clock.

One thread keeps the targets in a heap by their next due time and hands each due scrape to a pool of worker
threads. A target whose previous scrape is still running is not scraped twice at once: that due run is refused
(counted and logged) and the next one comes one interval on. A loop that falls behind (a busy machine)
runs a late target once and puts its next run back in phase, as APScheduler's ``coalesce`` does, instead of
catching up in a burst. The monotonic clock means a step of the wall clock moves no scrape.

This replaced one APScheduler job per target: at 1,000 targets APScheduler's own bookkeeping (its job store,
trigger arithmetic on aware datetimes, events) was ~8% of tuner's CPU (bench/RESULTS.md).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Generic, Hashable, Sequence, TypeVar

__all__ = ["ScrapeLoop"]

log = logging.getLogger("tuner.daemon")
T = TypeVar("T", bound=Hashable)


class ScrapeLoop(Generic[T]):
    """Run ``run(item)`` for each of ``items`` every ``every(item)`` seconds, first runs spread over one interval."""

    def __init__(self, items: Sequence[T], every: Callable[[T], float], run: Callable[[T], object], *,
                 workers: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], object] | None = None) -> None:
        """``clock`` and ``sleep`` (wait at most that long; the default wakes at ``stop``) are for tests."""
        self._items = list(items)
        self._every = {item: max(every(item), 1e-3) for item in self._items}
        self._run = run
        self._clock = clock
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="scrape")
        self._running: set[T] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._sleep = sleep or self._wake.wait
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.refused = 0  # due runs refused because the item's previous run was still going
        self.skipped = 0  # due runs a late loop folded into one (coalesced)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="scrape-loop", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """No new runs; with ``wait``, the runs in flight finish before this returns."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None and wait:
            self._thread.join()
        self._pool.shutdown(wait=wait)

    def _loop(self) -> None:
        start = self._clock()
        n = max(1, len(self._items))
        heap = [(start + self._every[item] * (i / n), i, item) for i, item in enumerate(self._items)]
        heapq.heapify(heap)
        while heap and not self._stopping:
            due, i, item = heap[0]
            wait = due - self._clock()
            if wait > 0:
                self._sleep(wait)
                continue
            every = self._every[item]
            now = self._clock()
            late = int((now - due) // every)  # whole intervals missed: run once, then back in phase
            if late:
                self.skipped += late
                log.warning("scrape of %s ran %.1f s late; %d due run(s) folded into this one", item, now - due,
                            late)
            heapq.heapreplace(heap, (due + (late + 1) * every, i, item))
            with self._lock:
                busy = item in self._running
                if not busy:
                    self._running.add(item)
            if busy:
                self.refused += 1
                log.warning("scrape of %s skipped: its previous scrape is still running (slower than its "
                            "interval)", item)
                continue
            try:
                self._pool.submit(self._one, item)
            except RuntimeError:  # the pool was shut down under us: stopping
                with self._lock:
                    self._running.discard(item)
                return

    def _one(self, item: T) -> None:
        try:
            self._run(item)
        except Exception:  # the run records its own failures; this is a bug, and must not stop the schedule
            log.exception("scrape of %s failed unexpectedly", item)
        finally:
            with self._lock:
                self._running.discard(item)
