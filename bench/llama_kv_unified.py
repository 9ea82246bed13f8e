"""llama-server with one unified KV buffer or one buffer per slot, in turns, on a corpus shape.

A llama-server started without ``--parallel`` runs 4 slots with ``kv_unified = 'true'``: one buffer of ``-c`` cells
that every sequence may use. ``--parallel N`` gives each slot ``-c / N`` cells (``kv_unified = 'false'``), unless
``--kv-unified`` is given too. tune reads a default server's slot count from ``/props`` (4), but that is not the
same config as ``--parallel 4``. This bench compares them on the same arrivals and prompts. Each run gets a fresh
server (the BPE GGUF, ``-c 16384 -t 1``, as bench/tune.py's llama-server trials), and the arms run in turns, rotated
each round. The load is vLLM's benchmark client with tuner's own arguments (tuner/tune/bench.py ``bench_args``,
``Connection: close``, the tiny model's tokenizer), counted as tuner counts it (``attainment``). For each run it prints the share of requests within the SLO (TTFT 2 s, E2E 20 s),
throughput and P99 TTFT.

  python bench/llama_kv_unified.py --rate 48 --requests 700 --rounds 4 --arms default,parallel4,parallel4-unified

The arms: default (no --parallel), parallel2, parallel4, parallel8 (one buffer per slot), and parallel4-unified,
parallel8-unified (--kv-unified). Needs TUNER_VLLM_PYTHON, TUNER_TINY_MODEL, TUNER_LLAMA_SERVER and
TUNER_TINY_BPE_GGUF (scripts/setup-real-servers.sh prints them). About 25 s a run here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.config import Slo  # noqa: E402
from tuner.signals.workload import parse_workload  # noqa: E402
from tuner.tune.bench import attainment, bench_args  # noqa: E402

SLO = Slo(ttft_p99="2s", e2e_p99="20s", objective=0.95)  # the corpus's (bench/tune_corpus.py)

ARMS = {
    "default": [],
    "parallel2": ["--parallel", "2"],
    "parallel4": ["--parallel", "4"],
    "parallel8": ["--parallel", "8"],
    "parallel4-unified": ["--parallel", "4", "--kv-unified"],
    "parallel8-unified": ["--parallel", "8", "--kv-unified"],
}
CLIENT = (
    "import sys;from vllm.benchmarks.serve import add_cli_args, main;"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P;p=P();add_cli_args(p);"
    "main(p.parse_args(sys.argv[1:]))"
)


def serve(server: str, gguf: str, extra: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """A fresh llama-server as bench/tune.py's trials start it (the BPE GGUF, ``-c 16384 -t 1``) with ``extra`` on
    its command line, once ``/health`` answers (bench/client_bound.py starts its servers here too)."""
    argv = [server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--metrics", "-t", "1", "-c", "16384"]
    proc = subprocess.Popen([*argv, *extra], stdout=log.open("ab"), stderr=subprocess.STDOUT, process_group=0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"llama-server {' '.join(extra)} was not healthy within 60 s; see {log}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload-file", default="bench/corpus-drawn8/drawn-8289-3.yaml")
    ap.add_argument("--rate", type=float, default=48.0)
    ap.add_argument("--requests", type=int, default=700)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--arms", default="default,parallel4,parallel4-unified")
    ap.add_argument("--port", type=int, default=62001)
    args = ap.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    env = {k: os.environ.get(k, "") for k in ("TUNER_VLLM_PYTHON", "TUNER_TINY_MODEL", "TUNER_LLAMA_SERVER")}
    env["TUNER_TINY_BPE_GGUF"] = os.environ.get("TUNER_TINY_BPE_GGUF", "")
    missing = [k for k, v in env.items() if not v]
    if missing:
        raise SystemExit(f"set {', '.join(missing)} (scripts/setup-real-servers.sh prints them)")
    workload = parse_workload(Path(args.workload_file).read_text(encoding="utf-8"), args.workload_file)
    out = Path(tempfile.mkdtemp(prefix="kvu-"))
    print(f"workload {args.workload_file}; {args.requests} requests at {args.rate} req/s a run; arms {arms}; {out}")
    rows = []
    for k in range(args.rounds):
        for arm in arms[k % len(arms) :] + arms[: k % len(arms)]:
            proc = serve(
                env["TUNER_LLAMA_SERVER"], env["TUNER_TINY_BPE_GGUF"], ARMS[arm], args.port, out / f"{arm}.log"
            )
            try:
                name = f"r{k}-{arm}.json"
                client = bench_args(
                    workload,
                    url=f"http://127.0.0.1:{args.port}",
                    model="tiny",
                    tokenizer=env["TUNER_TINY_MODEL"],
                    rate=args.rate,
                    prompts=args.requests,
                    slo=SLO,
                    result_dir=out,
                    result_file=name,
                    seed=100 + k,
                    close_connections=True,
                )
                subprocess.run(
                    [env["TUNER_VLLM_PYTHON"], "-c", CLIENT, *client],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    check=True,
                )
                r = json.loads((out / name).read_text(encoding="utf-8"))
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            good, sent = attainment(r, SLO)
            row = {
                "round": k,
                "arm": arm,
                "within_slo": round(good / sent, 3),
                "failed": r.get("failed"),
                "throughput_rps": round(r["request_throughput"], 2),
                "p99_ttft_s": round(r["p99_ttft_ms"] / 1000, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        print(
            f"{arm}: within the SLO {[r['within_slo'] for r in mine]}, req/s {[r['throughput_rps'] for r in mine]}, "
            f"P99 TTFT s {[r['p99_ttft_s'] for r in mine]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
