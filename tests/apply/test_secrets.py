"""Credentials in the config are never shown (issue 39, item 11): the value of vLLM's --api-key in
managed.extra_args is redacted in the journal (the unauthenticated GET /api/v1/journal, `tuner journal`), in the
argv a step records and in the daemon's log, while the store keeps the argv as run (a restore needs it); a
store.url password is not echoed. The health gate sending the key to a real llama-server:
tests/integration/test_secrets_real.py."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time

import requests
from sqlalchemy import text

from tuner.app import apply as apply_app
from tuner.app.session import Session
from tuner.apply.flow import Applier
from tuner.apply.managed import build_argv
from tuner.config import load_config
from tuner.daemon import Daemon
from tuner.daemon.jobs import RedactSecrets
from tuner.daemon.metrics import serve_metrics
from tuner.store import journal as jr

KEY = "sk-live-0123456789abcdef"
SHORT = "k9"  # too short to replace as text: hidden by its place in the argv


def _setup(tmp_path, key: str = KEY):
    (tmp_path / "model").mkdir()
    cfg_path = tmp_path / "tuner.yaml"
    cfg_path.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/tuner.db'}}\n"
        "targets:\n  - name: chat\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    managed: {{model: '{tmp_path / 'model'}', flags: {{max_num_seqs: 4}}, "
        f"extra_args: {{api-key: '{key}', enforce-eager: true}}}}\n"
    )
    assert (
        subprocess.run(
            [sys.executable, "-m", "tuner.cli", "--config", str(cfg_path), "db", "upgrade"], capture_output=True
        ).returncode
        == 0
    )
    session = Session(load_config(cfg_path), tmp_path)
    return cfg_path, session


def _journaled(session: Session, said: list[str]) -> tuple[int, list[str]]:
    """An apply as the managed route journals one: its argv from the real builder, a 'starting' step with it."""
    t = session.cfg.target("chat")
    old, new = build_argv(t, {"max_num_seqs": 4}), build_argv(t, {"max_num_seqs": 8})
    ap = Applier(session.cfg, session.store, session.config_dir, say=said.append)
    aid = jr.begin_apply(
        session.store.engine,
        target="chat",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=time.time(),
        diff={"max_num_seqs": 8},
        old_flags={"max_num_seqs": 4},
        new_flags={"max_num_seqs": 8},
        old_argv=old,
        new_argv=new,
        owner_pid=1,
        owner_start=1,
    )
    ap.step(aid, "starting", json.dumps(new), state="starting")  # what routes.Managed.switch does
    jr.step(session.store.engine, aid, "restoring", json.dumps(old), now=time.time())  # as written before redaction
    jr.finish(session.store.engine, aid, "failed", f"server log: api_key={KEY!r} rejected", now=time.time())
    return aid, new


def test_the_journal_api_cli_and_steps_never_show_the_api_key(tmp_path):
    cfg_path, session = _setup(tmp_path)
    said: list[str] = []
    aid, argv = _journaled(session, said)
    assert KEY in argv  # the server does get it

    shown = json.dumps([a.as_json() for a in apply_app.journal(session, "chat")])
    assert KEY not in shown and '"--api-key", "***"' in shown
    assert not any(KEY in s for s in said) and any("***" in s for s in said)

    daemon = Daemon(session.cfg, session.store, config_dir=tmp_path)
    httpd, _ = serve_metrics(daemon.state, "127.0.0.1", 0, daemon=daemon, token=None)
    try:
        body = requests.get(
            f"http://127.0.0.1:{httpd.server_address[1]}/api/v1/journal", timeout=10, proxies={"http": ""}
        ).text
    finally:
        httpd.shutdown()
    assert KEY not in body and aid == json.loads(body)[0]["id"]

    for args in (["journal"], ["journal", "--json"]):
        out = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "--config", str(cfg_path), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert KEY not in out.stdout + out.stderr and "***" in out.stdout

    with session.store.engine.connect() as conn:  # what a restore starts the server with: as run
        stored = conn.execute(
            text(
                "SELECT new_argv, (SELECT group_concat(detail) FROM apply_steps WHERE apply_id = "
                ":a AND step = 'starting') FROM applies WHERE id = :a"
            ),
            {"a": aid},
        ).one()
    assert json.loads(stored[0]) == argv and KEY not in stored[1]


def test_a_short_key_is_hidden_by_its_place_in_the_argv(tmp_path):
    _, session = _setup(tmp_path, key=SHORT)
    _journaled(session, [])
    (a,) = apply_app.journal(session, "chat")
    assert a.new_argv[a.new_argv.index("--api-key") + 1] == "***"
    assert all(f'"{SHORT}"' not in s["detail"] for s in a.steps)


def test_the_daemon_log_filter_redacts_any_logger(tmp_path):
    _, session = _setup(tmp_path)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets(session.cfg.redact))
    logger = logging.getLogger("tuner.test_secrets")
    logger.addHandler(handler)
    try:
        logger.warning("api: apply #1: failed %s", f"vLLM said: invalid api key {KEY}")
        logger.warning("argv %s", json.dumps(["--api-key", SHORT]))
    finally:
        logger.removeHandler(handler)
    assert KEY not in out.getvalue() and f'"{SHORT}"' not in out.getvalue() and out.getvalue().count("***") == 2


def test_a_store_url_password_is_not_echoed(tmp_path):
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text("store: {url: 'postgresql://tuner:hunter2secret@127.0.0.1:1/tuner'}\n")
    for args in (["db", "upgrade"], ["status"], ["db", "current"]):
        out = subprocess.run(
            [sys.executable, "-m", "tuner.cli", "--config", str(cfg), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert "hunter2secret" not in out.stdout + out.stderr and "tuner:***@" in out.stderr, out.stderr
