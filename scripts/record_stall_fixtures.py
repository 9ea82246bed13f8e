#!/usr/bin/env python3
"""Record what a stalled real server answers, into tests/fixtures/stall/, and the EngineStalled scenarios from it.

Usage (with the dev venv, after `eval "$(bash scripts/setup-real-servers.sh | grep ^export)"`):

    .venv/bin/python scripts/record_stall_fixtures.py [--out tests/fixtures/stall] [--only vllm|llama-server]
        [--scenarios tests/rules/scenarios]

vLLM: the tiny model under load (6 clients on --max-num-seqs 2, so requests run and wait), its engine core
stopped with SIGSTOP for STALL_S, then SIGCONT. llama-server: under load, the thread that runs its slots stopped
(ptrace) for LLAMA_STALL_S, then the whole process with SIGSTOP; and its counters sampled through one long
generation (which ones move while a request runs). Every STEP_S the recorder asks /health and /metrics with a
SCRAPE_TIMEOUT_S timeout (tuner's default scrape timeout) and writes what came back to a JSON-lines timeline; a few
whole bodies are kept. The scenarios (engine_stalled_*.yaml) are the timeline at the alert pack's 15 s step, and
their expectations a literal reading of the rule (tuner and promtool must then both agree with it).
Takes ~8 min (one vLLM start, a 4-minute stall). Leaves no server running.
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
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]  # run from a checkout, no install needed

import realservers  # noqa: E402

from tuner.lab.load import run_load  # noqa: E402
from tuner.lab.stall import ThreadStop, engine_core_pid, resume_process, stop_process  # noqa: E402

STEP_S = 5.0
SCRAPE_TIMEOUT_S = 3.0
STALL_S = 240.0  # the default pack's EngineStalled: a 1m window, then 2m pending: fired by 3m, with room
RESUMED_S = 90.0
LLAMA_STALL_S = 120.0  # EngineStalled for llama-server: 1m pending
VLLM_FLAGS = {"max-num-seqs": 2}
VLLM_LOAD = dict(concurrency=6, prompt_tokens_approx=100, max_tokens=600)
LLAMA_LOAD = dict(concurrency=6, prompt_tokens_approx=50, max_tokens=400)
VLLM_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:prompt_tokens_total",
    "vllm:kv_cache_usage_perc",
)
LLAMA_GAUGES = (
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:n_decode_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:prompt_tokens_total",
)


def log(msg: str) -> None:
    print(f"[record-stall] {msg}", file=sys.stderr, flush=True)


def ask(url: str, timeout: float = SCRAPE_TIMEOUT_S) -> tuple[int | None, str, float]:
    """(status or None, body or the error's name, seconds)."""
    t0 = time.monotonic()
    try:
        r = requests.get(url, timeout=timeout, proxies={"http": "", "https": ""})
        return r.status_code, r.text, time.monotonic() - t0
    except requests.RequestException as exc:
        return None, type(exc).__name__, time.monotonic() - t0


def sample(exposition: str, name: str) -> float:
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)", re.M)
    return sum(float(v) for v in pattern.findall(exposition))


class Timeline:
    """Every STEP_S: /health and /metrics, what they answered and how fast, and the named series' values."""

    def __init__(self, url: str, names: tuple[str, ...]) -> None:
        self.url, self.names, self.rows = url, names, []  # type: ignore[var-annotated]
        self.t0 = time.time()
        self.bodies: dict[str, str] = {}

    def take(self, phase: str) -> dict[str, Any]:
        h = ask(self.url + "/health")
        m = ask(self.url + "/metrics")
        row: dict[str, Any] = {
            "t": round(time.time() - self.t0, 2),
            "phase": phase,
            "health": {
                "status": h[0],
                "seconds": round(h[2], 3),
                "body": h[1][:200] if h[0] is not None else None,
                "error": None if h[0] is not None else h[1],
            },
            "metrics": {"status": m[0], "seconds": round(m[2], 3), "error": None if m[0] is not None else m[1]},
        }
        if m[0] == 200:
            row["values"] = {n: sample(m[1], n) for n in self.names}
            self.bodies[phase] = m[1]
        self.rows.append(row)
        log(json.dumps(row))
        return row

    def run(self, phase: str, seconds: float, every: float = STEP_S) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.monotonic()
            self.take(phase)
            time.sleep(max(0.0, every - (time.monotonic() - t)))


