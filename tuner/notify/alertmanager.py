"""Deliver queued notifications to Alertmanager (API v2), in order, retrying with backoff while one is down.

Evaluation writes what to send into the store's outbox in the same transaction as the alert state,
so a notification is never lost across a restart. ``flush`` posts each Alertmanager's items oldest
first and stops at the first failure, so a "resolved" never overtakes its "firing". An item leaves
the outbox only when Alertmanager answered 2xx (or 4xx: it rejected the payload, and retrying the
same bytes cannot help; that is logged).

One sender: the daemon flushes from every rule group's thread and from its notify job, at once. Only one of them
sends; a flush asked for while one is under way is done by that one, in another pass, and returns at once (nothing
waits on a slow Alertmanager twice). Each row is posted once per attempt, and a failure is counted once.
(One daemon per store, tuner/daemon/jobs.py, keeps a second process from sending the same outbox.)
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from tuner.collect import http
from tuner.errors import ScrapeError
from tuner.store.alerts import mark_failed, mark_sent, queued
from tuner.store.store import Store

__all__ = ["Notifier", "FlushResult"]

log = logging.getLogger("tuner.notify")


@dataclass
class FlushResult:
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # alertmanager -> last error


@dataclass(frozen=True)
class Answer:
    """What one POST to Alertmanager came to: delivered (no error), or why not and whether retrying can help."""

    error: str | None = None
    rejected: bool = False  # a 4xx other than 408/429: the same bytes will be refused again


class Notifier:
    def __init__(self, store: Store, *, timeout_s: float = 5.0, max_backoff_s: float = 300.0) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self._lock = threading.Lock()
        self._sending = False  # a flush is under way
        self._again: int | None = None  # the latest time a flush was asked for meanwhile: the sender passes again

    def _backoff_ms(self, attempts: int) -> int:
        return int(min(self.max_backoff_s, 2.0**attempts) * 1000)

    def flush(self, now_ms: int, *, limit: int = 200) -> FlushResult:
        """Send what is due at ``now_ms``. While another thread is sending, hand the work to it (it passes again
        with this ``now_ms``) and return an empty result."""
        with self._lock:
            if self._sending:
                self._again = max(now_ms, self._again or now_ms)
                return FlushResult()
            self._sending = True
        result = FlushResult()
        try:
            while True:
                self._pass(now_ms, limit, result)
                with self._lock:
                    if self._again is None:
                        self._sending = False
                        return result
                    now_ms, self._again = max(now_ms, self._again), None
        except BaseException:
            with self._lock:
                self._sending, self._again = False, None
            raise

    def _pass(self, now_ms: int, limit: int, result: FlushResult) -> None:
        blocked: set[str] = set()
        for row in queued(self.store, limit):
            am = row.alertmanager
            if am in blocked:
                continue
            if row.next_attempt_ms > now_ms:  # waiting out a backoff: later items of this AM wait too
                blocked.add(am)
                continue
            answer = self._post(am, row.payload)
            error = answer.error
            if error is None:
                mark_sent(self.store, row.id)
                result.sent += 1
            elif answer.rejected:
                log.error("alertmanager %s %s; dropping notification %d", am, error, row.id)
                mark_sent(self.store, row.id)
                result.dropped += 1
                result.errors[am] = error
            else:
                mark_failed(self.store, row.id, error, now_ms + self._backoff_ms(row.attempts + 1))
                result.failed += 1
                result.errors[am] = error
                blocked.add(am)

    def _post(self, am: str, payload: list[dict]) -> Answer:
        try:  # addressed directly, never through an env proxy
            resp = http.post_json(f"{am}/api/v2/alerts", payload, timeout_s=self.timeout_s)
        except ScrapeError as exc:
            return Answer(str(exc)[:300])
        if 200 <= resp.status < 300:
            return Answer()
        text = resp.body[:200].decode(errors="replace").strip()
        if 400 <= resp.status < 500 and resp.status not in (408, 429):
            return Answer(f"rejected with HTTP {resp.status}: {text}", rejected=True)
        return Answer(f"HTTP {resp.status}: {text}")
