"""How tuner starts a real inference server: argv builders, environment, and a supervised process.

Everything is an argv list handed to the OS directly, never a shell string, and every flag name and value is
validated first, so a value from a config file or the advisor can never smuggle in an extra option.

Used by the integration tests, the demo, the fixture recorder and (later) managed apply.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

from tuner.collect import http
from tuner.errors import ScrapeError, ServerStartError

__all__ = [
    "FlagValue",
    "ServerStartError",
    "ServerProcess",
    "Supervised",
    "error_line",
    "die_with_parent_hook",
    "own_group_dying_with_parent",
    "group_sentinel",
    "free_port",
    "llama_server_argv",
    "vllm_argv",
    "vllm_cpu_env",
]

FlagValue = str | int | float | bool | None

_FLAG_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\Z")
# Set through the builders' own arguments; a flag map that repeats them would make two sources of truth.
_VLLM_RESERVED = frozenset({"model", "host", "port", "served-model-name"})
_LLAMA_RESERVED = frozenset({"-m", "--model", "--host", "--port"})


def _render_value(flag: str, value: str | int | float) -> str:
    text = repr(value) if isinstance(value, float) else str(value)
    if not text:
        raise ValueError(f"flag {flag}: empty value; pass None to leave the flag out")
    if text.startswith("-"):
        raise ValueError(f"flag {flag}: value {text!r} starts with '-' and would read as another option")
    if "\x00" in text:
        raise ValueError(f"flag {flag}: value contains a NUL byte")
    return text


def render_flags(flags: Mapping[str, FlagValue], *, dashed: bool, reserved: frozenset[str]) -> list[str]:
    """Render a flag map: True -> bare flag, False -> --no-<name>, None -> omitted, else flag + value."""
    argv: list[str] = []
    for key, value in flags.items():
        if not isinstance(key, str):
            raise ValueError(f"flag name {key!r} is not a string")
        if dashed:
            name = key[2:] if key.startswith("--") else key[1:] if key.startswith("-") else ""
            if not name or not _FLAG_NAME.match(name):
                raise ValueError(f"flag {key!r}: expected '-x' or '--name' with lowercase letters, digits, '-'")
            flag = key
        else:
            if not _FLAG_NAME.match(key):
                raise ValueError(f"flag {key!r}: expected a bare name of lowercase letters, digits, '-'")
            name, flag = key, "--" + key
        if flag in reserved or key in reserved:
            raise ValueError(f"flag {key!r} is set by the builder's own argument; pass it there")
        if value is None:
            continue
        if value is True:
            argv.append(flag)
        elif value is False:
            # vLLM's BooleanOptionalAction (and llama.cpp's paired long flags) spell "off" as --no-<name>.
            if not flag.startswith("--"):
                raise ValueError(f"flag {key!r}: a short flag has no --no- form; pass None to leave it out")
            argv.append("--no-" + name)
        elif isinstance(value, (str, int, float)):
            argv += [flag, _render_value(key, value)]
        else:
            raise ValueError(f"flag {key!r}: unsupported value type {type(value).__name__}")
    return argv


def vllm_argv(
    python: str,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int,
    served_model_name: str | None = None,
    flags: Mapping[str, FlagValue] | None = None,
) -> list[str]:
    """argv for vLLM's OpenAI server; flag keys are bare names ("max-num-seqs": 8 -> --max-num-seqs 8).

    Started as a module because the `vllm` console script looks for a distribution named `vllm` and fails
    on the `vllm-cpu` build.
    """
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        _render_value("model", model),
        "--host",
        _render_value("host", host),
        "--port",
        str(_check_port(port)),
    ]
    if served_model_name is not None:
        argv += ["--served-model-name", _render_value("served-model-name", served_model_name)]
    return argv + render_flags(flags or {}, dashed=False, reserved=_VLLM_RESERVED)


def llama_server_argv(
    binary: str, model: str, *, host: str = "127.0.0.1", port: int, flags: Mapping[str, FlagValue] | None = None
) -> list[str]:
    """argv for llama.cpp's llama-server; flag keys carry their dashes ({"-c": 1024, "--metrics": True}).

    False renders --no-<name> (llama.cpp pairs e.g. --mmap/--no-mmap); flags without an "off" form, such as
    --metrics, are turned off by leaving them out (None).
    """
    argv = [
        binary,
        "-m",
        _render_value("-m", model),
        "--host",
        _render_value("--host", host),
        "--port",
        str(_check_port(port)),
    ]
    return argv + render_flags(flags or {}, dashed=True, reserved=_LLAMA_RESERVED)


def vllm_cpu_env(
    cache_root: str | os.PathLike[str], *, kvcache_space_gib: int | None = 1, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment for a vLLM CPU server: KV space in whole GiB, caches under cache_root (not $HOME).

    VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes (and --gpu-memory-utilization's sizing):
    pass kvcache_space_gib=None to size the KV cache with those flags; the variable is then removed.
    """
    if kvcache_space_gib is not None and (
        isinstance(kvcache_space_gib, bool) or not isinstance(kvcache_space_gib, int) or kvcache_space_gib < 1
    ):
        # The CPU build parses it with int() and crashes on "" or "0.5".
        raise ValueError(f"kvcache_space_gib must be a whole number of GiB >= 1 or None, got {kvcache_space_gib!r}")
    env = dict(os.environ if base is None else base)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kvcache_space_gib)
    env.update(
        {
            "VLLM_CACHE_ROOT": os.fspath(cache_root),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",  # the model is local; never try a hub that cannot be reached
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",  # log lines reach the log file as they happen
        }
    )
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host right now (the OS picks it; another process could still take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _check_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")
    return port


class Supervised(Protocol):
    """A server process tuner waits on: one it started (ServerProcess) or one found again by pid (managed)."""

    @property
    def log_path(self) -> Path: ...

    def gone(self) -> bool: ...

    def exit_code(self) -> int | None: ...  # None: unknown (not our child) or still running


def wait_healthy(proc: Supervised, health_url: str, timeout_s: float, *, interval: float = 0.25) -> float:
    """Poll GET ``health_url`` until it answers 200; seconds waited. ServerStartError when the process exits
    first (with the log's own error line, ``exited``) or ``timeout_s`` passes (with the last answer)."""
    t0 = time.monotonic()
    last = "no answer yet"
    while True:
        if proc.gone():
            code = proc.exit_code()
            raise ServerStartError(
                f"server exited{'' if code is None else f' with code {code}'} before "
                f"{health_url} answered 200: {error_line(proc.log_path)}",
                proc.log_path,
                log_tail(proc.log_path, 8),
                exited=True,
            )
        try:
            status = http.get(health_url, timeout_s=5, max_bytes=65536, accept="*/*").status
            if status == 200:
                return time.monotonic() - t0
            last = f"HTTP {status}"
        except ScrapeError as exc:
            last = str(exc).removeprefix(f"{health_url}: ")
        if time.monotonic() - t0 > timeout_s:
            raise ServerStartError(
                f"{health_url} not healthy after {timeout_s:.0f}s (last: {last})",
                proc.log_path,
                log_tail(proc.log_path, 8),
            )
        time.sleep(interval)


def log_tail(log: Path, n: int = 20) -> list[str]:
    """The last n lines of a server log (decoded leniently: servers print progress bars and odd bytes)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return list(collections.deque(lines, maxlen=n))


def error_line(log: Path, *, since_marker: bool = True) -> str:
    """The server's own reason for failing: the last error-looking line of its log since tuner's last start."""
    try:
        text = log.read_bytes()[-256 * 1024 :].decode(errors="replace")
    except OSError:
        return "(no log)"
    if since_marker and "==== tuner " in text:
        text = text[text.rindex("==== tuner ") :]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keys = ("Error", "error:", "ERROR", "Exception", "invalid", "failed", "must be")
    for ln in reversed(lines):
        if any(k in ln for k in keys) and not ln.startswith("Traceback"):
            return ln[-500:]
    return lines[-1][-500:] if lines else "(empty log)"


_PR_SET_PDEATHSIG = 1


def die_with_parent_hook() -> None:
    """Run in the child before exec: SIGKILL it when the process that started it dies (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def own_group_dying_with_parent() -> None:
    """Run in the child before exec: a process group of its own (``group_sentinel`` and a stop reach every process it
    forks) that dies with the process that started it, but in that process's session, not a new one.

    On a kernel with CFS autogroup (``/proc/sys/kernel/sched_autogroup_enabled``, on here) every session is a
    scheduling group: a trial server and the benchmark client that times it in different sessions share the CPU
    group against group, not thread against thread, and under load the client's requests went out in bursts (224
    in half a second where the arrival pattern has at most 38): the same flags then missed the SLO at a quarter of
    the rate they met minutes before. In one session, runs at the same rates measured P99 TTFT 0.02-0.05 s; with the
    client or the server in a session of its own, up to 9 s (bench/results/2026-11-27-0900-client-stalls.md)."""
    os.setpgid(0, 0)
    die_with_parent_hook()


_SENTINEL = """
import os, signal, sys
try:
    while os.read(0, 4096):
        pass
except OSError:
    pass
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except OSError:
    pass
"""


def group_sentinel(pgid: int) -> int:
    """Start a watcher that SIGKILLs process group ``pgid`` once this process dies or closes the returned fd.

    PR_SET_PDEATHSIG reaches only the process it was set in: when a tuner is killed, a vLLM server's API process
    dies with it but its engine core and worker (children in the same group) were seen running on 13 minutes
    later. The watcher (a tiny Python in its own session) reads a pipe whose only write end is this process's;
    the kernel closes that end when this process exits by any means, kill -9 included, and the watcher then
    kills the whole group. Close the fd after stopping the group yourself (ServerProcess.stop does)."""
    r, w = os.pipe()  # both ends non-inheritable: the server and other children never hold the write end
    try:
        subprocess.Popen(
            [sys.executable, "-S", "-c", _SENTINEL, str(pgid)],
            stdin=r,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        os.close(w)
        raise
    finally:
        os.close(r)
    return w


class ServerProcess:
    """A server started in its own session (process group), logging to a file, stoppable as a whole.

    Start with ServerProcess.start(...); use as a context manager to guarantee stop().
    """

    def __init__(
        self, popen: subprocess.Popen[bytes], argv: list[str], log_path: Path, sentinel_fd: int | None = None
    ) -> None:
        self._popen = popen
        self._sentinel_fd = sentinel_fd
        self.argv = argv
        self.log_path = log_path
        self.pid = popen.pid
        self.started_at = time.monotonic()

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        log_path: str | os.PathLike[str],
        cwd: str | os.PathLike[str] | None = None,
        *,
        die_with_parent: bool = False,
    ) -> ServerProcess:
        """Start argv (no shell) with env (None: inherit ours); stdout and stderr go to log_path.

        ``die_with_parent``: the server and every process it started die when this process dies, even by
        kill -9 (Linux PR_SET_PDEATHSIG for the server, ``group_sentinel`` for its group), for servers that must
        not outlive their tuner (tuning trials)."""
        argv = [os.fspath(a) for a in argv]
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                argv,
                env=None if env is None else dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # own process group: stop() can reach workers the server forks; a server that dies with its tuner (a
                # trial) stays in tuner's session, where the benchmark client timing it runs (see the function)
                start_new_session=not die_with_parent,
                preexec_fn=own_group_dying_with_parent if die_with_parent else None,
            )
        return cls(popen, argv, log_path, group_sentinel(popen.pid) if die_with_parent else None)

    @property
    def returncode(self) -> int | None:
        """Exit code once exited (negative: killed by that signal), else None."""
        return self._popen.poll()

    def is_running(self) -> bool:
        return self._popen.poll() is None

    def log_tail(self, n: int = 20) -> list[str]:
        """The last n lines of the log."""
        return log_tail(self.log_path, n)

    def wait_healthy(self, url: str, timeout: float, *, path: str = "/health", interval: float = 0.25) -> float:
        """Poll GET {url}{path} until 200; returns seconds since start. Raises ServerStartError on exit/timeout.

        url is the server's base URL; llama-server answers 503 while loading, vLLM refuses until it listens.
        Prometheus and Alertmanager use path="/-/ready".
        """
        wait_healthy(self, url.rstrip("/") + path, timeout, interval=interval)
        return time.monotonic() - self.started_at

    def gone(self) -> bool:
        return self._popen.poll() is not None

    def exit_code(self) -> int | None:
        return self._popen.poll()

    def stop(self, grace_s: float = 20.0) -> int:
        """Stop the server and everything in its process group; returns its exit code.

        SIGTERM, then after grace_s a SIGINT (llama-server stops decoding on the first signal but waits for
        clients to hang up; a second signal makes it exit), then SIGKILL to the whole group.
        """
        steps = ((signal.SIGTERM, grace_s), (signal.SIGINT, min(5.0, grace_s)))
        for sig, wait_s in steps:
            if self._popen.poll() is not None:
                break
            self._signal_leader(sig)
            try:
                self._popen.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        if self._popen.poll() is None:
            self._killpg()
            self._popen.wait()
        self._reap_group()
        self.release_sentinel()
        return self._popen.returncode

    def release_sentinel(self) -> None:
        """Let the group's sentinel go (``group_sentinel``), once the group is gone: its kill then finds nothing.
        Whoever stops the group by other means than ``stop`` calls this after. A sentinel never let go lives until
        this process exits, a Python apiece, and then kills a group id the kernel may have given to another process
        by then (pid_max is 32,768 on these hosts; a tune spends about a thousand pids in half an hour)."""
        if self._sentinel_fd is not None:
            os.close(self._sentinel_fd)
            self._sentinel_fd = None

    def _signal_leader(self, sig: signal.Signals) -> None:
        try:
            self._popen.send_signal(sig)
        except ProcessLookupError:
            pass

    def _killpg(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap_group(self, wait_s: float = 5.0) -> None:
        """Give group members a moment to follow the leader out (vLLM's engine core), then SIGKILL them."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)
        self._killpg()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else f"exited {self.returncode}"
        return f"<ServerProcess pid={self.pid} {state} {self.argv[0]!r}>"
