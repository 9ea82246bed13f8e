"""A real `tuner run` child process for reliability tests and benches: config, start, its /metrics, `tuner status --json`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tuner.apply.launch import free_port
from tuner.collect import http
from tuner.errors import ScrapeError

__all__ = ["free_port", "TunerProcess", "AlertSink", "wait_for", "stop"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str = "condition",
    *,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
    every_s: float = 0.1,
) -> T:
    """Poll ``predicate`` every ``every_s`` until it returns something true, and return that. AssertionError naming
    ``what`` after ``timeout_s``, or at once when ``proc`` (the process that should bring it about) has exited,
    with the end of its ``log``. The tests' and the benches' one wait helper."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise AssertionError(
                f"{what}: the process exited with {proc.returncode} first"
                + (f"; the end of {log}:\n{tail}" if tail else "")
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)
    return value


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> int | None:
    """SIGTERM ``proc`` and wait ``grace_s`` for it, then SIGKILL it; its exit code. The tests' and the benches' one
    way to stop a child (a daemon, a server) that they started."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


class TunerProcess:
    """Writes a config, migrates the store, runs `tuner run` as a child process with its log in the work dir."""

    def __init__(
        self,
        work: Path,
        targets: dict[str, tuple[str, str]],
        *,
        interval: str = "500ms",
        timeout: str = "1s",
        max_body: str = "10MiB",
        rules: str | None = None,
        alertmanagers: Sequence[str] = (),
        evaluation_interval: str = "1s",
    ) -> None:
        self.work = work
        self.port = free_port()
        self.db = work / "tuner.db"
        lines = [
            f"store: {{url: 'sqlite:///{self.db}'}}",
            f"listen: 127.0.0.1:{self.port}",
            f"defaults: {{scrape_interval: {interval}, scrape_timeout: {timeout}, max_body_bytes: {max_body}}}",
            "gpu: {source: none}",
            "targets:",
        ]
        lines += [f"  - {{name: {n}, backend: {b}, url: '{u}'}}" for n, (b, u) in targets.items()]
        alerting: dict[str, Any] = {
            "evaluation_interval": evaluation_interval,
            "resend_delay": "1m",
            "alertmanagers": list(alertmanagers),
        }
        if rules is not None:
            (work / "rules.yaml").write_text(rules)
            alerting["rule_files"] = ["rules.yaml"]
        lines.append(f"alerting: {json.dumps(alerting)}")  # JSON is YAML
        self.config = work / "tuner.yaml"
        self.config.write_text("\n".join(lines) + "\n")
        self.log = work / "tuner.log"
        self.proc: subprocess.Popen | None = None
        self.cli("db", "upgrade")

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tuner.cli", "--config", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def start(self, **popen: Any) -> TunerProcess:
        self.proc = proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "--config", str(self.config), "run"],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "ab"),
            **popen,
        )
        try:
            wait_for(lambda: self.metrics_text() is not None or proc.poll() is not None, 60, "tuner's /metrics")
            assert proc.poll() is None, self.log_tail()
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int:
        assert self.proc is not None
        code = stop(self.proc, 20)
        assert code is not None
        return code

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""

    def metrics_text(self) -> str | None:
        try:
            return http.get(f"http://127.0.0.1:{self.port}/metrics", timeout_s=5, max_bytes=2**24).body.decode()
        except ScrapeError:
            return None

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample of tuner's own /metrics (None when absent)."""
        text = self.metrics_text() or ""
        for line in text.splitlines():
            m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
            if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
                return float(m.group(2))
        return None

    def status(self) -> dict[str, dict]:
        """`tuner status --json`, by target name."""
        out = self.cli("status", "--json", "--window", "1m")
        return {t["target"]: t for t in json.loads(out.stdout)["targets"]}


class AlertSink:
    """Stands in for Alertmanager's API v2 on a given port: keeps every alert POSTed to /api/v2/alerts."""

    def __init__(self, port: int = 0) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts: list[list[dict]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.posts.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def alerts(self) -> list[dict]:
        return [a for post in list(self.posts) for a in post]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
