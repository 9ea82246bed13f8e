"""tuner/procfs.py against real processes: this one, a child that names itself with parentheses and spaces, a zombie,
a thread. Every field read is checked against what the process itself or the os module says."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuner import procfs
from tuner.lab.proc import wait_for

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux /proc only")


def test_this_process_reads_as_the_os_module_says():
    st = procfs.stat(os.getpid())
    assert st is not None
    assert (st.ppid, st.pgrp, st.state, st.gone) == (os.getppid(), os.getpgrp(), "R", False)
    assert st.processor in os.sched_getaffinity(0)
    assert st.flags & 0x00200000 == 0  # not a kernel thread
    before, cpu0 = st.cpu_ticks, time.process_time()
    while time.process_time() - cpu0 < 0.3:  # burn 0.3 s of CPU
        pass
    after = procfs.stat(os.getpid())
    assert after is not None and after.starttime == st.starttime
    spent = (after.cpu_ticks - before) / procfs.CLK_TCK
    assert spent == pytest.approx(time.process_time() - cpu0, abs=3 / procfs.CLK_TCK)


def test_a_name_with_parentheses_and_spaces_does_not_shift_the_fields():
    name = "a) b (c"
    child = subprocess.Popen(
        [sys.executable, "-c", f"open('/proc/self/comm', 'w').write({name!r}); import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        st = wait_for(lambda: (s := procfs.stat(child.pid)) is not None and s.comm == name and s, 10, "its new name")
        assert (st.ppid, st.pgrp) == (os.getpid(), os.getpgrp())
        assert child.pid in procfs.pids()
    finally:
        child.communicate(b"")


def test_a_zombie_is_gone_and_a_reaped_process_reads_as_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    st = wait_for(lambda: (s := procfs.stat(child.pid)) is not None and s.gone and s, 10, "a zombie")  # not reaped
    assert st.state == "Z"
    child.wait()
    assert procfs.stat(child.pid) is None and child.pid not in procfs.pids()


def test_a_thread_reads_under_its_process():
    ready, done, tid = threading.Event(), threading.Event(), []

    def run():
        tid.append(threading.get_native_id())
        ready.set()
        done.wait()

    t = threading.Thread(target=run, name="procfs-probe")
    t.start()
    try:
        ready.wait()
        st = procfs.stat(os.getpid(), tid[0])
        assert st is not None and st.ppid == os.getppid() and st.pgrp == os.getpgrp()
        assert procfs.stat(os.getpid(), 2**22 + 1) is None  # no such thread
    finally:
        done.set()
        t.join()


def test_a_line_that_is_not_a_stat_line_is_refused():
    with pytest.raises(ValueError, match="not a /proc stat line"):
        procfs.parse_stat("1 (x) R 0")


@pytest.mark.skipif(not procfs.schedules_by_session(), reason="the kernel does not schedule by session here")
def test_a_sessions_autogroup_level_is_set_for_that_session_only():
    mine = procfs.autogroup_nice(os.getpid())  # None where this runs in a session with no autogroup (CI's may)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        assert procfs.autogroup_nice(child.pid) == 0  # a new session starts a new autogroup, at 0
        assert procfs.set_autogroup_nice(child.pid, 7) == 7
        with open(f"/proc/{child.pid}/autogroup") as f:  # the kernel's own line says so
            assert f.read().rstrip().endswith("nice 7")
        assert procfs.autogroup_nice(os.getpid()) == mine  # this session's untouched
    finally:
        child.communicate(b"")
    assert procfs.autogroup_nice(child.pid) is None and procfs.set_autogroup_nice(child.pid, 7) is None  # gone


def _sessionless() -> int | None:
    """A live process in the session the kernel started with (session 0: PID 1's, where PID 1 never left it, and
    the kernel's own threads'), which has no autogroup of its own; None where this host shows none."""
    for pid in procfs.pids():
        try:
            if os.getsid(pid) == 0:
                return pid
        except OSError:
            continue
    return None


@pytest.mark.skipif(not procfs.schedules_by_session(), reason="the kernel does not schedule by session here")
def test_a_session_without_an_autogroup_of_its_own_reads_as_none():
    pid = _sessionless()
    if pid is None:
        pytest.skip("no process of session 0 is visible here")
    assert Path(f"/proc/{pid}/autogroup").read_text() == ""  # the kernel prints nothing for it ...
    assert procfs.autogroup_nice(pid) is None and procfs.set_autogroup_nice(pid, 5) is None  # ... and it is not set
    assert Path(f"/proc/{pid}/autogroup").read_text() == ""


def test_no_autogroup_reads_as_none(tmp_path, monkeypatch):
    off = tmp_path / "sched_autogroup_enabled"
    off.write_text("0\n")
    monkeypatch.setattr(procfs, "_AUTOGROUP_ENABLED", off)  # kernel.sched_autogroup_enabled=0, as on some hosts
    assert not procfs.schedules_by_session()
    assert procfs.autogroup_nice(os.getpid()) is None and procfs.set_autogroup_nice(os.getpid(), 5) is None
    monkeypatch.setattr(procfs, "_AUTOGROUP_ENABLED", tmp_path / "absent")  # a kernel built without autogroups
    assert not procfs.schedules_by_session() and procfs.autogroup_nice(os.getpid()) is None
