"""Where the demo's clients run, and how many requests reach the engine: the apply stall
(bench/results/2026-11-30-0058-demo-diagnosis.md, bench/results/2026-11-30-0250-session-yield.md).

One managed vLLM CPU under `tuner run`, configured as the demo configures it (tuner/lab/demo.py `demo_config`: tiny
model, --max-num-seqs 4), and the demo's own steady load (16 clients, 512-token answers, tuner/lab/demo.py) in
turns, one arm at a time (ARMS below: where the load process runs, or the CPU weight of the server's session against
other sessions). Each arm: 75 s of load, then the store's last 60 s read as an apply's baseline reads it
(tuner/signals/load.py `profile`): requests at the engine (Little's law), offered rate, time queued. One JSON line an
arm.

    python bench/demo_placement.py WORKDIR [--arms NANA]

Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner import procfs  # noqa: E402
from tuner.apply.launch import free_port  # noqa: E402
from tuner.config import load_config  # noqa: E402
from tuner.lab import demo  # noqa: E402
from tuner.lab.proc import stop  # noqa: E402
from tuner.signals.load import profile  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402
from tuner.store.store import Store  # noqa: E402

LOAD_S, WINDOW_S, PAUSE_S = 75, 60, 15
ARMS = {
    "A": "as the demo starts the load, the server's session as tuner left it",
    "B": "the load process placed on the cores the worker is not pinned to",
    "C": "the server's session's autogroup at nice 10 (tuner's default since 2026-11-30)",
    "D": "the load process in a session of its own",
    "N": "the server's session's autogroup at nice 0 (as before 2026-11-30)",
}


def _worker() -> int | None:
    """The pid of the (one) vLLM CPU worker on this host; None where none runs."""
    for pid in procfs.pids():
        st = procfs.stat(pid)
        if st is not None and st.comm == "VLLM::Worker":
            return pid
    return None


def _worker_cpus() -> set[int] | None:
    """The CPUs the (one) vLLM CPU worker on this host may run on; None where none runs."""
    pid = _worker()
    try:
        return os.sched_getaffinity(pid) if pid is not None else None
    except OSError:  # it ended meanwhile
        return None


def _server_session(nice: int | None) -> int | None:
    """The autogroup level of the server's session (the worker's), after setting it to ``nice`` unless None."""
    pid = _worker()
    if pid is None:
        return None
    if nice is not None:
        return procfs.set_autogroup_nice(os.getsid(pid), nice)
    return procfs.autogroup_nice(pid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path)
    ap.add_argument(
        "--arms", default="NANA", help="the arms in the order run: " + "; ".join(f"{k}: {v}" for k, v in ARMS.items())
    )
    args = ap.parse_args()
    if set(args.arms) - set(ARMS):
        ap.error(f"--arms {args.arms!r}: only {', '.join(ARMS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    port, own = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = args.workdir / "tuner.yaml"
    cfg.write_text(
        demo.demo_config(
            args.workdir, url, own, vllm_python=os.environ["TUNER_VLLM_PYTHON"], model=os.environ["TUNER_TINY_MODEL"]
        )
    )
    demo._tuner(cfg, "db", "upgrade")
    with open(args.workdir / "tuner.log", "w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "WARNING", "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        t0 = time.monotonic()
        while not demo._healthy(url):
            if daemon.poll() is not None or time.monotonic() - t0 > 600:
                print(f"vLLM did not come up: see {args.workdir}", file=sys.stderr)
                return 7
            time.sleep(1)
        time.sleep(PAUSE_S)
        loaded = load_config(cfg)
        store, target = Store(open_engine(loaded.store.url)), loaded.targets[0]
        as_left = _server_session(None)  # tuner's level, which arm A restores after another arm's
        for arm in args.arms:
            worker = _worker_cpus()
            session = _server_session({"A": as_left, "C": 10, "N": 0}.get(arm))
            load = demo._load_process(url, 0, 16, max_tokens=512, steady=True, own_session=arm == "D")
            placed = sorted(set(range(os.cpu_count() or 1)) - worker) if arm == "B" and worker else None
            if placed:
                os.sched_setaffinity(load.pid, placed)  # before it starts its client threads, which inherit it
            time.sleep(LOAD_S)
            now = time.time()
            prof = profile(store.window(target.name, now - WINDOW_S, now), slo=target.slo)
            st = procfs.stat(load.pid)
            cpu = st.cpu_ticks / procfs.CLK_TCK if st is not None else None
            load.send_signal(signal.SIGUSR1)
            out, _ = load.communicate(timeout=600)
            print(
                json.dumps(
                    {
                        "arm": arm,
                        "at": time.strftime("%H:%M:%S"),
                        "worker_cpus": sorted(worker or ()),
                        "clients_on": placed,
                        "server_session_nice": session,
                        "mean_in_flight": prof.mean_in_flight if prof else None,
                        "offered_rps": prof.offered_rps if prof else None,
                        "queue_time_share": prof.queue_time_share if prof else None,
                        "samples": prof.samples if prof else None,
                        "clients_cpu_s": cpu,
                        "clients": out.strip().splitlines()[-1]
                        if out.strip()
                        else None,  # ok, failed, retried, P50, P99
                        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
                    }
                ),
                flush=True,
            )
            time.sleep(PAUSE_S)
    finally:
        stop(daemon, 15)
        print(demo._tuner(cfg, "managed", "stop", timeout=120).stdout.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
