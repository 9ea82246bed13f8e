"""One rate, the same arrivals, run after run on the same vLLM CPU server: is a capacity's scatter per server or per
run, and does the trial engine core's nice level change it?

tune_spread.py measures the same flags on five fresh servers; when their capacities scatter, it cannot say whether a
server is slow or fast for its whole life (something tuner could place or warm differently) or each run meets or
misses by itself (which only more runs can average). This script starts fresh servers as a tune trial places them
(tuner's own managed path: the worker bound to core 1 with VLLM_CPU_OMP_THREADS_BIND, the benchmark client pinned to
core 0, the server in this script's session as a trial is in tuner's), warms each one up as tune does (30 requests at
the workload's own rate, not counted), then runs vLLM's benchmark client (tuner's BenchClient, tuner's run size: 15 s
times the workload's burst factor) at the given rates with the same arrival pattern every run (``arrivals=0``, as
a capacity search's runs), for --runs rounds. With --nices 10,0 it sets the engine core's threads to those nice
levels above the server's in turns before each run (tune's default is ``managed.engine_core_nice: 10``), so the two
levels share the server and the host's moments. With --neighbour off,on a run is made in turns with and without
tune_spread.py's neighbour (half a core, in a session of its own, started before the run and stopped after it).
Each run prints the requests within the SLO, P99 TTFT, what the server completed a second, its decode step at 8
sequences (tuner/tune/speed.py), and how long the engine core's and the worker's threads ran and how long they
waited runnable for a CPU over the run (/proc/PID/task/*/schedstat: a thread the kernel does not run while it
could is starved, whatever its nice level says it should get).

  python bench/same_rate.py --servers 1 --runs 4 --rates 21.11 --nices 10,0
  python bench/same_rate.py --servers 2 --runs 3 --rates 16,18.38        # two rates in turns, nice 10 only
  python bench/same_rate.py --workload-file bench/corpus/bursty.yaml --rates 5.19 --nices 10,0 --neighbour off,on

Needs TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (scripts/setup-real-servers.sh prints them). ~75 s a run on
drawn-2161-2 (burst factor 4.65).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.stallwatch import schedstat  # noqa: E402
from bench.tune_spread import NEIGHBOUR, write_config  # noqa: E402
from tuner import procfs  # noqa: E402
from tuner.apply import managed as mg  # noqa: E402
from tuner.apply.launch import free_port  # noqa: E402
from tuner.config import parse_config  # noqa: E402
from tuner.signals.workload import parse_workload  # noqa: E402
from tuner.tune.bench import BenchClient  # noqa: E402
from tuner.tune.compare import burst_factor  # noqa: E402

SLO = "{ttft_p99: 2s, e2e_p99: 20s, objective: 0.95}"  # the corpus's (bench/tune_corpus.py)


def set_engine_nice(server: mg.Running, level: int) -> int:
    """Every thread of the server's engine core at the server's nice level + ``level``; how many threads."""
    base = os.getpriority(os.PRIO_PROCESS, server.pid)
    return mg.set_engine_core_nice(mg.engine_cores(mg.group_pids(server.pid)), base + level)


def server_parts(server: mg.Running) -> dict[str, int]:
    """The engine core's and the worker's pids (vLLM names its processes VLLM::EngineCore, VLLM::Worker)."""
    pids = mg.group_pids(server.pid)
    engines = mg.engine_cores(pids)
    parts = {"engine": engines[0]} if engines else {}
    for pid in pids:
        st = procfs.stat(pid)
        if st is not None and st.comm.startswith("VLLM::Worker"):
            parts["worker"] = pid
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--runs", type=int, default=4, help="rounds: each round runs every rate x nice once")
    ap.add_argument("--rates", default="21.11", help="comma-separated req/s, run in turns")
    ap.add_argument("--nices", default="10", help="comma-separated engine core nice levels, run in turns")
    ap.add_argument("--neighbour", default="off", help="comma-separated: off, on; run in turns")
    ap.add_argument("--workload-file", default="bench/corpus-drawn2/drawn-2161-2.yaml")
    ap.add_argument("--flags", default='{"max_num_seqs": 8, "max_num_batched_tokens": 2048}', help="JSON")
    args = ap.parse_args()
    python, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_TINY_MODEL")
    if not python or not model:
        sys.exit("set TUNER_VLLM_PYTHON and TUNER_TINY_MODEL (eval the exports of scripts/setup-real-servers.sh)")
    rates = [float(r) for r in args.rates.split(",")]
    nices = [int(n) for n in args.nices.split(",")]
    work = Path(tempfile.mkdtemp(prefix="same-rate-"))
    text = (ROOT / args.workload_file).read_text()
    w = parse_workload(text)
    cfg = parse_config(write_config(work, python, model, json.loads(args.flags), text, SLO, nices[0]).read_text())
    t = cfg.targets[0]
    assert t.managed is not None and t.slo is not None
    (work / "logs").mkdir()
    print(
        f"{args.workload_file} (burstiness {w.burstiness}); flags {dict(t.managed.flags)}; rates {rates}; engine core nice {nices}; "
        f"workdir {work}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    neighbours = args.neighbour.split(",")
    arms = [(rate, nice, nb) for rate in rates for nice in nices for nb in neighbours]
    with BenchClient(python, work / "client") as client:
        client.pin((0,))
        for s in range(args.servers):
            shadow = t.model_copy(update={"url": f"http://127.0.0.1:{free_port()}"})
            env = {**mg.server_env(t), "VLLM_CPU_OMP_THREADS_BIND": "1"}
            server = mg.start_server(
                mg.build_argv(shadow, dict(t.managed.flags)),
                env,
                work / "logs" / f"server-{s}.log",
                nice=t.managed.nice,
                die_with_parent=True,
            )
            try:
                mg.wait_healthy(server, shadow.url, 300)
                kw = {"url": shadow.url, "model": t.served_name, "tokenizer": model, "slo": t.slo}
                client.run(w, rate=w.rate_rps, prompts=30, **kw)  # tune's warm-up run, not counted
                for i in range(args.runs * len(arms)):
                    rate, nice, nb = arms[(i + s) % len(arms)]  # the next server starts on the next arm
                    threads = set_engine_nice(server, nice)
                    prompts = math.ceil(max(40, int(rate * 15)) * burst_factor(w.burstiness))
                    parts = server_parts(server)
                    before = {k: schedstat(pid) for k, pid in parts.items()}
                    noisy = (
                        subprocess.Popen([sys.executable, "-c", NEIGHBOUR], start_new_session=True)
                        if nb == "on"
                        else None
                    )
                    t0 = time.monotonic()
                    try:
                        r = client.run(w, rate=rate, prompts=prompts, arrivals=0, **kw)
                    finally:
                        if noisy is not None:
                            noisy.send_signal(signal.SIGTERM)
                            noisy.wait()
                    wall = time.monotonic() - t0
                    sched = {}
                    for k, pid in parts.items():
                        ran, waited = schedstat(pid)
                        sched[f"{k}_ran"] = round((ran - before[k][0]) / wall, 2)
                        sched[f"{k}_waited"] = round((waited - before[k][1]) / wall, 2)
                    step8 = (r.step_s or {}).get("8") or (r.step_s or {}).get(8)
                    print(
                        json.dumps(
                            {
                                "server": s,
                                "run": i,
                                "rate": rate,
                                "nice": nice,
                                "neighbour": nb,
                                "threads": threads,
                                "good": r.good,
                                "sent": r.sent,
                                "within": round(r.attainment, 4),
                                "ttft_p99_s": round(r.ttft_p99 or 0.0, 2),
                                "completed_rps": round(r.throughput_rps or 0.0, 1),
                                "step_ms_at_8": round(step8 * 1000, 2) if step8 else None,
                                **sched,  # cores' worth over the run
                                "at": time.strftime("%H:%M:%S"),
                            }
                        ),
                        flush=True,
                    )
            finally:
                mg.stop_server(server, grace_s=5.0)


if __name__ == "__main__":
    main()
