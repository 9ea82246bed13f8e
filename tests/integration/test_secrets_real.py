"""A real llama-server started with --api-key (managed.extra_args): tuner's health gate sends the key and passes,
where it used to be refused with 401 and count the start as failed; the argv tuner writes into the server's log and
what it says never show the key (issue 39, item 11)."""

from __future__ import annotations

import realservers
from conftest import require

from tuner.apply.flow import Applier
from tuner.apply.launch import free_port
from tuner.config import parse_config
from tuner.store.db import open_engine, upgrade
from tuner.store.store import Store

KEY = "sk-live-0123456789abcdef"


def test_the_health_gate_sends_the_api_key_a_server_needs_and_nothing_shows_it(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    cfg = parse_config(
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n"
        f"targets:\n  - name: llama\n    backend: llamacpp\n    url: http://127.0.0.1:{port}\n"
        f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n"
        f"      executable: {realservers.LLAMA_SERVER.path()}\n"
        f"      flags: {{parallel: 1, ctx_size: 512}}\n      extra_args: {{'-t': 1, '--api-key': '{KEY}'}}\n"
        "      drain_timeout: 5s\n"
    )
    engine = open_engine(cfg.store.url)
    upgrade(engine)
    said: list[str] = []
    ap = Applier(cfg, Store(engine), tmp_path, say=said.append)
    t = cfg.target("llama")
    try:
        r = ap.servers.start(t)  # /health (public), then one completion: refused without the key
        assert KEY in r.argv  # the server got it
        assert any("healthy after" in s for s in said), said
    finally:
        ap.servers.stop(t)
        engine.dispose()
    log = (tmp_path / "logs" / "llama.log").read_text()
    starting = [line for line in log.splitlines() if line.startswith("==== tuner")]
    assert starting and all(KEY not in line and '"--api-key", "***"' in line for line in starting), starting
    assert not any(KEY in s for s in said)
