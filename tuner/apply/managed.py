"""Managed servers: tuner starts them from the target's ``managed:`` section, finds them again, drains and stops them.

A managed server runs in its own session, logging to ``<log_dir>/<target>.log``, and outlives the tuner process
that started it: a tuner restarted (or killed) finds it again by pid *and* kernel start time, so a recycled pid
is never mistaken for it. The argv is built from the allow-listed flags (tuner/flags.py) and the fixed
``extra_args`` with the argv builders of tuner/apply/launch.py — a list handed to the OS, never a shell.

The health gate is ``/health`` answering 200 and then one real request (a 4-token completion, or an embedding
for ``type: embedding``): a server that loads but cannot serve does not pass.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import procfs
from tuner.apply import launch
from tuner.apply.launch import ServerProcess, error_line, llama_server_argv, vllm_argv
from tuner.backends import backend as backend_of
from tuner.collect import http
from tuner.config import Target
from tuner.errors import ConfigError, ScrapeError, ServerStartError
from tuner.flags import redact_argv, render, tunable_spelled

__all__ = [
    "build_argv",
    "server_env",
    "log_path",
    "proc_start_time",
    "proc_argv",
    "is_alive",
    "Running",
    "group_pids",
    "find_by_argv",
    "start_server",
    "stop_server",
    "wait_healthy",
    "engine_cores",
    "set_engine_core_nice",
    "yield_engine_core",
    "yield_note",
    "health_gate",
    "error_line",
    "drain_llama",
]


def _check_model(target: Target) -> str:
    assert target.managed is not None
    path = Path(target.managed.model)
    if not path.exists():
        raise ConfigError("config", f"targets[{target.name}].managed.model", f"{path}: no such file or directory")
    if backend_of(target.backend).model_is_file and not path.is_file():
        raise ConfigError("config", f"targets[{target.name}].managed.model", f"{path}: llama-server needs a .gguf file")
    return str(path.resolve())


def build_argv(target: Target, flags: Mapping[str, Any]) -> list[str]:
    """The full argv for ``target`` with the tunable ``flags`` (tuner's names); validated, never a shell string."""
    m = target.managed
    if m is None:
        raise ConfigError("config", f"targets[{target.name}].managed", "the target is not managed by tuner")
    for key in m.extra_args:  # the config refuses these already; a target built otherwise is checked here
        if tunable_spelled(target.backend, key) is not None:
            raise ConfigError(
                "config",
                f"targets[{target.name}].managed.extra_args.{key}",
                "a tunable flag belongs in managed.flags, where tuner can change it",
            )
    model = _check_model(target)
    host, port = target.host_port
    backend = target.backend
    try:
        tunable = render(backend, flags)
        if backend == "vllm":
            fixed: dict[str, Any] = {"shutdown-timeout": int(m.drain_timeout.total_seconds())}
            if m.type == "embedding":
                fixed["runner"] = "pooling"
            fixed.update(m.extra_args)
            return vllm_argv(
                m.executable or sys.executable,
                model,
                host=host,
                port=port,
                served_model_name=target.served_name,
                flags={**fixed, **tunable},
            )
        fixed = {"--metrics": True}  # tuner reads /metrics; without it llama-server answers 501
        if m.type == "embedding":
            fixed["--embedding"] = True
        fixed.update(m.extra_args)
        return llama_server_argv(
            m.executable or "llama-server", model, host=host, port=port, flags={**fixed, **tunable}
        )
    except ValueError as exc:  # FlagError is one; so are the builders' refusals
        raise ConfigError("config", f"targets[{target.name}].managed", str(exc)) from None


def server_env(target: Target) -> dict[str, str]:
    assert target.managed is not None
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    env.update(target.managed.env)
    return env


def log_path(target: Target, config_dir: Path) -> Path:
    assert target.managed is not None
    return (config_dir / target.managed.log_dir / f"{target.name}.log").resolve()


# ---- finding processes ---------------------------------------------------------------------------


def proc_start_time(pid: int) -> int | None:
    """The kernel's start time of pid (clock ticks since boot), or None when it does not exist or is a zombie."""
    st = procfs.stat(pid)
    return st.starttime if st is not None and not st.gone else None


def proc_argv(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def find_by_argv(argv: list[str]) -> int | None:
    """A live process running exactly ``argv`` (a server started by a tuner killed before it could record it)."""
    if not argv:
        return None
    return next((pid for pid in procfs.pids() if proc_argv(pid) == argv and proc_start_time(pid)), None)


def is_alive(pid: int | None, start: int | None) -> bool:
    return pid is not None and start is not None and proc_start_time(pid) == start


@dataclass
class Running:
    """A server process: started here (``popen`` set, so it can be reaped) or found again by pid."""

    pid: int
    start: int
    argv: list[str]
    log: Path
    proc: ServerProcess | None = None
    engine_core_nice: int | None = None  # set by yield_engine_core once healthy (None: left as it started)
    session_nice: int | None = None  # its session's autogroup level, set with it (None: not set, or no autogroups)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.is_running()
        return is_alive(self.pid, self.start)

    def exit_code(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def gone(self) -> bool:
        return not self.alive()

    @property
    def log_path(self) -> Path:
        return self.log


def start_server(
    argv: list[str], env: Mapping[str, str], log: Path, *, nice: int = 0, die_with_parent: bool = False
) -> Running:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        f.write(
            f"\n==== tuner {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {json.dumps(redact_argv(argv))}\n".encode()
        )
    proc = ServerProcess.start(argv, env, log, die_with_parent=die_with_parent)
    if nice:  # set before the server forks its workers, which inherit it
        try:
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
        except OSError:
            pass
    start = proc_start_time(proc.pid)
    return Running(proc.pid, start or 0, list(argv), log, proc)


def _wait_gone(r: Running, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if r.gone():
            return True
        time.sleep(0.1)
    return r.gone()


def group_pids(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``: a managed server and the workers it forked (it
    runs in a session of its own, so its pid is its group's id)."""
    return sorted(pid for pid in procfs.pids() if _in_group(pid, pgid))


def _in_group(pid: int, pgid: int) -> bool:
    st = procfs.stat(pid)
    return st is not None and st.pgrp == pgid and not st.gone


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. An exited leader nobody has reaped yet (tuner is often not
    its parent) is a zombie that ``killpg(pgid, 0)`` still finds: only members that are not zombies count."""
    return any(_in_group(pid, pgid) for pid in procfs.pids())


def stop_server(r: Running, *, grace_s: float, second_signal_after_s: float = 5.0) -> str:
    """SIGTERM, wait ``grace_s`` (vLLM drains for --shutdown-timeout meanwhile), SIGINT, then SIGKILL the group.

    Returns what it took, for the journal ("exited after SIGTERM in 3.1s", ...).
    """
    t0 = time.monotonic()
    how = "was not running"
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGINT, second_signal_after_s)):
        if r.gone():
            break
        try:
            os.kill(r.pid, sig)
        except ProcessLookupError:
            break
        if _wait_gone(r, wait_s):
            how = f"exited after {sig.name} in {time.monotonic() - t0:.1f}s"
            break
    else:
        how = f"killed (SIGKILL) after {time.monotonic() - t0:.1f}s"
    if not r.gone():
        try:
            os.killpg(r.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _wait_gone(r, 10)
    deadline = time.monotonic() + 5  # the engine core and other workers follow the leader out
    while _group_alive(r.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(r.pid):
        try:
            os.killpg(r.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if r.proc is not None and not _group_alive(r.pid):
        r.proc.release_sentinel()  # a group still there keeps its sentinel: it goes when tuner does
    return how


def drain_llama(url: str, grace_s: float) -> str:
    """llama-server has no drain: wait (up to grace_s) until /slots shows no slot processing, then stop it."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            slots = http.get_json(url + "/slots", timeout_s=2.0)
        except ScrapeError:
            slots = None
        if slots is None:  # unreachable, or /slots disabled (501) or not JSON
            return "no /slots answer; stopping now"
        if isinstance(slots, list) and not any(s.get("is_processing") for s in slots if isinstance(s, dict)):
            return f"idle after {grace_s - (deadline - time.monotonic()):.1f}s"
        time.sleep(0.2)
    return f"still busy after {grace_s:.0f}s grace; stopping anyway"


# ---- health ----------------------------------------------------------------------------------------


def wait_healthy(r: Running, url: str, timeout_s: float) -> float:
    """Poll /health until 200; seconds waited. ServerStartError (with the log's error line) on exit or timeout."""
    return launch.wait_healthy(r, url + "/health", timeout_s)


_ENGINE_CORE = "VLLM::EngineCor"  # the engine core's name in /proc/<pid>/comm (16-byte limit: "VLLM::EngineCore")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _affinity(pid: int) -> set[int]:
    try:
        return os.sched_getaffinity(pid)
    except OSError:
        return set()


def engine_cores(pids: list[int]) -> list[int]:
    """The vLLM engine core processes among ``pids`` (a server's ``group_pids``; none: not vLLM, or it ended)."""
    return [p for p in pids if _comm(p).startswith(_ENGINE_CORE)]


def set_engine_core_nice(cores: list[int], level: int) -> int:
    """Every thread of the engine core processes ``cores`` at nice ``level``; how many threads were set. Nice is per
    thread on Linux, and threads started later inherit their creator's."""
    done = 0
    for core in cores:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{core}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, level)
                done += 1
            except OSError:  # a thread that ended meanwhile
                pass
    return done


def yield_engine_core(r: Running, delta: int) -> int | None:
    """On a CPU host, run a vLLM server's engine core ``delta`` nice levels below the rest of the server; the nice
    level it now runs at, or None where nothing was done (``delta`` 0, no engine core: not vLLM, or no worker
    pinned to its cores: a GPU host).

    vLLM's CPU worker pins its compute threads to its cores (``VLLM_CPU_OMP_THREADS_BIND``), and its engine core,
    after each message from the worker, busy-waits for the next one for up to a second (``sched_yield`` in a loop:
    vllm/distributed/device_communicators/shm_broadcast.py, ``busy_loop_s=1``) on the cores left over, where the
    API server and the clients run. Loaded, it spins all the time, and on a 2-core host the API server got a tenth of
    a core: requests waited in it, unseen by the engine, which then ran 1 request where 16 clients had one each
    in flight, and served in bursts. At a lower priority the spin gives way to the rest of the server (measured on
    2 cores with 16 clients of 512 tokens against --max-num-seqs 4, three runs each: 2.08 -> 3.24 req/s, 5.7 -> 15.3
    requests at the engine on average; bench/results/2026-11-27-1908-engine-core.md). Under CFS autogroup a nice
    level orders the threads of one session: processes in other sessions (clients on the host, tuner's commands)
    still share the CPU with the server's session as a whole (docs/cpu-hosts.md), and the spinning session took
    both cores from every other session: 16 clients in another session sat runnable for seconds without running and
    kept 1-11 of their 16 requests at the engine (4.4 on average), an apply's command waited minutes to run. So where
    the server leads a session of its own (a managed server; a trial shares tuner's, where its benchmark client runs)
    and the kernel schedules by session, the session's autogroup runs at the same level: the clients then kept all
    16 at the engine and the server served 2.1x as much (bench/results/2026-11-30-0250-session-yield.md). A level yields
    only under contention: an otherwise idle host's cores are still the server's. Idempotent: the level is set,
    not lowered again, from the server's own (its ``nice``)."""
    if delta <= 0:
        return None
    pids = group_pids(r.pid)
    cores = engine_cores(pids)
    if not cores:
        return None
    free = _affinity(cores[0])
    if not any(_affinity(p) < free for p in pids if p != r.pid and p not in cores):
        return None
    try:
        level = min(19, os.getpriority(os.PRIO_PROCESS, r.pid) + delta)
    except OSError:
        return None
    if not set_engine_core_nice(cores, level):
        return None
    r.engine_core_nice = level
    try:
        leads = os.getsid(r.pid) == r.pid
    except OSError:  # it ended meanwhile
        leads = False
    if leads:
        r.session_nice = procfs.set_autogroup_nice(r.pid, level)
    return level


def yield_note(r: Running, *, why: bool = False) -> str:
    """What yield_engine_core did to ``r``, as a journal step or a log line ends with it, and with ``why`` what that
    does; "" where nothing."""
    if r.engine_core_nice is None:
        return ""
    session = f", its session at nice {r.session_nice}" if r.session_nice is not None else ""
    gives_way = " and to other sessions" if r.session_nice is not None else ""
    reason = f" (its busy-wait gives way to the API server{gives_way})" if why else ""
    return f"; engine core at nice {r.engine_core_nice}{session}{reason}"


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError:
        return body[:2000].decode(errors="replace")


def health_gate(target: Target, timeout_s: float = 60.0) -> str:
    """One real request through the server. Returns a short description; ServerStartError when it fails."""
    m = target.managed
    kind = m.type if m is not None else "llm"
    model = target.served_name
    body: dict[str, Any]
    if kind == "embedding":
        path, body = "/v1/embeddings", {"model": model, "input": "tuner health check"}
    else:
        path, body = "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    if not backend_of(target.backend).gate_names_model:
        body.pop("model")
    key = m.api_key if m is not None else None  # a server started with --api-key refuses requests without it
    try:
        resp = http.post_json(
            target.url + path, body, timeout_s=timeout_s, headers={"Authorization": f"Bearer {key}"} if key else None
        )
    except ScrapeError as exc:
        raise ServerStartError(f"health gate: POST {target.url}{path} failed: {exc}", None, []) from None
    status, answer = resp.status, _json_or_text(resp.body)
    ok = (
        status == 200
        and isinstance(answer, dict)
        and (bool(answer.get("data")) if kind == "embedding" else bool(answer.get("choices")))
    )
    if not ok:
        raise ServerStartError(f"health gate: POST {target.url}{path} answered {status}: {str(answer)[:300]}", None, [])
    return f"POST {path} answered 200"
