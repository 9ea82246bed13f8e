"""Progress on long waits: a quiet command says what it waits for; a real line clears and resets it."""

from __future__ import annotations

import io
import time

from tuner.app import apply as apply_app
from tuner.app.session import Session
from tuner.cli.progress import Heartbeat
from tuner.config import parse_config
from tuner.store import journal as jr


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_quiet_for_the_period_says_what_it_waits_for_piped_as_plain_lines():
    clock, out = _Clock(), io.StringIO()
    hb = Heartbeat(lambda: "apply #1: draining the old server (12s)", every=5.0, out=out, tty=False, clock=clock)
    hb.say("[apply #1] draining: pid 42")
    clock.t += 4.9
    assert hb.tick() is False  # said something less than 5 s ago
    clock.t += 0.2
    assert hb.tick() is True
    assert hb.tick() is False  # at most one line per period
    clock.t += 5.0
    assert hb.tick() is True
    assert out.getvalue().splitlines() == [
        "[apply #1] draining: pid 42",
        "… apply #1: draining the old server (12s)",
        "… apply #1: draining the old server (12s)",
    ]


def test_on_a_terminal_the_line_is_rewritten_and_cleared_before_the_next_real_line():
    clock, out = _Clock(), io.StringIO()
    hb = Heartbeat(lambda: "apply #1: observing the new flags (7s)", every=5.0, out=out, tty=True, clock=clock)
    clock.t += 6
    assert hb.tick()
    hb.say("[apply #1] verdict: kept")
    assert out.getvalue() == "\r\033[K… apply #1: observing the new flags (7s)\r\033[K[apply #1] verdict: kept\n"
    # nothing to say (no apply running): no line
    quiet = Heartbeat(lambda: None, out=out, tty=True, clock=clock)
    clock.t += 60
    assert quiet.tick() is False


def test_the_thread_runs_it_and_stops_with_the_call():
    out = io.StringIO()
    with Heartbeat(lambda: "waiting", every=0.0, out=out, tty=False, poll=0.01):
        deadline = time.monotonic() + 10
        while "… waiting" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "… waiting" in out.getvalue()


def test_waiting_on_names_the_running_step_and_how_long(tmp_path, store):
    cfg = parse_config("targets:\n  - {name: t, backend: vllm, url: 'http://127.0.0.1:9'}\n")
    s = Session(cfg, tmp_path, store)
    assert apply_app.waiting_on(s, "t", 1000.0) is None  # nothing running
    aid = jr.begin_apply(
        store.engine,
        target="t",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=990.0,
        diff={"max_num_seqs": 8},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    jr.step(store.engine, aid, "draining", "pid 42", now=995.0, state="draining")
    assert apply_app.waiting_on(s, "t", 1003.0) == (
        f"apply #{aid}: draining the old server (in-flight requests finish first) (8s)"
    )
    jr.step(store.engine, aid, "observing", "30s", now=1010.0, state="observing")
    assert apply_app.waiting_on(s, "t", 1022.0) == f"apply #{aid}: observing the new flags (12s)"
    jr.finish(store.engine, aid, "kept", "", now=1040.0)
    assert apply_app.waiting_on(s, "t", 1041.0) is None


def test_one_heartbeat_serves_several_waits_in_turn():
    out = io.StringIO()
    hb = Heartbeat(lambda: "waiting", every=0.0, out=out, tty=False, poll=0.01)
    for _ in range(2):  # e.g. `tuner managed start` over two targets
        before = out.getvalue().count("… waiting")
        with hb:
            deadline = time.monotonic() + 10
            while out.getvalue().count("… waiting") == before and time.monotonic() < deadline:
                time.sleep(0.01)
        assert out.getvalue().count("… waiting") > before
