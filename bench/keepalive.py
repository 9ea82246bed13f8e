"""Requests lost to kept-alive connections on a loaded vLLM CPU, and with a fresh connection per request.

Starts vLLM (tiny model, --kv-cache-memory-bytes 3000000: it preempts, as the KV-saturation test makes it) and
sends rounds of 32 completions (about 300-token prompts, 600 generated tokens) from 8 client threads, each with one
requests.Session, as tuner.lab.load did before it sent ``Connection: close``. Per request it records whether the
connection was reused, the gap since that session's previous answer, and the outcome; the server's access log says
which requests it ever saw.

Usage: .venv/bin/python bench/keepalive.py [--rounds 3] [--keepalive SECONDS] [--fresh]
(needs scripts/setup-real-servers.sh; ~1 minute a round on 2 cores, 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.apply.launch import ServerProcess, free_port, vllm_argv, vllm_cpu_env  # noqa: E402
from tuner.lab.load import make_prompt  # noqa: E402

CACHE = Path(os.environ.get("TUNER_CACHE") or Path.home() / ".cache" / "tuner")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keepalive", type=int, help="VLLM_HTTP_TIMEOUT_KEEP_ALIVE for the server (vLLM's default: 5)")
    ap.add_argument("--fresh", action="store_true", help="Connection: close on every request (tuner.lab.load now)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-keepalive-"))
    port = free_port()
    argv = vllm_argv(
        str(Path(os.environ.get("TUNER_VLLM_PYTHON") or CACHE / "vllm-venv" / "bin" / "python")),
        str(Path(os.environ.get("TUNER_TINY_MODEL") or CACHE / "models" / "tiny-llama")),
        port=port,
        served_model_name="tiny-llama",
        flags={"enforce-eager": True, "max-model-len": 1024, "max-num-seqs": 8, "kv-cache-memory-bytes": 3_000_000},
    )
    env = vllm_cpu_env(str(work / "cache"), kvcache_space_gib=None)
    if args.keepalive is not None:
        env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] = str(args.keepalive)
    log = work / "vllm.log"
    server = ServerProcess.start(argv, env, log, cwd=work)
    url = f"http://127.0.0.1:{port}"
    records: list[dict] = []
    lock = threading.Lock()
    try:
        server.wait_healthy(url, 300)
        for rnd in range(args.rounds):
            nxt = [0]

            def worker(w: int, nxt: list[int] = nxt, rnd: int = rnd) -> None:  # this round's (joined within it)
                s = requests.Session()
                s.trust_env = False
                if args.fresh:
                    s.headers["Connection"] = "close"
                last_end, n = None, 0
                while True:
                    with lock:
                        if nxt[0] >= 32:
                            return
                        i = nxt[0]
                        nxt[0] += 1
                    body = {
                        "model": "tiny-llama",
                        "prompt": make_prompt(i, 230, distinct=True),
                        "max_tokens": 600,
                        "ignore_eos": True,
                        "temperature": 0.0,
                    }
                    t0 = time.monotonic()
                    try:
                        out = f"HTTP {s.post(url + '/v1/completions', json=body, timeout=300).status_code}"
                    except requests.RequestException as e:
                        out = f"{type(e).__name__}: {e}"[:120]
                    t1 = time.monotonic()
                    with lock:
                        records.append(
                            {
                                "round": rnd,
                                "reused": n > 0 and not args.fresh,
                                "gap_s": None if last_end is None else t0 - last_end,
                                "dur_s": t1 - t0,
                                "out": out,
                            }
                        )
                    last_end, n = t1, n + 1

            threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            lost = [r for r in records if r["round"] == rnd and r["out"] != "HTTP 200"]
            print(f"round {rnd}: 32 sent, {len(lost)} failed", *(f"\n  {r}" for r in lost), flush=True)
    finally:
        server.stop(grace_s=10)
    seen = sum(1 for line in log.read_text(errors="replace").splitlines() if "POST /v1/completions" in line)
    failed = sum(r["out"] != "HTTP 200" for r in records)
    print(
        f"keepalive={args.keepalive or 'default (5)'} fresh={args.fresh}: {len(records)} sent, {failed} failed, "
        f"{seen} logged by the server"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
