"""Apply against a real llama-server (starts in ~1 s): the managed loop, crash restarts, tuner killed mid-apply,
an apply hook on a server tuner does not own, and the by-hand path.

Every test runs the real `tuner` CLI and a real `tuner run` daemon as subprocesses, as an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import realservers
from conftest import require

from tuner.apply.launch import free_port
from tuner.apply.managed import proc_argv
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.db import open_engine


def tuner(cfg: Path, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check:
        assert proc.returncode == 0, f"tuner {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def write_config(tmp_path: Path, port: int, *, observe: str = "6s", extra: str = "", managed: bool = True) -> Path:
    cfg = tmp_path / "tuner.yaml"
    body = (
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n"
        f"listen: 127.0.0.1:{free_port()}\n"
        "defaults: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "targets:\n"
        f"  - name: llama\n    backend: {'auto' if managed else 'llamacpp'}\n    url: http://127.0.0.1:{port}\n"
    )
    if managed:
        body += (
            f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n"
            f"      executable: {realservers.LLAMA_SERVER.path()}\n"
            "      flags: {parallel: 2, ctx_size: 512}\n      extra_args: {'-t': 1}\n"
            "      drain_timeout: 5s\n      max_restarts: 2\n      restart_window: 5m\n"
        )
    budget = "" if "max_restarts_per_hour" in extra else ", max_restarts_per_hour: 50"
    # These tests are about how an apply happens; a verdict that cannot tell keeps the new flags here (the
    # verdict itself is tested on recorded real series, tests/apply/test_verdict.py, and in the demo).
    body += (
        f"    apply: {{observe: {observe}, observe_max: {observe}, on_inconclusive: keep_new, baseline: 30s, "
        f"min_requests: 1{budget}{extra}}}\n"
    )
    cfg.write_text(body)
    tuner(cfg, "db", "upgrade")
    return cfg


def propose(engine, target: str, diff: dict, current: dict) -> int:  # type: ignore[no-untyped-def]
    """Store a recommendation as the advisor would (for tests whose point is the apply, not the advice)."""
    return recs.add_recommendation(
        engine,
        target=target,
        now=time.time(),
        rules=["test"],
        diff_key=json.dumps(diff, sort_keys=True),
        diff=diff,
        current=current,
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )


def start_daemon(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "INFO", "run"],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def stop_daemon(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_for(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def managed_pid(cfg: Path) -> int | None:
    st = jr.get_managed(open_engine(f"sqlite:///{cfg.parent / 'tuner.db'}"), "llama")
    if st is None or st.pid is None or proc_argv(st.pid) is None:
        return None
    return st.pid


def slots(port: int) -> int | None:
    """How many slots the server has; None while it is not serving them: not listening yet (a restarted process
    exists before it binds its port: refused), or still loading (503 with an error object, whose len() once passed
    for "1 slot")."""
    import requests

    try:
        resp = requests.get(f"http://127.0.0.1:{port}/slots", timeout=5, proxies={"http": ""})
    except requests.ConnectionError:
        return None
    body = resp.json() if resp.status_code == 200 else None
    return len(body) if isinstance(body, list) else None


def background_load(port: int, seconds: float) -> subprocess.Popen[str]:
    """Clients that keep sending for ``seconds``, and retry (after a pause) while the server restarts."""
    script = (
        "import sys, time; from tuner.lab.load import run_load\n"
        "end, ok, failed = time.monotonic() + float(sys.argv[2]), 0, 0\n"
        "while time.monotonic() < end:\n"
        "    r = run_load(sys.argv[1], model='x', n_requests=24, concurrency=6, prompt_tokens_approx=80,\n"
        "                 max_tokens=48, timeout_s=max(1.0, end - time.monotonic()))\n"
        "    ok, failed = ok + r.ok, failed + r.failed\n"
        "    if r.failed: time.sleep(0.3)\n"
        "print(ok, failed)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script, f"http://127.0.0.1:{port}", str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_managed_llama_recommend_apply_verdict_rollback(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    cfg = write_config(tmp_path, port)
    daemon = start_daemon(cfg, tmp_path / "run.log")
    try:
        first = wait_for(lambda: managed_pid(cfg), 60, "the daemon to start the managed llama-server")
        assert wait_for(lambda: slots(port), 30, "the managed llama-server to serve its slots") == 2
        # 12 at a time against --parallel 2 for several 1 s scrapes: requests are deferred and the advisor says so.
        realservers.run_load_process(
            f"http://127.0.0.1:{port}",
            model="x",
            n_requests=240,
            concurrency=12,
            prompt_tokens_approx=100,
            max_tokens=96,
            timeout_s=120,
        )
        time.sleep(2)
        out = json.loads(tuner(cfg, "recommend", "llama", "--window", "1m", "--json").stdout)
        rec = next(r for r in out["recommendations"] if "parallel" in r["diff"])
        assert rec["diff"]["parallel"] > 2 and rec["current"]["parallel"] == 2

        dry = json.loads(tuner(cfg, "apply-recommendation", str(rec["id"]), "--dry-run", "--json").stdout)
        assert dry["how"] == "managed" and "--parallel" in dry["new_argv"]
        assert dry["new_argv"][dry["new_argv"].index("--parallel") + 1] == str(rec["diff"]["parallel"])
        assert managed_pid(cfg) == first  # a dry run changes nothing

        load = background_load(port, 30)
        time.sleep(8)  # a baseline under load
        assert load.poll() is None, load.communicate()
        proc = tuner(cfg, "apply-recommendation", str(rec["id"]), "--yes", "--json", check=False)
        load_out = load.communicate(timeout=60)
        a = json.loads(proc.stdout)
        steps = [s["step"] for s in a["steps"]]
        assert steps[:8] == [
            "planned",
            "baseline",
            "draining",
            "stopped",
            "starting",
            "health_check",
            "healthy",
            "observing",
        ], steps
        assert a["state"] == "done" and a["outcome"] in ("kept", "rolled_back", "inconclusive"), a
        assert a["baseline"]["capacity_tokens_per_s"] and a["after"]["capacity_tokens_per_s"], (a, load_out)
        if a["outcome"] == "kept" and a["baseline"]["saturated"]:  # kept on capacity: it did rise
            assert a["after"]["capacity_tokens_per_s"] > a["baseline"]["capacity_tokens_per_s"], a
        pid = managed_pid(cfg)
        assert pid not in (None, first)
        status = recs.get_recommendation(open_engine(f"sqlite:///{tmp_path / 'tuner.db'}"), rec["id"]).status
        if a["outcome"] in ("kept", "inconclusive"):  # no regression found: the new flags stay (keep_new)
            assert proc.returncode == 0 and status == "applied"
            assert proc_argv(pid) == a["new_argv"] and slots(port) == rec["diff"]["parallel"]
            # ... and `tuner rollback` puts the old ones back
            back = tuner(cfg, "rollback", "llama", "--yes")
            assert "outcome rolled_back" in back.stdout
            assert slots(port) == 2 and proc_argv(managed_pid(cfg))[-6:] == a["old_argv"][-6:]
        else:  # a regression: tuner put the old flags back itself
            assert proc.returncode == 8 and status == "rolled_back" and "previous flags restored" in a["note"]
            assert proc_argv(pid) == a["old_argv"] and slots(port) == 2
        journal = tuner(cfg, "journal", "llama").stdout
        assert f"apply #{a['id']}" in journal and "verdict" in journal
        listen = cfg.read_text().split("listen: ")[1].split()[0]

        def metrics() -> str:  # the apply side of /metrics is refreshed every 5 s
            import requests

            text = requests.get(f"http://{listen}/metrics", timeout=5, proxies={"http": ""}).text
            want = (
                f'tuner_applies_total{{outcome="{a["outcome"]}",target="llama"}} 1.0',
                'tuner_managed_server_up{target="llama"} 1.0',
            )
            return text if all(w in text for w in want) else ""

        wait_for(metrics, 15, "tuner's /metrics to count the apply and see the managed server up")
    finally:
        stop_daemon(daemon)
        tuner(cfg, "managed", "stop", check=False)


def test_a_crashed_managed_server_is_restarted_a_bounded_number_of_times(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    cfg = write_config(tmp_path, port)
    daemon = start_daemon(cfg, tmp_path / "run.log")
    try:
        pids = [wait_for(lambda: managed_pid(cfg), 60, "the first start")]
        for n in (1, 2):  # max_restarts: 2
            os.kill(pids[-1], signal.SIGKILL)
            pids.append(wait_for(lambda: (p := managed_pid(cfg)) not in (None, *pids) and p, 30, f"restart {n}"))
            # the new pid is recorded as soon as the process exists: wait until it serves its slots
            assert wait_for(lambda: slots(port), 30, f"restart {n} to serve its slots") == 2
        os.kill(pids[-1], signal.SIGKILL)
        st = wait_for(
            lambda: (
                (s := jr.get_managed(open_engine(f"sqlite:///{tmp_path / 'tuner.db'}"), "llama"))
                and s.state == "given_up"
                and s
            ),
            30,
            "the supervisor to give up",
        )
        assert "2 restarts" in st.note
        status = tuner(cfg, "managed", "status", check=False)
        assert status.returncode == 1 and "given_up" in status.stdout
        time.sleep(6)
        assert managed_pid(cfg) is None  # it stays down: no restart storm
    finally:
        stop_daemon(daemon)
        tuner(cfg, "managed", "stop", check=False)


# Killed as soon as the journal shows kill_at: on a loaded machine the apply may be a step or two further by
# then (draining stopped the old server: "no server running"; the new one already up: "the new flags"); each
# finding has its own right answer, checked below.
_ANY = ("the old flags", "no server running", "the new flags")


@pytest.mark.parametrize("kill_at, findings", [("baseline", _ANY), ("observing", ("the new flags",))])
def test_tuner_killed_mid_apply_is_reconciled(tmp_path, kill_at, findings):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    cfg = write_config(tmp_path, port, observe="30s")
    tuner(cfg, "managed", "start")
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    try:
        rid = propose(engine, "llama", {"parallel": 3}, {"parallel": 2})
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "apply-recommendation", str(rid), "--yes"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: any(s["step"] == kill_at for a in jr.list_applies(engine) for s in a.steps),
            60,
            f"the apply to reach {kill_at}",
        )
        proc.kill()
        proc.wait()
        open_ = jr.open_applies(engine)
        assert len(open_) == 1 and open_[0].state != "done"
        out = tuner(cfg, "reconcile", timeout=120).stdout
        a = jr.get_apply(engine, open_[0].id)
        found = next((f for f in findings if f"server found with {f}" in a.note), None)
        assert a.state == "done" and found, (out, a.note)
        assert [s["step"] for s in a.steps].count("reconcile") == 1
        in_force = slots(port)
        if found == "the old flags":
            assert a.outcome == "rolled_back" and "nothing was changed" in a.note and in_force == 2
            assert recs.get_recommendation(engine, rid).status == "proposed"
        elif found == "no server running":
            assert a.outcome == "rolled_back" and "previous flags restored and healthy" in a.note and in_force == 2
        else:  # observed again by the reconciling tuner, then judged
            assert "observing" in [
                s["step"] for s in a.steps[a.steps.index(next(s for s in a.steps if s["step"] == "reconcile")) :]
            ]
            assert a.outcome in ("kept", "rolled_back", "inconclusive")  # no load here: inconclusive, kept new
            assert in_force == (2 if a.outcome == "rolled_back" else 3)
        assert not jr.open_applies(engine)
    finally:
        tuner(cfg, "managed", "stop", check=False)


HOOK = """
import json, os, signal, subprocess, sys, time
# A deployment's own restart script, as an operator would write one: stop the llama-server whose pid is in the
# pid file, start it again with the flags tuner passes, record the argv it was given.
pidfile, binary, model, port, *flags = sys.argv[1:]
with open(pidfile + ".calls", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
try:
    os.kill(int(open(pidfile).read()), signal.SIGTERM); time.sleep(1)
except (OSError, ValueError):
    pass
p = subprocess.Popen([binary, "-m", model, "--host", "127.0.0.1", "--port", port, "--metrics", "-t", "1", *flags],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
open(pidfile, "w").write(str(p.pid))
"""


def test_unmanaged_target_applies_through_its_hook_and_by_hand(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    hook, pidfile = tmp_path / "restart-llama.py", tmp_path / "llama.pid"
    hook.write_text(HOOK)
    # the operator's server, started by their script (not by tuner)
    subprocess.run(
        [
            sys.executable,
            str(hook),
            str(pidfile),
            str(realservers.LLAMA_SERVER.path()),
            str(realservers.TINY_GGUF.path()),
            str(port),
            "--parallel",
            "2",
            "-c",
            "512",
        ],
        check=True,
    )
    try:
        extra = (
            f", hook: {{command: [{sys.executable}, {hook}, {pidfile}, {realservers.LLAMA_SERVER.path()}, "
            f"{realservers.TINY_GGUF.path()}, '{port}', '{{flags}}']}}"
        )
        cfg = write_config(tmp_path, port, observe="2s", extra=extra, managed=False)
        cfg.write_text(cfg.read_text().replace("    apply:", "    flags: {parallel: 2, ctx_size: 512}\n    apply:"))
        engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
        wait_for(
            lambda: (
                subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}/health"], capture_output=True).returncode == 0
            ),
            30,
            "the operator's server",
        )
        rid = propose(engine, "llama", {"parallel": 4}, {"parallel": 2})
        a = json.loads(tuner(cfg, "apply-recommendation", str(rid), "--yes", "--json").stdout)
        assert a["outcome"] in ("kept", "inconclusive") and slots(port) == 4  # no traffic: nothing to judge
        call = json.loads((tmp_path / "llama.pid.calls").read_text().splitlines()[-1])
        assert call[4:] == ["--parallel", "4", "-c", "512"]  # {flags} became the full flag list, as argv elements

        # Without a hook tuner says what to do by hand, waits, then gates and observes.
        cfg.write_text(cfg.read_text().split(", hook:")[0] + "}\n")
        rid2 = propose(engine, "llama", {"parallel": 3}, {"parallel": 4})
        wait = tuner(cfg, "apply-recommendation", str(rid2), "--yes").stdout
        assert "restart it by hand with --parallel 3" in wait and f"apply-recommendation {rid2} --applied" in wait
        assert slots(port) == 4  # tuner did not touch it
        subprocess.run(
            [
                sys.executable,
                str(hook),
                str(pidfile),
                str(realservers.LLAMA_SERVER.path()),
                str(realservers.TINY_GGUF.path()),
                str(port),
                "--parallel",
                "3",
                "-c",
                "512",
            ],
            check=True,
        )
        wait_for(
            lambda: (
                subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}/health"], capture_output=True).returncode == 0
            ),
            30,
            "the restarted server",
        )
        done = json.loads(tuner(cfg, "apply-recommendation", str(rid2), "--applied", "--json").stdout)
        assert done["outcome"] in ("kept", "inconclusive") and "applied_by_hand" in [s["step"] for s in done["steps"]]
    finally:
        try:
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_auto_mode_applies_by_itself_within_its_guardrails(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    cfg = write_config(
        tmp_path,
        port,
        observe="3s",
        extra=", mode: auto, auto_interval: 2s, min_confidence: 0.5, cooldown: 1h, max_restarts_per_hour: 3",
    )
    daemon = start_daemon(cfg, tmp_path / "run.log")
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    try:
        wait_for(lambda: managed_pid(cfg), 60, "the daemon to start the managed llama-server")
        load = background_load(port, 40)
        a = wait_for(
            lambda: next((a for a in jr.list_applies(engine) if a.state == "done"), None),
            60,
            "auto mode to apply a recommendation",
        )
        assert a.mode == "auto" and a.kind == "apply" and "parallel" in a.diff
        rec = recs.get_recommendation(engine, a.recommendation_id)
        assert rec.confidence >= 0.5 and rec.status in ("applied", "rolled_back")
        assert slots(port) == (2 if a.outcome == "rolled_back" else a.new_flags["parallel"])
        # The load goes on and the advisor may propose more, but the 1 h cooldown holds.
        time.sleep(8)
        assert len(jr.list_applies(engine)) == 1
        load.communicate(timeout=60)
        assert "auto llama: not now: cooldown" in (tmp_path / "run.log").read_text()
    finally:
        stop_daemon(daemon)
        tuner(cfg, "managed", "stop", check=False)


def test_an_embedding_server_is_started_and_gated_with_a_real_embedding(tmp_path):
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF)
    port = free_port()
    cfg = write_config(tmp_path, port)
    cfg.write_text(
        cfg.read_text().replace("      flags: {parallel: 2", "      type: embedding\n      flags: {parallel: 2")
    )
    try:
        # The tiny GGUF is a causal LM without a pooling type: llama-server starts and answers /health, but
        # cannot embed. The gate's real request catches what /health alone would pass.
        bad = tuner(cfg, "managed", "start", check=False)
        assert bad.returncode == 7 and "/v1/embeddings answered 400" in bad.stderr and "Pooling" in bad.stderr
        tuner(cfg, "managed", "stop", check=False)
        cfg.write_text(cfg.read_text().replace("extra_args: {'-t': 1}", "extra_args: {'-t': 1, '--pooling': mean}"))
        out = tuner(cfg, "managed", "start").stdout
        assert "POST /v1/embeddings answered 200" in out
        argv = proc_argv(managed_pid(cfg))
        assert "--embedding" in argv and argv[argv.index("--pooling") + 1] == "mean"
    finally:
        tuner(cfg, "managed", "stop", check=False)
