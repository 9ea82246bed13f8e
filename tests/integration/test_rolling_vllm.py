"""A rolling apply through a real HAProxy in front of two real vLLM (CPU build) replicas that tuner manages, under a
steady load from a client that never retries (tuner/lab/load.py, retry_for_s=0).

vLLM is the server whose single-instance apply lost requests (it answers HTTP 500 "cannot schedule new futures
after shutdown" while it drains, then refuses connections for the ~30 s it takes to start again): here each
replica leaves HAProxy's rotation and drains before it stops, so not one client request may fail.

The replicas' OpenMP threads are not bound (VLLM_CPU_OMP_THREADS_BIND=nobind in each replica's ``env``): with one
core bound to each replica (0 and 1), a restarting replica's engine process was put on the other replica's core,
whose vLLM worker spins there, and sat in sched_setaffinity for minutes (seen here: 208 s for one restart, and one
that had not started after 6 minutes until the other replica was stopped). The load is kept steady and light
(two clients, short completions, half a second's pause after each answer), below what one replica serves, so that
the replica left serving keeps up while the other restarts beside it. About 3 minutes: two vLLM starts, then two
restarts under load.
"""

from __future__ import annotations

import json
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
from tuner.apply.managed import proc_argv
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.db import open_engine

NAMES = ("tiny.r1", "tiny.r2")


def _max_num_seqs(engine, name: str) -> str | None:
    st = jr.get_managed(engine, name)
    argv = proc_argv(st.pid) if st and st.pid else None
    return argv[argv.index("--max-num-seqs") + 1] if argv and "--max-num-seqs" in argv else None


def test_a_rolling_apply_of_two_vllm_replicas_through_haproxy_loses_no_request(tmp_path: Path) -> None:
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL, realservers.HAPROXY)
    front, ports, sock = free_port(), (free_port(), free_port()), str(tmp_path / "haproxy.sock")
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n"
        "defaults: {scrape_interval: 2s, scrape_timeout: 2s}\n"
        f"listen: 127.0.0.1:{free_port()}\n"
        "targets:\n"
        f"  - name: tiny\n    backend: vllm\n    url: http://127.0.0.1:{front}\n"
        "    slo: {ttft_p99: 5s, e2e_p99: 30s}\n"
        f"    balancer: {{socket: '{sock}', backend: tiny, drain_timeout: 60s, up_timeout: 60s}}\n"
        "    replicas:\n"
        f"      - {{name: r1, url: 'http://127.0.0.1:{ports[0]}', env: {{VLLM_CPU_OMP_THREADS_BIND: nobind}}}}\n"
        f"      - {{name: r2, url: 'http://127.0.0.1:{ports[1]}', env: {{VLLM_CPU_OMP_THREADS_BIND: nobind}}}}\n"
        f"    managed:\n      model: {realservers.TINY_MODEL.path()}\n"
        f"      executable: {realservers.VLLM_PYTHON.path()}\n"
        "      flags: {max_num_seqs: 2, max_model_len: 1024, enable_prefix_caching: false}\n"
        "      extra_args: {enforce-eager: true}\n"
        f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{tmp_path / 'vllm-cache'}'}}\n"
        f"      drain_timeout: 30s\n      start_timeout: 6m\n      log_dir: {tmp_path / 'logs'}\n"
        "    apply: {observe: 4s, observe_max: 4s, baseline: 10s, on_inconclusive: keep_new, "
        "max_restarts_per_hour: 50}\n"
    )
    out = _tuner(cfg, "haproxy-config", "tiny")
    assert out.returncode == 0, out.stderr
    (tmp_path / "haproxy.cfg").write_text(out.stdout)
    assert _tuner(cfg, "db", "upgrade").returncode == 0
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    # both replicas start at once, each on its own core
    starts = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuner.cli",
                "--config",
                str(cfg),
                "--log-level",
                "WARNING",
                "managed",
                "start",
                name,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        for name in NAMES
    ]
    haproxy = None
    try:
        for p in starts:
            _, err = p.communicate(timeout=900)
            assert p.returncode == 0, err[-3000:]
        haproxy = subprocess.Popen(
            [str(realservers.HAPROXY.path()), "-db", "-f", str(tmp_path / "haproxy.cfg")],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "haproxy.log", "w"),
        )
        lb = HAProxy(sock, "tiny")
        wait_for(
            lambda: Path(sock).exists() and all(s.status == "UP" for s in lb.stats().values()),
            60,
            "both vLLM replicas UP in HAProxy",
        )
        before = {n: _max_num_seqs(engine, n) for n in NAMES}
        assert before == {n: "2" for n in NAMES}, before

        rid = recs.add_recommendation(
            engine,
            target="tiny.r1",
            now=time.time(),
            rules=["test"],
            diff_key="{}",
            diff={"max_num_seqs": 4},
            current={},
            evidence=[],
            expected_effect="",
            risk="",
            confidence=0.9,
            rank=1,
            memory_check={"ok": True},
        )
        load = Load(front, concurrency=2, prompt_tokens=32, model="tiny", max_tokens=16, think_s=0.5)
        wait_for(lambda: all(s.total >= 3 for s in lb.stats().values()), 120, "the load to reach both replicas")
        applied = _tuner(cfg, "apply-recommendation", str(rid), "--yes", "--json", timeout=1200)
        result = load.finish()
        assert applied.stdout, applied.stderr[-3000:]
        a = json.loads(applied.stdout)

        steps = [(s["step"], s["detail"].split(":")[0]) for s in a["steps"]]
        order = [(k, who) for k, who in steps if k in ("draining", "stopped", "starting", "in_rotation")][:8]
        assert order == [
            ("draining", "tiny.r1"),
            ("stopped", "tiny.r1"),
            ("starting", "tiny.r1"),
            ("in_rotation", "tiny.r1"),
            ("draining", "tiny.r2"),
            ("stopped", "tiny.r2"),
            ("starting", "tiny.r2"),
            ("in_rotation", "tiny.r2"),
        ], steps
        assert {n: _max_num_seqs(engine, n) for n in NAMES} == {n: "4" for n in NAMES}
        assert all(s.status == "UP" for s in lb.stats().values())
        # the roll ran inside the load, and the clients lost nothing
        ts = [s["ts_ms"] / 1000 for s in a["steps"]]
        assert load.t0 < ts[0] and ts[-1] < load.t1
        assert result.failed == 0, result.errors
        assert result.ok >= 10, result
        starting = {who: t for (k, who), t in zip(steps, ts) if k == "starting"}
        up = {who: t for (k, who), t in zip(steps, ts) if k == "in_rotation"}
        print(
            json.dumps(
                {
                    "ok": result.ok,
                    "failed": result.failed,
                    "outcome": a["outcome"],
                    "roll_s": round(ts[-1] - ts[0], 1),
                    "start_to_rotation_s": {n: round(up[n] - starting[n], 1) for n in NAMES},
                }
            )
        )
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(timeout=10)
        for p in starts:
            if p.poll() is None:
                p.kill()
        for name in NAMES:
            _tuner(cfg, "managed", "stop", name)
