"""managed.restart_when_stalled, one step at a time: the restart is asked for once the engine has been stalled that
long, not before, and not again at once when the guardrails refuse it. (The restart itself, of a real stalled
llama-server: tests/integration/test_stall_real.py.)"""

from __future__ import annotations

import time

import pytest

from tuner.app.stall import StallWatch, stall_step
from tuner.apply.flow import Applier
from tuner.config import parse_config
from tuner.errors import ApplyError
from tuner.signals.derive import EngineSignals, TargetSignals
from tuner.store import journal as jr


def _sig(stalled: float) -> TargetSignals:
    return TargetSignals(
        "t",
        "vllm",
        60,
        0,
        None,
        (EngineSignals("0", "m", 10, requests_running=2, requests_waiting=4, stalled_requests=stalled),),
    )


def test_the_restart_is_asked_for_after_restart_when_stalled_and_a_refusal_waits_as_long_again(store, tmp_path):
    (tmp_path / "model").mkdir()
    cfg = parse_config(
        "targets:\n  - name: t\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    managed: {{model: '{tmp_path / 'model'}', restart_when_stalled: 2m}}\n"
        "    apply: {max_restarts_per_hour: 1}\n"
    )
    ap, t, watch = Applier(cfg, store, tmp_path, say=lambda m: None), cfg.targets[0], StallWatch()
    now = time.time()
    aid = jr.begin_apply(
        store.engine,
        target="t",
        recommendation_id=None,
        kind="apply",
        mode="auto",
        now=now - 60,
        diff={},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    jr.step(store.engine, aid, "starting", now=now - 60)  # the restart budget (1 an hour) is spent
    jr.finish(store.engine, aid, "kept", "", now=now - 60)

    assert stall_step(ap, t, _sig(6), now=now, watch=watch) is None and watch.since == {"t": now}
    assert stall_step(ap, t, _sig(6), now=now + 119, watch=watch) is None
    with pytest.raises(ApplyError, match="server starts by applies in the last hour"):  # it asked, and was refused
        stall_step(ap, t, _sig(6), now=now + 120, watch=watch)
    assert watch.since == {"t": now + 120}  # asked again only after another 2 minutes of stall
    assert stall_step(ap, t, _sig(6), now=now + 200, watch=watch) is None
    assert stall_step(ap, t, _sig(0), now=now + 210, watch=watch) is None and watch.since == {}  # it moved again
    assert stall_step(ap, t, None, now=now + 220, watch=watch) is None


def test_off_unless_set(store, tmp_path):
    (tmp_path / "model").mkdir()
    cfg = parse_config(
        "targets:\n  - name: t\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        f"    managed: {{model: '{tmp_path / 'model'}'}}\n"
    )
    watch = StallWatch()
    assert cfg.targets[0].managed.restart_when_stalled is None
    for k in range(3):
        assert (
            stall_step(Applier(cfg, store, tmp_path), cfg.targets[0], _sig(6), now=1e9 + 3600 * k, watch=watch) is None
        )
    assert watch.since == {}
