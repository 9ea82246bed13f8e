"""Why fresh vLLM CPU servers with the same flags meet the SLO differently on the same run: where each process ran.

bench/results/2026-11-28-1932-tune-spread.md gave five fresh servers the same 238-request run (the same rate, arrival
times and prompts) and they met the SLO for 68-99% of it, in two groups. This starts ``--servers`` fresh servers one
after another, each a `tuner tune --budget 1` (bench/tune_spread.py) whose workload starts at ``--rate``, so every
server's first measured run is that same run; meanwhile it samples, twice a second, every thread of the trial's vLLM
processes and of the benchmark client (/proc/PID/task/TID/stat: its CPU time and the core it last ran on) and adds
each thread's CPU time to the core it was on. Only samples in which the worker was busy (over half a core) count.

For each server: its share within the SLO at the first run, and the CPU seconds of the API server, the engine core,
the worker and the client on each core, with the share of the worker's core that others took.

  python bench/server_modes.py --servers 4 --rate 5.19 --workload-file bench/corpus-drawn2/drawn-2161-2.yaml \
      --flags max_num_seqs=8,max_num_batched_tokens=2048
Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them). ~2.5 min a server here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.tune_spread import one_server, parse_flags, vllm_and_model, write_config  # noqa: E402
from tuner import procfs  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def role(pid: int) -> str | None:
    """What a process is to a trial, from its command line and name; None: not one of them."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    if comm.startswith("VLLM::Worker"):
        return "worker"
    if comm.startswith("VLLM::EngineCor"):
        return "engine"
    if "vllm.benchmarks.serve" in cmd:
        return "client"
    if "vllm.entrypoints" in cmd or re.search(r"\bvllm\b.*\bserve\b", cmd):
        return "api"
    return None


def threads(pid: int) -> dict[int, tuple[int, int]]:
    """tid -> (utime + stime in ticks, the core it last ran on)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = procfs.stat(pid, tid)
        if st is not None:
            out[int(tid)] = (st.cpu_ticks, st.processor)
    return out


class Sampler:
    """CPU seconds by (role, core), over the samples in which the worker used more than half a core."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.seconds: dict[tuple[str, int], float] = defaultdict(float)
        self.busy_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last: dict[tuple[int, int], int] = {}
        roles: dict[int, str | None] = {}
        while not self._stop.wait(self.period_s):
            step: dict[tuple[str, int], float] = defaultdict(float)
            seen: dict[tuple[int, int], int] = {}
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                if roles.get(pid) is None:  # again until it has one: vLLM's processes rename themselves after start
                    roles[pid] = role(pid)
                r = roles[pid]
                if r is None:
                    continue
                for tid, (ticks, core) in threads(pid).items():
                    seen[(pid, tid)] = ticks
                    before = last.get((pid, tid))
                    if before is not None and ticks > before:
                        step[(r, core)] += (ticks - before) / TICKS
            last = seen
            worker = sum(v for (r, _), v in step.items() if r == "worker")
            if worker > 0.5 * self.period_s:
                self.busy_s += self.period_s
                for k, v in step.items():
                    self.seconds[k] += v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=5.19, help="the workload's rate: the first measured run's")
    ap.add_argument("--workload-file", required=True)
    ap.add_argument("--flags", default="max_num_seqs=8,max_num_batched_tokens=2048")
    ap.add_argument("--run-seconds", type=float, default=10.0)
    ap.add_argument("--max-runs", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    python, model = vllm_and_model()
    from bench.tune_corpus import SLO

    flags = parse_flags(args.flags)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="server-modes-"))
    work.mkdir(parents=True, exist_ok=True)
    text = re.sub(r"(?m)^rate_rps: .*$", f"rate_rps: {args.rate:g}", Path(args.workload_file).read_text())
    cfg = write_config(work, python, model, flags, text, SLO, 10)
    subprocess.run(
        [sys.executable, "-m", "tuner.cli", "-c", str(cfg), "db", "upgrade"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    from sqlalchemy import text as sql

    from tuner.store import tuning as tj
    from tuner.store.db import open_engine

    print(f"flags {flags}; workload {args.workload_file} at {args.rate:g} req/s; workdir {work}", flush=True)
    for i in range(args.servers):
        t0 = time.monotonic()
        with Sampler() as sampler:
            r = one_server(cfg, work, "spread", args, f"server-{i + 1}")
        first = None
        if r.get("capacity_rps") is not None:
            engine = open_engine(f"sqlite:///{work / 'tuner.db'}")
            with engine.connect() as c:
                rid = c.execute(sql("select max(id) from tune_runs")).scalar()
            trial = tj.trials(engine, rid)[0]
            engine.dispose()
            first = [(round(x["rate_rps"], 2), x["good"], x["sent"]) for x in trial.detail.get("runs", [])]
        cores = sorted({c for _, c in sampler.seconds})
        table = {
            who: {c: round(sampler.seconds.get((who, c), 0.0), 1) for c in cores}
            for who in ("worker", "engine", "api", "client")
        }
        worker_core = max(cores, key=lambda c: table["worker"].get(c, 0.0)) if cores else None
        others = (
            sum(table[w].get(worker_core, 0.0) for w in ("engine", "api", "client")) if worker_core is not None else 0
        )
        print(
            json.dumps(
                {
                    "server": i + 1,
                    "runs (rate, good, sent)": first,
                    "capacity_rps": r.get("capacity_rps"),
                    "busy_s": round(sampler.busy_s, 1),
                    "cpu_s_by_core": table,
                    "worker_core": worker_core,
                    "others_on_worker_core_s": round(others, 1),
                    "wall_s": round(time.monotonic() - t0, 1),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
