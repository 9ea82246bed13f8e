"""Record the verdict corpus: tests/fixtures/verdict_corpus/<id>/{before,after}/ and case.json.

Each recording (tests/fixtures/verdict_corpus/PLAN.md lists them) is a before side and an after side. Each side
starts a real server (vLLM CPU build on the tiny model, or llama-server on the tiny GGUF) with that side's flags,
drives it with vLLM's own benchmark client (``vllm.benchmarks.serve``, open-loop Poisson arrivals at the side's
rate, streaming, so the client times every request's first token) and saves the server's /metrics every second as
``<unix_ms>.txt.gz`` (vLLM: cut to the families the verdict reads; llama-server: whole, with ``<unix_ms>.slots.json``).

The recorded window is the time the client was sending: from the last scrape before its first request to the first
scrape after its last request was sent. A saturated side's backlog is still in the server then, as it is in any
window of a live apply; the requests it finishes after the window are not in it.

case.json keeps the truth from the client side, next to the series: per request (in send order) its send time
(unix seconds), time to first token, end-to-end latency, generated tokens and whether it failed, from the client's
own clock. The corpus test reads its truth from those alone.

Usage: .venv/bin/python scripts/record_verdict_corpus.py [--only v01,l03] [--seconds 30]
(needs scripts/setup-real-servers.sh; about 2.5 minutes a vLLM recording, 1.5 a llama-server one, on 2 cores).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.apply.launch import ServerProcess, free_port, llama_server_argv, vllm_argv, vllm_cpu_env
from tuner.collect import http
from tuner.config import Slo
from tuner.signals.workload import Workload
from tuner.tune.bench import BenchClient

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "verdict_corpus"
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
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "process_start_time_seconds",
)


@dataclass(frozen=True)
class Side:
    flags: dict[str, Any]
    rate: float  # requests/s, Poisson
    seconds: float | None = None  # of sending; None: the run's --seconds
    input_len: int = 192
    output_len: int = 48
    prefix_len: int = 0
    prompts: int | None = None  # a fixed count (a trickle) instead of rate x seconds


@dataclass(frozen=True)
class Recording:
    backend: str
    intent: str
    before: Side
    after: Side


def _v(seqs: int, **more: Any) -> dict[str, Any]:
    return {"max-num-seqs": seqs, **more}


# Rates are set from the capacities --calibrate-style runs measured on this machine while other work shared its 2
# cores (192 prompt / 48 generated tokens, the client beside the server): about 2.5 req/s at max-num-seqs 1 and 4.5
# at 2 and 4. "Below capacity" is 1-2 req/s, "saturated" 8-12. Every recording is judged without an SLO and under
# each of SLOS (the corpus test), so the same pair meets several objectives.
SLOS = {
    "tight": {"ttft_p99": 0.5, "e2e_p99": 2.0},
    "mid": {"ttft_p99": 1.5, "e2e_p99": 5.0},
    "loose": {"ttft_p99": 5.0, "e2e_p99": 15.0},
}
RECORDINGS: dict[str, Recording] = {
    "v01": Recording(
        "vllm",
        "max-num-seqs 16 -> 2 at a rate between their capacities: a queue appears",
        Side(_v(16), 4.0),
        Side(_v(2), 4.0),
    ),
    "v02": Recording("vllm", "max-num-seqs 2 -> 16 at that rate: the queue goes", Side(_v(2), 4.0), Side(_v(16), 4.0)),
    "v04": Recording("vllm", "max-num-seqs 8 restarted, below its capacity", Side(_v(8), 2.0), Side(_v(8), 2.0)),
    "v05": Recording("vllm", "max-num-seqs 8 restarted, above its capacity", Side(_v(8), 10.0), Side(_v(8), 10.0)),
    "v06": Recording("vllm", "the same flags, the load doubled below capacity", Side(_v(16), 1.0), Side(_v(16), 2.0)),
    "v07": Recording("vllm", "the same flags, the load halved", Side(_v(16), 2.0), Side(_v(16), 1.0)),
    "v08": Recording("vllm", "a trickle", Side(_v(8), 1.0, prompts=4), Side(_v(16), 1.0, prompts=4)),
    "v09": Recording("vllm", "max-num-seqs 4 -> 16, saturated on both sides", Side(_v(4), 12.0), Side(_v(16), 12.0)),
    "v10": Recording("vllm", "max-num-seqs 16 -> 4, saturated on both sides", Side(_v(16), 12.0), Side(_v(4), 12.0)),
    "v11": Recording("vllm", "max-num-seqs 16 -> 1 under a moderate load", Side(_v(16), 3.0), Side(_v(1), 3.0)),
    "v12": Recording("vllm", "max-num-seqs 1 -> 16 under that load", Side(_v(1), 3.0), Side(_v(16), 3.0)),
    "v13": Recording(
        "vllm",
        "max-num-batched-tokens 2048 -> 64 (prefill in small chunks), below capacity",
        Side(_v(8, **{"max-num-batched-tokens": 2048}), 1.5, input_len=640),
        Side(_v(8, **{"max-num-batched-tokens": 64}), 1.5, input_len=640),
    ),
    "v14": Recording(
        "vllm",
        "max-model-len 1024 -> 2048",
        Side(_v(8, **{"max-model-len": 1024}), 2.0),
        Side(_v(8, **{"max-model-len": 2048}), 2.0),
    ),
    "v15": Recording(
        "vllm",
        "prefix caching off -> on, prompts sharing a long prefix",
        Side(_v(8, **{"enable-prefix-caching": False}), 2.0, input_len=640, prefix_len=512),
        Side(_v(8, **{"enable-prefix-caching": True}), 2.0, input_len=640, prefix_len=512),
    ),
    "v16": Recording("vllm", "the same flags, the load tripled into saturation", Side(_v(4), 1.5), Side(_v(4), 4.5)),
    "v17": Recording("vllm", "max-num-seqs 8 -> 2 while the load halves", Side(_v(8), 3.0), Side(_v(2), 1.5)),
    "v18": Recording(
        "vllm",
        "max-num-seqs 2 restarted, saturated (a tight SLO breached on both sides)",
        Side(_v(2), 8.0),
        Side(_v(2), 8.0),
    ),
    "v19": Recording(
        "vllm", "max-num-seqs 2 -> 4 under a heavy load, saturated on both sides", Side(_v(2), 10.0), Side(_v(4), 10.0)
    ),
    # planned as kv-cache-dtype auto -> fp8; on this host's CPU (no AVX-512, no AMX) vLLM refuses an fp8 KV cache at
    # start ("FP8 KV cache on CPU requires x86 with AVX-512 or AMX"), so the KV cache is cut instead
    "v22": Recording(
        "vllm",
        "the KV cache cut from 1 GiB to 3 MB (preemptions)",
        Side(_v(8, **{"kv-cache-memory-bytes": 2**30}), 2.0),
        Side(_v(8, **{"kv-cache-memory-bytes": 3_000_000}), 2.0),
    ),
    "v23": Recording("vllm", "max-num-seqs 16 -> 8 under a light load", Side(_v(16), 1.0), Side(_v(8), 1.0)),
    "l01": Recording(
        "llamacpp",
        "--parallel 1 -> 4 under concurrent load",
        Side({"--parallel": 1, "-c": 2048}, 6.0),
        Side({"--parallel": 4, "-c": 2048}, 6.0),
    ),
    "l02": Recording(
        "llamacpp",
        "--parallel 4 -> 1 under concurrent load",
        Side({"--parallel": 4, "-c": 2048}, 6.0),
        Side({"--parallel": 1, "-c": 2048}, 6.0),
    ),
    "l03": Recording(
        "llamacpp",
        "--parallel 2 restarted",
        Side({"--parallel": 2, "-c": 2048}, 3.0),
        Side({"--parallel": 2, "-c": 2048}, 3.0),
    ),
    # l04, l07 (and l08) were first recorded with 4 slots of 512 tokens (l04) and 640-token prompts (l07): the tiny GGUF's
    # byte-level vocabulary makes a prompt several times longer in its tokens than in the benchmark tokenizer's, so
    # they overflowed their slots and almost nothing finished (7 of 60, 5 of 80). Recorded again with prompts that fit.
    "l04": Recording(
        "llamacpp",
        "the same flags, the load doubled",
        Side({"--parallel": 2, "-c": 4096}, 1.0),
        Side({"--parallel": 2, "-c": 4096}, 2.0),
    ),
    "l05": Recording(
        "llamacpp",
        "a trickle",
        Side({"--parallel": 2, "-c": 2048}, 0.5, prompts=3),
        Side({"--parallel": 4, "-c": 2048}, 0.5, prompts=3),
    ),
    "l06": Recording(
        "llamacpp",
        "-c 2048 -> 4096",
        Side({"--parallel": 2, "-c": 2048}, 2.0),
        Side({"--parallel": 2, "-c": 4096}, 2.0),
    ),
    "l07": Recording(
        "llamacpp",
        "-b/-ub 512 -> 32 (prefill in small batches)",
        Side({"--parallel": 1, "-c": 4096, "-b": 512, "-ub": 512}, 1.0, input_len=384),
        Side({"--parallel": 1, "-c": 4096, "-b": 32, "-ub": 32}, 1.0, input_len=384),
    ),
    # l08 too (slots of 512 with -c 2048 at --parallel 4: 7 of 40 finished): recorded again with -c 8192
    "l08": Recording(
        "llamacpp",
        "--parallel 2 -> 4 under a light load",
        Side({"--parallel": 2, "-c": 8192}, 1.0),
        Side({"--parallel": 4, "-c": 8192}, 1.0),
    ),
}


def _keep(text: str) -> str:
    out = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else line.split("{")[0].split(" ")[0]
        base = name
        for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        if name in KEEP or base in KEEP or base + "_total" in KEEP:
            out.append(line)
    return "\n".join(out) + "\n"


def _start(backend: str, flags: dict[str, Any], work: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    if backend == "vllm":
        merged = {"enforce-eager": True, "max-model-len": 1024, **flags}
        argv = vllm_argv(str(VLLM_PYTHON), str(TINY_MODEL), port=port, served_model_name="tiny-llama", flags=merged)
        # the KV space variable overrides --kv-cache-memory-bytes: left out where a side sets that flag
        env = vllm_cpu_env(
            tempfile.mkdtemp(prefix="vllm-cache-", dir=work),
            kvcache_space_gib=None if "kv-cache-memory-bytes" in flags else 1,
        )
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


class _Scraper(threading.Thread):
    """Saves the server's /metrics (and llama-server's /slots) every second until stopped."""

    def __init__(self, url: str, backend: str, out: Path) -> None:
        super().__init__(daemon=True)
        self.url, self.backend, self.out = url, backend, out
        self.stop = threading.Event()
        self.saved: list[int] = []
        self.failed = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                body = http.get(self.url + "/metrics", timeout_s=15, max_bytes=16 * 2**20).body.decode()
                ms = int(time.time() * 1000)
                text = _keep(body) if self.backend == "vllm" else body
                (self.out / f"{ms}.txt.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
                if self.backend != "vllm":
                    slots = http.get(self.url + "/slots", timeout_s=15, max_bytes=2**20).body.decode()
                    (self.out / f"{ms}.slots.json").write_text(slots)
                self.saved.append(ms)
            except Exception as exc:  # noqa: BLE001 (a late or failed scrape is part of what is recorded)
                self.failed += 1
                print(f"    scrape failed: {exc}", flush=True)
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))


def _trim(out: Path, saved: list[int], first_send: float, last_send: float) -> int:
    """Keep the scrapes from the last one before the first request to the first one after the last was sent."""
    lo = max([ms for ms in saved if ms <= first_send * 1000] or [saved[0]])
    hi = min([ms for ms in saved if ms >= last_send * 1000] or [saved[-1]])
    kept = 0
    for ms in saved:
        if lo <= ms <= hi:
            kept += 1
            continue
        for suffix in (".txt.gz", ".slots.json"):
            (out / f"{ms}{suffix}").unlink(missing_ok=True)
    return kept


def _side(
    client: BenchClient, case_dir: Path, name: str, backend: str, side: Side, seconds: float, work: Path
) -> dict[str, Any]:
    out = case_dir / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    proc, url = _start(backend, side.flags, work)
    try:
        prompts = side.prompts or max(4, round(side.rate * (side.seconds or seconds)))
        workload = Workload(input_len=side.input_len, output_len=side.output_len, prefix_len=side.prefix_len)
        # a warm-up outside the window: the first requests of a fresh server compile and allocate
        client.run(
            workload,
            url=url,
            model="tiny-llama" if backend == "vllm" else "tiny",
            tokenizer=str(TINY_MODEL),
            rate=side.rate,
            prompts=4,
            slo=Slo(),
            warmups=0,
        )
        scraper = _Scraper(url, backend, out)
        scraper.start()
        while not scraper.saved:
            time.sleep(0.05)
        offset = time.time() - time.perf_counter()  # the client's start times are CLOCK_MONOTONIC, as ours
        run = client.run(
            workload,
            url=url,
            model="tiny-llama" if backend == "vllm" else "tiny",
            tokenizer=str(TINY_MODEL),
            rate=side.rate,
            prompts=prompts,
            slo=Slo(),
            warmups=0,
        )
        time.sleep(1.2)  # one more scrape after the last answer, so the trim can find its end
        scraper.stop.set()
        scraper.join()
    finally:
        proc.stop(grace_s=10)
    result = json.loads(Path(run.result_file).read_text())
    starts = [s + offset for s in result["start_times"]]
    order = sorted(range(len(starts)), key=lambda i: starts[i])
    errors = result.get("errors") or [""] * len(starts)
    requests = [
        {
            "sent": round(starts[i], 4),
            "ttft": round(result["ttfts"][i] or 0.0, 5),
            "e2e": round(result["latencies"][i] or 0.0, 5),
            "tokens": int(result["output_lens"][i] or 0),
            "failed": bool(errors[i]),
        }
        for i in order
    ]
    kept = _trim(out, scraper.saved, requests[0]["sent"], requests[-1]["sent"])
    return {
        "flags": side.flags,
        "rate": side.rate,
        "input_len": side.input_len,
        "output_len": side.output_len,
        "prefix_len": side.prefix_len,
        "prompts": prompts,
        "scrapes": kept,
        "scrapes_failed": scraper.failed,
        "client": {
            "completed": result["completed"],
            "failed": result.get("failed", 0),
            "duration_s": round(result["duration"], 3),
            "requests": requests,
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(RECORDINGS), help="comma-separated recording ids")
    ap.add_argument("--seconds", type=float, default=40.0, help="seconds of sending per side")
    args = ap.parse_args()
    ids = [i for i in args.only.split(",") if i]
    unknown = [i for i in ids if i not in RECORDINGS]
    if unknown:
        ap.error(f"unknown recording id(s): {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="tuner-corpus-") as tmp, BenchClient(str(VLLM_PYTHON), Path(tmp)) as client:
        for rid in ids:
            rec = RECORDINGS[rid]
            case_dir = OUT / rid
            print(f"== {rid}: {rec.intent}", flush=True)
            t0 = time.monotonic()
            sides = {}
            for name, side in (("before", rec.before), ("after", rec.after)):
                sides[name] = _side(client, case_dir, name, rec.backend, side, args.seconds, Path(tmp))
                c = sides[name]["client"]
                print(
                    f"   {name}: {c['completed']}/{sides[name]['prompts']} completed in {c['duration_s']} s, "
                    f"{sides[name]['scrapes']} scrapes kept",
                    flush=True,
                )
            meta = {
                "id": rid,
                "backend": rec.backend,
                "intent": rec.intent,
                "slos": SLOS if rec.backend == "vllm" else {},
                **sides,
                "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "command": f"scripts/record_verdict_corpus.py --only {rid} --seconds {args.seconds:g}",
            }
            (case_dir / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
            print(f"   {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
