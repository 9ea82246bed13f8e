"""Several threads flush one Notifier at once, as the daemon's rule-group threads and its notify job do: every outbox
row reaches the receiver once, in order, and a failed post is counted (and backed off) once.

The receiver is a real local HTTP server that counts the POSTs to /api/v2/alerts (a real Alertmanager would hide
duplicates: it deduplicates identical alerts before its webhook, so only a count of what reached it shows them).
The threads are released together by a barrier, no sleeps.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tuner.notify import Notifier
from tuner.store.alerts import enqueue, outbox_size, queued


class Receiver:
    """Counts every alert it is POSTed, in arrival order; answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.status, self.seen, self.lock = status, [], threading.Lock()
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                with recv.lock:
                    recv.seen += [a["labels"]["n"] for a in body]
                self.send_response(recv.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(status: int = 200) -> Receiver:
        made.append(Receiver(status))
        return made[-1]

    yield make
    for r in made:
        r.httpd.shutdown()
        r.httpd.server_close()


def _flush_at_once(notifier: Notifier, threads: int, now_ms: int) -> list:
    barrier, results, errors = threading.Barrier(threads), [], []

    def flush() -> None:
        barrier.wait(10)
        try:
            results.append(notifier.flush(now_ms))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    workers = [threading.Thread(target=flush) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors, errors
    return results


def test_threads_flushing_at_once_post_each_row_once_and_in_order(store, receiver):
    am = receiver()
    rows = 190  # under one flush's limit (200): every row is due in the first pass
    for n in range(rows):  # one alert a row, numbered in the order the evaluations queued them
        enqueue(store, am.url, [{"labels": {"alertname": "A", "n": str(n)}}], now_ms=1000)
    notifier = Notifier(store)
    results = _flush_at_once(notifier, threads=8, now_ms=2000)
    counts = Counter(am.seen)
    twice = sum(1 for c in counts.values() if c > 1)
    assert twice == 0, f"{twice}/{rows} rows posted more than once ({len(am.seen)} posts)"
    assert am.seen == [str(n) for n in range(rows)]  # every row, once, oldest first
    assert sum(r.sent for r in results) == rows and outbox_size(store) == 0


def test_threads_flushing_at_once_count_a_failure_once(store, receiver):
    """Alertmanager answers 503: its first row is posted once, backed off once (attempts 1, 2 s), and the rows
    behind it wait; before, each thread posted it and each added an attempt (the backoff grew with the threads)."""
    am = receiver(503)
    for n in range(5):
        enqueue(store, am.url, [{"labels": {"alertname": "A", "n": str(n)}}], now_ms=1000)
    results = _flush_at_once(Notifier(store), threads=8, now_ms=2000)
    assert am.seen == ["0"], am.seen
    first, *rest = queued(store)
    assert (first.attempts, first.next_attempt_ms) == (1, 2000 + 2000), first
    assert all(r.attempts == 0 for r in rest)
    assert sum(r.failed for r in results) == 1
