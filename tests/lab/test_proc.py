"""tuner.lab.proc.wait_for: the tests' and the benches' one wait helper."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.lab.proc import wait_for


def test_wait_for_returns_what_the_predicate_returned() -> None:
    answers = iter([None, 0, {"pid": 7}])
    assert wait_for(lambda: next(answers), 5, "an answer", every_s=0.01) == {"pid": 7}


def test_wait_for_names_what_it_waited_for_when_time_runs_out() -> None:
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 0.2s waiting for the farm's ports"):
        wait_for(lambda: False, 0.2, "the farm's ports", every_s=0.02)
    assert time.monotonic() - t0 < 5


def test_wait_for_stops_at_once_when_the_process_exited_and_shows_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('bind: address in use'); sys.exit(3)"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    proc.wait(30)
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"(?s)the server: the process exited with 3 first.*address in use"):
        wait_for(lambda: False, 60, "the server", proc=proc, log=log)
    assert time.monotonic() - t0 < 5  # not the 60 s of the timeout


def test_wait_for_a_running_process_waits_for_the_predicate(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ready = time.monotonic() + 0.3
        assert wait_for(lambda: time.monotonic() > ready, 10, "the clock", proc=proc, every_s=0.02) is True
    finally:
        proc.kill()
        proc.wait(10)


def test_stop_ends_a_child_by_sigterm_and_one_that_ignores_it_by_sigkill() -> None:
    from tuner.lab.proc import stop

    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop(polite, 10) == -15  # SIGTERM ended it
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"  # its handler is in place
    assert stop(stubborn, 0.5) == -9  # SIGTERM ignored: SIGKILL after the grace
    assert stop(stubborn, 0.5) == -9  # a child already stopped: its code, nothing sent
