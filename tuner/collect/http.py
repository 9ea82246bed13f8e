"""tuner's one HTTP client: bounded requests with a total deadline and a body cap, so a slow or huge peer costs a
bounded amount. Scrapes, health checks, health gates, drains and Alertmanager notifications all go through it.

Its own HTTP/1.1 over a socket rather than requests or http.client: every read waits at most what is left of the
request's deadline, so a server that trickles bytes still hits it (requests' per-read timeout would wait
forever), and a scrape's two requests cost a fraction of http.client's CPU (its header parsing goes through the
email package; bench/results/). It speaks what servers answer a GET or a POST with: Content-Length,
chunked and close-delimited bodies, 1xx interim answers, keep-alive. tests/collect/test_http.py holds it equal to
http.client on the same answers. No proxy is ever used: targets, servers and Alertmanagers are addressed directly.
"""

from __future__ import annotations

import functools
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tuner.errors import ScrapeError

__all__ = ["Response", "Peer", "Peers", "peer_for", "get", "get_json", "post_json"]

_USER_AGENT = "tuner/0.1 (+https://github.com/tuner)"
_MAX_HEAD = 65536  # a status line and headers longer than this are not an answer a scraper should read
_READ = 65536


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str


def get(
    url: str, *, timeout_s: float, max_bytes: int, accept: str = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
) -> Response:
    """GET ``url``; raise ScrapeError on refusal, timeout, or a body over ``max_bytes``."""
    return _request("GET", url, None, {"Accept": accept}, timeout_s=timeout_s, max_bytes=max_bytes)


def post_json(
    url: str, payload: Any, *, timeout_s: float, max_bytes: int = 2**20, headers: Mapping[str, str] | None = None
) -> Response:
    """POST ``payload`` as JSON (with ``headers`` besides: a server's Authorization); any status comes back as a
    Response; ScrapeError as ``get``."""
    return _request(
        "POST",
        url,
        json.dumps(payload).encode(),
        {"Accept": "application/json", "Content-Type": "application/json", **(headers or {})},
        timeout_s=timeout_s,
        max_bytes=max_bytes,
    )


