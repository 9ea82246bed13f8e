"""Deliver queued notifications to Alertmanager (API v2), in order, retrying with backoff while one is down.

Evaluation writes what to send into the store's outbox in the same transaction as the alert state,
so a notification is never lost across a restart. ``flush`` posts each Alertmanager's items oldest
first and stops at the first failure, so a "resolved" never overtakes its "firing". An item leaves
the outbox only when Alertmanager answered 2xx (or 4xx: it rejected the payload, and retrying the
same bytes cannot help; that is logged).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import requests
from sqlalchemy import select

from tuner.store.alerts import OutboxRow, mark_failed, mark_sent
from tuner.store.store import Store

__all__ = ["Notifier", "FlushResult"]

log = logging.getLogger("tuner.notify")


@dataclass
class FlushResult:
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # alertmanager -> last error


class Notifier:
    def __init__(self, store: Store, *, timeout_s: float = 5.0, max_backoff_s: float = 300.0) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.session = requests.Session()
        self.session.trust_env = False  # Alertmanager is addressed directly, not through an env proxy

    def _backoff_ms(self, attempts: int) -> int:
        return int(min(self.max_backoff_s, 2.0 ** attempts) * 1000)

    def flush(self, now_ms: int, *, limit: int = 200) -> FlushResult:
        result = FlushResult()
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(OutboxRow).order_by(OutboxRow.id).limit(limit)).all()
        blocked: set[str] = set()
        for row in rows:
            am = row.alertmanager
            if am in blocked:
                continue
            if row.next_attempt_ms > now_ms:  # waiting out a backoff: later items of this AM wait too
                blocked.add(am)
                continue
            error = self._post(am, json.loads(row.payload))
            if error is None:
                mark_sent(self.store, row.id)
                result.sent += 1
            elif error.startswith("rejected"):
                log.error("alertmanager %s %s; dropping notification %d", am, error, row.id)
                mark_sent(self.store, row.id)
                result.dropped += 1
                result.errors[am] = error
            else:
                mark_failed(self.store, row.id, error, now_ms + self._backoff_ms(row.attempts + 1))
                result.failed += 1
                result.errors[am] = error
                blocked.add(am)
        return result

    def _post(self, am: str, payload: list[dict]) -> str | None:
        """None on success, else why (prefixed "rejected" for a 4xx that retrying cannot fix)."""
        try:
            resp = self.session.post(f"{am}/api/v2/alerts", json=payload, timeout=self.timeout_s)
        except requests.RequestException as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        if 200 <= resp.status_code < 300:
            return None
        text = resp.text[:200].strip()
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            return f"rejected with HTTP {resp.status_code}: {text}"
        return f"HTTP {resp.status_code}: {text}"
