"""Record real before/after series for the verdict's tests: tests/fixtures/verdict/<case>/{before,after}/.

Each side starts a real server (vLLM CPU build on the tiny model, or llama-server on the tiny GGUF) with that
side's flags, runs a closed-loop load from tuner.lab.load in a niced process of its own, and saves the server's
/metrics every second as ``<unix_ms>.txt.gz``, cut to the families tuner's verdict and signals read
(llama-server: whole, with ``<unix_ms>.slots.json``). case.json records the flags, the load, what the client
saw and the outcome the case must get:

  queue_more_seqs     max-num-seqs 2 -> 8 under a queue (12 clients): capacity up            -> kept
  fewer_seqs          max-num-seqs 16 -> 1 under 12 clients: capacity down                  -> rolled_back
  same_restart        max-num-seqs 4 -> 4, the same load: the noise of a restart            -> never rolled_back
  load_doubled        max-num-seqs 16, 3 clients -> 6 clients, same flags                   -> never rolled_back
  trickle             3 requests a side                                                     -> inconclusive
  llama_more_parallel llama-server --parallel 1 -> 4 under 8 clients                         -> kept
  llama_less_parallel llama-server --parallel 4 -> 1 under 8 clients                         -> rolled_back

Usage: .venv/bin/python scripts/record_verdict_fixtures.py [--cases a,b] [--seconds 20]
(needs scripts/setup-real-servers.sh; ~10 minutes on 2 cores, everything on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.apply.launch import ServerProcess, free_port, llama_server_argv, vllm_argv, vllm_cpu_env
from tuner.collect import http

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "verdict"
CACHE = Path(os.environ.get("TUNER_CACHE") or Path.home() / ".cache" / "tuner")
VLLM_PYTHON = Path(os.environ.get("TUNER_VLLM_PYTHON") or CACHE / "vllm-venv" / "bin" / "python")
TINY_MODEL = Path(os.environ.get("TUNER_TINY_MODEL") or CACHE / "models" / "tiny-llama")
LLAMA_SERVER = Path(os.environ.get("TUNER_LLAMA_SERVER") or CACHE / "llama.cpp" / "bin" / "llama-server")
TINY_GGUF = Path(os.environ.get("TUNER_TINY_GGUF") or CACHE / "models" / "tiny.gguf")

KEEP = (
    "vllm:request_success_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:cache_config_info",
    "process_start_time_seconds",
)

# case -> (backend, before flags, after flags, before clients, after clients, requests a side or None, expected)
CASES = {
    "queue_more_seqs": ("vllm", {"max-num-seqs": 2}, {"max-num-seqs": 8}, 12, 12, None, "kept"),
    "fewer_seqs": ("vllm", {"max-num-seqs": 16}, {"max-num-seqs": 1}, 12, 12, None, "rolled_back"),
    "same_restart": ("vllm", {"max-num-seqs": 4}, {"max-num-seqs": 4}, 8, 8, None, "not rolled_back"),
    "load_doubled": ("vllm", {"max-num-seqs": 16}, {"max-num-seqs": 16}, 3, 6, None, "not rolled_back"),
    "trickle": ("vllm", {"max-num-seqs": 8}, {"max-num-seqs": 16}, 1, 1, 3, "inconclusive"),
    "llama_more_parallel": (
        "llamacpp",
        {"--parallel": 1, "-c": 2048},
        {"--parallel": 4, "-c": 2048},
        8,
        8,
        None,
        "kept",
    ),
    "llama_less_parallel": (
        "llamacpp",
        {"--parallel": 4, "-c": 2048},
        {"--parallel": 1, "-c": 2048},
        8,
        8,
        None,
        "rolled_back",
    ),
}


def _keep(text: str) -> str:
    out = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else line.split("{")[0].split(" ")[0]
        base = name
        for suffix in ("_bucket", "_count", "_sum", "_created"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        if name in KEEP or base in KEEP:
            out.append(line)
    return "\n".join(out) + "\n"


def _start(backend: str, flags: dict, work: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    if backend == "vllm":
        merged = {"enforce-eager": True, "max-model-len": 1024, **flags}
        argv = vllm_argv(str(VLLM_PYTHON), str(TINY_MODEL), port=port, served_model_name="tiny-llama", flags=merged)
        env = vllm_cpu_env(tempfile.mkdtemp(prefix="vllm-cache-", dir=work), kvcache_space_gib=1)
        proc = ServerProcess.start(argv, env, work / f"vllm-{port}.log", cwd=work)
        timeout = 300.0
    else:
        merged = {"-t": 1, "--metrics": True, **flags}
        argv = llama_server_argv(str(LLAMA_SERVER), str(TINY_GGUF), port=port, flags=merged)
        proc = ServerProcess.start(argv, None, work / f"llama-{port}.log", cwd=work)
        timeout = 60.0
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_healthy(url, timeout)
    except BaseException:
        proc.stop(grace_s=5)
        raise
    return proc, url


def _load(url: str, backend: str, clients: int, n: int, seconds: float) -> subprocess.Popen[str]:
    kwargs = {
        "model": "tiny-llama" if backend == "vllm" else None,
        "n_requests": n,
        "concurrency": clients,
        "prompt_tokens_approx": 100,
        "max_tokens": 64 if backend == "vllm" else 128,
        "timeout_s": seconds,
    }
    script = (
        "import dataclasses, json, sys; from tuner.lab.load import run_load; "
        "r = run_load(sys.argv[1], **json.loads(sys.argv[2])); "
        "print(json.dumps({k: v for k, v in dataclasses.asdict(r).items() if k != 'latencies_s'}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, url, json.dumps(kwargs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        os.setpriority(os.PRIO_PROCESS, proc.pid, 10)  # the server keeps its share of 2 cores
    except OSError:
        pass
    return proc


def _side(
    case_dir: Path, side: str, backend: str, flags: dict, clients: int, n: int | None, seconds: float, work: Path
) -> dict:
    out = case_dir / side
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    proc, url = _start(backend, flags, work)
    try:
        warm = 0.0 if n else 4.0  # a trickle's few requests land inside the recorded window
        load = _load(url, backend, clients, n or 10_000, warm + seconds + 1)
        time.sleep(warm)  # the load reaches its steady state before the first sample
        end, files = time.monotonic() + seconds, 0
        while time.monotonic() < end or files < 2:
            t0 = time.monotonic()
            try:
                body = http.get(url + "/metrics", timeout_s=15, max_bytes=16 * 2**20).body.decode()
                ms = int(time.time() * 1000)
                if backend == "vllm":
                    (out / f"{ms}.txt.gz").write_bytes(gzip.compress(_keep(body).encode(), mtime=0))
                else:
                    (out / f"{ms}.txt.gz").write_bytes(gzip.compress(body.encode(), mtime=0))
                    slots = http.get(url + "/slots", timeout_s=15, max_bytes=2**20).body.decode()
                    (out / f"{ms}.slots.json").write_text(slots)
                files += 1
            except Exception as exc:  # noqa: BLE001 (a late scrape is part of what is recorded: note it, go on)
                print(f"  {side}: scrape failed: {exc}", flush=True)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        stdout, _ = load.communicate(timeout=600)
        client = json.loads(stdout.strip().splitlines()[-1])
    finally:
        proc.stop(grace_s=10)
    return {"flags": flags, "clients": clients, "samples": files, "client": client}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seconds", type=float, default=20.0, help="recorded seconds per side")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tuner-verdict-") as tmp:
        for name in args.cases.split(","):
            backend, before, after, c0, c1, n, expected = CASES[name]
            case_dir = OUT / name
            print(f"== {name}: {backend} {before} -> {after}, clients {c0} -> {c1}", flush=True)
            sides = {
                side: _side(case_dir, side, backend, flags, clients, n, args.seconds, Path(tmp))
                for side, flags, clients in (("before", before, c0), ("after", after, c1))
            }
            meta = {
                "backend": backend,
                "expected": expected,
                "seconds": args.seconds,
                **sides,
                "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
                "command": f"scripts/record_verdict_fixtures.py --cases {name} --seconds {args.seconds:g}",
            }
            (case_dir / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
            print(
                f"   before: {sides['before']['client']['ok']} ok, after: {sides['after']['client']['ok']} ok",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
