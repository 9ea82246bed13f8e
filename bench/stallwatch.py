"""Catch a stall of a process in the act: what its threads were doing while it answered nothing.

The alert bench saw tuner's whole process stop for 1.5-10 s under a saturated vLLM (its scrape loop "ran 10.1 s
late", bench/results/2026-11-25-1445-whole-run.md), and a log line written after the stall cannot say why. This
probes the process's HTTP port every ``every_s``; when an answer takes longer than ``after_s``, it records, while
the stall lasts: each thread's state, kernel wait channel and CPU time over half a second (/proc), the machine's
pressure (/proc/pressure), and, where py-spy is installed, every thread's stack with native frames and which one
holds the GIL; and over the whole stall, how long its threads ran and how long they waited runnable for a CPU
(schedstat), and which processes on the machine used the CPU meanwhile. One stall's record tells the cases apart: a
thread running with the GIL (a long call that never lets go), threads runnable but given no CPU (the machine or a
cgroup), threads asleep with nothing to wake them, a thread in uninterruptible sleep (IO).

    watch = StallWatch(pid, port, out=Path("stalls.txt")); watch.start(); ...; watch.stop(); watch.stalls
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tuner import procfs

__all__ = ["Stall", "StallWatch", "threads_of"]


@dataclass
class Stall:
    at: float  # unix seconds: when the unanswered probe was sent
    seconds: float  # until its answer came (or the watch stopped)
    summary: str  # one line: thread states, who used CPU, the GIL holder's frames, pressure


def threads_of(pid: int) -> dict[int, tuple[str, str, str, float]]:
    """tid -> (name, state, wchan, CPU seconds) of each of ``pid``'s threads; empty when it is gone."""
    out: dict[int, tuple[str, str, str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = procfs.stat(pid, tid)
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            continue
        if st is not None:
            out[int(tid)] = (st.comm, st.state, wchan, st.cpu_ticks / procfs.CLK_TCK)
    return out


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) summed over ``pid``'s threads (/proc schedstat)."""
    ran = waited = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0, 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu, delay, _ = f.read().split()
        except (OSError, ValueError):
            continue
        ran, waited = ran + int(on_cpu), waited + int(delay)
    return ran / 1e9, waited / 1e9


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """pid -> (name, CPU seconds) of every process on the machine."""
    found = ((pid, procfs.stat(pid)) for pid in procfs.pids())
    return {pid: (st.comm, st.cpu_ticks / procfs.CLK_TCK) for pid, st in found if st is not None}


def _pressure() -> str:
    parts = []
    for kind in ("cpu", "io", "memory"):
        try:
            with open(f"/proc/pressure/{kind}") as f:
                some = f.readline().split()  # some avg10=... avg60=... avg300=... total=...
            parts.append(f"{kind} {some[1].split('=')[1]}%")
        except (OSError, IndexError):
            continue
    return "pressure (some, avg10): " + ", ".join(parts) if parts else "pressure: not available"


class StallWatch:
    def __init__(
        self, pid: int, port: int, *, out: Path, every_s: float = 0.25, after_s: float = 1.0, py_spy: str | None = None
    ) -> None:
        self.pid, self.port, self.out = pid, port, out
        self.every_s, self.after_s = every_s, after_s
        found = py_spy or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.py_spy = found if Path(found).exists() else None
        self.stalls: list[Stall] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallwatch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def within(self, start: float, end: float) -> list[Stall]:
        return [s for s in self.stalls if start <= s.at <= end]

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            at, t0 = time.time(), time.monotonic()
            sched0 = schedstat(self.pid)  # what the stall, if this probe finds one, is measured from
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.after_s)
            except OSError:
                continue  # not listening (yet, or any more): nothing to time
            try:
                sock.sendall(b"GET /-/stallwatch HTTP/1.0\r\n\r\n")
                try:
                    sock.recv(1)
                    continue
                except TimeoutError:
                    pass
                procs0, c0 = cpu_by_process(), time.monotonic()
                summary = f"captured {c0 - t0:.1f} s after the probe: " + self._capture(at)
                sock.settimeout(0.25)
                while not self._stop.is_set():  # the stall lasts until the answer comes
                    try:
                        sock.recv(1)
                        break
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                seconds = time.monotonic() - t0
                ran, waited = (b - a for a, b in zip(sched0, schedstat(self.pid)))
                procs1, c1 = cpu_by_process(), time.monotonic()
                top = sorted(
                    ((procs1[p][1] - procs0[p][1], procs1[p][0], p) for p in procs1 if p in procs0), reverse=True
                )[:4]
                whole = (
                    f"over the whole stall its threads ran {ran:.2f} s and waited {waited:.2f} s runnable for a "
                    f"CPU; the machine's busiest processes from its capture on ({c1 - c0:.1f} s): "
                    + ", ".join(f"{name}[{p}] {cpu:.1f} s" for cpu, name, p in top)
                )
                with open(self.out, "a") as f:
                    f.write(f"=== stall ended after {seconds:.1f} s: {whole}\n\n")
                self.stalls.append(Stall(at, seconds, f"{whole}; {summary}"))
            except OSError:
                continue
            finally:
                sock.close()

    def _capture(self, at: float) -> str:
        before = threads_of(self.pid)
        time.sleep(0.5)
        after = threads_of(self.pid)
        used = sorted(((after[t][3] - before[t][3], t) for t in after if t in before), reverse=True)
        states: dict[str, int] = {}
        for _, state, _, _ in after.values():
            states[state] = states.get(state, 0) + 1
        busy = [f"{after[t][0]}[{t}] {cpu:.2f} s" for cpu, t in used[:3] if cpu > 0]
        waits: dict[str, int] = {}
        for _, state, wchan, _ in after.values():
            if state in ("D", "R"):
                waits[f"{state}:{wchan}"] = waits.get(f"{state}:{wchan}", 0) + 1
        dump = ""
        if self.py_spy is not None:
            try:
                dump = subprocess.run(
                    [self.py_spy, "dump", "--pid", str(self.pid), "--native"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                ).stdout
            except subprocess.TimeoutExpired:
                dump = "(py-spy dump timed out)"
        gil = _gil_holder(dump)
        summary = (
            f"threads by state {dict(sorted(states.items()))}; CPU in the next 0.5 s: "
            f"{', '.join(busy) or 'none'}; running or in IO: {waits or 'none'}; GIL: {gil}; {_pressure()}"
        )
        with open(self.out, "a") as f:
            f.write(
                f"=== stall probe sent {time.strftime('%H:%M:%S', time.gmtime(at))} UTC "
                f"(+{at % 1:.2f} s)\n{summary}\n"
                + "".join(f"  {t} {n} {s} {w} cpu {c:.2f}\n" for t, (n, s, w, c) in sorted(after.items()))
                + dump
                + "\n"
            )
        return summary


def _gil_holder(dump: str) -> str:
    """The thread py-spy marks as holding the GIL, and its innermost frames, from a ``py-spy dump``."""
    if not dump:
        return "unknown (no py-spy dump)"
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and "gil" in line:
            frames: list[str] = []
            for ln in lines[i + 1 :]:  # its innermost frames, down to the first of Python code
                if not ln.startswith(" "):
                    break
                frames.append(ln.strip())
                if ".py:" in ln or len(frames) == 8:
                    break
            return f"{line.strip()} in {' <- '.join(frames)}"
    return "no thread holds it"
