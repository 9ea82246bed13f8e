"""``tuner dashboards push`` against a tiny local HTTP server that records what grafana-client sends.

NOT a real Grafana: no Grafana server can be installed on these machines (not in Debian, PyPI or npm). The
stand-in answers the three endpoints push uses the way Grafana's HTTP API documents them (GET/POST /api/folders,
POST /api/dashboards/db with 412 on an existing uid unless overwrite) and keeps what it was sent, so the test
checks the requests themselves: folder created once, overwrite=true, the bearer token, idempotence.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tuner.apply.launch import free_port
from tuner.cli import main
from tuner.dashboards import build_dashboards

TOKEN = "glsa_test_token_123"


class FakeGrafana:
    """Folders and dashboards in memory; every request recorded as (method, path, authorization, json body)."""

    def __init__(self, status: int | None = None) -> None:
        self.requests: list[tuple[str, str, str | None, object]] = []
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}
        self.status = status  # answer every request with this status instead (e.g. 401)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                path = self.path.split("?")[0]
                fake.requests.append((method, path, self.headers.get("Authorization"), body))
                if fake.status:
                    return self._reply(fake.status, {"message": "invalid API key"})
                if (method, path) == ("GET", "/api/folders"):
                    return self._reply(
                        200, [{"id": f["id"], "uid": uid, "title": f["title"]} for uid, f in fake.folders.items()]
                    )
                if (method, path) == ("POST", "/api/folders"):
                    uid = body.get("uid") or f"f{len(fake.folders)}"
                    if uid in fake.folders:
                        return self._reply(409, {"message": "a folder with the same uid already exists"})
                    fake.folders[uid] = {"id": len(fake.folders) + 1, "title": body["title"]}
                    return self._reply(200, {"id": fake.folders[uid]["id"], "uid": uid, "title": body["title"]})
                if (method, path) == ("POST", "/api/dashboards/db"):
                    dash = body["dashboard"]
                    old = fake.dashboards.get(dash["uid"])
                    if old is not None and not body.get("overwrite"):
                        return self._reply(412, {"status": "name-exists", "message": "exists"})
                    if body.get("folderUid") not in fake.folders:
                        return self._reply(400, {"message": "folder not found"})
                    version = (old["version"] + 1) if old else 1
                    fake.dashboards[dash["uid"]] = {
                        "version": version,
                        "folderUid": body["folderUid"],
                        "dashboard": dash,
                    }
                    return self._reply(
                        200,
                        {
                            "id": 1,
                            "uid": dash["uid"],
                            "status": "success",
                            "version": version,
                            "url": f"/d/{dash['uid']}/x",
                        },
                    )
                return self._reply(404, {"message": "not found"})

            def do_GET(self) -> None:  # noqa: N802
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeGrafana:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_push_creates_the_folder_once_and_overwrites_dashboards(monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    uids = set(build_dashboards())
    with FakeGrafana() as grafana:
        assert main(["dashboards", "push", "--grafana-url", grafana.url, "--folder", "LLM serving"]) == 0
        first = list(grafana.requests)
        assert main(["dashboards", "push", "--grafana-url", grafana.url, "--folder", "LLM serving"]) == 0
        second = grafana.requests[len(first) :]
    out = capsys.readouterr().out
    assert "created" in out and "found" in out
    # Every request carries the token as a bearer header; the token never appears elsewhere.
    assert all(auth == f"Bearer {TOKEN}" for _, _, auth, _ in grafana.requests)
    creates = [r for r in grafana.requests if r[:2] == ("POST", "/api/folders")]
    assert len(creates) == 1 and creates[0][3]["title"] == "LLM serving"
    assert [m for m, p, _, _ in second if p == "/api/folders"] == ["GET"]  # idempotent: found, not re-created
    for run in (first, second):
        posted = [b for m, p, _, b in run if p == "/api/dashboards/db"]
        assert {b["dashboard"]["uid"] for b in posted} == uids
        assert all(b["overwrite"] is True and b["folderUid"] == "tuner-llm-serving" for b in posted)
        assert all(b["dashboard"]["id"] is None for b in posted)  # matched by uid, never by a stale id
    assert set(grafana.dashboards) == uids and len(grafana.folders) == 1
    assert {d["version"] for d in grafana.dashboards.values()} == {2}
    assert grafana.dashboards["tuner-vllm"]["dashboard"] == {**build_dashboards()["tuner-vllm"], "id": None}


def test_push_from_generated_files(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "generate", "-o", str(tmp_path)]) == 0
    with FakeGrafana() as grafana:
        assert main(["dashboards", "push", "--grafana-url", grafana.url, "--from", str(tmp_path)]) == 0
    assert set(grafana.dashboards) == {p.stem for p in tmp_path.glob("*.json")}


def test_unreachable_grafana_is_one_line_naming_the_url(monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["dashboards", "push", "--grafana-url", url]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tuner: error: Grafana at {url}: cannot connect") and "\n" not in err
    assert TOKEN not in err


def test_rejected_token_says_to_check_it(monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    with FakeGrafana(status=401) as grafana:
        assert main(["dashboards", "push", "--grafana-url", grafana.url]) == 4
    err = capsys.readouterr().err.strip()
    assert f"Grafana at {grafana.url}: HTTP 401" in err and "GRAFANA_TOKEN" in err and TOKEN not in err


def test_missing_token_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    assert main(["dashboards", "push", "--grafana-url", "http://127.0.0.1:3000"]) == 2
    assert "GRAFANA_TOKEN" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["{not json", '{"title": "no uid"}'])
def test_push_from_a_bad_file_names_it(monkeypatch, capsys, tmp_path, content):
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    (tmp_path / "bad.json").write_text(content)
    assert main(["dashboards", "push", "--grafana-url", "http://127.0.0.1:3000", "--from", str(tmp_path)]) == 2
    assert "bad.json" in capsys.readouterr().err
