"""Applier.restart: a managed server restarted with the flags in force, journaled as a ``restart`` under the apply
guardrails. The restart of a real server (a stalled llama-server) runs in tests/integration/test_stall_real.py;
these are the refusals, which happen before anything is journaled or stopped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuner.apply.flow import Applier
from tuner.apply.restart import restart
from tuner.config import parse_config
from tuner.errors import ApplyError
from tuner.store import journal as jr


def _cfg(tmp_path: Path, managed: bool = True):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    text = "targets:\n  - name: t\n    backend: llamacpp\n    url: http://127.0.0.1:9\n"
    if managed:
        text += f"    managed: {{model: '{tmp_path / 'm.gguf'}', restart_when_stalled: 2m}}\n"
    return parse_config(text + "    apply: {max_restarts_per_hour: 2}\n")


def test_a_restart_is_refused_past_the_restart_budget_and_on_a_server_tuner_does_not_manage(store, tmp_path):
    cfg = _cfg(tmp_path)
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    now = time.time()
    for i in range(2):  # two server starts by applies in the last hour
        aid = jr.begin_apply(
            store.engine,
            target="t",
            recommendation_id=None,
            kind="apply",
            mode="auto",
            now=now - 600 + i,
            diff={},
            old_flags={},
            new_flags={},
            old_argv=[],
            new_argv=[],
            owner_pid=1,
            owner_start=1,
        )
        jr.step(store.engine, aid, "starting", now=now - 600 + i)
        jr.finish(store.engine, aid, "kept", "", now=now - 600 + i)
    with pytest.raises(ApplyError, match=r"2 server starts by applies in the last hour .*max_restarts_per_hour 2"):
        restart(ap, "t", reason="stalled")
    assert [a.kind for a in jr.list_applies(store.engine)] == ["apply", "apply"]  # nothing journaled
    assert cfg.targets[0].managed is not None and cfg.targets[0].managed.restart_when_stalled.total_seconds() == 120

    plain = _cfg(tmp_path, managed=False)
    with pytest.raises(ApplyError, match="is not managed"):
        restart(Applier(plain, store, tmp_path, say=lambda m: None), "t", reason="stalled")


def test_a_restart_waits_while_an_apply_is_open_on_the_target(store, tmp_path):
    ap = Applier(_cfg(tmp_path), store, tmp_path, say=lambda m: None)
    jr.begin_apply(
        store.engine,
        target="t",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=time.time(),
        diff={},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    with pytest.raises(ApplyError, match="apply #1"):
        restart(ap, "t", reason="stalled")
