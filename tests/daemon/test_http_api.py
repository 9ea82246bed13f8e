"""tuner's HTTP listener: read-only views for anyone on it, actions only with the token (tuner/daemon/http_api.py).

A real listener, a real daemon and store; the action applied is a by-hand apply (an unmanaged target without a
hook), so it changes the journal without needing a server: tests/integration/test_apply_*.py drive real ones.
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tuner.config import DEFAULT_LISTEN, parse_config
from tuner.daemon import Daemon
from tuner.daemon.metrics import serve_metrics
from tuner.errors import ConfigError
from tuner.store import journal as jr
from tuner.store import recommendations as recs

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def api(store):
    cfg = parse_config(
        "targets:\n  - {name: t, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}\n"
        "  - {name: u, backend: vllm, url: 'http://127.0.0.1:9'}\n"
    )
    daemon = Daemon(cfg, store)
    servers = []

    def start(token):
        httpd, _ = serve_metrics(daemon.state, "127.0.0.1", 0, daemon=daemon, token=token)
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield daemon, start
    for s in servers:
        s.shutdown()


def rec(store, target="t"):
    return recs.add_recommendation(
        store.engine,
        target=target,
        now=time.time(),
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 8},
        current={"max_num_seqs": 4},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )


def post(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.post(url, headers=headers, timeout=10, proxies={"http": ""})


def test_actions_are_refused_without_a_configured_token(api, store):
    daemon, start = api
    base = start(None)
    rid = rec(store)
    r = post(f"{base}/api/v1/recommendations/{rid}/apply", TOKEN)
    assert r.status_code == 403 and "disabled" in r.json()["error"]
    assert jr.list_applies(store.engine) == []
    assert requests.get(f"{base}/metrics", timeout=10, proxies={"http": ""}).status_code == 200


def test_the_token_is_required_and_checked(api, store):
    daemon, start = api
    base = start(TOKEN)
    rid = rec(store)
    url = f"{base}/api/v1/recommendations/{rid}/apply"
    r = post(url)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert post(url, "wrong-token-0123456789").status_code == 403
    assert jr.list_applies(store.engine) == []  # nothing happened

    r = post(url, TOKEN)
    assert r.status_code == 202 and r.json()["follow"] == "/api/v1/journal?target=t"
    deadline = time.monotonic() + 10
    # the row appears as "planned" and moves to awaiting_manual a step later: wait for that state, not the row
    while not any(a.state == "awaiting_manual" for a in jr.list_applies(store.engine)) and time.monotonic() < deadline:
        time.sleep(0.05)
    (a,) = jr.list_applies(store.engine)
    assert a.mode == "api" and a.state == "awaiting_manual" and a.diff == {"max_num_seqs": 8}
    journal = requests.get(f"{base}/api/v1/journal?target=t", timeout=10, proxies={"http": ""}).json()
    assert journal[0]["id"] == a.id  # reading needs no token

    # the target is held by the open apply; a recommendation that is not proposed is refused
    assert post(f"{base}/api/v1/recommendations/{rec(store)}/apply", TOKEN).status_code == 409
    recs.set_status(store.engine, rid, "rejected", now=time.time())
    assert post(url, TOKEN).status_code == 409


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("get", "/api/v1/recommendations/1/apply", 405),
        ("post", "/api/v1/recommendations/999/apply", 404),
        ("post", "/api/v1/targets/nope/rollback", 404),
        ("post", "/api/v1/targets/../../etc/rollback", 404),
        ("post", "/metrics", 404),
        ("get", "/admin", 404),
    ],
)
def test_everything_else_is_refused(api, method, path, status):
    _, start = api
    base = start(TOKEN)
    r = getattr(requests, method)(
        base + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10, proxies={"http": ""}
    )
    assert r.status_code == status, r.text


def test_rollback_needs_a_kept_apply(api, store):
    daemon, start = api
    base = start(TOKEN)
    r = post(f"{base}/api/v1/targets/u/rollback", TOKEN)
    # refused before the answer (it was a 202 that only the log contradicted): the reason is in the answer
    assert r.status_code == 409 and "u: no kept apply to roll back" in r.json()["error"], r.text
    assert jr.list_applies(store.engine, target="u") == []


def test_defaults_bind_loopback_and_tokens_are_checked(tmp_path, monkeypatch):
    assert DEFAULT_LISTEN.startswith("127.0.0.1:")
    monkeypatch.delenv("TUNER_API_TOKEN", raising=False)
    assert parse_config("{}").api.token() is None
    monkeypatch.setenv("TUNER_API_TOKEN", TOKEN)
    assert parse_config("{}").api.token() == TOKEN
    (tmp_path / "short").write_text("abc\n")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        parse_config("api: {token_file: short}").api.token(tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        parse_config("api: {token_file: missing}").api.token(tmp_path)


GROUPED = (
    "targets:\n  - {name: t, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}\n"
    "  - name: g\n    backend: vllm\n    url: http://127.0.0.1:9\n    flags: {max-num-seqs: 4}\n"
    "    balancer: {socket: SOCKET, backend: g}\n"
    "    replicas: [{name: r1, url: 'http://127.0.0.1:10'}, {name: r2, url: 'http://127.0.0.1:11'}]\n"
)


@pytest.mark.parametrize("first, second", [("t", "t"), ("g.r1", "g.r2")], ids=["one target", "two replicas"])
def test_two_apply_requests_at_the_same_instant_one_is_refused_before_the_answer(tmp_path, store, first, second):
    """Two POSTs released together by a barrier, against the daemon's real listener, many pairs: one 202, one 409
    naming the apply that holds the target (or its group), one apply opened. Before the fix both were answered 202
    (the target was checked, then the apply opened on a thread after the answer) and some pairs ran both."""
    cfg = parse_config(GROUPED.replace("SOCKET", str(tmp_path / "haproxy.sock")))
    daemon = Daemon(cfg, store)
    httpd, _ = serve_metrics(daemon.state, "127.0.0.1", 0, daemon=daemon, token=TOKEN)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    pairs, answers, opened = 30, [], []
    try:
        for _ in range(pairs):
            ids = [rec(store, first), rec(store, second)]
            barrier, got = threading.Barrier(2), {}

            def ask(rid):
                barrier.wait(10)  # noqa: B023 (each pair's threads are joined within its iteration)
                got[rid] = post(f"{base}/api/v1/recommendations/{rid}/apply", TOKEN)  # noqa: B023

            threads = [threading.Thread(target=ask, args=(rid,)) for rid in ids]
            for th in threads:
                th.start()
            for th in threads:
                th.join(30)
            for th in list(httpd.actions):  # what the 202s started (a by-hand apply: it opens and waits)
                th.join(30)
            httpd.actions.clear()
            answers.append(
                sorted((r.status_code, r.json().get("error", r.json().get("apply_id"))) for r in got.values())
            )
            open_now = jr.open_applies(store.engine)
            opened.append(len(open_now))
            for a in open_now:
                jr.finish(store.engine, a.id, "failed", "cancelled by the test", now=time.time())
    finally:
        httpd.shutdown()
    both = sum(1 for a in answers if [s for s, _ in a] == [202, 202])
    assert both == 0 and opened == [1] * pairs, f"{both}/{pairs} pairs both answered 202; applies opened: {opened}"
    for (ok, aid), (refused, error) in answers:
        assert (ok, refused) == (202, 409), answers
        assert f"apply #{aid}" in error and "in progress" in error, error
        if first != second:
            assert "replica group g" in error, error
