"""Rolling applies through a real HAProxy in front of two real llama-server replicas that tuner manages, under a
steady load from a client that never retries (tuner/lab/load.py, retry_for_s=0): what the clients see is what
counts.

  * a rolling apply: every replica ends on the new flags, each was drained in HAProxy, restarted, gated and UP
    again before the next one left, and not one client request failed;
  * a replica that cannot start with the new flags stops the roll: the replica already changed goes back to the
    old flags, the failed one starts again with them, both are UP, and still no client request failed;
  * a canary of a regressing change (-b/-ub 32 under long prompts), scraped by a real `tuner run`: judged against its unchanged peer over the same window, rolled back, the control never touched,
    and the verdict agrees with what the two replicas measured.

The failed start is injected by the replicas' executable: a wrapper that runs the real llama-server, except for
replica r2 with --parallel 3, where it exits at once with an error line (as a binary that cannot start would).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import realservers
from conftest import require
from test_apply_llama import start_daemon, stop_daemon, wait_for

from tuner.apply.balancer import HAProxy
from tuner.apply.launch import free_port
from tuner.apply.managed import proc_argv
from tuner.lab.load import LoadResult, run_load
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.db import open_engine

WRAPPER = """\
import os, sys
args = sys.argv[1:]
if "--port" in args and args[args.index("--port") + 1] == sys.argv[0].rsplit("-", 1)[-1].split(".")[0] \\
        and "--parallel" in args and args[args.index("--parallel") + 1] == "3":
    print("error: injected: this replica cannot start with --parallel 3", file=sys.stderr, flush=True)
    sys.exit(1)
