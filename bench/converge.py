"""Does the live loop converge? Auto mode from a poor max-num-seqs under a queueing load, against a full grid.

On a real vLLM (CPU build, tiny model) under one steady closed-loop load (C clients, each one completion of
MAX_TOKENS at a time, a failed request sent again after 0.2 s; bench/apply.py's client):
  1. grid: the managed argv started directly for every max_num_seqs in GRID; after a warm-up, capacity =
     the increase of the server's own vllm:request_success_total over W seconds / W;
  2. auto: `tuner run` with the target managed at START, `apply.mode: auto`, its guardrails loosened so that
     applies follow each other (cooldown = the baseline window, so each recommendation reads the flags in force
     only; min_confidence 0.6 passes the advisor's 0.8 and keeps out a backend change's 0.5), the same load
     throughout; it ends when an apply was not kept, when no apply came for IDLE_S after the last one, or after
     BUDGET_S;
  3. reported: each auto apply (diff, verdict, capacity before/after as the verdict measured it, outage,
     client requests that failed while it ran), and how many applies it took to come within 10% of the grid's
     best capacity.

Fairness on 2 cores: the clients share the CPU with vLLM in both phases alike (same process, same
concurrency, same answers, normal priority: clients ahead of vLLM starve the HTTP server that answers /metrics,
and tuner would judge blind). tuner scrapes every 5 s with a 5 s timeout, as the demo does.

Usage: eval "$(bash scripts/setup-real-servers.sh | grep ^export)"; .venv/bin/python bench/converge.py
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from bench.apply import Load, requests_summary, save_config, tuner_cli  # noqa: E402  (the recording closed-loop client)
from tuner.apply import managed as mg  # noqa: E402
from tuner.apply.launch import ServerProcess, free_port  # noqa: E402
from tuner.config import load_config  # noqa: E402
from tuner.lab.proc import wait_for  # noqa: E402
from tuner.store import journal as jr  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402

TARGET = "converge"
GRID = (2, 4, 8, 16)
START = 2
CLIENTS = 16
MAX_TOKENS = 256
WARMUP_S, W_S = 10.0, 30.0
BUDGET_S, IDLE_S = 900.0, 150.0  # idle: longer than cooldown + baseline + two auto ticks


def _gate_passes(t: Any) -> bool:
    """The managed server's health gate passes (a server still starting refuses, or fails the gate)."""
    try:
        return bool(mg.health_gate(t, timeout_s=10))
    except Exception:  # noqa: BLE001 (not up yet)
        return False


def write_config(root: Path, port: int, seqs: int) -> Path:
    exe, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_TINY_MODEL")
    if not exe or not model:
        raise SystemExit(
            'TUNER_VLLM_PYTHON / TUNER_TINY_MODEL not set: eval "$(bash scripts/setup-real-servers.sh '
            '| grep ^export)" first'
        )
    doc = {
        "store": {"url": f"sqlite:///{root / 'tuner.db'}"},
        "listen": f"127.0.0.1:{free_port()}",
        "defaults": {"scrape_interval": "5s", "scrape_timeout": "5s", "signal_window": "40s"},
        "targets": [
            {
                "name": TARGET,
                "backend": "vllm",
                "url": f"http://127.0.0.1:{port}",
                "slo": {"ttft_p99": "2s", "e2e_p99": "10s"},
                "managed": {
                    "model": model,
                    "executable": exe,
                    "flags": {"max_num_seqs": seqs, "max_model_len": 1024},
                    "extra_args": {"enforce-eager": True},
                    "drain_timeout": "30s",
                    "start_timeout": "300s",
                    "env": {
                        "VLLM_CPU_KVCACHE_SPACE": "1",
                        "HF_HUB_OFFLINE": "1",
                        "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
                    },
                },
                "apply": {
                    "mode": "auto",
                    "baseline": "40s",
                    "observe": "30s",
                    "observe_max": "60s",
                    "min_requests": 5,
                    "auto_interval": "10s",
                    "cooldown": "40s",
                    "min_confidence": 0.6,
                    "max_restarts_per_hour": 30,
                    "max_consecutive_rollbacks": 2,
                },
            }
        ],
    }
    return save_config(root, doc)


def finished_total(port: int) -> float:
    import requests

    body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=60).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("vllm:request_success_total{")
    )


