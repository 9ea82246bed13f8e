"""tuner's HTTP listener: read-only views for anyone on it, actions only with the token (tuner/daemon/http_api.py).

A real listener, a real daemon and store; the action applied is a by-hand apply (an unmanaged target without a
hook), so it changes the journal without needing a server: tests/integration/test_apply_*.py drive real ones.
"""

from __future__ import annotations

import time

import pytest
import requests

from tuner.config import DEFAULT_LISTEN, parse_config
from tuner.daemon import Daemon
from tuner.errors import ConfigError
from tuner.daemon.metrics import serve_metrics
from tuner.store import journal as jr
from tuner.store import recommendations as recs

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def api(store):
    cfg = parse_config("targets:\n  - {name: t, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}\n"
                       "  - {name: u, backend: vllm, url: 'http://127.0.0.1:9'}\n")
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
    return recs.add_recommendation(store.engine, target=target, now=time.time(), rules=["r"], diff_key="{}",
                                   diff={"max_num_seqs": 8}, current={"max_num_seqs": 4}, evidence=[],
                                   expected_effect="", risk="", confidence=0.9, rank=1, memory_check={"ok": True})


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
    while not any(a.state == "awaiting_manual" for a in jr.list_applies(store.engine)) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    (a,) = jr.list_applies(store.engine)
    assert a.mode == "api" and a.state == "awaiting_manual" and a.diff == {"max_num_seqs": 8}
    journal = requests.get(f"{base}/api/v1/journal?target=t", timeout=10, proxies={"http": ""}).json()
    assert journal[0]["id"] == a.id  # reading needs no token

    # the target is held by the open apply; a recommendation that is not proposed is refused
    assert post(f"{base}/api/v1/recommendations/{rec(store)}/apply", TOKEN).status_code == 409
    recs.set_status(store.engine, rid, "rejected", now=time.time())
    assert post(url, TOKEN).status_code == 409


@pytest.mark.parametrize("method, path, status", [
    ("get", "/api/v1/recommendations/1/apply", 405),
    ("post", "/api/v1/recommendations/999/apply", 404),
    ("post", "/api/v1/targets/nope/rollback", 404),
    ("post", "/api/v1/targets/../../etc/rollback", 404),
    ("post", "/metrics", 404),
    ("get", "/admin", 404),
])
def test_everything_else_is_refused(api, method, path, status):
    _, start = api
    base = start(TOKEN)
    r = getattr(requests, method)(base + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10,
                                  proxies={"http": ""})
    assert r.status_code == status, r.text


def test_rollback_needs_a_kept_apply(api, store):
    daemon, start = api
    base = start(TOKEN)
    r = post(f"{base}/api/v1/targets/u/rollback", TOKEN)
    assert r.status_code == 202  # accepted; the rollback itself finds nothing to undo and says so in the log
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
