"""Serve a recorded exposition whose counters and histograms advance on every scrape.

For tests and benchmarks that need many live-looking endpoints without many real servers: each
GET /metrics returns the recorded text with every counter, bucket, _count and _sum grown by
``growth`` times its recorded value per scrape (so buckets stay cumulative), gauges as recorded. A value
recorded whole (a count) stays whole, rounded, as a server's counts are.
"""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["ReplayExposition", "ReplayServer"]

_SAMPLE = re.compile(r"^(?P<head>[^#\s][^ ]*(?:\{.*\})?) (?P<value>\S+)(?P<tail>.*)$")
_GROWS = ("_total", "_bucket", "_count", "_sum")


class ReplayExposition:
    def __init__(self, text: str, growth: float = 0.01) -> None:
        self.parts: list[tuple[str, float, bool]] = []  # (line head, recorded value, grows)
        self._whole: set[int] = set()  # indexes of the growing parts recorded as whole numbers
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if not m or m.group("tail").strip():
                self.parts.append((line, 0.0, False))
                continue
            name = m.group("head").split("{", 1)[0]
            try:
                value = float(m.group("value"))
            except ValueError:
                self.parts.append((line, 0.0, False))
                continue
            grows = name.endswith(_GROWS) and not name.endswith("_created")
            if grows and value.is_integer():
                self._whole.add(len(self.parts))
            self.parts.append((m.group("head") + " ", value, grows))
        self.growth = growth
        self.scrapes = 0
        self._lock = threading.Lock()

    def render(self) -> bytes:
        with self._lock:
            n = self.scrapes
            self.scrapes += 1
        k = 1.0 + self.growth * n
        out = []
        for i, (head, value, grows) in enumerate(self.parts):
            if head.endswith(" "):
                if not grows:
                    grown = value
                elif i in self._whole:
                    grown = value + n * max(1, round(value * self.growth)) if value > 0 else value
                else:
                    grown = value * k
                out.append(f"{head}{grown!r}")
            else:
                out.append(head)
        return ("\n".join(out) + "\n").encode()


class ReplayServer:
    """A ThreadingHTTPServer on 127.0.0.1 serving /metrics (and /health 200) from a ReplayExposition."""

    def __init__(self, exposition: ReplayExposition, port: int = 0) -> None:
        self.exposition = expo = exposition

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/metrics":
                    body, ctype = expo.render(), "text/plain; version=0.0.4; charset=utf-8"
                elif self.path == "/health":
                    body, ctype = b"", "text/plain"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ReplayServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
