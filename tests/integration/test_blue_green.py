"""Blue/green applies on one host through a real HAProxy in front of one real llama-server that tuner manages, under
a steady load from a client that never retries (tuner/lab/load.py, retry_for_s=0):

  * an apply: the new flags start on a spare port and join the backend (HAProxy's check UP) before the server is
    drained; the server restarts with them on its own port and comes back UP before the spare is drained and
    deleted from the backend; not one client request failed, and nothing is left behind (no spare process, no
    spare server in HAProxy, no spare run state);
  * a config that cannot start fails on the spare: the server is never touched (same pid), the spare is gone, no
    request failed;
  * kill -9 of tuner while the spare serves alone and the server is down: `tuner reconcile` brings the server back
    on the old flags, UP, and removes the spare.

The failed start is injected by the server's executable: a wrapper that runs the real llama-server, except with
--parallel 3 on any port but the server's own (the spare's), where it exits at once with an error line; with
--parallel 4 on its own port the server takes 4 s more to start, so that the spare serves alone for a while (and
kill -9 can land there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import realservers
from conftest import require
from test_apply_llama import wait_for
from test_rolling_haproxy import Load, _tuner

from tuner.apply.balancer import HAProxy
from tuner.apply.launch import free_port
from tuner.apply.managed import is_alive, proc_argv
from tuner.lab.load import LoadResult
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.db import open_engine

WRAPPER = """\
import os, sys, time
args = sys.argv[1:]
own = sys.argv[0].rsplit("-", 1)[-1].split(".")[0]
parallel, port = args[args.index("--parallel") + 1], args[args.index("--port") + 1]
if parallel == "3" and port != own:
    print("error: injected: the spare cannot start with --parallel 3", file=sys.stderr, flush=True)
    sys.exit(1)
if parallel == "4" and port == own:
    time.sleep(4)  # a slow start of the server itself: the spare serves alone meanwhile
