"""The bounded GET: a total deadline and a body cap, against real local servers that misbehave."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from tests.helpers import VLLM_DIR, Route, serve, wait_until
from tuner.collect import http, vllm
from tuner.errors import ScrapeError

MB = 1 << 20
# A deadline is a correctness bound: the call must return within the timeout plus scheduling slack.
SLACK_S = 1.5


def test_ok_body_status_and_content_type() -> None:
    body = (VLLM_DIR / "metrics_idle.txt").read_bytes()
    with serve({"/metrics": Route(body=body, content_type="text/plain; version=0.0.4")}) as url:
        resp = http.get(f"{url}/metrics", timeout_s=5, max_bytes=len(body))
    assert (resp.status, resp.body, resp.content_type) == (200, body, "text/plain; version=0.0.4")


def test_query_string_reaches_the_server() -> None:
    with serve({"/slots": Route(body=b"[]")}) as url:
        resp = http.get(f"{url}/slots?fail_on_no_slot=1", timeout_s=5, max_bytes=100)
    assert resp.body == b"[]"


def test_http_error_is_returned_as_a_status() -> None:
    with serve({"/metrics": Route(status=500, body=b"Internal Server Error: engine dead")}) as url:
        resp = http.get(f"{url}/metrics", timeout_s=5, max_bytes=MB)
    assert (resp.status, resp.body) == (500, b"Internal Server Error: engine dead")


def test_vllm_scrape_turns_an_http_error_into_a_scrape_error() -> None:
    with serve({"/metrics": Route(status=500, body=b"Internal Server Error: engine dead")}) as url:
        with pytest.raises(ScrapeError) as info:
            vllm.scrape(url, target="gpu-box", timeout_s=5, max_bytes=MB)
    assert str(info.value) == f"{url}/metrics answered HTTP 500: 'Internal Server Error: engine dead'"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_connection_refused() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    with pytest.raises(ScrapeError, match="connection refused; is the server running on that port"):
        http.get(url, timeout_s=5, max_bytes=MB)


def test_not_an_http_url() -> None:
    with pytest.raises(ScrapeError, match="not an http"):
        http.get("ftp://127.0.0.1/metrics", timeout_s=1, max_bytes=MB)


def _timed_get(url: str, timeout_s: float) -> tuple[ScrapeError, float]:
    start = time.monotonic()
    with pytest.raises(ScrapeError) as info:
        http.get(url, timeout_s=timeout_s, max_bytes=MB)
    return info.value, time.monotonic() - start


def test_server_that_never_answers_hits_the_deadline() -> None:
    with serve({"/metrics": Route(delay_s=60, body=b"late")}) as url:
        err, took = _timed_get(f"{url}/metrics", timeout_s=1.0)
    assert "no complete answer within 1s" in str(err)
    assert took < 1.0 + SLACK_S


def test_listener_that_never_accepts_hits_the_deadline() -> None:
    with socket.socket() as listener:  # the kernel completes the handshake; nobody ever reads
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        err, took = _timed_get(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", timeout_s=1.0)
    assert "no complete answer within 1s" in str(err)
    assert took < 1.0 + SLACK_S


def test_trickling_server_hits_the_total_deadline() -> None:
    # 1 byte every 0.2 s: each read succeeds, so only a total deadline stops it (the body needs 20 s)
    route = Route(body=b"x" * 100, trickle=(1, 0.2))
    with serve({"/metrics": route}) as url:
        err, took = _timed_get(f"{url}/metrics", timeout_s=1.0)
    assert "no complete answer within 1s" in str(err)
    assert took < 1.0 + SLACK_S
    assert 0 < route.bytes_sent < 100


def _fifty_mb() -> Iterator[bytes]:
    chunk = b"# padding padding padding padding padding padding padding padding padding padding\n" * 800
    sent = 0
    while sent < 50 * MB:
        yield chunk
        sent += len(chunk)


@pytest.mark.parametrize("declared", [None, 50 * MB], ids=["no-content-length", "content-length"])
def test_huge_body_is_refused_without_reading_it_all(declared: int | None) -> None:
    route = Route(stream=_fifty_mb, content_length=declared)
    with serve({"/metrics": route}) as url:
        with pytest.raises(ScrapeError) as info:
            http.get(f"{url}/metrics", timeout_s=10, max_bytes=1 * MB)
        assert wait_until(route.finished.is_set, timeout_s=10)  # the server saw the client hang up
    assert f"max_body_bytes={MB}" in str(info.value)
    if declared is not None:
        assert f"body of {declared} bytes" in str(info.value)  # refused on the header alone
    # the client stopped after ~1 MB; the rest of the 50 MB was never sent (socket buffers aside)
    assert route.bytes_sent < 10 * MB


def test_body_exactly_at_the_cap_is_accepted() -> None:
    body = b"a 1\n" * 1000
    with serve({"/metrics": Route(body=body)}) as url:
        assert http.get(f"{url}/metrics", timeout_s=5, max_bytes=len(body)).body == body
        with pytest.raises(ScrapeError, match=f"exceeds max_body_bytes={len(body) - 1}"):
            http.get(f"{url}/metrics", timeout_s=5, max_bytes=len(body) - 1)


class _RawServer:
    """A listening socket on 127.0.0.1 whose connections, one at a time, go to ``handle``."""

    def __init__(self) -> None:
        import threading

        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()


class _KeepAliveServer(_RawServer):
    """A raw HTTP/1.1 server that counts connections and requests; ``close_after`` answers per connection, then
    it closes the socket without saying so (as a server whose keep-alive timer fired would)."""

    def __init__(self, close_after: int | None = None) -> None:
        self.connections = 0
        self.closed = 0
        self.requests: list[str] = []
        self.close_after = close_after
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        self.connections += 1
        self._serve(conn)
        self.closed += 1

    def _serve(self, conn: socket.socket) -> None:
        buf, answered = b"", 0
        with conn:
            while self.close_after is None or answered < self.close_after:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    path = head.split(b" ")[1].decode()
                    self.requests.append(path)
                    body = (VLLM_DIR / "metrics_idle.txt").read_bytes() if path == "/metrics" else b""
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(body), body)
                    )
                    answered += 1


def test_a_scrape_asks_metrics_and_health_over_one_connection() -> None:
    server = _KeepAliveServer()
    try:
        snap = vllm.scrape(server.url, target="t", timeout_s=3, max_bytes=MB)
        assert snap.healthy is True and snap.engines
        assert server.requests == ["/metrics", "/health"] and server.connections == 1
        vllm.scrape(server.url, target="t", timeout_s=3, max_bytes=MB)  # the next scrape: its own connection
        assert server.connections == 2
    finally:
        server.close()


def test_a_kept_alive_connection_the_server_dropped_is_asked_again_on_a_fresh_one() -> None:
    server = _KeepAliveServer(close_after=1)  # answers /metrics, then drops the connection silently
    try:
        with http.Peer(server.url) as peer:
            assert peer.get("/metrics", timeout_s=3, max_bytes=MB).status == 200
            assert wait_until(lambda: server.closed == 1)  # the server dropped it; our side does not know yet
            assert peer.get("/health", timeout_s=3, max_bytes=MB).status == 200
        assert server.requests == ["/metrics", "/health"] and server.connections == 2
    finally:
        server.close()


def test_kept_peers_scrape_over_one_connection_from_one_scrape_to_the_next() -> None:
    """The daemon's Peers: a target's scrapes reuse its connection (as Prometheus's do); closed, they let it go."""
    server = _KeepAliveServer()
    peers = http.Peers()
    try:
        for _ in range(3):
            assert vllm.scrape(server.url, target="t", timeout_s=3, max_bytes=MB, peers=peers).healthy is True
        assert server.requests == ["/metrics", "/health"] * 3 and server.connections == 1
        peers.close()
        assert wait_until(lambda: server.closed == 1)
    finally:
        server.close()


def test_a_kept_connection_the_server_closed_while_idle_is_replaced_before_the_next_scrape() -> None:
    """uvicorn (vLLM) closes an idle connection after 5 s, llama-server after its keep-alive timeout: the next
    scrape notices and asks on a fresh connection, every request once, no error."""
    server = _KeepAliveServer(close_after=2)  # one scrape's two answers, then it drops the connection silently
    peers = http.Peers()
    try:
        vllm.scrape(server.url, target="t", timeout_s=3, max_bytes=MB, peers=peers)
        assert wait_until(lambda: server.closed == 1)
        peer = peers.peer("t", server.url)
        assert peer.conn is not None and peer.conn.dropped()
        snap = vllm.scrape(server.url, target="t", timeout_s=3, max_bytes=MB, peers=peers)
        assert snap.healthy is True and snap.engines
        assert server.requests == ["/metrics", "/health"] * 2 and server.connections == 2
    finally:
        peers.close()
        server.close()


def test_a_peer_that_closes_after_every_answer_still_gets_each_request_once() -> None:
    with serve({"/metrics": Route(body=b"m"), "/health": Route(body=b"")}) as url:  # HTTP/1.0: closes each time
        with http.Peer(url) as peer:
            assert peer.get("/metrics", timeout_s=3, max_bytes=MB).body == b"m"
            assert peer.get("/health", timeout_s=3, max_bytes=MB).status == 200


# ---- the same answers read by http.client (the standard library's HTTP/1.1 client) --------------------------

_ANSWERS = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 5\r\n\r\nhello",
    "chunked, extensions, trailer": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: a/b\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n"
    ),
    "chunked wins over a length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    ),
    "HTTP/1.0, no length: to the close": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nbody until close\n",
    "1.1, Connection: close, no length": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nxyz",
    "100 Continue first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "204": b"HTTP/1.1 204 No Content\r\nContent-Type: x\r\n\r\n",
    "bare LF lines": b"HTTP/1.1 200 OK\nContent-Length: 3\nContent-Type: t\n\nabc",
    "header case and spacing": b"HTTP/1.1 503 Service Unavailable\r\ncontent-length:  4\r\nCONTENT-TYPE:j\r\n\r\ndown",
    "a long body": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (3 * MB, b"m" * (3 * MB)),
    "a long chunked body": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (n, b"c" * n) for n in range(1, 3000, 7))
    + b"0\r\n\r\n",
}