def background_load(
    url: str, model: str | None, stop: threading.Event, said: list[str], **load: Any
) -> threading.Thread:
    """Clients that keep ``concurrency`` requests in flight until ``stop`` (and a long timeout for a stall); how
    it went is appended to ``said``."""

    def go() -> None:
        r = run_load(
            url,
            model=model,
            n_requests=10_000,
            timeout_s=1200,
            send_for_s=1100,
            stop=stop,
            distinct_prompts=True,
            **load,
        )
        said.append(f"load across the stall: {r.ok} ok, {r.failed} failed, errors {list(r.errors[:2])}")
        log(said[-1])

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def record_vllm(out: Path, workdir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    notes: list[str] = []
    server = realservers.start_vllm(workdir / "vllm", flags=VLLM_FLAGS)
    stop = threading.Event()
    try:
        tl = Timeline(server.url, VLLM_GAUGES)
        tl.take("idle")
        load = background_load(server.url, server.model_name, stop, notes, **VLLM_LOAD)
        tl.run("serving", 45)
        core = engine_core_pid(server.process.pid)
        (out / "vllm_metrics_before_stop.txt").write_text(tl.bodies["serving"])
        stop_process(core)
        log(f"SIGSTOP engine core pid {core}")
        tl.run("stopped", 30)
        # a request that arrives while the engine core is stopped: do the gauges count it?
        late: list[tuple[int | None, str, float]] = []
        threading.Thread(target=lambda: late.append(ask(server.url + "/v1/models", 10)), daemon=True).start()
        extra = threading.Thread(
            target=lambda: run_load(
                server.url,
                model=server.model_name,
                n_requests=2,
                concurrency=2,
                prompt_tokens_approx=20,
                max_tokens=8,
                timeout_s=STALL_S + RESUMED_S,
            ),
            daemon=True,
        )
        extra.start()
        tl.run("stopped", STALL_S - 30)
        h = ask(server.url + "/health")
        (out / "vllm_health_stopped.json").write_text(
            json.dumps({"status": h[0], "body": h[1], "seconds": round(h[2], 3)}) + "\n"
        )
        (out / "vllm_metrics_stopped.txt").write_text(tl.bodies["stopped"])
        resume_process(core)
        log(f"SIGCONT engine core pid {core}")
        tl.run("resumed", RESUMED_S)
        (out / "vllm_metrics_resumed.txt").write_text(tl.bodies["resumed"])
        stop.set()
        load.join(300)
        extra.join(60)
        notes.insert(0, f"/v1/models while the engine core was stopped: {late[0][0] if late else 'no answer'}")
        return tl.rows, notes
    finally:
        stop.set()
        log(f"vLLM stop exit code {server.stop()}")


def record_llama(out: Path, workdir: Path, notes: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    server = realservers.start_llama_server(workdir / "llama")
    stop = threading.Event()
    try:
        # which counters move while one request generates: poll /metrics as fast as it answers
        seen: list[dict[str, Any]] = []
        done = threading.Event()

        def one() -> None:
            run_load(
                server.url,
                model=None,
                n_requests=2,
                concurrency=2,
                prompt_tokens_approx=50,
                max_tokens=450,
                timeout_s=60,
            )
            done.set()

        threading.Thread(target=one, daemon=True).start()
        t0 = time.time()
        while not done.is_set():
            status, body, _ = ask(server.url + "/metrics")
            if status == 200:
                seen.append({"t": round(time.time() - t0, 3), **{n: sample(body, n) for n in LLAMA_GAUGES}})
            time.sleep(0.01)
        status, body, _ = ask(server.url + "/metrics")
        seen.append({"t": round(time.time() - t0, 3), "after": True, **{n: sample(body, n) for n in LLAMA_GAUGES}})

        tl = Timeline(server.url, LLAMA_GAUGES)
        tl.take("idle")
        load = background_load(server.url, None, stop, notes, **LLAMA_LOAD)
        tl.run("serving", 45)
        (out / "llama_metrics_before_stop.txt").write_text(tl.bodies["serving"])
        with ThreadStop(server.process.pid):
            log("main loop thread stopped")
            s = ask(server.url + "/slots")
            (out / "llama_slots_loop_stopped.json").write_text(
                json.dumps({"status": s[0], "error": None if s[0] else s[1], "seconds": round(s[2], 3)}) + "\n"
            )
            h = ask(server.url + "/health")
            (out / "llama_health_loop_stopped.json").write_text(
                json.dumps({"status": h[0], "body": h[1], "seconds": round(h[2], 3)}) + "\n"
            )
            tl.run("loop_stopped", LLAMA_STALL_S)
        log("main loop thread resumed")
        tl.run("resumed", 45)
        stop_process(server.process.pid)
        log("SIGSTOP llama-server")
        tl.run("process_stopped", 20)
        resume_process(server.process.pid)
        tl.run("process_resumed", 15)
        stop.set()
        load.join(300)
        return tl.rows, seen
    finally:
        stop.set()
        log(f"llama-server stop exit code {server.stop()}")


# ---- scenarios: the timeline at the pack's step, and the rule read literally ---------------------------------

STEP = 15.0


def _at_steps(rows: list[dict[str, Any]], start: float) -> list[dict[str, Any]]:
    """The row nearest each 15 s step from ``start`` (the first serving row)."""
    out = []
    t = start
    while t <= rows[-1]["t"] + 1e-9:
        out.append(min(rows, key=lambda r: abs(r["t"] - t)))
        t += STEP
    return out


def _fmt(values: list[float | None]) -> str:
    return " ".join("_" if v is None else repr(float(v)) for v in values)


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s}s" if m and s else f"{m}m" if m else f"{s}s"


def vllm_scenario(rows: list[dict[str, Any]], rel_fixture: str) -> str:
    steps = _at_steps(rows, next(r["t"] for r in rows if r["phase"] == "serving"))
    vals = [r.get("values") for r in steps]

    def series(name: str) -> list[float | None]:
        return [v[name] if v else None for v in vals]

    run, wait = series("vllm:num_requests_running"), series("vllm:num_requests_waiting")
    up = [1.0 if r["metrics"]["status"] == 200 else 0.0 for r in steps]
    healthy = [1.0 if r["health"]["status"] == 200 else 0.0 for r in steps]
    gen, done = series("vllm:generation_tokens_total"), series("vllm:request_success_total")
    window, hold = 4, 8  # 1m and 2m in 15 s steps (alerts/default.yaml EngineStalled)

    def stalled(i: int) -> bool:  # in flight now, and neither counter moved over the window before
        if i < window or None in (run[i], wait[i], gen[i], gen[i - window], done[i], done[i - window]):
            return False
        return (run[i] or 0) + (wait[i] or 0) > 0 and gen[i] == gen[i - window] and done[i] == done[i - window]

    cond = [stalled(i) for i in range(len(steps))]
    fires = next(i for i in range(len(steps)) if i >= hold and all(cond[i - hold : i + 1]))
    clears = next(i for i in range(fires, len(steps)) if not cond[i])
    inflight = (run[fires] or 0) + (wait[fires] or 0)
    stop_t = next(r["t"] for r in rows if r["phase"] == "stopped")
    cont_t = next(r["t"] for r in rows if r["phase"] == "resumed")
    start_t = steps[0]["t"]
    return f"""# Recorded by scripts/record_stall_fixtures.py from {rel_fixture}: a real vLLM CPU (tiny model,
# --max-num-seqs 2, 6 clients) whose engine core was stopped with SIGSTOP {_minutes(stop_t - start_t)} into the
# series and let go (SIGCONT) at {_minutes(cont_t - start_t)}. Its /health and /metrics kept answering 200; the
# running and waiting gauges stayed where they were and the counters stopped. EngineStalled (no token generated
# and no request finished over 1m, requests in flight) holds from {_minutes(fires * STEP - 2 * 60)} and fires 2m
# later; it clears at the first step whose window saw the engine move again.
rules: ../../../alerts/default.yaml
target: {{name: chat, backend: vllm}}
interval: 15s
input_series:
  - series: 'vllm:num_requests_running{{engine="0",model_name="tiny-llama"}}'
    values: '{_fmt(run)}'
  - series: 'vllm:num_requests_waiting{{engine="0",model_name="tiny-llama"}}'
    values: '{_fmt(wait)}'
  - series: 'vllm:generation_tokens_total{{engine="0",model_name="tiny-llama"}}'
    values: '{_fmt(gen)}'
  - series: 'vllm:request_success_total{{engine="0",finished_reason="length",model_name="tiny-llama"}}'
    values: '{_fmt(done)}'
  - series: 'tuner_target_up'
    values: '{_fmt(up)}'
  - series: 'tuner_target_server_healthy'
    values: '{_fmt(healthy)}'
alert_rule_test:
  - eval_time: {_minutes((fires - 1) * STEP)}
    alertname: EngineStalled
    exp_alerts: []
  - eval_time: {_minutes(fires * STEP)}
    alertname: EngineStalled
    exp_alerts:
      - exp_labels: {{severity: critical, engine: "0", model_name: tiny-llama}}
  - eval_time: {_minutes((clears - 1) * STEP)}
    alertname: EngineStalled
    exp_alerts:
      - exp_labels: {{severity: critical, engine: "0", model_name: tiny-llama}}
  - eval_time: {_minutes(clears * STEP)}
    alertname: EngineStalled
    exp_alerts: []
  - eval_time: {_minutes(fires * STEP)}
    alertname: EngineHealthFailing
    exp_alerts: []
  - eval_time: {_minutes(fires * STEP)}
    alertname: TargetDown
    exp_alerts: []
# in flight when it fired: {inflight:g}
"""


def llama_scenario(rows: list[dict[str, Any]], rel_fixture: str) -> str:
    rows = [r for r in rows if r["phase"] in ("serving", "loop_stopped", "resumed")]
    steps = _at_steps(rows, rows[0]["t"])
    up = [1.0 if r["metrics"]["status"] == 200 else 0.0 for r in steps]
    healthy = [1.0 if r["health"]["status"] == 200 else 0.0 if r["health"]["status"] else None for r in steps]
    hold = 4  # 1m in 15 s steps
    cond = [u == 0 and h == 1 for u, h in zip(up, healthy)]
    fires = next(i for i in range(len(steps)) if i >= hold and all(cond[i - hold : i + 1]))
    clears = next(i for i in range(fires, len(steps)) if not cond[i])
    start_t = steps[0]["t"]
    stop_t = next(r["t"] for r in rows if r["phase"] == "loop_stopped")
    into = _minutes(stop_t - start_t)
    back = _minutes(next(r["t"] for r in rows if r["phase"] == "resumed") - stop_t)
    return f"""# Recorded by scripts/record_stall_fixtures.py from {rel_fixture}: a real llama-server (tiny GGUF,
# --parallel 2, 6 clients) whose main thread, the loop that runs the slots, was stopped (ptrace) {into} into
# the series and let go {back} later. /health kept answering 200 from the HTTP threads; /metrics and /slots,
# answered by that loop, timed out ({SCRAPE_TIMEOUT_S:g} s, tuner's default scrape timeout). tuner_target_up and
# tuner_target_server_healthy are what tuner records of each: the scrape stored data, /health answered 200.
# (The timeline goes on with the whole process stopped by SIGSTOP: then nothing answers, /health neither: a
# down target, not a stalled one. That part is left out here.)
rules: ../../../alerts/default.yaml
target: {{name: chat, backend: llamacpp}}
interval: 15s
input_series:
  - series: 'tuner_target_up'
    values: '{_fmt(up)}'
  - series: 'tuner_target_server_healthy'
    values: '{_fmt(healthy)}'
alert_rule_test:
  - eval_time: {_minutes((fires - 1) * STEP)}
    alertname: EngineStalled
    exp_alerts: []
  - eval_time: {_minutes(fires * STEP)}
    alertname: EngineStalled
    exp_alerts:
      - exp_labels: {{severity: critical, backend: llamacpp}}
  - eval_time: {_minutes(clears * STEP)}
    alertname: EngineStalled
    exp_alerts: []
  - eval_time: {_minutes(fires * STEP)}
    alertname: TargetDown
    exp_alerts:
      - exp_labels: {{severity: critical}}
"""


def _span(rows: list[dict[str, Any]], phase: str, key: str) -> str:
    got = [r[key]["seconds"] for r in rows if r["phase"] == phase and r[key]["status"] == 200]
    statuses = sorted({str(r[key]["status"] or r[key]["error"]) for r in rows if r["phase"] == phase})
    if not got:
        return f"{'/'.join(statuses)} every time"
    return f"{'/'.join(statuses)} every time, in {min(got) * 1000:.0f}-{max(got) * 1000:.0f} ms"


def _frozen(rows: list[dict[str, Any]], phase: str, name: str) -> str:
    vals = sorted({r["values"][name] for r in rows if r["phase"] == phase and "values" in r})
    return "/".join(f"{v:g}" for v in vals)


def write_readme(
    out: Path,
    vllm: list[dict[str, Any]] | None,
    llama: list[dict[str, Any]] | None,
    counters: list[dict[str, Any]] | None,
    notes: list[str],
    llama_notes: list[str],
) -> None:
    lines = [
        "# What a stalled real server answers",
        "",
        "Recorded by `scripts/record_stall_fixtures.py` (see its docstring; about 8 minutes, needs the real",
        'servers of `scripts/setup-real-servers.sh`): `eval "$(bash scripts/setup-real-servers.sh | grep ^export)"; '
        ".venv/bin/python scripts/record_stall_fixtures.py`. It also writes",
        "`tests/rules/scenarios/engine_stalled_vllm.yaml` and `engine_stalled_llamacpp.yaml` from the timelines.",
        f"Every {STEP_S:g} s the recorder asked `/health` and `/metrics` with a {SCRAPE_TIMEOUT_S:g} s timeout "
        "(tuner's default scrape timeout); each `*_timeline.jsonl` line is one such look: its phase, what each "
        "answered and how fast, and the values of the series that matter.",
        "",
    ]
    if vllm:
        stopped = [r for r in vllm if r["phase"] == "stopped"]
        lines += [
            "## vLLM (CPU build, tiny model, `--max-num-seqs 2`, 6 clients)",
            "",
            f"The engine core (`VLLM::EngineCore`, a child of the API server) stopped with SIGSTOP for "
            f"{stopped[-1]['t'] - stopped[0]['t'] + STEP_S:.0f} s, then SIGCONT:",
            "",
            f"- `/health`: {_span(vllm, 'stopped', 'health')} (`vllm_health_stopped.json`: 200, empty body).",
            f"- `/metrics`: {_span(vllm, 'stopped', 'metrics')} (`vllm_metrics_stopped.txt`).",
            f"- The gauges stay where the engine left them: running {_frozen(vllm, 'stopped', 'vllm:num_requests_running')}"
            f", waiting {_frozen(vllm, 'stopped', 'vllm:num_requests_waiting')}; the counters stop: generation tokens "
            f"{_frozen(vllm, 'stopped', 'vllm:generation_tokens_total')}, finished requests "
            f"{_frozen(vllm, 'stopped', 'vllm:request_success_total')}.",
            "- Two requests sent 30 s into the stop are not counted: waiting stays the same until SIGCONT, then "
            "shows them. A stall that begins with nothing in flight leaves the gauges at 0 whatever arrives.",
            *(f"- {n}." for n in notes),
            "- After SIGCONT the counters move again within the next look.",
            "",
            "Files: `vllm_timeline.jsonl`, `vllm_metrics_before_stop.txt` (under load, just before the stop), "
            "`vllm_metrics_stopped.txt` (the last look while stopped), `vllm_health_stopped.json`, "
            "`vllm_metrics_resumed.txt`, `vllm_notes.txt`.",
            "",
        ]
    if llama:
        lines += [
            "## llama-server (tiny GGUF, `--parallel 2 -c 1024 -t 1 --metrics`, 6 clients)",
            "",
            "- The loop that runs the slots (the main thread, tid = pid) stopped alone (ptrace), the HTTP threads "
            "running on: "
            f"`/health` {_span(llama, 'loop_stopped', 'health')}; `/metrics` {_span(llama, 'loop_stopped', 'metrics')}"
            "; `/slots` too (`llama_slots_loop_stopped.json`). That loop answers /metrics and /slots, so a stuck "
            "loop shows as a failed scrape while /health answers: there is no `requests_deferred` to read then.",
            f"- The whole process stopped with SIGSTOP: `/health` {_span(llama, 'process_stopped', 'health')}, "
            f"`/metrics` {_span(llama, 'process_stopped', 'metrics')}: a down target.",
            *(f"- {n}." for n in llama_notes),
            "",
        ]
    if counters:
        mid = [c for c in counters if c["llamacpp:requests_processing"] > 0]
        if mid:
            lines += [
                f"`llama_counters_during_generation.jsonl`: /metrics polled as fast as it answers through two "
                f"450-token requests. While one ran, `n_decode_total` went {mid[0]['llamacpp:n_decode_total']:g} -> "
                f"{mid[-1]['llamacpp:n_decode_total']:g} and `tokens_predicted_total` stayed "
                f"{mid[-1]['llamacpp:tokens_predicted_total']:g} (it counts a request's tokens when it finishes): "
                "progress is `n_decode_total`, not tokens predicted.",
                "",
            ]
    (out / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "stall")
    ap.add_argument("--scenarios", type=Path, default=ROOT / "tests" / "rules" / "scenarios")
    ap.add_argument("--only", choices=["vllm", "llama-server"])
    ap.add_argument(
        "--from-timelines",
        action="store_true",
        help="write README.md and the scenarios again from the recorded timelines (no server)",
    )
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
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(out, ROOT)
    if not args.from_timelines:
        with tempfile.TemporaryDirectory(prefix="tuner-record-stall-") as tmp:
            if "llama-server" in chosen:
                llama_notes: list[str] = []
                llama, counters = record_llama(out, Path(tmp), llama_notes)
                (out / "llama_notes.txt").write_text("\n".join(llama_notes) + "\n")
                (out / "llama_timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in llama))
                (out / "llama_counters_during_generation.jsonl").write_text(
                    "".join(json.dumps(r) + "\n" for r in counters)
                )
            if "vllm" in chosen:
                vllm, notes = record_vllm(out, Path(tmp))
                (out / "vllm_timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in vllm))
                (out / "vllm_notes.txt").write_text("\n".join(notes) + "\n")
        log(f"recorded {dt.date.today().isoformat()} into {out}")

    def read(name: str) -> list[dict[str, Any]] | None:
        f = out / name
        return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else None

    vllm_rows, llama_rows = read("vllm_timeline.jsonl"), read("llama_timeline.jsonl")
    if vllm_rows:
        (args.scenarios / "engine_stalled_vllm.yaml").write_text(vllm_scenario(vllm_rows, f"{rel}/vllm_timeline.jsonl"))
    if llama_rows:
        (args.scenarios / "engine_stalled_llamacpp.yaml").write_text(
            llama_scenario(llama_rows, f"{rel}/llama_timeline.jsonl")
        )

    def lines(name: str) -> list[str]:
        return [x for x in (out / name).read_text().splitlines() if x] if (out / name).exists() else []

    write_readme(
        out,
        vllm_rows,
        llama_rows,
        read("llama_counters_during_generation.jsonl"),
        lines("vllm_notes.txt"),
        lines("llama_notes.txt"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
