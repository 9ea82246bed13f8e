"""tuner.lab.load against a real local HTTP/1.1 server that keeps connections alive."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tuner.lab.load import run_load


class _Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps connections alive unless the client says close
    seen: list[tuple[str, int]] = []  # (path, client port) per request
    answers: list[int] = []  # statuses to answer completions with first (then 200)
    hold: threading.Event | None = None  # completions wait for it when set
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            self.seen.append((self.path, self.client_address[1]))
        with self.lock:
            status = self.answers.pop(0) if self.answers and self.path != "/tokenize" else 200
        if status == 0:  # close the connection without a byte of answer, as a draining vLLM does
            self.close_connection = True
            return
        if status != 200:
            self.send_error(status)
            return
        if self.hold is not None and self.path != "/tokenize":
            self.hold.wait(30)
        if self.path == "/tokenize":
            body = json.dumps({"count": 200}).encode()
        else:
            body = json.dumps(
                {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 10, "completion_tokens": 4}}
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _server() -> ThreadingHTTPServer:
    _Completions.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_every_request_goes_on_a_fresh_connection():
    """A kept-alive connection can cross the server's idle close under load (test_realservers_smoke.py):
    the load generator never reuses one."""
    httpd = _server()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        # The server does keep connections alive: a plain session reuses one for all its requests.
        with requests.Session() as s:
            for _ in range(3):
                assert s.post(url + "/v1/completions", json={}, timeout=5).status_code == 200
        assert len({port for _, port in _Completions.seen}) == 1

        _Completions.seen = []
        result = run_load(
            url, model="m", n_requests=12, concurrency=3, prompt_tokens_approx=10, max_tokens=4, timeout_s=30
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.ok == 12 and result.failed == 0, result.errors
    assert result.completion_tokens == 12 * 4
    ports = [port for path, port in _Completions.seen if path == "/v1/completions"]
    assert len(ports) == 12 and len(set(ports)) == 12  # one connection per request


def test_retries_only_what_the_server_did_not_take():
    httpd = _server()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    kw = {"model": "m", "n_requests": 1, "concurrency": 1, "prompt_tokens_approx": 10, "max_tokens": 4, "timeout_s": 30}
    try:
        _Completions.answers = [500, 503]  # draining, then restarting: not taken, sent again
        r = run_load(url, retry_for_s=10, **kw)
        assert (r.ok, r.failed, r.retried) == (1, 0, 2), r.errors
        _Completions.answers = [500]
        r = run_load(url, **kw)  # no retries asked for: the 500 is a failure
        assert (r.ok, r.failed, r.retried) == (0, 1, 0)
        _Completions.answers = [0, 0]  # closed unanswered, twice: sent again, as the OpenAI SDK does
        r = run_load(url, retry_for_s=10, **kw)
        assert (r.ok, r.failed, r.retried) == (1, 0, 2), r.errors
        _Completions.answers = [0]
        r = run_load(url, **kw)  # no retries asked for: lost, and said so
        assert (r.ok, r.failed, r.retried) == (0, 1, 0) and "Remote end closed" in r.errors[0], r.errors
        _Completions.answers = [400]  # the server took it and said no: never sent twice
        r = run_load(url, retry_for_s=10, **kw)
        assert (r.ok, r.failed, r.retried) == (0, 1, 0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    # Nothing listens: refused connections are retried until the budget runs out, then counted as failed.
    r = run_load(url, retry_for_s=1.2, **{**kw, "timeout_s": 5})
    assert r.ok == 0 and r.failed == 1 and r.retried >= 1


@pytest.mark.parametrize("by", ["send_for_s", "stop"])
def test_a_steady_load_keeps_the_clients_busy_then_lets_what_is_in_flight_finish(by):
    """A steady closed loop for a while (the demo's load across an apply), ended by time or by the caller:
    requests in flight then are answered, and nothing new starts."""
    import time

    httpd = _server()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    _Completions.hold = threading.Event()
    stop = threading.Event()
    out = []
    try:
        worker = threading.Thread(
            target=lambda: out.append(
                run_load(
                    url,
                    model="m",
                    n_requests=10_000,
                    concurrency=3,
                    prompt_tokens_approx=10,
                    max_tokens=4,
                    timeout_s=30,
                    send_for_s=0.3 if by == "send_for_s" else None,
                    stop=stop,
                )
            )
        )
        worker.start()
        while len([p for p, _ in _Completions.seen if p == "/v1/completions"]) < 3:  # all three clients busy
            time.sleep(0.01)
        if by == "stop":
            stop.set()
        seen = time.monotonic()  # run_load started before this, so its sending time ends before seen + 0.3
        while by == "send_for_s" and time.monotonic() < seen + 0.3:  # the time is over while all three are held
            time.sleep(0.01)
        _Completions.hold.set()
        worker.join(30)
    finally:
        _Completions.hold = None
        httpd.shutdown()
        httpd.server_close()
    [r] = out
    assert (r.requested, r.ok, r.failed, r.not_sent) == (3, 3, 0, 0), r


def test_think_time_paces_each_client_and_stop_ends_the_pause():
    """With think_s each client waits after its answer before the next request; stop ends the wait at once."""
    import time

    httpd = _server()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    stop, out = threading.Event(), []
    try:
        worker = threading.Thread(
            target=lambda: out.append(
                run_load(
                    url,
                    model="m",
                    n_requests=10_000,
                    concurrency=2,
                    prompt_tokens_approx=10,
                    max_tokens=4,
                    timeout_s=120,
                    think_s=60,
                    stop=stop,
                )
            )
        )
        worker.start()
        while len([p for p, _ in _Completions.seen if p == "/v1/completions"]) < 2:  # both clients answered once
            time.sleep(0.01)
        stop.set()
        worker.join(20)  # far less than the 60 s pause: the stop ended it
        assert not worker.is_alive()
    finally:
        httpd.shutdown()
        httpd.server_close()
    [r] = out
    # without the pause the two clients would have sent request after request until the stop
    assert (r.requested, r.ok, r.failed) == (2, 2, 0), r
    with pytest.raises(ValueError, match="think_s"):
        run_load(
            url, model="m", n_requests=1, concurrency=1, prompt_tokens_approx=1, max_tokens=1, timeout_s=5, think_s=-1
        )