class Peer:
    """Requests to one server, one after another, over one kept-alive connection: a scrape's /metrics and
    /health (llama-server: /health, /metrics, /slots) cost one TCP connection instead of one each. Use it as a
    context manager; the connection closes at the end, unless the Peer is ``kept`` (Peers: the next scrape
    reuses it). Any failure closes it too, and a server that closed a kept-alive connection between two requests
    gets the request again on a fresh one (GETs only)."""

    def __init__(self, base_url: str, *, kept: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self.conn: _Connection | None = None
        self.kept = kept

    def get(
        self, path: str, *, timeout_s: float, max_bytes: int, accept: str = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
    ) -> Response:
        if self.conn is not None and self.conn.dropped():  # idle since an earlier scrape, and closed meanwhile
            self.close()
        reused = self.conn is not None
        try:
            return _request(
                "GET",
                self.base_url + path,
                None,
                {"Accept": accept},
                timeout_s=timeout_s,
                max_bytes=max_bytes,
                peer=self,
            )
        except _Stale:
            if not reused:
                raise ScrapeError(
                    f"{self.base_url}{path}: the server closed the connection without answering"
                ) from None
            return _request(
                "GET",
                self.base_url + path,
                None,
                {"Accept": accept},
                timeout_s=timeout_s,
                max_bytes=max_bytes,
                peer=self,
            )

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.kept:
            self.close()


class Peers:
    """Connections kept alive from one scrape of a target to the next, as Prometheus keeps its scrape connections:
    a scrape then costs no TCP connect and close (~5% of the daemon's CPU at 1,000 targets, bench/results/).
    One Peer per (target, base URL); a target's scrapes must not overlap (the daemon never runs two at once).
    A server that closed the idle connection (uvicorn after 5 s, llama-server's keep-alive timeout) is noticed
    before the next request, which goes on a fresh one."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], Peer] = {}
        self._lock = threading.Lock()

    def peer(self, target: str, base_url: str) -> Peer:
        found = self._by.get((target, base_url))
        if found is None:
            with self._lock:
                found = self._by.setdefault((target, base_url), Peer(base_url, kept=True))
        return found

    def close(self) -> None:
        with self._lock:
            peers, self._by = list(self._by.values()), {}
        for p in peers:
            p.close()


def peer_for(peers: Peers | None, target: str, base_url: str) -> Peer:
    """The target's kept Peer, or a Peer of one scrape when nothing is kept."""
    return peers.peer(target, base_url) if peers is not None else Peer(base_url)


class _Stale(ScrapeError):
    """The server closed the connection before a byte of answer: nothing was answered, a GET may be sent again."""


class _Timeout(Exception):
    pass


class _Connection:
    """One socket to one server and the bytes read past the last answer."""

    def __init__(self, scheme: str, host: str, port: int | None, timeout_s: float) -> None:
        port = port or (443 if scheme == "https" else 80)
        sock = socket.create_connection((host, port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock: socket.socket = sock
        self.buf = bytearray()  # appended in place: a long body costs its length, not its square

    def close(self) -> None:
        self.sock.close()

    def dropped(self) -> bool:
        """Between two answers: True when the server closed the connection (or sent what nothing asked for)."""
        if self.buf:
            return True
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        return bool(poll.poll(0))

    def fill(self, deadline: float) -> bool:
        """Read what has arrived into ``buf``, waiting at most until ``deadline``; False at the end of the stream."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(_READ)
        except TimeoutError:
            raise _Timeout from None
        self.buf += chunk
        return bool(chunk)


class _Answer:
    """What has been read of one answer so far (for the error messages)."""

    def __init__(self) -> None:
        self.started = False  # a byte of the answer arrived
        self.size = 0  # body bytes


def _head(conn: _Connection, deadline: float, answer: _Answer) -> tuple[str, int, dict[str, str]]:
    """The status line and headers of the next final (non-1xx) answer: (version, status, lower-cased headers)."""
    while True:
        start = 0
        while True:
            end = conn.buf.find(b"\n\r\n", start)
            # a bare-LF head ends earlier, or not at all: never search the body behind a CRLF head (52 KB a scrape)
            bare = conn.buf.find(b"\n\n", start, end + 1 if end >= 0 else len(conn.buf))
            if bare >= 0 and (end < 0 or bare < end):
                end, sep = bare, 2
            else:
                sep = 3
            if end >= 0:
                break
            if len(conn.buf) > _MAX_HEAD:
                raise ScrapeError(f"an answer whose headers exceed {_MAX_HEAD} bytes")
            start = max(0, len(conn.buf) - 2)
            if not conn.fill(deadline):
                if conn.buf:
                    raise ScrapeError("the server closed the connection in the middle of its headers")
                raise _Closed
            answer.started = True
        lines = conn.buf[:end].decode("latin-1").split("\n")
        conn.buf = conn.buf[end + sep :]
        first = lines[0].rstrip("\r")
        version, _, rest = first.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/") or len(code) != 3 or not code.isdigit():
            raise ScrapeError(f"not an HTTP answer: {first[:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.rstrip("\r").partition(":")
            if colon:
                key = name.strip().lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
        status = int(code)
        if 100 <= status < 200 and status != 101:
            continue  # an interim answer (100 Continue, 103 Early Hints): the final one follows
        return version, status, headers


class _Closed(Exception):
    """The stream ended before a byte of answer."""


def _body(
    conn: _Connection,
    method: str,
    status: int,
    headers: dict[str, str],
    *,
    deadline: float,
    max_bytes: int,
    url: str,
    answer: _Answer,
) -> tuple[bytes, bool]:
    """The answer's body and whether the stream ends with it (close-delimited)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b"", False
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _chunked(conn, deadline=deadline, max_bytes=max_bytes, url=url, answer=answer), False
    declared = headers.get("content-length")
    if declared is not None:
        declared = declared.split(",")[0].strip()  # a repeated header (", "-joined) carries the same number
        if not declared.isdigit():
            raise ScrapeError(f"{url}: a Content-Length that is not a number: {headers['content-length']!r}")
        n = int(declared)
        if n > max_bytes:
            raise ScrapeError(
                f"{url}: body of {n} bytes exceeds max_body_bytes={max_bytes}; "
                "raise defaults.max_body_bytes if this target is really that large"
            )
        while len(conn.buf) < n:
            answer.size = len(conn.buf)
            if not conn.fill(deadline):
                raise ScrapeError(f"{url}: the server closed the connection after {len(conn.buf)} of its {n} bytes")
        body, conn.buf = bytes(conn.buf[:n]), conn.buf[n:]
        return body, False
    while True:  # no length: the body runs to the end of the stream
        answer.size = len(conn.buf)
        if len(conn.buf) > max_bytes:
            raise _too_big(url, max_bytes)
        if not conn.fill(deadline):
            body, conn.buf = bytes(conn.buf), bytearray()
            return body, True


def _too_big(url: str, max_bytes: int) -> ScrapeError:
    return ScrapeError(
        f"{url}: body exceeds max_body_bytes={max_bytes}; raise defaults.max_body_bytes if this "
        "target is really that large"
    )


def _chunked(conn: _Connection, *, deadline: float, max_bytes: int, url: str, answer: _Answer) -> bytes:
    parts: list[bytes] = []
    while True:
        while (eol := conn.buf.find(b"\n")) < 0:
            if len(conn.buf) > _MAX_HEAD:
                raise ScrapeError(f"{url}: a chunk size line longer than {_MAX_HEAD} bytes")
            if not conn.fill(deadline):
                raise ScrapeError(f"{url}: the server closed the connection in the middle of a chunked body")
        size_text = conn.buf[:eol].split(b";")[0].strip()
        conn.buf = conn.buf[eol + 1 :]
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ScrapeError(f"{url}: a bad chunk size {size_text[:20]!r}") from None
        if size < 0:
            raise ScrapeError(f"{url}: a bad chunk size {size_text[:20]!r}")
        if size == 0:  # the last chunk; then trailers up to an empty line
            while True:
                while (eol := conn.buf.find(b"\n")) < 0:
                    if len(conn.buf) > _MAX_HEAD:
                        raise ScrapeError(f"{url}: trailers longer than {_MAX_HEAD} bytes")
                    if not conn.fill(deadline):
                        return b"".join(parts)  # a server that hangs up after the last chunk: the body is whole
                line, conn.buf = conn.buf[:eol], conn.buf[eol + 1 :]
                if not line.strip():
                    return b"".join(parts)
        answer.size += size
        if answer.size > max_bytes:
            raise _too_big(url, max_bytes)
        while len(conn.buf) < size + 1:
            if not conn.fill(deadline):
                raise ScrapeError(f"{url}: the server closed the connection in the middle of a chunked body")
        parts.append(bytes(conn.buf[:size]))
        rest = conn.buf[size:]
        while not (rest.startswith(b"\r\n") or rest.startswith(b"\n")):
            if len(rest) >= 2:
                raise ScrapeError(f"{url}: a chunk longer than its size line says")
            if not conn.fill(deadline):
                raise ScrapeError(f"{url}: the server closed the connection in the middle of a chunked body")
            rest = conn.buf[size:]
        conn.buf = rest[2:] if rest.startswith(b"\r\n") else rest[1:]


def _keeps_alive(version: str, headers: dict[str, str]) -> bool:
    tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
    if "close" in tokens:
        return False
    return version != "HTTP/1.0" or "keep-alive" in tokens


@functools.lru_cache(maxsize=4096)
def _split(url: str) -> tuple[str, str, int | None, str, str]:
    """(scheme, host name, port, Host header, path with query) of ``url`` (a target's URLs repeat every scrape)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError(f"{url}: not an http(s) URL")
    try:
        port = parts.port
    except ValueError as exc:  # "Port out of range 0-65535", a port that is not a number
        raise ScrapeError(f"{url}: ValueError: {exc}") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port, parts.netloc.rpartition("@")[2], path


def _request(
    method: str,
    url: str,
    body: bytes | None,
    headers: dict[str, str],
    *,
    timeout_s: float,
    max_bytes: int,
    peer: Peer | None = None,
) -> Response:
    scheme, hostname, port, host, path = _split(url)
    deadline = time.monotonic() + timeout_s
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity", f"User-Agent: {_USER_AGENT}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    conn = peer.conn if peer is not None else None
    answer = _Answer()
    kept = False
    try:
        if conn is None:
            try:
                conn = _Connection(scheme, hostname, port, timeout_s)
            except TimeoutError:
                raise _Timeout from None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        conn.sock.settimeout(remaining)
        try:
            conn.sock.sendall(request)
        except TimeoutError:
            raise _Timeout from None
        version, status, got = _head(conn, deadline, answer)
        data, closes = _body(conn, method, status, got, deadline=deadline, max_bytes=max_bytes, url=url, answer=answer)
        kept = peer is not None and not closes and _keeps_alive(version, got)
        return Response(status, data, got.get("content-type", ""))
    except _Closed:
        if peer is not None:
            raise _Stale(url) from None
        raise ScrapeError(f"{url}: the server closed the connection without answering") from None
    except (BrokenPipeError, ConnectionResetError) if peer is not None and not answer.started else ():  # noqa: B030
        raise _Stale(url) from None
    except _Timeout:
        read = f" ({answer.size} bytes read)" if answer.started else ""
        raise ScrapeError(
            f"{url}: no complete answer within {timeout_s:g}s{read}; the server is slow or hung"
        ) from None
    except ScrapeError as exc:
        if str(exc).startswith(url):
            raise
        raise ScrapeError(f"{url}: {exc}") from None
    except ConnectionRefusedError:
        raise ScrapeError(f"{url}: connection refused; is the server running on that port?") from None
    except TimeoutError:
        raise ScrapeError(f"{url}: no complete answer within {timeout_s:g}s; the server is slow or hung") from None
    except (OSError, ValueError) as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    finally:
        if kept:
            assert peer is not None
            peer.conn = conn
        else:
            if conn is not None:
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
