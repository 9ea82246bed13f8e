"""Linux's /proc, read one way: a process's or a thread's stat line with the fields tuner uses named (proc(5)), the
processes there are, and the nice level of a session's autogroup (read and set).

The command name sits in parentheses and may itself hold spaces and parentheses (a thread named ``a) b``), so the
fields are split after the last ``)``, never on the first space. A process that is gone between listing and reading
reads as None: callers treat it as not there, which it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Stat",
    "CLK_TCK",
    "parse_stat",
    "stat",
    "pids",
    "schedules_by_session",
    "autogroup_nice",
    "set_autogroup_nice",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")  # the unit of utime, stime and starttime


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>[/task/<tid>]/stat that tuner reads (numbered as proc(5) numbers them)."""

    comm: str  # 2, without the parentheses (the kernel truncates it to 15 bytes)
    state: str  # 3: R, S, D, Z (zombie), X (dead), ...
    ppid: int  # 4
    pgrp: int  # 5
    flags: int  # 9: PF_* (0x00200000: a kernel thread)
    utime: int  # 14, clock ticks
    stime: int  # 15
    cutime: int  # 16: waited-for children's
    cstime: int  # 17
    starttime: int  # 22: clock ticks after boot
    processor: int  # 39: the CPU it last ran on

    @property
    def gone(self) -> bool:
        """A zombie or dead: it runs nothing, though its pid still reads."""
        return self.state in ("Z", "X")

    @property
    def cpu_ticks(self) -> int:
        """Its own CPU time (utime + stime), clock ticks."""
        return self.utime + self.stime


def parse_stat(text: str) -> Stat:
    """One stat line; ValueError where it is not one."""
    try:
        comm = text[text.index("(") + 1 : text.rindex(")")]
        f = text[text.rindex(")") + 2 :].split()
        return Stat(
            comm=comm,
            state=f[0],
            ppid=int(f[1]),
            pgrp=int(f[2]),
            flags=int(f[6]),
            utime=int(f[11]),
            stime=int(f[12]),
            cutime=int(f[13]),
            cstime=int(f[14]),
            starttime=int(f[19]),
            processor=int(f[36]),
        )
    except (ValueError, IndexError) as exc:
        raise ValueError(f"not a /proc stat line: {text[:80]!r}") from exc


def stat(pid: int | str, tid: int | str | None = None) -> Stat | None:
    """Process ``pid``'s stat (its thread ``tid``'s where given); None where it cannot be read (gone, or never was)."""
    path = Path(f"/proc/{pid}") / (f"task/{tid}" if tid is not None else "") / "stat"
    try:
        return parse_stat(path.read_text())
    except (OSError, ValueError):
        return None


def pids() -> list[int]:
    """The processes /proc lists now (threads are under each one's task/)."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


_AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def schedules_by_session() -> bool:
    """Whether the kernel schedules by session: it has autogroups and ``kernel.sched_autogroup_enabled`` is 1.

    Where it does, each session that ``setsid`` started shares one CPU weight against the other sessions', set by
    its autogroup's nice level (0 by default; sched(7), "The autogroup feature"); a process's own nice orders it only
    within its session."""
    try:
        return _AUTOGROUP_ENABLED.read_text().strip() == "1"
    except OSError:
        return False


def autogroup_nice(pid: int) -> int | None:
    """The nice level of the autogroup ``pid``'s session is in; None where the kernel does not schedule by session,
    ``pid`` is gone, or its session has no autogroup of its own.

    The last is the session of PID 1 and of whatever it starts without ``setsid`` (a CI runner's job may be one):
    the kernel prints nothing for it, and schedules each of its processes against every session as if alone."""
    if not schedules_by_session():
        return None
    try:
        line = Path(f"/proc/{pid}/autogroup").read_text()  # "/autogroup-25 nice 0", or "" (no autogroup of its own)
        return int(line.split("nice")[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int, nice: int) -> int | None:
    """Set the nice level of ``pid``'s session's autogroup (every process of the session shares it); the level it now
    has, None where the kernel does not schedule by session, ``pid`` is gone, or it may not be set (lowering a
    level needs privilege)."""
    if autogroup_nice(pid) is None:
        return None
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        return None
    return autogroup_nice(pid)
