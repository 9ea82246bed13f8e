"""Stall a real server on purpose, and let it go: what the fixture recorder and the integration tests do to see
"up but not serving" (tests/fixtures/stall/README.md says what each server then answers).

- vLLM: its engine core is a child process named ``VLLM::EngineCore``; SIGSTOP stops it while the API server
  process (HTTP, /health, /metrics) runs on; SIGCONT lets it go on where it was.
- llama-server: one process. SIGSTOP stops every thread, the HTTP ones too (nothing answers: a down target).
  Its main thread (tid = pid) runs the loop that drives the slots and answers /metrics and /slots; stopped alone
  (ptrace: seize, then interrupt that one thread), /health still answers from the HTTP threads. Detaching lets
  it go on. Linux only; needs the right to trace the process (the same user, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import ctypes
import os
import signal

from tuner import procfs

__all__ = ["children", "engine_core_pid", "stop_process", "resume_process", "ThreadStop"]

_PTRACE_DETACH, _PTRACE_SEIZE, _PTRACE_INTERRUPT = 17, 0x4206, 0x4207
_WALL = 0x40000000  # waitpid: any thread, child or traced


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, comm) of the processes whose parent is ``pid``."""
    found = ((child, procfs.stat(child)) for child in procfs.pids())
    return [(child, st.comm) for child, st in found if st is not None and st.ppid == pid]


def engine_core_pid(server_pid: int) -> int:
    """The pid of a vLLM server's engine core (comm ``VLLM::EngineCor``, truncated by the kernel to 15 bytes);
    LookupError naming the children found when there is none."""
    found = children(server_pid)
    for pid, comm in found:
        if comm.startswith("VLLM::EngineCor"):
            return pid
    raise LookupError(f"no VLLM::EngineCore among the children of pid {server_pid}: {found}")


def stop_process(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def resume_process(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


class ThreadStop:
    """One thread stopped, the others running: ``with ThreadStop(tid): ...`` (ptrace seize + interrupt; detach
    on exit lets it run on)."""

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        self._libc.ptrace.restype = ctypes.c_long

    def _call(self, request: int) -> None:
        if self._libc.ptrace(request, self.tid, None, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"ptrace({request:#x}) on thread {self.tid}: {os.strerror(err)}")

    def __enter__(self) -> ThreadStop:
        self._call(_PTRACE_SEIZE)
        try:
            self._call(_PTRACE_INTERRUPT)
            os.waitpid(self.tid, _WALL)  # until it is stopped (the tracer's own thread must detach it too)
        except OSError:
            self._call(_PTRACE_DETACH)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call(_PTRACE_DETACH)
        except OSError:  # it died meanwhile (killed by whoever restarted it): collect it as its tracer, if it waits
            try:
                os.waitpid(self.tid, _WALL | os.WNOHANG)
            except ChildProcessError:
                pass