os.execv({server!r}, [sys.argv[0], *args])  # argv[0] stays the executable tuner started
"""


def _tuner(cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class Group:
    """Two managed llama-server replicas (tuner starts them) behind a real HAProxy (the test starts it)."""

    def __init__(
        self, tmp: Path, apply: str = "observe: 4s, observe_max: 4s, baseline: 10s, on_inconclusive: keep_new"
    ) -> None:
        self.tmp, self.front, self.ports = tmp, free_port(), (free_port(), free_port())
        self.sock = str(tmp / "haproxy.sock")
        server = str(realservers.LLAMA_SERVER.path())
        # the wrapper knows r2 by its port: its file name ends in it
        self.exe = tmp / f"llama-wrapper-{self.ports[1]}.py"
        self.exe.write_text(f"#!{sys.executable}\n" + WRAPPER.format(server=server))
        self.exe.chmod(0o755)
        self.cfg = tmp / "tuner.yaml"
        self.cfg.write_text(
            f"store: {{url: 'sqlite:///{tmp / 'tuner.db'}'}}\n"
            "defaults: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            f"listen: 127.0.0.1:{free_port()}\n"
            "targets:\n"
            f"  - name: chat\n    backend: llamacpp\n    url: http://127.0.0.1:{self.front}\n"
            f"    balancer: {{socket: '{self.sock}', backend: chat, drain_timeout: 30s, up_timeout: 20s}}\n"
            "    replicas:\n"
            f"      - {{name: r1, url: 'http://127.0.0.1:{self.ports[0]}'}}\n"
            f"      - {{name: r2, url: 'http://127.0.0.1:{self.ports[1]}'}}\n"
            f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n      executable: {self.exe}\n"
            "      flags: {parallel: 2, ctx_size: 1024}\n      extra_args: {'-t': 1}\n"
            f"      drain_timeout: 5s\n      start_timeout: 60s\n      log_dir: {tmp / 'logs'}\n"
            f"    apply: {{{apply}, max_restarts_per_hour: 50}}\n"
        )
        out = _tuner(self.cfg, "haproxy-config", "chat")
        assert out.returncode == 0, out.stderr
        (tmp / "haproxy.cfg").write_text(out.stdout)
        assert _tuner(self.cfg, "db", "upgrade").returncode == 0
        self.engine = open_engine(f"sqlite:///{tmp / 'tuner.db'}")
        for name in ("chat.r1", "chat.r2"):
            started = _tuner(self.cfg, "managed", "start", name)
            assert started.returncode == 0, started.stderr
        self.haproxy = subprocess.Popen(
            [str(realservers.HAPROXY.path()), "-db", "-f", str(tmp / "haproxy.cfg")],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "haproxy.log", "w"),
        )
        self.lb = HAProxy(self.sock, "chat")
        wait_for(
            lambda: Path(self.sock).exists() and all(s.status == "UP" for s in self.lb.stats().values()),
            30,
            "both replicas UP in HAProxy",
        )

    def argv(self, name: str) -> list[str] | None:
        st = jr.get_managed(self.engine, name)
        return proc_argv(st.pid) if st and st.pid else None

    def parallel(self, name: str) -> str | None:
        argv = self.argv(name)
        return argv[argv.index("--parallel") + 1] if argv else None

    def close(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(timeout=10)
        for name in ("chat.r1", "chat.r2"):
            _tuner(self.cfg, "managed", "stop", name)


def _num(d: dict, k: str) -> float | None:
    v = d.get(k)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Load:
    """Clients through HAProxy that never retry, until stopped."""

    def __init__(
        self,
        port: int,
        concurrency: int = 3,
        prompt_tokens: int = 32,
        model: str = "x",
        max_tokens: int = 24,
        think_s: float = 0.0,
    ) -> None:
        self.stop, self.result, self.concurrency, self.prompt = threading.Event(), None, concurrency, prompt_tokens
        self.model, self.max_tokens, self.think_s = model, max_tokens, think_s
        self.t0 = time.time()
        self.thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self.thread.start()

    def _run(self, port: int) -> None:
        self.result = run_load(
            f"http://127.0.0.1:{port}",
            model=self.model,
            n_requests=10_000,
            concurrency=self.concurrency,
            prompt_tokens_approx=self.prompt,
            max_tokens=self.max_tokens,
            timeout_s=600,
            think_s=self.think_s,
            stop=self.stop,
        )

    def finish(self) -> LoadResult:
        self.stop.set()
        self.thread.join(timeout=120)
        assert self.result is not None
        self.t1 = time.time()
        return self.result


def _apply(
    g: Group, diff: dict, *extra: str, concurrency: int = 3, prompt_tokens: int = 32, warm_s: float = 0.0
) -> tuple[dict, Load, LoadResult]:
    rid = recs.add_recommendation(
        g.engine,
        target="chat.r1",
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
    load = Load(g.front, concurrency, prompt_tokens)
    wait_for(lambda: sum(s.total for s in g.lb.stats().values()) >= 10, 60, "the load to reach both replicas")
    time.sleep(warm_s)
    out = _tuner(g.cfg, "apply-recommendation", str(rid), "--yes", "--json", *extra)
    time.sleep(1.0)  # requests keep flowing after the roll
    result = load.finish()
    assert out.stdout, out.stderr[-3000:]
    return json.loads(out.stdout), load, result


def test_a_rolling_apply_through_haproxy_loses_no_request(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.HAPROXY)
    g = Group(tmp_path)
    try:
        before = {name: g.argv(name) for name in ("chat.r1", "chat.r2")}
        a, load, result = _apply(g, {"parallel": 4})
        steps = [(s["step"], s["detail"].split(":")[0]) for s in a["steps"]]
        steps = steps[: steps.index(("healthy", next(d for k, d in steps if k == "healthy")))]  # the roll itself
        # one replica at a time: r1 drained, restarted and UP before r2 left the rotation
        order = [(k, who) for k, who in steps if k in ("draining", "stopped", "starting", "in_rotation")]
        assert order == [
            ("draining", "chat.r1"),
            ("stopped", "chat.r1"),
            ("starting", "chat.r1"),
            ("in_rotation", "chat.r1"),
            ("draining", "chat.r2"),
            ("stopped", "chat.r2"),
            ("starting", "chat.r2"),
            ("in_rotation", "chat.r2"),
        ], steps
        assert g.parallel("chat.r1") == g.parallel("chat.r2") == "4"
        assert all(g.argv(n) != before[n] for n in before)
        assert all(s.status == "UP" for s in g.lb.stats().values())
        # the roll ran inside the load, and the clients lost nothing
        ts = [s["ts_ms"] / 1000 for s in a["steps"]]
        assert load.t0 < ts[0] and ts[-1] < load.t1
        assert result.failed == 0, result.errors
        assert result.ok >= 20, result
        print(
            json.dumps(
                {"ok": result.ok, "failed": result.failed, "outcome": a["outcome"], "roll_s": round(ts[-1] - ts[0], 1)}
            )
        )
    finally:
        g.close()


def test_a_replica_that_cannot_start_stops_the_roll_and_both_go_back(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.HAPROXY)
    g = Group(tmp_path)
    try:
        before = {name: g.argv(name) for name in ("chat.r1", "chat.r2")}
        a, load, result = _apply(g, {"parallel": 3})  # r2 cannot start with --parallel 3 (the wrapper)
        assert a["outcome"] == "failed" and "injected: this replica cannot start" in a["note"], a["note"]
        kinds = [s["step"] for s in a["steps"]]
        assert "in_rotation" in kinds[: kinds.index("start_failed")]  # r1 had been changed and was back in rotation
        # both replicas back on the old flags, both UP, and the clients never noticed
        assert {n: g.argv(n) for n in before} == before or all(g.parallel(n) == "2" for n in before)
        assert all(g.parallel(n) == "2" for n in before)
        assert all(s.status == "UP" for s in g.lb.stats().values())
        assert jr.open_applies(g.engine) == []
        assert result.failed == 0, result.errors
        print(json.dumps({"ok": result.ok, "failed": result.failed, "note": a["note"]}))
    finally:
        g.close()


def test_a_canary_of_a_regression_is_judged_against_its_live_peer_and_rolled_back(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.HAPROXY)
    g = Group(tmp_path, apply="observe: 15s, observe_max: 30s, baseline: 10s, on_inconclusive: keep_previous")
    daemon = start_daemon(g.cfg, tmp_path / "run.log")  # scrapes both replicas every second
    try:
        control = jr.get_managed(g.engine, "chat.r2")
        assert control is not None and control.pid
        control_argv, canary_argv = g.argv("chat.r2"), g.argv("chat.r1")
        # -b/-ub 32 split each ~400-token prompt into 13 physical batches: measured here on one llama-server
        # (-t 1, 3 clients, 60 requests), 1.11 s against 0.70 s with the defaults
        a, load, result = _apply(
            g, {"batch_size": 32, "ubatch_size": 32}, "--canary", concurrency=6, prompt_tokens=400, warm_s=5.0
        )
        assert a["kind"] == "canary", a
        # the journal holds both replicas over the same window: control as "before", canary as "after"
        base, after = a["baseline"], a["after"]
        assert (base["replica"], after["replica"]) == ("chat.r2", "chat.r1") and base["window"] == after["window"]
        # the decision, against what the two measured side by side
        higher_is_better = ("capacity_rps", "capacity_tokens_per_s", "tokens_per_s", "slo_attainment")
        lower_is_better = ("e2e_p99", "ttft_p99", "seconds_per_token", "waiting_share", "queued_share")
        worse = [
            k
            for k in higher_is_better
            if _num(after, k) is not None and _num(base, k) is not None and after[k] < base[k]
        ] + [
            k
            for k in lower_is_better
            if _num(after, k) is not None and _num(base, k) is not None and after[k] > base[k]
        ]
        assert worse, (base, after)  # the canary measured worse than the control on something the verdict reads
        assert a["outcome"] == "rolled_back", (a["outcome"], a["note"], base, after)
        assert "canary against control over the same window" in a["note"]
        # the canary is back, the control was never restarted, both UP, and the clients lost nothing
        assert g.argv("chat.r1") == canary_argv
        assert g.argv("chat.r2") == control_argv and jr.get_managed(g.engine, "chat.r2").pid == control.pid
        assert all(s.status == "UP" for s in g.lb.stats().values())
        assert result.failed == 0, result.errors
        journal = _tuner(g.cfg, "journal", "chat.r1").stdout
        assert "control chat.r2" in journal and "canary chat.r1" in journal
        print(
            json.dumps(
                {"worse": worse, "control": base, "canary": after, "ok": result.ok, "failed": result.failed},
                default=str,
            )
        )
    finally:
        stop_daemon(daemon)
        g.close()
