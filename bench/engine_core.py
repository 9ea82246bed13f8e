"""A vLLM CPU server under a steady closed-loop load, with its engine core as vLLM starts it and yielding
(tuner.apply.managed.yield_engine_core): what it serves, and how many of the clients' requests reach the engine.

Each run starts a fresh server as the demo's production (tiny model, --enforce-eager --max-num-seqs 4
--max-model-len 1024, a 1 GiB KV cache) through tuner's own managed path (start_server, wait_healthy), then 16
clients (tuner.lab.load, 200-token prompts, 512 generated tokens, one request each in flight) for --seconds. Every
second the script reads how many requests the clients have in flight and the server's running + waiting gauges.
Runs alternate between the two modes (A B A B ...), so that what else the host does falls on both.

Usage: .venv/bin/python bench/engine_core.py [--rounds 3] [--seconds 60] [--out bench/results]
(needs scripts/setup-real-servers.sh; ~3 minutes a round on 2 cores, 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.apply import managed as mg  # noqa: E402
from tuner.apply.launch import free_port, vllm_argv, vllm_cpu_env  # noqa: E402
from tuner.collect.scrape import scrape_url  # noqa: E402
from tuner.errors import TunerError  # noqa: E402
from tuner.lab import load  # noqa: E402

CACHE = Path(os.environ.get("TUNER_CACHE") or Path.home() / ".cache" / "tuner")
CLIENTS = 16


def gauges(url: str) -> float | None:
    """Requests running and waiting on the server, read as tuner reads them (one scrape, as Servers.in_flight does);
    None when /metrics did not answer within 5 s."""
    try:
        snap = scrape_url("vllm", url, target="bench", timeout_s=5, max_bytes=2**22, health=False)
    except TunerError:
        return None
    return sum((e.requests_running or 0.0) + (e.requests_waiting or 0.0) for e in snap.engines)


def one_run(yielded: bool, seconds: float, work: Path) -> dict[str, float | str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = vllm_argv(
        str(Path(os.environ.get("TUNER_VLLM_PYTHON") or CACHE / "vllm-venv" / "bin" / "python")),
        str(Path(os.environ.get("TUNER_TINY_MODEL") or CACHE / "models" / "tiny-llama")),
        port=port,
        served_model_name="tiny-llama",
        flags={"enforce-eager": True, "max-model-len": 1024, "max-num-seqs": 4},
    )
    env = vllm_cpu_env(str(work / "cache"), kvcache_space_gib=1)
    server = mg.start_server(argv, env, work / f"vllm-{port}.log")
    in_flight = [0]
    lock = threading.Lock()
    post = requests.Session.post

    def counted(self: requests.Session, *a: object, **k: object) -> requests.Response:
        with lock:
            in_flight[0] += 1
        try:
            return post(self, *a, **k)  # type: ignore[arg-type]
        finally:
            with lock:
                in_flight[0] -= 1

    try:
        mg.wait_healthy(server, url, 600)
        level = mg.yield_engine_core(server, 10) if yielded else None
        requests.Session.post = counted  # type: ignore[method-assign]
        stop = threading.Event()
        result: list[load.LoadResult] = []
        clients = threading.Thread(
            target=lambda: result.append(
                load.run_load(
                    url,
                    model="tiny-llama",
                    n_requests=load.MAX_REQUESTS,
                    concurrency=CLIENTS,
                    prompt_tokens_approx=200,
                    max_tokens=512,
                    send_for_s=seconds + 10,
                    stop=stop,
                    timeout_s=seconds + 300,
                )
            )
        )
        clients.start()
        time.sleep(10)  # every client has sent its first request
        at_client, at_engine, silent = [], [], 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.monotonic()
            g = gauges(url)
            at_client.append(in_flight[0])
            if g is None:
                silent += 1
            else:
                at_engine.append(g)
            time.sleep(max(0.0, 1 - (time.monotonic() - t)))
        stop.set()
        clients.join()
        r = result[0]
        return {
            "mode": f"yielded (nice {level})" if yielded else "as vLLM starts it",
            "served": r.ok / r.wall_s,
            "failed": r.failed,
            "client": statistics.fmean(at_client),
            "engine": statistics.fmean(at_engine) if at_engine else float("nan"),
            "silent": silent,
            "samples": len(at_client),
        }
    finally:
        requests.Session.post = post  # type: ignore[method-assign]
        mg.stop_server(server, grace_s=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tuner-engine-core-"))
    started = time.strftime("%Y-%m-%d %H:%M")
    load_before = os.getloadavg()
    runs = []
    for rnd in range(args.rounds):
        for yielded in (False, True):
            run = one_run(yielded, args.seconds, work)
            runs.append(run)
            print(f"round {rnd + 1} {run}", flush=True)
    rows = [
        f"| {i + 1} | {r['mode']} | {r['served']:.2f} | {r['failed']} | {r['client']:.1f} | {r['engine']:.1f} | "
        f"{r['silent']} of {r['samples']} |"
        for i, r in enumerate(runs)
    ]
    by_mode: dict[str, list[float]] = {}
    for r in runs:
        by_mode.setdefault("yielded" if str(r["mode"]).startswith("yielded") else "as started", []).append(
            float(r["served"])
        )
    summary = "; ".join(
        f"{mode}: {statistics.fmean(v):.2f} req/s ({min(v):.2f}-{max(v):.2f}, {len(v)} runs)"
        for mode, v in by_mode.items()
    )
    text = (
        f"## A vLLM CPU engine core as started and yielding ({started} UTC, `bench/engine_core.py`)\n\n"
        f"{CLIENTS} closed-loop clients (200-token prompts, 512 tokens out) against a fresh vLLM 0.32 CPU server each "
        f"run (tiny model, --max-num-seqs 4, 1 GiB KV cache), {args.seconds:g} s measured after 10 s, modes "
        f"alternating. Load average before: {load_before[0]:.2f}.\n\n"
        "| run | engine core | served req/s | failed | clients' requests in flight | at the engine (running + "
        "waiting) | /metrics silent (5 s) |\n|---|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
        f"Served: {summary}.\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y-%m-%d-%H%M')}-engine-core.md"
    path.write_text(text)
    print(text)
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
