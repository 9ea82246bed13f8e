"""Auto mode halts after rollbacks in a row, and tuner raises AutoApplyHalted (default pack) and says so on /metrics.

Real daemon, real store and rule evaluation; the applies are written through the journal as the apply path writes
them (their servers are not the point here: test_apply_llama.py runs auto mode against a real llama-server).
"""

from __future__ import annotations

import time

from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.store import journal as jr


def finished(store, outcome: str, now: float, mode: str = "auto") -> None:
    aid = jr.begin_apply(
        store.engine,
        target="a",
        recommendation_id=None,
        kind="apply",
        mode=mode,
        now=now,
        diff={"parallel": 4},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    jr.finish(store.engine, aid, outcome, "test", now=now + 1)


def test_rollbacks_in_a_row_halt_auto_mode_and_raise_the_alert(store):
    cfg = parse_config(
        "targets:\n  - {name: a, backend: llamacpp, url: 'http://127.0.0.1:9', "
        "apply: {mode: auto, max_consecutive_rollbacks: 2}}\n"
        "  - {name: b, backend: llamacpp, url: 'http://127.0.0.1:9'}\n"
    )
    daemon = Daemon(cfg, store)
    group = next(g for g in daemon.alerting.rules.groups if g.name == "tuner-targets")
    now = time.time()

    finished(store, "rolled_back", now - 100)
    daemon.alerting.evaluate_group(group)
    assert not [x for x in daemon.alerting.active() if x.labels["alertname"] == "AutoApplyHalted"]

    finished(store, "failed", now - 50)
    daemon.alerting.evaluate_group(group)
    halted = [x for x in daemon.alerting.active() if x.labels["alertname"] == "AutoApplyHalted"]
    assert [(x.labels["target"], x.state) for x in halted] == [("a", "firing")]  # no `for:`: fires at once
    daemon.applying.status_once()
    assert daemon.state.auto_halted == {"a": True}  # b is not in auto mode: no series at all

    finished(store, "kept", now - 10, mode="manual")  # an operator's kept apply ends the streak
    daemon.alerting.evaluate_group(group)
    assert not [
        x for x in daemon.alerting.active() if x.labels["alertname"] == "AutoApplyHalted" and x.state == "firing"
    ]