def grid(root: Path) -> dict[int, float]:
    out: dict[int, float] = {}
    for seqs in GRID:
        port = free_port()
        (root / f"grid-{seqs}").mkdir()
        cfg = write_config(root / f"grid-{seqs}", port, seqs)
        t = load_config(cfg).target(TARGET)
        proc = ServerProcess.start(
            mg.build_argv(t, dict(t.managed.flags)),
            mg.server_env(t),  # type: ignore[union-attr]
            cfg.parent / "logs" / "server.log",
        )
        try:
            proc.wait_healthy(t.url, 300, interval=0.2)
            load = Load(port, TARGET, CLIENTS, MAX_TOKENS)  # tuner serves the model under the target's name
            load.start()
            time.sleep(WARMUP_S)
            f0, t0 = finished_total(port), time.monotonic()
            time.sleep(W_S)
            f1, t1 = finished_total(port), time.monotonic()
            load.stop()
            out[seqs] = (f1 - f0) / (t1 - t0)
            failed = sum(1 for r in load.done if r.outcome != "ok")
            print(
                f"  grid max_num_seqs {seqs:>2}: capacity {out[seqs]:.2f} req/s ({f1 - f0:.0f} finished in "
                f"{t1 - t0:.0f}s; {failed} client requests failed)",
                flush=True,
            )
        finally:
            proc.stop(grace_s=30)
    return out


def auto(root: Path) -> tuple[list[dict[str, Any]], Load]:
    (root / "auto").mkdir()
    port = free_port()
    cfg = write_config(root / "auto", port, START)
    t = load_config(cfg).target(TARGET)
    engine = open_engine(f"sqlite:///{root / 'auto' / 'tuner.db'}")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "WARNING", "run"],
        stdout=open(root / "auto" / "tuner.log", "w"),
        stderr=subprocess.STDOUT,
    )
    load = None
    try:
        wait_for(
            lambda: _gate_passes(t),
            400,
            f"the managed vLLM to come up ({root / 'auto'})",
            proc=daemon,
            log=root / "auto" / "tuner.log",
            every_s=1,
        )
        load = Load(port, TARGET, CLIENTS, MAX_TOKENS)
        load.start()
        started = time.monotonic()
        last_done = started + 120  # the first apply needs a baseline window of queueing first
        seen: set[int] = set()
        while time.monotonic() - started < BUDGET_S:
            time.sleep(5)
            applies = jr.list_applies(engine, target=TARGET, limit=50)
            for a in applies:
                if a.state == "done" and a.id not in seen:
                    seen.add(a.id)
                    last_done = time.monotonic()
                    print(f"  auto apply #{a.id} {a.diff}: {a.outcome}", flush=True)
            if any(a.state == "done" and a.outcome != "kept" for a in applies):
                break  # its next step did not pay: nothing left to gain here
            if not jr.open_applies_for(engine, TARGET) and time.monotonic() - last_done > IDLE_S:
                break  # nothing proposed any more
        load.stop()
        return sorted(
            (a.as_json() for a in jr.list_applies(engine, target=TARGET, limit=50)), key=lambda a: a["id"]
        ), load
    finally:
        if load is not None:
            load.stop()
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        tuner_cli(cfg, "managed", "stop", timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-grid", action="store_true")
    args = ap.parse_args()
    print(
        f"host {platform.node()}, {os.cpu_count()} cores; "
        f"{CLIENTS} clients x {MAX_TOKENS} tokens; grid {GRID}; auto from max_num_seqs {START}",
        flush=True,
    )
    root = Path(tempfile.mkdtemp(prefix="tuner-converge-"))
    caps = {} if args.skip_grid else grid(root)
    applies, load = auto(root)
    best = max(caps.values()) if caps else None
    print(
        "\n| apply | diff | verdict | capacity before -> after (req/s) | outage (s) | journal: in flight at drain, "
        "arrivals during outage | client requests sent again / lost (attempts failed) |"
    )
    print("|---|---|---|---|---:|---|---|")
    within = None
    for n, a in enumerate(applies, 1):
        lo, hi = a["created_ms"] / 1000, a["updated_ms"] / 1000 + 1
        c = requests_summary([r for r in load.done if lo <= r.start <= hi])
        b, af = a.get("baseline") or {}, a.get("after") or {}
        cap_after = af.get("capacity_rps")
        print(
            f"| {n} (#{a['id']}) | {a['diff']} | {a['outcome']} | {b.get('capacity_rps')} -> {cap_after} | "
            f"{af.get('outage_s')} | {b.get('in_flight_at_drain')}, {af.get('arrivals_during_outage')} | "
            f"{c['retried']} / {c['lost']} ({c['attempts_failed']}) |"
        )
        if within is None and best and a["outcome"] == "kept" and cap_after and cap_after >= 0.9 * best:
            within = n
    print(f"\ngrid best: {best} req/s; came within 10% after {within} apply(s)" if best else "")
    whole = requests_summary(load.done)
    print(
        f"client requests during the auto phase: {whole['requests']}, sent again {whole['retried']}, lost "
        f"{whole['lost']} ({whole['attempts_failed']} failed attempts)"
    )
    print(f"data: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
