"""tuner's HTTP listener: ``/metrics``, a read-only JSON view of the journal, and token-protected actions.

    GET  /metrics                                   tuner's own exposition (metrics.py)
    GET  /api/v1/journal[?target=T]                 the apply journal, newest first (read-only)
    GET  /api/v1/recommendations[?target=T]         stored recommendations (read-only)
    POST /api/v1/recommendations/{id}/apply         apply one (202: started; `tuner journal` follows it)
    POST /api/v1/targets/{name}/rollback            roll a target back (202)

An action is opened in the journal before the answer: 202 means its entry holds the target (its id is in the answer);
409 is the refusal, decided then (the target or its replica group is held by another apply, which the error names;
the recommendation is not proposed; nothing to roll back). Of two requests at the same instant one gets 202.

Anything that changes state needs ``Authorization: Bearer <token>``; the token comes from ``api.token_file`` or
``$TUNER_API_TOKEN`` and is compared in constant time. Without a configured token those endpoints answer 403:
tuner never runs unauthenticated actions. The listener binds to 127.0.0.1 unless ``listen`` says otherwise.
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
import re
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tuner.app import apply as apply_app
from tuner.app.recommend import stored
from tuner.errors import ApplyError, ConfigError, TunerError

__all__ = ["serve", "ApiServer", "MAX_CONNECTIONS", "REQUEST_TIMEOUT_S"]

log = logging.getLogger("tuner.api")
_MAX_BODY = 64 * 1024
_APPLY = re.compile(r"^/api/v1/recommendations/(\d{1,12})/apply\Z")
_ROLLBACK = re.compile(r"^/api/v1/targets/([A-Za-z0-9][A-Za-z0-9_.-]{0,62})/rollback\Z")


# At most this many connections are served at once; one more is answered 503 at once and closed (a thread per
# connection, unbounded, held 600 threads for 600 half-sent requests). A scrape of /metrics takes milliseconds.
MAX_CONNECTIONS = 32
# A connection that sends nothing for this long is dropped (per read: a request arrives in one go).
REQUEST_TIMEOUT_S = 10.0
_BUSY_BODY = b'{"error": "too many connections; try again"}\n'
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the kernel's backlog of connections not yet accepted

    def __init__(
        self,
        addr: tuple[str, int],
        registry: CollectorRegistry,
        daemon: Any | None,
        token: str | None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        if ":" in addr[0]:  # an IPv6 address (config's listen: "[::1]:9464")
            self.address_family = socket.AF_INET6
        super().__init__(addr, _Handler)
        self.registry, self.tuner, self.token = registry, daemon, token
        self.actions: list[threading.Thread] = []
        self.request_timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0  # connections answered 503 because every slot was taken

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection while a slot is free; else 503 now (never blocks the accept loop)."""
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line, not socketserver's traceback on stderr (a client that went away, a bug in a handler)."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.debug("api: connection from %s: %r", client_address[0], exc)
        else:
            log.error("api: request from %s failed: %r", client_address[0], exc)


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer
    server_version = "tuner"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout_s)  # every read and write of this connection

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.client_address[0], *args)

    def _send(
        self, status: int, body: bytes, ctype: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, (json.dumps(obj, default=str) + "\n").encode(), headers=headers)

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        named = parse_qs(url.query).get("target")
        target = named[0] if named else None
        if url.path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
            return
        d = self.server.tuner
        if d is None or not url.path.startswith("/api/v1/"):
            self._json(404, {"error": f"no such endpoint: {url.path}"})
            return
        try:
            if url.path == "/api/v1/journal":
                self._json(200, [a.as_json() for a in apply_app.journal(d.session, target, limit=100)])
            elif url.path == "/api/v1/recommendations":
                self._json(200, [r.as_json() for r in stored(d.store, target=target)])
            elif _APPLY.match(url.path) or _ROLLBACK.match(url.path):
                self._json(405, {"error": "use POST"}, {"Allow": "POST"})
            else:
                self._json(404, {"error": f"no such endpoint: {url.path}"})
        except TunerError as exc:
            self._json(500, {"error": str(exc)})

    do_HEAD = do_GET

    def _authorized(self) -> bool:
        token = self.server.token
        if not token:
            self._json(
                403,
                {
                    "error": "state-changing endpoints are disabled: set api.token_file in the config "
                    "or TUNER_API_TOKEN, then send Authorization: Bearer <token>"
                },
            )
            return False
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            self._json(401, {"error": "missing Authorization: Bearer <token>"}, {"WWW-Authenticate": "Bearer"})
            return False
        if not hmac.compare_digest(given[7:].strip().encode(), token.encode()):
            self._json(403, {"error": "wrong token"})
            return False
        return True

    def do_POST(self) -> None:  # noqa: N802
        self.close_connection = True  # one request per connection: an unread body never reads as the next one
        if "Transfer-Encoding" in self.headers:
            self._json(400, {"error": "no endpoint takes a body; send none (Transfer-Encoding is not accepted)"})
            return
        given = self.headers.get("Content-Length", "0").strip() or "0"
        if not given.isascii() or not given.isdigit():  # "-1" read to the end of the stream; "abc" raised
            self._json(400, {"error": f"Content-Length {given[:20]!r} is not a number of bytes"})
            return
        length = int(given)
        if length > _MAX_BODY:
            self._json(413, {"error": f"body over {_MAX_BODY} bytes"})
            return
        if length:
            self.rfile.read(length)  # no endpoint takes a body; drained (within the socket timeout) before answering
        path = urlsplit(self.path).path
        apply, rollback = _APPLY.match(path), _ROLLBACK.match(path)
        if not (apply or rollback) or self.server.tuner is None:
            self._json(404, {"error": f"no such endpoint: {path}"})
            return
        if not self._authorized():
            return
        d = self.server.tuner
        try:
            if apply:
                opened = apply_app.start(d.applier, rec_id=int(apply.group(1)), mode="api")
            else:
                assert rollback is not None
                opened = apply_app.start(d.applier, target=rollback.group(1), mode="api")
        except ApplyError as exc:  # busy, not proposed, nothing to roll back, stale, the restart budget
            self._json(409, {"error": str(exc)})
            return
        except TunerError as exc:  # no such recommendation or target
            self._json(404, {"error": str(exc)})
            return
        thread = threading.Thread(target=_run, args=(opened.what, opened.run), name=opened.what, daemon=True)
        self.server.actions.append(thread)
        thread.start()
        log.warning("api: %s started by %s (apply #%d)", opened.what, self.client_address[0], opened.id)
        self._json(
            202, {"started": opened.what, "apply_id": opened.id, "follow": f"/api/v1/journal?target={opened.target}"}
        )


def _run(what: str, action: Callable[[], Any]) -> None:
    try:
        a = action()
        log.warning("api: %s: %s %s", what, a.outcome, a.note)  # the daemon's log filter redacts credentials
    except TunerError as exc:
        log.error("api: %s: %s", what, exc)
    except Exception:  # noqa: BLE001
        log.exception("api: %s failed", what)


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    daemon: Any | None = None,
    token: str | None = None,
    max_connections: int = MAX_CONNECTIONS,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> tuple[ApiServer, threading.Thread]:
    """Start the listener in a thread; returns (server, thread). ``daemon`` enables the /api/v1 endpoints.
    ConfigError naming ``listen`` when the address cannot be bound (in use, not this host's)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        httpd = ApiServer((host, port), registry, daemon, token, max_connections=max_connections, timeout_s=timeout_s)
    except OSError as exc:
        hint = (
            "another process listens there (another tuner?): stop it or choose another port"
            if exc.errno == errno.EADDRINUSE
            else "check the address"
        )
        raise ConfigError("config", "listen", f"cannot listen on {where}: {exc.strerror or exc}; {hint}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="tuner-http", daemon=True)
    thread.start()
    return httpd, thread
