"""The daemon's one writer to the store: scrapes queue here and are written in one transaction a tick (every
``FLUSH_S``, or at once by the scrape that fills the queue to ``FLUSH_MAX``), in queue order. A write the store
refuses is recorded as a job error of each target in it, and cleared by the next write that goes through."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tuner.daemon.state import DaemonState
from tuner.errors import StoreError
from tuner.store.store import Failed, Scraped, Store

__all__ = ["StoreWriter", "FLUSH_S", "FLUSH_MAX"]

FLUSH_S = 0.25  # the writer commits queued scrapes this often: one transaction for ~50 at 1,000 targets / 5 s
FLUSH_MAX = 100  # or as soon as this many wait


class StoreWriter:
    def __init__(self, store: Store, state: DaemonState, job_error: Callable[[str, str], None]) -> None:
        self.store = store
        self.state = state
        self.job_error = job_error
        self._pending: list[Scraped | Failed] = []  # scrapes waiting for the writer's next transaction
        self._pending_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one transaction at a time, in queue order
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        """Write what is queued every FLUSH_S until ``stop`` is set."""

        def write_forever() -> None:
            while not stop.wait(FLUSH_S):
                self.flush()

        self._thread = threading.Thread(target=write_forever, name="store-writer", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """After ``stop``: wait for the thread, then write what the last scrapes queued."""
        if self._thread is not None:
            self._thread.join()
            self.flush()

    def keep(self, item: Scraped | Failed) -> bool:
        """Queue a scrape for the writer while it runs; otherwise (tests, one-off calls) write it now. A full
        queue is written by the scrape that filled it: scrapes never outrun the store (a busy store makes the
        scrape jobs late, which the scrapes table shows, instead of a queue that grows without bound)."""
        if self._thread is None:
            return self._write([item])
        with self._pending_lock:
            self._pending.append(item)
            full = len(self._pending) >= FLUSH_MAX
        return self.flush() if full else True

    def flush(self) -> bool:
        """Write every queued scrape in one transaction; False when the store refused them (recorded)."""
        with self._flush_lock:
            with self._pending_lock:
                batch, self._pending = self._pending, []
            return self._write(batch) if batch else True

    def _write(self, batch: list[Scraped | Failed]) -> bool:
        names = {item.target for item in batch}
        try:
            self.store.write(batch)
        except StoreError as exc:  # nothing of the batch was written: say so for each of its targets
            for name in sorted(names):
                self.job_error(f"store:{name}", str(exc))
            return False
        with self.state.lock:  # a write went through again (the lock was released, space was freed)
            for name in names:
                self.state.job_errors.pop(f"store:{name}", None)
        return True