os.execv({server!r}, [sys.argv[0], *args])  # argv[0] stays the executable tuner started
"""


class BlueGreen:
    """One managed llama-server (tuner starts it) behind a real HAProxy (the test starts it, from the config that
    `tuner haproxy-config` prints)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.front, self.port = tmp, free_port(), free_port()
        self.sock = str(tmp / "haproxy.sock")
        self.exe = tmp / f"llama-wrapper-{self.port}.py"
        self.exe.write_text(f"#!{sys.executable}\n" + WRAPPER.format(server=str(realservers.LLAMA_SERVER.path())))
        self.exe.chmod(0o755)
        self.cfg = tmp / "tuner.yaml"
        self.cfg.write_text(
            f"store: {{url: 'sqlite:///{tmp / 'tuner.db'}'}}\n"
            "defaults: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            f"listen: 127.0.0.1:{free_port()}\n"
            "targets:\n"
            f"  - name: chat\n    backend: llamacpp\n    url: http://127.0.0.1:{self.port}\n"
            f"    balancer: {{socket: '{self.sock}', backend: chat, server: blue, frontend: '127.0.0.1:{self.front}',"
            " drain_timeout: 30s, up_timeout: 20s}\n"
            f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n      executable: {self.exe}\n"
            "      flags: {parallel: 2, ctx_size: 1024}\n      extra_args: {'-t': 1}\n"
            f"      drain_timeout: 5s\n      start_timeout: 60s\n      log_dir: {tmp / 'logs'}\n"
            "    apply: {observe: 4s, observe_max: 4s, baseline: 10s, on_inconclusive: keep_new, "
            "max_restarts_per_hour: 50}\n"
        )
        out = _tuner(self.cfg, "haproxy-config", "chat")
        assert out.returncode == 0, out.stderr
        (tmp / "haproxy.cfg").write_text(out.stdout)
        assert _tuner(self.cfg, "db", "upgrade").returncode == 0
        self.engine = open_engine(f"sqlite:///{tmp / 'tuner.db'}")
        started = _tuner(self.cfg, "managed", "start", "chat")
        assert started.returncode == 0, started.stderr
        self.haproxy = subprocess.Popen(
            [str(realservers.HAPROXY.path()), "-db", "-f", str(tmp / "haproxy.cfg")],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "haproxy.log", "w"),
        )
        self.lb = HAProxy(self.sock, "chat")
        wait_for(lambda: Path(self.sock).exists() and self.lb.stat("blue").status == "UP", 30, "blue UP in HAProxy")

    def pid(self) -> int | None:
        st = jr.get_managed(self.engine, "chat")
        return st.pid if st and st.pid and is_alive(st.pid, st.proc_start) else None

    def parallel(self) -> str | None:
        pid = self.pid()
        argv = proc_argv(pid) if pid else None
        return argv[argv.index("--parallel") + 1] if argv else None

    def spare_pids(self) -> list[int]:
        """llama-server processes of this test on any port but the server's own."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    argv = (d / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if str(self.exe).encode() in argv and f"{self.port}".encode() not in argv:
                    out.append(int(d.name))
        return out

    def recommend(self, diff: dict) -> int:
        return recs.add_recommendation(
            self.engine,
            target="chat",
            now=time.time(),
            rules=["test"],
            diff_key="{}",
            diff=diff,
            current={},
            evidence=[],
            expected_effect="",
            risk="",
            confidence=0.9,
            rank=1,
            memory_check={"ok": True},
        )

    def close(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(timeout=10)
        _tuner(self.cfg, "managed", "stop", "chat")
        for pid in self.spare_pids():
            os.kill(pid, signal.SIGKILL)


def _clean(g: BlueGreen) -> None:
    """Nothing left behind: only blue in the backend, UP; no spare process; no spare run state."""
    assert set(g.lb.stats()) == {"blue"} and g.lb.stat("blue").status == "UP"
    assert g.spare_pids() == []
    assert jr.get_managed(g.engine, "chat~spare") is None
    assert jr.open_applies(g.engine) == []


def _apply_under_load(g: BlueGreen, diff: dict) -> tuple[dict, Load, LoadResult]:
    """`tuner apply-recommendation` of ``diff`` while clients that never retry go through HAProxy."""
    load = Load(g.front)
    wait_for(lambda: g.lb.stat("blue").total >= 10, 60, "the load to reach the server")
    out = _tuner(g.cfg, "apply-recommendation", str(g.recommend(diff)), "--yes", "--json")
    time.sleep(1.0)  # requests keep flowing after the switch
    result = load.finish()
    assert out.stdout, out.stderr[-3000:]
    return json.loads(out.stdout), load, result


def test_a_blue_green_apply_on_one_host_loses_no_request_and_leaves_nothing_behind(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.HAPROXY)
    g = BlueGreen(tmp_path)
    try:
        pid0 = g.pid()
        a, load, result = _apply_under_load(g, {"parallel": 4})
        steps = [(s["step"], s["detail"].split(":")[0].split(" on ")[0]) for s in a["steps"]]
        order = [st for st in steps if st[0] in ("room", "starting", "in_rotation", "draining", "stopped", "removed")]
        # the spare serves before blue leaves; blue is back before the spare leaves
        assert [k for k, _ in order] == [
            "room",
            "starting",
            "in_rotation",
            "draining",
            "stopped",
            "starting",
            "in_rotation",
            "stopped",
            "removed",
        ], steps
        assert [who for _, who in order[1:]] == [
            "chat~spare",
            "chat~spare",
            "chat",
            "chat",
            "chat",
            "chat",
            "chat~spare",
            "chat~spare",
        ], steps
        assert g.parallel() == "4" and g.pid() != pid0
        _clean(g)
        ts = [s["ts_ms"] / 1000 for s in a["steps"]]
        assert load.t0 < ts[0] and ts[-1] < load.t1  # the switch ran inside the load
        assert result.failed == 0, result.errors
        assert result.ok >= 20, result
        print(
            json.dumps(
                {
                    "ok": result.ok,
                    "failed": result.failed,
                    "outcome": a["outcome"],
                    "switch_s": round(ts[-1] - ts[0], 1),
                }
            )
        )
    finally:
        g.close()


def test_a_config_that_cannot_start_fails_on_the_spare_and_the_server_is_never_touched(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.HAPROXY)
    g = BlueGreen(tmp_path)
    try:
        pid0 = g.pid()
        a, _, result = _apply_under_load(g, {"parallel": 3})
        assert a["outcome"] == "failed" and "injected: the spare cannot start" in a["note"], a["note"]
        assert g.pid() == pid0 and g.parallel() == "2"  # blue never restarted
        assert not any(s["step"] == "draining" for s in a["steps"]), a["steps"]
        _clean(g)
        assert result.failed == 0, result.errors
    finally:
        g.close()


def test_kill_9_while_the_spare_serves_alone_then_reconcile_brings_the_server_back(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.HAPROXY)
    g = BlueGreen(tmp_path)
    try:
        load = Load(g.front)
        wait_for(lambda: g.lb.stat("blue").total >= 10, 60, "the load to reach the server")
        rid = g.recommend({"parallel": 4})
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuner.cli",
                "--config",
                str(g.cfg),
                "--log-level",
                "WARNING",
                "apply-recommendation",
                str(rid),
                "--yes",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def blue_starting() -> bool:
            applies = jr.open_applies(g.engine)
            return bool(applies) and any(
                s["step"] == "health_check" and s["detail"].startswith("chat:")
                for s in jr.get_apply(g.engine, applies[0].id).steps
            )

        wait_for(blue_starting, 120, "blue to be starting again while the spare serves")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert g.spare_pids() and g.lb.stat("blue").status != "UP", "the spare serves alone"
        rec = _tuner(g.cfg, "reconcile")
        assert rec.returncode == 0, rec.stderr
        result = load.finish()
        _clean(g)
        # killed while blue started with the new flags: reconcile waits for its health, observes and judges it again
        # (or, were it not healthy, rolls back); either way it runs what the journal says
        a = jr.list_applies(g.engine, target="chat")[0]
        assert a.outcome in ("rolled_back", "kept", "inconclusive"), a.note
        assert g.parallel() == ("2" if a.outcome == "rolled_back" else "4"), (a.outcome, a.note)
        # while blue was down the spare served: the clients saw at most the requests cut by kill -9 itself
        assert result.failed <= 3, result.errors
        print(json.dumps({"ok": result.ok, "failed": result.failed, "note": a.note}))
    finally:
        g.close()
