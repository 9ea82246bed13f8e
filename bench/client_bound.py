"""Does one benchmark client bound what a llama-server trial can read? CPU of client and server, rate by rate.

bench/tune.py's llama-server grids (bench/results/*-tune-corpus-llama.md) read 55-74 req/s on the tiny model with one
compute thread (``-t 1``), from one Python process: vLLM's benchmark client as tune runs it (tuner/tune/bench.py
``BenchClient``, one request per connection as tuner does for llama-server). On two cores a client that needs a whole
core to send and read 60-100 requests a second would be what the grid measures, not the server. This runs one fresh
llama-server (the BPE GGUF, ``-c 16384 -t 1``, as the grid's trials) and the same client at rising rates, and reads,
for each run, from /proc: the CPU the client's process used and the server's, as shares of one core over the run; and
from the client's own result: the requests within the SLO, P99 TTFT and how long it took to send them (the span of
the start times, against what the rate schedules: a client that cannot keep up sends late).

  python bench/client_bound.py --parallel 8 --rates 16,32,48,64,80,96,128 --seconds 12

A client near a whole core while the server's compute thread has CPU to spare is the bound; the reverse is the
server. Needs TUNER_VLLM_PYTHON, TUNER_TINY_MODEL, TUNER_LLAMA_SERVER, TUNER_TINY_BPE_GGUF
(scripts/setup-real-servers.sh prints them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.llama_kv_unified import serve  # noqa: E402  (a fresh llama-server as tune.py's trials)
from tuner.config import Slo  # noqa: E402
from tuner.signals.workload import Workload, parse_workload  # noqa: E402
from tuner.tune.bench import BenchClient  # noqa: E402

SLO = Slo(ttft_p99="2s", e2e_p99="20s", objective=0.95)  # the corpus's (bench/tune_corpus.py)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of a process, all its threads (its children's not counted); of one of its threads
    with ``thread``."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


# where the server computes and where the client runs: as tune does for llama-server (the kernel places both), or
# llama-server's one compute thread held to core 1 by its own flags and the client to core 0
ARMS = {"free": ([], None), "pinned": (["--cpu-range", "1-1", "--cpu-strict", "1"], [0])}


def ladder(
    args: argparse.Namespace,
    workload: Workload,
    rates: list[float],
    out: Path,
    server_pid: int,
    client_cpus: list[int] | None,
    env: dict[str, str],
    label: str,
) -> None:
    out.mkdir()
    with BenchClient(env["TUNER_VLLM_PYTHON"], out, close_connections=True) as client:
        client.pin(client_cpus)
        url = f"http://127.0.0.1:{args.port}"
        run: dict[str, Any] = dict(url=url, model="tiny", tokenizer=env["TUNER_TINY_MODEL"], slo=SLO, arrivals=1)
        client.run(workload, rate=rates[0], prompts=int(rates[0] * 2), **run)  # starts it, warms the server
        for rate in rates:
            prompts = max(1, round(rate * args.seconds))
            pid = client.pid
            assert pid is not None  # the warm-up started it
            c0, m0, s0, t0 = cpu_s(pid), cpu_s(pid, pid), cpu_s(server_pid), time.monotonic()
            r = client.run(workload, rate=rate, prompts=prompts, **run)
            c1, m1, s1, t1 = cpu_s(pid), cpu_s(pid, pid), cpu_s(server_pid), time.monotonic()
            detail = json.loads((client.results / r.result_file).read_text(encoding="utf-8"))
            starts = [s for s in detail.get("start_times") or [] if isinstance(s, (int, float))]
            span = max(starts) - min(starts) if len(starts) > 1 else None
            row = {
                "run": label,
                "rate": rate,
                "sent": r.sent,
                "within_slo": round(r.attainment, 3),
                "throughput_rps": round(r.throughput_rps, 1),
                "p99_ttft_s": None if r.ttft_p99 is None else round(r.ttft_p99, 3),
                "send_span_s": None if span is None else round(span, 2),
                "scheduled_s": round(prompts / rate, 2),
                "wall_s": round(t1 - t0, 1),
                "client_core": round((c1 - c0) / (t1 - t0), 2),
                "client_main_thread_core": round((m1 - m0) / (t1 - t0), 2),  # its event loop: one thread at most 1
                "server_core": round((s1 - s0) / (t1 - t0), 2),
                # over the benchmark's own duration (first send to last answer); the wall adds the client's warm-ups
                # and its result file, so this is the higher of the two
                "client_core_in_duration": round((c1 - c0) / r.duration_s, 2) if r.duration_s else None,
            }
            print(json.dumps(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload-file", default="bench/corpus-drawn8/drawn-8289-3.yaml")
    ap.add_argument("--parallel", type=int, default=8, help="llama-server's --parallel (0: left out)")
    ap.add_argument("--rates", default="16,32,48,64,80,96,128")
    ap.add_argument("--seconds", type=float, default=12.0, help="a run's length at its rate (tune's llama runs: 12)")
    ap.add_argument("--arms", default="free,pinned", help=f"from {', '.join(ARMS)}; they run in turns")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=62011)
    args = ap.parse_args()
    arms = args.arms.split(",")
    if any(a not in ARMS for a in arms):
        ap.error(f"--arms: choose from {', '.join(ARMS)}")
    env = {k: os.environ.get(k, "") for k in ("TUNER_VLLM_PYTHON", "TUNER_TINY_MODEL", "TUNER_LLAMA_SERVER")}
    env["TUNER_TINY_BPE_GGUF"] = os.environ.get("TUNER_TINY_BPE_GGUF", "")
    missing = [k for k, v in env.items() if not v]
    if missing:
        raise SystemExit(f"set {', '.join(missing)} (scripts/setup-real-servers.sh prints them)")
    workload = parse_workload(Path(args.workload_file).read_text(encoding="utf-8"), args.workload_file)
    out = Path(tempfile.mkdtemp(prefix="client-bound-"))
    rates = [float(r) for r in args.rates.split(",")]
    print(
        f"workload {args.workload_file}; --parallel {args.parallel}; {args.seconds:g}-s runs at {rates}; arms {arms} "
        f"in turns, {args.rounds} rounds; {out}"
    )
    for k in range(args.rounds):
        for arm in arms[k % len(arms) :] + arms[: k % len(arms)]:
            extra, client_cpus = ARMS[arm]
            log = out / f"server-{k}-{arm}.log"
            slots = ["--parallel", str(args.parallel)] if args.parallel else []
            proc = serve(env["TUNER_LLAMA_SERVER"], env["TUNER_TINY_BPE_GGUF"], slots + extra, args.port, log)
            try:
                ladder(args, workload, rates, out / f"{k}-{arm}", proc.pid, client_cpus, env, f"{k} {arm}")
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
