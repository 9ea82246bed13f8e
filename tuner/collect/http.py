"""tuner's one HTTP client: bounded requests with a total deadline and a body cap, so a slow or huge peer costs a
bounded amount. Scrapes, health checks, health gates, drains and Alertmanager notifications all go through it.

http.client rather than requests: its ``read1`` returns whatever has arrived, so a server that
trickles bytes still hits the deadline (requests' per-read timeout would wait forever). No proxy is ever used:
targets, servers and Alertmanagers are addressed directly.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tuner.errors import ScrapeError

__all__ = ["Response", "Peer", "get", "get_json", "post_json"]

_USER_AGENT = "tuner/0.1 (+https://github.com/tuner)"


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str


def get(url: str, *, timeout_s: float, max_bytes: int,
        accept: str = "text/plain;version=0.0.4;q=1,*/*;q=0.1") -> Response:
    """GET ``url``; raise ScrapeError on refusal, timeout, or a body over ``max_bytes``."""
    return _request("GET", url, None, {"Accept": accept}, timeout_s=timeout_s, max_bytes=max_bytes)


def post_json(url: str, payload: Any, *, timeout_s: float, max_bytes: int = 2**20) -> Response:
    """POST ``payload`` as JSON; any status comes back as a Response; ScrapeError as ``get``."""
    return _request("POST", url, json.dumps(payload).encode(),
                    {"Accept": "application/json", "Content-Type": "application/json"},
                    timeout_s=timeout_s, max_bytes=max_bytes)


class Peer:
    """Requests to one server, one after another, over one kept-alive connection: a scrape's /metrics and
    /health (llama-server: /health, /metrics, /slots) cost one TCP connection instead of one each. Use it as a
    context manager; the connection closes at the end. Any failure closes it too, and a server that closed a
    kept-alive connection between two requests gets the request again on a fresh one (GETs only)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str, *, timeout_s: float, max_bytes: int,
            accept: str = "text/plain;version=0.0.4;q=1,*/*;q=0.1") -> Response:
        reused = self.conn is not None and self.conn.sock is not None
        try:
            return _request("GET", self.base_url + path, None, {"Accept": accept}, timeout_s=timeout_s,
                            max_bytes=max_bytes, peer=self)
        except _Stale:
            if not reused:
                raise ScrapeError(f"{self.base_url}{path}: the server closed the connection without answering")
            return _request("GET", self.base_url + path, None, {"Accept": accept}, timeout_s=timeout_s,
                            max_bytes=max_bytes, peer=self)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Stale(ScrapeError):
    """A kept-alive connection the server had closed: nothing was answered, the request may be sent again."""


def _request(method: str, url: str, body: bytes | None, headers: dict[str, str], *, timeout_s: float,
             max_bytes: int, peer: Peer | None = None) -> Response:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError(f"{url}: not an http(s) URL")
    deadline = time.monotonic() + timeout_s
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = peer.conn if peer is not None and peer.conn is not None else conn_cls(parts.hostname, parts.port,
                                                                                   timeout=timeout_s)
    conn.timeout = timeout_s
    if conn.sock is not None:
        conn.sock.settimeout(timeout_s)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    resp: http.client.HTTPResponse | None = None
    kept = False
    try:
        conn.request(method, path, body=body, headers={**headers, "User-Agent": _USER_AGENT})
        resp = conn.getresponse()
        declared = resp.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise ScrapeError(f"{url}: body of {int(declared)} bytes exceeds max_body_bytes={max_bytes}; "
                              "raise defaults.max_body_bytes if this target is really that large")
        chunks, size = [], 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ScrapeError(f"{url}: no complete answer within {timeout_s:g}s "
                                  f"({size} bytes read); the server is slow or hung")
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise ScrapeError(f"{url}: body exceeds max_body_bytes={max_bytes}; raise "
                                  "defaults.max_body_bytes if this target is really that large")
            chunks.append(chunk)
        kept = peer is not None and not resp.will_close
        return Response(resp.status, b"".join(chunks), resp.getheader("Content-Type") or "")
    except ScrapeError:
        raise
    except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) if peer is not None else ():
        raise _Stale(url) from None
    except ConnectionRefusedError:
        raise ScrapeError(f"{url}: connection refused; is the server running on that port?") from None
    except (socket.timeout, TimeoutError):
        raise ScrapeError(f"{url}: no complete answer within {timeout_s:g}s; the server is slow or hung") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    finally:
        if resp is not None:  # its file object keeps the socket open after conn.close()
            resp.close()
        if kept:
            assert peer is not None
            peer.conn = conn
        else:
            conn.close()
            if peer is not None:
                peer.conn = None


def get_json(url: str, *, timeout_s: float, max_bytes: int = 2**20) -> Any | None:
    """GET a JSON document: the parsed body on 200, None on any other status or a body that is not JSON;
    ScrapeError when the server cannot be reached in time (as ``get``)."""
    resp = get(url, timeout_s=timeout_s, max_bytes=max_bytes, accept="application/json")
    if resp.status != 200:
        return None
    try:
        return json.loads(resp.body)
    except ValueError:
        return None
