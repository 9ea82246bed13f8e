"""The daemon's scrape schedule: every direct target on its own interval, timed by the monotonic clock.

One thread keeps the targets in a heap by their next due time and hands each due scrape to a pool of worker
threads. A target whose previous scrape is still running is not scraped twice at once: that due run is refused
(counted and logged) and the next one comes one interval on. A loop that falls behind (a busy machine)
runs a late target once and puts its next run back in phase, as APScheduler's ``coalesce`` does, instead of
catching up in a burst. The monotonic clock means a step of the wall clock moves no scrape.

This replaced one APScheduler job per target: at 1,000 targets APScheduler's own bookkeeping (its job store,
trigger arithmetic on aware datetimes, events) was ~8% of tuner's CPU (bench/results/2026-11-23-1909-whole-run.md).
The workers take runs from a queue of their own rather than a ThreadPoolExecutor: a run then costs no Future and no
semaphore round (at 1,000 targets the executor's handoff was ~15% of the samples in which the ingest held the GIL).

``settle(before)`` lets a reader wait for the data of a moment: until every run due at or before it has been handed
out and has finished. The alert evaluation uses it to read a scrape the moment it lands, not an interval on.

``add`` and ``remove`` change the items while the loop runs (Kubernetes pods come and go): an added item's first
run is within one interval, a removed one is not run again (a run of it in flight finishes).
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["ScrapeLoop"]

log = logging.getLogger("tuner.daemon")
T = TypeVar("T", bound=Hashable)


class ScrapeLoop(Generic[T]):
    """Run ``run(item)`` for each of ``items`` every ``every(item)`` seconds, first runs spread over one interval."""

    def __init__(
        self,
        items: Sequence[T],
        every: Callable[[T], float],
        run: Callable[[T], object],
        *,
        workers: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        start: float | None = None,
        spread: bool = True,
        what: str = "scrape",
    ) -> None:
        """``start``: the schedule's origin on ``clock`` (the first item's first run; default: when the loop's
        thread starts), so that another schedule can be laid in phase with this one; ``spread``: the first runs
        spread over one interval (False: every item's at the origin); ``what``: the runs' name in the log.
        ``clock`` and ``sleep`` (wait at most that long; the default wakes at ``stop``) are for tests."""
        self._items = list(items)
        self._spread, self._what = spread, what
        self._every = {item: max(every(item), 1e-3) for item in self._items}
        self._run = run
        self._clock = clock
        self._workers = max(1, workers)
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()  # runs handed out; None: a worker stops
        self._threads: list[threading.Thread] = []  # started as runs need them, up to ``workers``
        # workers that finished a run and went back to the queue, less the runs handed to them since; with every
        # worker started it may count one that took a run queued while all were busy (then no worker is started)
        self._idle = 0
        self._origin = start
        self._running: dict[T, float] = {}  # item -> the due time of its run in flight
        self._heap: list[tuple[float, int, T]] = []  # (next due, index, item): built when the loop starts
        self._removed: set[T] = set()  # items taken out while scheduled: dropped when they come due
        self._started = False
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)  # a run finished: settle() looks again
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
        with self._finished:  # a settle() waiting returns now
            self._finished.notify_all()
        if self._thread is not None and wait:
            self._thread.join()
        with self._lock:
            threads = list(self._threads)
            for _ in threads:
                self._queue.put(None)
        if wait:
            for t in threads:
                t.join()

    def settle(self, before: float, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until every run due at or before ``before`` (on the loop's clock) has
        been handed out and has finished; True if so, False if some run due by then is still pending or going."""

        def settled() -> bool:
            if not self._started or self._stopping:
                return True
            if self._heap and self._heap[0][0] <= before:  # due by then, not handed out yet (the loop is late)
                return False
            return all(due > before for due in self._running.values())

        with self._finished:
            return self._finished.wait_for(settled, timeout)

    def add(self, item: T, every: float) -> None:
        """Run ``item`` too, every ``every`` seconds, the first run within one interval from now."""
        with self._lock:
            if item in self._every:
                self._removed.discard(item)  # taken out and back before it came due: its schedule stands
                return
            self._every[item] = max(every, 1e-3)
            self._items.append(item)
            if self._started:
                first = self._clock() + self._every[item] * (hash(item) % 997) / 997  # spread, as the first runs
                heapq.heappush(self._heap, (first, len(self._items), item))
        self._wake.set()

    def remove(self, item: T) -> None:
        """Run ``item`` no more (a run in flight finishes)."""
        with self._lock:
            if item in self._every:
                self._removed.add(item)

    def _loop(self) -> None:
        start = self._clock() if self._origin is None else self._origin
        n = max(1, len(self._items)) if self._spread else float("inf")  # i / inf: every first run at the start
        heap = self._heap
        with self._lock:
            heap[:] = [(start + self._every[item] * (i / n), i, item) for i, item in enumerate(self._items)]
            heapq.heapify(heap)
            self._started = True
        while not self._stopping:
            self._wake.clear()  # an add() from here on wakes the wait below
            with self._lock:
                while heap and heap[0][2] in self._removed:  # taken out: dropped, not run
                    gone = heapq.heappop(heap)[2]
                    self._removed.discard(gone)
                    self._items.remove(gone)
                    del self._every[gone]
                head = heap[0] if heap else None
            if head is None:
                self._wake.wait(1.0)  # no items (yet): an add() or stop() wakes it
                continue
            due, i, item = head
            wait = due - self._clock()
            if wait > 0:
                self._sleep(wait)
                continue
            every = self._every[item]
            now = self._clock()
            late = int((now - due) // every)  # whole intervals missed: run once, then back in phase
            if late:
                self.skipped += late
                log.warning(
                    "%s of %s ran %.1f s late; %d due run(s) folded into this one", self._what, item, now - due, late
                )
            with self._lock:
                if not heap or heap[0] != head:  # an add() put another item first meanwhile: look again
                    continue
                heapq.heapreplace(heap, (due + (late + 1) * every, i, item))
                busy = item in self._running
                if not busy:
                    self._running[item] = due
            if busy:
                self.refused += 1
                log.warning(
                    "%s of %s skipped: its previous %s is still running (slower than its interval)",
                    self._what,
                    item,
                    self._what,
                )
                continue
            self._hand_out(item)

    def _hand_out(self, item: T) -> None:
        with self._lock:
            if self._stopping:  # stop() has told the workers to end: this run is not handed out
                self._running.pop(item, None)
                self._finished.notify_all()
                return
            self._queue.put(item)  # if every worker is busy, the first one done takes it
            if self._idle:
                self._idle -= 1  # one of them takes it
            elif len(self._threads) < self._workers:
                t = threading.Thread(target=self._work, name=f"{self._what}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._run(item)
            except Exception:  # the run records its own failures; this is a bug, and must not stop the schedule
                log.exception("%s of %s failed unexpectedly", self._what, item)
            finally:
                with self._lock:
                    self._running.pop(item, None)
                    self._finished.notify_all()
                    self._idle += 1
