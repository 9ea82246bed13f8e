"""A real Alertmanager 0.25 (Debian's prometheus-alertmanager) with a webhook receiver, both on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from tests.conftest import require_tool


class Webhook:
    """Receives Alertmanager's webhook POSTs and keeps their JSON bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.bodies.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def alerts(self, status: str | None = None) -> list[dict]:
        return [a for b in self.bodies for a in b["alerts"] if status is None or a["status"] == status]

    def wait_for(self, predicate, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.1)
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Alertmanager:
    def __init__(self, binary: str, home: Path, webhook: Webhook, port: int | None = None) -> None:
        self.binary, self.home, self.webhook = binary, home, webhook
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        home.mkdir(parents=True, exist_ok=True)
        (home / "am.yml").write_text(
            json.dumps(
                {
                    "route": {
                        "receiver": "hook",
                        "group_by": ["alertname", "target"],
                        "group_wait": "1s",
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook.url, "send_resolved": True}]}],
                }
            )
        )

    def start(self) -> Alertmanager:
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.home / 'am.yml'}",
                f"--storage.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=open(self.home / "am.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"alertmanager did not start: {(self.home / 'am.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.httpd.shutdown()


@pytest.fixture
def alertmanager_factory(tmp_path, webhook):
    binary = require_tool("prometheus-alertmanager")
    made: list[Alertmanager] = []

    def make(port: int | None = None) -> Alertmanager:
        am = Alertmanager(binary, tmp_path / f"am{len(made)}", webhook, port)
        made.append(am)
        return am

    yield make
    for am in made:
        am.stop()
