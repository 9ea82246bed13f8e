#!/usr/bin/env python3
"""Record real /metrics, /slots, /health, /props and /version bodies from real servers into tests/fixtures/.

Usage (with the dev venv, after `eval "$(bash scripts/setup-real-servers.sh | grep ^export)"`):

    .venv/bin/python scripts/record_fixtures.py [--out tests/fixtures] [--only vllm|llama-server]

This is where tuner's unit-test fixtures come from: every file is a body a real server sent, unedited.
Servers, flags and load come from tests/integration/realservers.py (the same tiny setups the integration
tier uses) and tuner.lab.load; tests/fixtures/README.md is rewritten to say what produced each file.
Takes ~3 min (three vLLM starts). Leaves no server running.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]  # run from a checkout, no install needed

import realservers  # noqa: E402
from realservers import RealServer  # noqa: E402

from tuner.apply.launch import free_port  # noqa: E402
from tuner.lab.load import LoadResult, run_load  # noqa: E402

# Load shapes. vLLM: 24 concurrent > --max-num-seqs 8, so requests wait. llama-server: 8 concurrent on
# --parallel 2 slots, so requests are deferred; 100 + 380 tokens fits a 512-token slot (-c 1024 / 2).
VLLM_LOAD = dict(n_requests=48, concurrency=24, prompt_tokens_approx=200, max_tokens=256, timeout_s=300)
VLLM_SMALL_LOAD = dict(n_requests=16, concurrency=8, prompt_tokens_approx=200, max_tokens=64, timeout_s=120)
# 3 MB of bf16 KV holds 45 blocks of 128 tokens; 8 running sequences of up to 900 tokens need 64, and 16
# concurrent clients keep the queue full for the whole run: sustained preemptions at near-full KV.
VLLM_KV_FLAGS = {"kv-cache-memory-bytes": 3_000_000}
VLLM_KV_LOAD = dict(n_requests=48, concurrency=16, prompt_tokens_approx=400, max_tokens=500, timeout_s=300)
LLAMA_LOAD = dict(n_requests=32, concurrency=8, prompt_tokens_approx=100, max_tokens=380, timeout_s=300)


def log(msg: str) -> None:
    print(f"[record] {msg}", file=sys.stderr, flush=True)


def get(url: str, timeout: float = 10) -> requests.Response:
    return requests.get(url, timeout=timeout, proxies={"http": "", "https": ""})


def sample(exposition: str, name: str) -> float:
    """Sum of every sample of one metric name in a text exposition (0 when absent)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)", re.M)
    return sum(float(v) for v in pattern.findall(exposition))


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.written: list[Path] = []
        self.notes: dict[str, list[str]] = {}  # fixture dir -> README lines

    def write(self, subdir: str, name: str, body: str | bytes, note: str) -> None:
        path = self.out / subdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
        self.written.append(path)
        self.notes.setdefault(subdir, []).append(f"- `{name}`: {note}")
        log(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({path.stat().st_size} B)")


def load_in_background(url: str, **kwargs: object) -> tuple[threading.Thread, list[LoadResult]]:
    """Run run_load in a thread so the caller can scrape while requests are in flight."""
    result: list[LoadResult] = []
    thread = threading.Thread(target=lambda: result.append(run_load(url, **kwargs)), daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread, result


def capture_during(
    url: str,
    thread: threading.Thread,
    good: Callable[[str], bool],
    score: Callable[[str], float],
    extra: Callable[[], bytes] | None = None,
) -> tuple[str, bytes | None, bool]:
    """Poll /metrics while the load thread runs: first body that is good(), else the best-scoring one."""
    best: tuple[float, str, bytes | None] = (-1.0, "", None)
    while thread.is_alive():
        body = get(url + "/metrics").text
        side = extra() if extra else None
        if good(body):
            return body, side, True
        if score(body) > best[0]:
            best = (score(body), body, side)
        time.sleep(0.1)
    return best[1], best[2], False


def wait_idle(url: str, names: tuple[str, ...], timeout: float = 60) -> str:
    """The /metrics body once every named gauge reads 0 (in-flight work finished)."""
    deadline = time.monotonic() + timeout
    while True:
        body = get(url + "/metrics").text
        if all(sample(body, n) == 0 for n in names) or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def shape(load: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in load.items())


def describe(result: LoadResult) -> str:
    p50 = result.quantile(0.5)
    return (
        f"{result.ok}/{result.requested} ok, {result.failed} failed, {result.completion_tokens} tokens "
        f"generated, p50 {p50:.2f} s, wall {result.wall_s:.1f} s"
        if p50 is not None
        else f"{result.ok}/{result.requested} ok, errors: {result.errors[:2]}"
    )


def shown_argv(server: RealServer) -> str:
    """argv with machine-specific paths and the random port replaced, for the README."""
    argv = list(server.process.argv)
    argv[0] = Path(argv[0]).name if server.kind == "llama-server" else "python"
    model_flag = "--model" if server.kind == "vllm" else "-m"  # vLLM's argv also has "-m <module>"
    for i, _a in enumerate(argv):
        if i and argv[i - 1] == model_flag:
            argv[i] = "$TUNER_TINY_MODEL" if server.kind == "vllm" else "$TUNER_TINY_GGUF"
        elif i and argv[i - 1] == "--port":
            argv[i] = "PORT"
    return " ".join(argv)


def record_vllm(rec: Recorder, workdir: Path) -> None:
    sub = "vllm-0.32-cpu"
    metric_names = ("vllm:num_requests_running", "vllm:num_requests_waiting")

    # 1. Default tiny server; probe /health while it loads to see what a loading vLLM answers.
    port = free_port()
    seen: list[str] = []
    stop_probe = threading.Event()

    failures: set[str] = set()

    def probe() -> None:
        while not stop_probe.is_set():
            try:
                r = get(f"http://127.0.0.1:{port}/health", timeout=2)
                if r.status_code != 200:
                    seen.append(json.dumps({"status": r.status_code, "body": r.text}))
                return
            except requests.ConnectionError as e:
                failures.add("connection refused" if "refused" in str(e) else "connection error")
            except requests.Timeout:
                failures.add("timeout")
            time.sleep(0.2)

    threading.Thread(target=probe, daemon=True).start()
    t0 = time.monotonic()
    server = realservers.start_vllm(workdir / "vllm-default", port=port)
    stop_probe.set()
    log(f"vLLM healthy in {time.monotonic() - t0:.1f} s")
    try:
        argv = shown_argv(server)
        if seen:
            rec.write(sub, "health_loading.txt", seen[0] + "\n", f"/health while loading. `{argv}`")
        else:
            rec.notes.setdefault(sub, []).append(
                "- no `health_loading.txt`: while loading, vLLM sent no HTTP answer to /health ("
                + (", ".join(sorted(failures)) or "nothing")
                + "); it answers only once ready, with 200."
            )
        rec.write(sub, "version.json", get(server.url + "/version").content, "GET /version")
        rec.write(
            sub,
            "metrics_idle.txt",
            get(server.url + "/metrics").content,
            f"/metrics right after /health turned 200, no request served yet. `{argv}`",
        )
        thread, result = load_in_background(server.url, model=server.model_name, **VLLM_LOAD)
        body, _, ok = capture_during(
            server.url,
            thread,
            good=lambda b: sample(b, metric_names[0]) > 0 and sample(b, metric_names[1]) > 0,
            score=lambda b: sample(b, metric_names[0]) + sample(b, metric_names[1]),
        )
        thread.join()
        if not ok:
            log("warning: never saw running > 0 and waiting > 0 at once; kept the busiest body")
        rec.write(
            sub,
            "metrics_under_load.txt",
            body,
            f"/metrics while run_load({shape(VLLM_LOAD)}) ran (running {sample(body, metric_names[0]):g}, waiting "
            f"{sample(body, metric_names[1]):g}). Load: {describe(result[0])}. Same server.",
        )
        rec.write(
            sub,
            "metrics_after_load.txt",
            wait_idle(server.url, metric_names),
            "/metrics after that load finished (running and waiting back to 0). Same server.",
        )
    finally:
        log(f"vLLM stop exit code {server.stop()}")

    # 2. Prefix caching off: its cache_config_info label and absent prefix-cache hits.
    server = realservers.start_vllm(workdir / "vllm-noprefix", flags={"enable-prefix-caching": False})
    try:
        result = run_load(server.url, model=server.model_name, **VLLM_SMALL_LOAD)  # type: ignore[arg-type]
        rec.write(
            sub,
            "metrics_prefix_caching_off.txt",
            wait_idle(server.url, metric_names),
            f"/metrics after run_load({shape(VLLM_SMALL_LOAD)}) ({describe(result)}). `{shown_argv(server)}`",
        )
    finally:
        server.stop()

    # 3. KV pressure: a tiny KV space and distinct prompts force preemptions and near-full KV usage.
    server = realservers.start_vllm(workdir / "vllm-kv", flags=VLLM_KV_FLAGS)
    try:
        thread, result = load_in_background(server.url, model=server.model_name, distinct_prompts=True, **VLLM_KV_LOAD)
        body, _, ok = capture_during(
            server.url,
            thread,
            good=lambda b: (
                sample(b, "vllm:num_preemptions_total") > 0 and sample(b, "vllm:kv_cache_usage_perc") >= 0.85
            ),
            score=lambda b: (
                sample(b, "vllm:kv_cache_usage_perc") + (1.0 if sample(b, "vllm:num_preemptions_total") > 0 else 0.0)
            ),
        )
        thread.join()
        if not ok:
            log("warning: never saw preemptions > 0 with KV usage >= 0.85; kept the fullest body")
        rec.write(
            sub,
            "metrics_kv_pressure.txt",
            body,
            f"/metrics under run_load({shape(VLLM_KV_LOAD)}), distinct prompts (KV usage "
            f"{sample(body, 'vllm:kv_cache_usage_perc'):.2f}, preemptions "
            f"{sample(body, 'vllm:num_preemptions_total'):g}). Load: {describe(result[0])}. "
            f"VLLM_CPU_KVCACHE_SPACE unset (it would override the flag). `{shown_argv(server)}`",
        )
    finally:
        server.stop()


def record_llama(rec: Recorder, workdir: Path) -> None:
    sub = "llama-server"
    gauges = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
    server = realservers.start_llama_server(workdir / "llama")
    try:
        argv = shown_argv(server)
        url = server.url
        rec.write(sub, "health_ok.json", get(url + "/health").content, "GET /health once loaded")
        rec.write(sub, "props.json", get(url + "/props").content, f"GET /props. `{argv}`")
        rec.write(
            sub,
            "metrics_idle.txt",
            get(url + "/metrics").content,
            f"/metrics right after start, no request served yet. `{argv}`",
        )
        rec.write(sub, "slots_idle.json", get(url + "/slots").content, "/slots at the same moment")
        thread, result = load_in_background(url, model=None, **LLAMA_LOAD)
        body, slots, ok = capture_during(
            url,
            thread,
            good=lambda b: sample(b, gauges[0]) > 0 and sample(b, gauges[1]) > 0,
            score=lambda b: sample(b, gauges[0]) + sample(b, gauges[1]),
            extra=lambda: get(url + "/slots").content,
        )
        thread.join()
        if not ok:
            log("warning: never saw processing > 0 and deferred > 0 at once; kept the busiest body")
        rec.write(
            sub,
            "metrics_mid_load.txt",
            body,
            f"/metrics while run_load({shape(LLAMA_LOAD)}) ran on /v1/completions (processing "
            f"{sample(body, gauges[0]):g}, deferred {sample(body, gauges[1]):g}). "
            f"Load: {describe(result[0])}. Same server.",
        )
        rec.write(sub, "slots_mid_load.json", slots or b"", "/slots fetched right after metrics_mid_load.txt")
        rec.write(
            sub, "metrics_after_load.txt", wait_idle(url, gauges), "/metrics after that load finished. Same server."
        )
        rec.write(sub, "slots_after_load.json", get(url + "/slots").content, "/slots at the same moment")
    finally:
        log(f"llama-server stop exit code {server.stop()}")

    server = realservers.start_llama_server(workdir / "llama-nometrics", flags={"--metrics": None})
    try:
        r = get(server.url + "/metrics")
        rec.write(
            sub,
            "no_metrics_501.txt",
            json.dumps({"status": r.status_code, "body": r.text}) + "\n",
            f"status and body of /metrics on a server started without --metrics. `{shown_argv(server)}`",
        )
    finally:
        server.stop()


def versions() -> dict[str, str]:
    """What produced the files: engine versions as the installed parts report them."""
    out = {}
    vpy = realservers.VLLM_PYTHON.path()
    if vpy:
        meta = vpy.parent.parent / "lib"
        dists = sorted(p.name for p in meta.glob("python3*/site-packages/vllm_cpu-*.dist-info"))
        out["vllm"] = dists[0].removesuffix(".dist-info").replace("_", "-") if dists else "unknown"
    llama = realservers.LLAMA_SERVER.path()
    if llama and (llama.parent.parent / "SOURCE").exists():
        out["llama-server"] = "built from " + (llama.parent.parent / "SOURCE").read_text().strip()
    return out


README_BEGIN = "<!-- BEGIN generated by scripts/record_fixtures.py -->"
README_END = "<!-- END generated by scripts/record_fixtures.py -->"


def machine() -> str:
    try:
        os_name = (
            dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
            .get("PRETTY_NAME", "Linux")
            .strip('"')
        )
    except OSError:
        os_name = sys.platform
    return f"{os.cpu_count()}-core CPU-only {os_name} machine"


def write_readme(rec: Recorder, extra: dict[str, str]) -> None:
    """Rewrite the generated part of tests/fixtures/README.md; text outside the markers is kept."""
    lines = [
        README_BEGIN,
        "## Recorded by `scripts/record_fixtures.py`",
        "",
        "Every file below is a body a real server sent, unedited. Re-record them (about 3 minutes; needs",
        "the real servers from `scripts/setup-real-servers.sh`):",
        "",
        "```sh",
        'eval "$(bash scripts/setup-real-servers.sh | grep ^export)"',
        ".venv/bin/python scripts/record_fixtures.py            # or --only vllm / --only llama-server",
        "```",
        "",
        f"Last recorded {dt.date.today().isoformat()} on a {machine()}.",
        "Models: `scripts/make_tiny_hf_model.py` (Llama, hidden 128, 2 layers, 4k BPE vocab, served as",
        "`tiny-llama`) and `scripts/make_tiny_gguf.py` (llama arch, 356-token byte+ASCII vocab); random weights.",
        "vLLM runs with `VLLM_CPU_KVCACHE_SPACE=1` unless noted; load comes from `tuner.lab.load.run_load`",
        "(no `seed`, `ignore_eos`, greedy). Server flags are those of `tests/integration/realservers.py`.",
        "",
    ]
    titles = {"vllm-0.32-cpu": "vLLM 0.32 (CPU build)", "llama-server": "llama.cpp llama-server"}
    for subdir, notes in rec.notes.items():
        lines += [f"### `{subdir}/`: {titles.get(subdir, subdir)}", ""]
        if extra.get(subdir):
            lines += [f"Version: {extra[subdir]}.", ""]
        lines += notes + [""]
    lines.append(README_END)
    path = rec.out / "README.md"
    old = (
        path.read_text()
        if path.exists()
        else (
            "# Test fixtures\n\nRecorded real bodies that the unit tests replay. Folders not listed below have "
            "their own README.\n\n"
        )
    )
    if README_BEGIN in old and README_END in old:
        head, rest = old.split(README_BEGIN, 1)
        tail = rest.split(README_END, 1)[1]
    else:
        head, tail = old.rstrip("\n") + "\n\n", "\n"
    path.write_text(head + "\n".join(lines) + tail)
    rec.written.append(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    ap.add_argument("--only", choices=["vllm", "llama-server"])
    args = ap.parse_args(argv)
    needs = {
        "vllm": (realservers.VLLM_PYTHON, realservers.TINY_MODEL),
        "llama-server": (realservers.LLAMA_SERVER, realservers.TINY_GGUF),
    }
    chosen = [args.only] if args.only else list(needs)
    missing = [r for k in chosen for r in (p.missing_reason() for p in needs[k]) if r]
    if missing:
        log("cannot record: " + "; ".join(missing))
        return 2
    rec = Recorder(args.out.resolve())
    ver = versions()
    with tempfile.TemporaryDirectory(prefix="tuner-record-") as tmp:
        if "llama-server" in chosen:
            record_llama(rec, Path(tmp))
        if "vllm" in chosen:
            record_vllm(rec, Path(tmp))
    props = rec.out / "llama-server" / "props.json"
    if props.exists():
        build = json.loads(props.read_text()).get("build_info")
        ver["llama-server"] = f"{ver.get('llama-server', '')}, build_info {build!r}".lstrip(", ")
    vj = rec.out / "vllm-0.32-cpu" / "version.json"
    extra = {
        "vllm-0.32-cpu": ver.get("vllm", "") + (f", /version {vj.read_text().strip()}" if vj.exists() else ""),
        "llama-server": ver.get("llama-server", ""),
    }
    if args.only is None:
        write_readme(rec, extra)
    else:
        log("--only: README.md not rewritten (it describes a full recording)")
    for path in rec.written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
