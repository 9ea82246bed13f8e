"""tuner's listener against hostile clients, over real sockets (issue 39, item 10): bad Content-Length headers are a
400 at once, a connection that sends nothing is dropped after the timeout, and connections past the pool's size
are answered 503 at once instead of each holding a thread."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from tuner.daemon.http_api import serve
from tuner.lab.proc import wait_for


@pytest.fixture
def listener():
    started = []

    def start(**kw):
        httpd, _ = serve(CollectorRegistry(), "127.0.0.1", 0, **kw)
        started.append(httpd)
        return httpd, httpd.server_address[1]

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def _exchange(port: int, raw: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


@pytest.mark.parametrize("length", ["-1", "abc", "1e3", "٣"])
def test_a_bad_content_length_is_400_at_once(listener, caplog, length):
    _, port = listener()
    caplog.set_level(logging.DEBUG)
    start = time.monotonic()
    got = _exchange(
        port, f"POST /api/v1/targets/t/rollback HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()
    )
    assert got.startswith(b"HTTP/1.0 400"), got
    assert b"is not a number of bytes" in got
    assert time.monotonic() - start < 2  # "-1" read until the client hung up; "abc" raised in the handler
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_a_connection_that_sends_nothing_is_dropped_after_the_timeout(listener):
    _, port = listener(timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metr")  # half a request line, then silence
        start = time.monotonic()
        assert s.recv(100) == b""  # closed by the server
        assert 0.4 <= time.monotonic() - start < 5


def test_connections_past_the_pool_are_refused_at_once_and_threads_stay_bounded(listener):
    httpd, port = listener(max_connections=8, timeout_s=3.0)
    before = threading.active_count()
    held = []
    try:
        for _ in range(8):  # half-sent requests: each holds a slot until the timeout
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            held.append(s)
        wait_for(lambda: threading.active_count() >= before + 8, 10, "the eight handlers to start")
        for _ in range(50):
            start = time.monotonic()
            got = _exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n")
            assert got.startswith(b"HTTP/1.0 503") and b"Retry-After: 1" in got, got
            assert time.monotonic() - start < 2
        assert threading.active_count() <= before + 8
        assert httpd.refused == 50
    finally:
        for s in held:
            s.close()
    # slots free again once the held connections are gone: a request is served
    wait_for(
        lambda: _exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200"),
        10,
        "a request to be served again",
    )
