"""yield_engine_core on real processes laid out as a vLLM CPU server is: an API server (the group's leader), an
engine core (named as vLLM names it) and a worker pinned to a core of its own. Real processes, no vLLM: the
integration tier checks the same on a real vLLM (tests/integration/test_apply_vllm.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tuner import procfs
from tuner.apply import managed as mg

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a pinned worker needs 2 CPUs")

# The leader starts the engine core and the worker as vLLM's API server does (they inherit its group), writes their
# pids, then waits. The engine core names itself; the worker pins itself to the first CPU (or not, with "free").
_SERVER = r"""
import os, subprocess, sys, time
core = subprocess.Popen([sys.executable, "-c",
    "import time; open('/proc/self/comm', 'w').write('VLLM::EngineCore'); time.sleep(600)"])
pin = sys.argv[1] == "pinned"
worker = subprocess.Popen([sys.executable, "-c",
    "import os, sys, time\nif sys.argv[1] == 'pinned': os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    "open('/proc/self/comm', 'w').write('VLLM::Worker'); time.sleep(600)", sys.argv[1]])
print(core.pid, worker.pid, flush=True)
time.sleep(600)
"""


def _server(
    tmp_path: Path, worker: str, nice: int = 0, *, die_with_parent: bool = False
) -> tuple[mg.Running, int, int]:
    r = mg.start_server(
        [sys.executable, "-c", _SERVER, worker],
        dict(os.environ),
        tmp_path / "server.log",
        nice=nice,
        die_with_parent=die_with_parent,
    )
    deadline = time.monotonic() + 120  # a niced stand-in on a busy host can wait long for a core
    while time.monotonic() < deadline:
        lines = [ln for ln in (tmp_path / "server.log").read_text().splitlines() if ln and not ln.startswith("=")]
        if lines:
            core, wk = map(int, lines[0].split())
            names_set = mg._comm(core).startswith("VLLM::EngineCor") and mg._comm(wk) == "VLLM::Worker"
            pinned = worker != "pinned" or len(os.sched_getaffinity(wk)) == 1
            if names_set and pinned:
                return r, core, wk
        time.sleep(0.05)
    mg.stop_server(r, grace_s=1)
    raise AssertionError("the stand-in server did not start")


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


def _thread_nices(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.fixture
def started(tmp_path):
    servers: list[mg.Running] = []

    def start(worker: str, nice: int = 0, *, die_with_parent: bool = False) -> tuple[mg.Running, int, int]:
        got = _server(tmp_path / str(len(servers)), worker, nice, die_with_parent=die_with_parent)
        servers.append(got[0])
        return got

    yield start
    for r in servers:
        mg.stop_server(r, grace_s=1)


def test_the_engine_core_alone_runs_lower_where_its_worker_is_pinned(started):
    r, core, worker = started("pinned")
    base = _nice(r.pid)  # the server's own: this test process's (0, or more under nice(1))
    want = min(19, base + 10)
    assert r.engine_core_nice is None
    assert mg.yield_engine_core(r, 10) == want and r.engine_core_nice == want  # what the apply's journal says
    assert _thread_nices(core) == {want}  # every thread of the engine core
    assert _nice(r.pid) == base and _nice(worker) == base  # the API server and the worker as they were
    assert mg.yield_engine_core(r, 10) == want and _thread_nices(core) == {want}  # set, not lowered again


@pytest.mark.skipif(not procfs.schedules_by_session(), reason="the kernel does not schedule by session here")
def test_a_server_leading_its_own_session_yields_that_session_too(started):
    mine = procfs.autogroup_nice(os.getpid())  # None where tuner runs in a session with no autogroup (CI's may)
    r, core, worker = started("pinned")  # a managed server: a session of its own
    want = min(19, _nice(r.pid) + 10)
    assert procfs.autogroup_nice(r.pid) == 0 and r.session_nice is None
    assert mg.yield_engine_core(r, 10) == want
    assert r.session_nice == want and procfs.autogroup_nice(r.pid) == want  # the kernel's own line
    assert procfs.autogroup_nice(core) == want == procfs.autogroup_nice(worker)  # one group: the whole session
    assert mg.yield_note(r) == f"; engine core at nice {want}, its session at nice {want}"
    assert mg.yield_note(r, why=True) == (
        f"; engine core at nice {want}, its session at nice {want}"
        " (its busy-wait gives way to the API server and to other sessions)"
    )
    assert procfs.autogroup_nice(os.getpid()) == mine  # tuner's own session as it was


def test_a_trial_in_tuners_session_leaves_that_session_alone(started):
    mine = procfs.autogroup_nice(os.getpid())
    r, core, _ = started("pinned", die_with_parent=True)  # a trial server: in tuner's session, with its client
    assert os.getsid(r.pid) == os.getsid(0)
    want = min(19, _nice(r.pid) + 10)
    assert mg.yield_engine_core(r, 10) == want and _thread_nices(core) == {want}
    assert r.session_nice is None and mg.yield_note(r) == f"; engine core at nice {want}"
    assert mg.yield_note(r, why=True) == f"; engine core at nice {want} (its busy-wait gives way to the API server)"
    assert procfs.autogroup_nice(os.getpid()) == mine  # tuner (and the trial's client) not yielded with it


@pytest.mark.skipif(os.geteuid() != 0 and os.getpriority(os.PRIO_PROCESS, 0) > 5, reason="cannot raise priority")
def test_below_the_servers_own_priority(started):
    r, core, worker = started("pinned", nice=5)
    assert _nice(r.pid) == 5
    assert mg.yield_engine_core(r, 10) == 15 and _thread_nices(core) == {15} and _nice(worker) == 5
    r2, core2, _ = started("pinned", nice=15)
    assert mg.yield_engine_core(r2, 10) == 19 and _thread_nices(core2) == {19}  # nice(1)'s floor


def test_nothing_is_done_where_no_worker_is_pinned_or_it_is_turned_off(started):
    r, core, worker = started("free")  # a GPU host: vLLM binds no worker to cores
    base = _nice(r.pid)
    assert mg.yield_engine_core(r, 10) is None and _nice(core) == base and r.engine_core_nice is None
    assert r.session_nice is None and procfs.autogroup_nice(r.pid) in (0, None) and mg.yield_note(r) == ""
    assert mg.yield_note(r, why=True) == ""
    r2, core2, _ = started("pinned")
    assert mg.yield_engine_core(r2, 0) is None and _nice(core2) == base  # engine_core_nice: 0


def test_a_server_without_an_engine_core_is_left_alone(tmp_path):
    r = mg.start_server([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), tmp_path / "l.log")
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert mg.yield_engine_core(r, 10) is None and _nice(r.pid) == base  # llama-server, or any other server
    finally:
        mg.stop_server(r, grace_s=1)


def test_the_config_turns_it_on_by_default_within_nices_range():
    from pydantic import ValidationError

    from tuner.config import Managed

    assert Managed(model="m").engine_core_nice == 10
    assert Managed(model="m", engine_core_nice=0).engine_core_nice == 0
    with pytest.raises(ValidationError, match="engine_core_nice"):
        Managed(model="m", engine_core_nice=20)
    with pytest.raises(ValidationError, match="engine_core_nice"):
        Managed(model="m", engine_core_nice=-1)
