"""Smoke test for the integration tier: each real server starts, is healthy and exposes what tuner reads."""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import time

import pytest
import realservers
import requests
from conftest import require
from realservers import RealServer

from tuner.lab import run_load


def _get(url: str) -> requests.Response:
    return requests.get(url, timeout=10)


def test_vllm_serves_metrics_and_completions(vllm_server: RealServer):
    assert _get(vllm_server.url + "/health").status_code == 200
    result = run_load(
        vllm_server.url,
        model=vllm_server.model_name,
        n_requests=4,
        concurrency=2,
        prompt_tokens_approx=32,
        max_tokens=8,
        timeout_s=60,
    )
    assert result.ok == 4, result.errors
    metrics = _get(vllm_server.url + "/metrics")
    assert metrics.status_code == 200
    assert "vllm:num_requests_running" in metrics.text
    assert "vllm:cache_config_info" in metrics.text


def test_vllm_closes_kept_alive_connections_after_5s_idle(vllm_server: RealServer):
    """The root of "Remote end closed connection without response" under load (docs/cpu-hosts.md).

    uvicorn in vLLM closes a kept-alive connection 5 s after its last response (VLLM_HTTP_TIMEOUT_KEEP_ALIVE).
    On 2 cores saturated by vLLM a client can take that long to read one answer and send the next request on
    the same connection: the request crosses the server's close, is never read (the server logs nothing), and
    the client gets no response. Measured here: the next request read up to 4.8 s after the previous response,
    and 3 of 96 requests lost at the default keep-alive against 0 of 192 with it raised to 120 s. This test makes
    the 5 s gap on purpose, where the race makes it by chance; tuner.lab.load sends every request on a fresh
    connection (tests/lab/test_load.py proves it), so no request of its can cross a close.
    """
    body = json.dumps({"model": vllm_server.model_name, "prompt": "hello", "max_tokens": 2}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", vllm_server.port, timeout=30)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and not first.will_close  # kept alive
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until the server has closed its end (EOF readable)
            if select.select([conn.sock], [], [], 0.5)[0] and conn.sock.recv(1, socket.MSG_PEEK) == b"":
                break
        idle = time.monotonic() - (deadline - 30)
        assert 4.0 <= idle < 30, f"the server closed the idle connection after {idle:.1f}s"
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            conn.getresponse()
    finally:
        conn.close()


def test_llama_server_serves_metrics_and_slots(llama_server: RealServer):
    assert _get(llama_server.url + "/health").status_code == 200
    result = run_load(
        llama_server.url, model=None, n_requests=4, concurrency=2, prompt_tokens_approx=32, max_tokens=16, timeout_s=60
    )
    assert result.ok == 4, result.errors
    metrics = _get(llama_server.url + "/metrics")
    assert metrics.status_code == 200
    assert "llamacpp:requests_processing" in metrics.text
    slots = _get(llama_server.url + "/slots").json()
    assert len(slots) == 2  # --parallel 2


def test_llama_server_closes_a_fresh_connection_that_sends_nothing_for_5s(llama_server: RealServer):
    """The root of llama-server's "Remote end closed connection without response" under load (docs/cpu-hosts.md).

    cpp-httplib's keep-alive wait (a fixed 5 s, no llama-server flag changes it; `--timeout` is the read timeout)
    also guards a new connection's first request: a client that connects and is then starved for 5 s before its
    request arrives finds the connection closed, with nothing read. Measured here: a request 4 s after connecting
    is answered, 6 s after is not. On 2 cores beside a loaded vLLM a client's thread can be starved that long
    (4.8 s measured for vLLM's keep-alive race), so the test that loads llama-server beside a loaded vLLM runs its
    clients ahead of the servers where it may (realservers.run_load_process(ahead=True)).
    """

    def after(gap: float) -> bytes:
        with socket.create_connection(("127.0.0.1", llama_server.port), timeout=10) as sock:
            deadline = time.monotonic() + gap
            while time.monotonic() < deadline:  # send nothing until the gap has passed, unless the server closes
                if select.select([sock], [], [], 0.2)[0] and sock.recv(1, socket.MSG_PEEK) == b"":
                    return b""
            try:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return sock.recv(64)
            except OSError:
                return b""

    assert after(3.0).startswith(b"HTTP/1.1 200")
    assert after(7.0) == b""  # closed unanswered: the client sees "Remote end closed connection without response"


_HF_IDS = """
import json, random, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
texts = json.load(sys.stdin)
rng = random.Random(8289)  # text as vLLM's random dataset writes it: random token ids, decoded
texts += [tok.decode([rng.randrange(5, tok.get_vocab_size()) for _ in range(n)]) for n in (50, 400)]
print(json.dumps([[t, tok.encode(t, add_special_tokens=False).ids] for t in texts]))
"""


def _tokenize(url: str, text: str) -> list[int]:
    return _post(url + "/tokenize", {"content": text}).json()["tokens"]


def _post(url: str, body: dict) -> requests.Response:
    return requests.post(url, json=body, timeout=30)


def test_llama_server_on_the_bpe_gguf_counts_a_prompt_as_the_clients_tokenizer_does(llama_server_factory):
    """bench/tune.py replays a workload on llama-server with vLLM's benchmark client, which writes and counts its
    prompts with the tiny HF model's tokenizer. The tiny GGUF's own vocabulary (bytes and ASCII) spelled them in
    about 4x as many tokens, and 1-3% of a replay's requests overflowed their slots on every config
    (bench/results/2026-11-30-0738-tune-corpus-llama.md). The GGUF written with that tokenizer's vocabulary
    (make_tiny_gguf.py --vocab-from) tokenizes every text to the same ids, the client's random-token prompts
    included, and its sampled text is valid UTF-8 (llama-server answers 500 otherwise)."""
    require(realservers.TINY_BPE_GGUF, realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    texts = ["Hello world, this is a test of the tokenizer.", "def f(x):\n    return x * 2  # 12345", "the end " * 30]
    out = subprocess.run(
        [str(realservers.VLLM_PYTHON.path()), "-c", _HF_IDS, str(realservers.TINY_MODEL.path())],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    pairs = json.loads(out.stdout)
    bpe = llama_server_factory(model=realservers.TINY_BPE_GGUF.path())
    for text, ids in pairs:
        assert _tokenize(bpe.url, text) == ids, text[:60]
    # the byte vocabulary's count, for the record of why: several times the client's on the same prompts
    chars = llama_server_factory(model=realservers.TINY_GGUF.path())
    longest_text, longest_ids = pairs[-1]
    assert len(_tokenize(chars.url, longest_text)) >= 2 * len(longest_ids)
    for text, ids in pairs[-2:]:
        got = _post(bpe.url + "/v1/completions", {"prompt": text, "max_tokens": 32})
        assert got.status_code == 200, got.text[:300]
        assert got.json()["usage"]["prompt_tokens"] == len(ids) + 1  # and the BOS the model's tokenizer adds


def test_llama_server_without_metrics_answers_501(llama_server_no_metrics: RealServer):
    assert _get(llama_server_no_metrics.url + "/health").status_code == 200
    assert _get(llama_server_no_metrics.url + "/metrics").status_code == 501


def test_prometheus_scrapes_llama_server(llama_server: RealServer, prometheus_factory):
    prom = prometheus_factory([f"127.0.0.1:{llama_server.port}"], interval_s=1.0)
    deadline = time.monotonic() + 30
    result: list = []
    while time.monotonic() < deadline and not result:
        body = _get(prom.url + "/api/v1/query?query=llamacpp:requests_processing").json()
        result = body["data"]["result"]
        time.sleep(0.5)
    assert result, "Prometheus never stored llamacpp:requests_processing"
    up = _get(prom.url + "/api/v1/query?query=up").json()["data"]["result"]
    assert [r["value"][1] for r in up] == ["1"]