class _Canned(_RawServer):
    """Answers every connection's first request with ``answer`` (sent in small pieces), then closes it."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    break
                buf += data
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                for i in range(0, len(self.answer), 997):  # pieces that split lines, sizes and bodies
                    conn.sendall(self.answer[i : i + 997])
            except (BrokenPipeError, ConnectionResetError):
                pass  # a client that stopped reading (over its cap)


@pytest.mark.parametrize("answer", list(_ANSWERS.values()), ids=list(_ANSWERS))
def test_each_answer_reads_as_http_client_reads_it(answer: bytes) -> None:
    import http.client as stdlib

    server = _Canned(answer)
    try:
        ours = http.get(f"http://127.0.0.1:{server.port}/metrics", timeout_s=5, max_bytes=4 * MB)
        reference = stdlib.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            reference.request("GET", "/metrics")
            r = reference.getresponse()
            theirs = (r.status, r.read(), r.getheader("Content-Type") or "")
        finally:
            reference.close()
    finally:
        server.close()
    assert (ours.status, ours.body, ours.content_type) == theirs
    assert theirs[1] or theirs[0] == 204  # the case has a body to compare (a silent empty read would pass)


@pytest.mark.parametrize(
    ("answer", "max_bytes", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", MB, "closed the connection after 3 of its 10 bytes"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", MB, "not an HTTP answer: 'SSH-2.0-OpenSSH_9.2'"),
        (_ANSWERS["a long chunked body"], 1000, "exceeds max_body_bytes=1000"),
    ],
    ids=["a body cut short", "not HTTP", "a chunked body over the cap"],
)
def test_a_bad_answer_is_an_error_that_says_what_was_wrong(answer: bytes, max_bytes: int, error: str) -> None:
    server = _Canned(answer)
    try:
        with pytest.raises(ScrapeError, match=error):
            http.get(f"http://127.0.0.1:{server.port}/metrics", timeout_s=5, max_bytes=max_bytes)
    finally:
        server.close()


def test_https_verifies_the_server_certificate_as_http_client_does(tmp_path, monkeypatch) -> None:
    import shutil
    import ssl
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    if shutil.which("openssl") is None:
        pytest.skip("openssl (the command) makes the test's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"vllm:x 1\n")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://localhost:{server.server_address[1]}/metrics"
    try:
        with pytest.raises(ScrapeError, match="CERTIFICATE_VERIFY_FAILED"):  # self-signed, not trusted
            http.get(url, timeout_s=5, max_bytes=MB)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted the way OpenSSL is told to
        assert http.get(url, timeout_s=5, max_bytes=MB).body == b"vllm:x 1\n"
    finally:
        server.shutdown()
        server.server_close()
