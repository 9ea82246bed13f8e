"""``tuner demo``: tuner's whole loop, end to end, against a real vLLM it starts and manages itself.

Writes a config whose one target is a *managed* vLLM (CPU build, tiny local model, ``--max-num-seqs 4``),
runs ``tuner run`` (which starts vLLM), drives a light then a heavy load (more concurrent requests than
--max-num-seqs, so requests queue) while showing ``tuner status`` and ``tuner signals``, asks
``tuner recommend`` for a flag change, measures it with ``tuner tune`` (two trials on servers beside production,
then the better one against the flags in force in turns), applies tune's measured winner (or, when tune measured
no difference, the advisor's proposal, saying so) with ``tuner apply-recommendation`` under load (drain,
restart, health gate, observe, verdict), and shows ``tuner journal`` and tuner's own /metrics. Everything binds
to 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tuner.apply.launch import free_port
from tuner.collect import http
from tuner.config import load_config
from tuner.errors import ScrapeError
from tuner.lab.proc import stop
from tuner.names import VLLM_REQUEST_SUCCESS_TOTAL
from tuner.signals.load import SATURATED_QUEUE_TIME_SHARE, profile
from tuner.store.db import open_engine
from tuner.store.journal import ApplyOutcome
from tuner.store.store import Store

__all__ = ["run_demo"]

MODEL_NAME = "tiny-llama"
BASELINE_S = 60  # the apply's baseline window; the demo's clients fill it before the apply starts
MIN_BASELINE_SCRAPES = 6  # stored scrapes the baseline must hold before the apply starts (every 5 s: 12 due)


def _say(msg: str) -> None:
    print(f"\n=== {time.strftime('%H:%M:%S')} {msg}", flush=True)


def _tuner(config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(config), "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _show(config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = _tuner(config, *args, timeout=timeout)
    print(proc.stdout.rstrip() or proc.stderr.rstrip(), flush=True)
    return proc


def _load_process(
    url: str, n: int, conc: int, max_tokens: int = 256, *, steady: bool = False, own_session: bool = False
) -> subprocess.Popen[str]:
    """The load generator in a process of its own, as clients are: it never competes with tuner for a lock.

    ``steady``: it keeps ``conc`` requests in flight (a closed loop, ``n`` ignored) until it gets SIGUSR1 (at most
    10 minutes) and, like real clients, sends a request again while the server restarts (refused, HTTP 500 or a
    connection closed unanswered while vLLM drains): none of its requests is lost to an apply. The clients are
    not niced: niced on 2 cores beside a busy vLLM they offered less load than their concurrency, and the
    verdict saw the load fall, not the server's capacity. Nor are they put ahead of vLLM: then its HTTP server,
    which answers /metrics, starved, and a 60 s baseline held fewer than two scrapes.
    """
    script = (
        "import json, signal, sys, threading; from tuner.lab.load import run_load\n"
        "url, model, n, conc, max_tokens, steady = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])\n"
        "stop = threading.Event(); signal.signal(signal.SIGUSR1, lambda *_: stop.set())\n"
        "r = run_load(url, model=model, n_requests=10_000 if steady else n, concurrency=conc,\n"
        "             prompt_tokens_approx=200, max_tokens=max_tokens, retry_for_s=120.0 if steady else 0.0,\n"
        "             send_for_s=600.0 if steady else None, stop=stop, timeout_s=900.0 if steady else 300.0)\n"
        "lat = r.latencies_s; q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0\n"
        "print(json.dumps([r.ok, r.failed, r.retried, q(0.5), q(0.99), list(r.errors[:2])]))\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script, url, MODEL_NAME, str(n), str(conc), str(max_tokens), str(int(steady))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_session,
    )


def _finish_load(proc: subprocess.Popen[str]) -> None:
    out, err = proc.communicate(timeout=600)
    try:
        ok, failed, retried, p50, p99, errors = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"-- load generator failed: {err.strip()[-500:]}")
        return
    print(
        f"-- load done: {ok} ok, {failed} failed, {retried} attempts sent again while the server restarted, "
        f"client P50 {p50:.2f}s P99 {p99:.2f}s" + (f" (e.g. {errors[0]})" if errors else ""),
        flush=True,
    )


def demo_config(workdir: Path, url: str, own_port: int, *, vllm_python: str, model: str) -> str:
    """The demo's tuner.yaml: a store in ``workdir``, tuner's own endpoint on ``own_port``, and one managed vLLM (the
    tiny model, --max-num-seqs 4) served at ``url`` (bench/demo_placement.py runs the same server)."""
    return (
        "# written by `tuner demo`\n"
        f"store: {{url: 'sqlite:///{workdir / 'tuner.db'}'}}\n"
        f"listen: 127.0.0.1:{own_port}\n"
        "defaults: {scrape_interval: 5s, scrape_timeout: 5s, signal_window: 1m}\n"
        "gpu: {source: nvml}\n"
        "targets:\n"
        f"  - name: {MODEL_NAME}\n    backend: vllm\n    url: {url}\n"
        "    slo: {ttft_p99: 2s, e2e_p99: 10s, objective: 0.95}   # 40-request runs judge 0.95 (0.99 needs 200)\n"
        "    managed:                       # tuner starts, supervises and restarts this vLLM itself\n"
        f"      model: {model}\n"
        f"      executable: {vllm_python}\n"
        "      flags: {max_num_seqs: 4, max_model_len: 1024}\n"
        "      extra_args: {enforce-eager: true}\n"
        f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{workdir / 'vllm-cache'}'}}\n"
        "      drain_timeout: 30s\n"
        f"    apply: {{baseline: {BASELINE_S}s, observe: 30s, observe_max: 90s, min_requests: 5}}\n"
    )


def run_demo(*, vllm_python: str, model: str, workdir: Path, load_scale: float = 1.0) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    port, own_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    config = workdir / "tuner.yaml"
    config.write_text(demo_config(workdir, url, own_port, vllm_python=vllm_python, model=model))
    _say(f"config {config}")
    print(config.read_text(), end="")
    _say("tuner db upgrade")
    _show(config, "db", "upgrade")

    _say(
        f"tuner run: starts the managed vLLM, scrapes it every 5s (own metrics on http://127.0.0.1:{own_port}/metrics)"
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(config), "--log-level", "WARNING", "run"],
        stdout=open(workdir / "tuner.log", "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        t0 = time.monotonic()
        while _tuner(config, "managed", "status").returncode != 0 or not _healthy(url):
            if daemon.poll() is not None or time.monotonic() - t0 > 600:
                print(f"vLLM did not come up; see {workdir / 'tuner.log'} and {workdir / 'logs'}")
                return 7
            time.sleep(1)
        print(f"vLLM healthy after {time.monotonic() - t0:.0f}s (started by tuner; log: {workdir / 'logs'})")
        _show(config, "managed", "status")
        time.sleep(3)
        _show(config, "status", "--window", "1m")

        # Long answers (256 tokens) keep each phase going across several 5 s scrapes: on 2 cores a loaded vLLM can
        # miss a scrape's deadline, and more than one scrape must see the queue (the heavy phase: 128 requests in
        # about 10 s, each queued up to ~2 s; ~25 s while the server's session starved its clients, before it yielded).
        for phase, n, conc in (
            ("light load: 12 requests, 2 at a time", 12, 2),
            ("heavy load: 128 requests, 16 at a time (max-num-seqs is 4)", 128, 16),
        ):
            _say(phase)
            load = _load_process(url, max(1, int(n * load_scale)), conc)
            time.sleep(5)
            if load.poll() is None:
                print("-- while the load runs:")
                _show(config, "status", "--window", "1m")
            _finish_load(load)
            time.sleep(5.5)  # one more scrape sees the end of the phase
            _show(config, "status", "--window", "1m")

        _say("tuner signals tiny-llama --window 1m --json")
        sig = json.loads(_tuner(config, "signals", MODEL_NAME, "--window", "1m", "--json").stdout)
        print(json.dumps(sig["engines"][0], indent=1))

        _say("tuner recommend tiny-llama --window 1m")
        out = _tuner(config, "recommend", MODEL_NAME, "--window", "1m", "--json")
        recs = json.loads(out.stdout)["recommendations"] if out.returncode == 0 else []
        _show(config, "recommendations", "list")
        flag_changes = [r for r in recs if "backend" not in r["diff"]]  # a backend change is not applied
        rec = next((r for r in flag_changes if "max_num_seqs" in r["diff"]), flag_changes[0] if flag_changes else None)

        # Measure before applying: the workload the server really served, replayed by vLLM's own benchmark client
        # against trial servers beside it (the flags in force, then the advisor's proposal), each one's capacity
        # within the SLO found by bracketing the request rate; then the better one against the flags in force on
        # two fresh servers in turns (A B, B A, ...), which either resolves the difference with its confidence or
        # says none is measurable at this budget.
        _say("tuner workload tiny-llama --window 5m -o workload.yaml   (what it served, as a replayable workload)")
        _show(config, "workload", MODEL_NAME, "--window", "5m", "-o", str(workdir / "workload.yaml"))
        _say(
            "tuner tune tiny-llama --workload workload.yaml --budget 3 --flags max_num_seqs=4/8/16   (trial "
            "servers on spare ports; production keeps serving)"
        )
        _show(
            config,
            "tune",
            MODEL_NAME,
            "--workload",
            str(workdir / "workload.yaml"),
            "--window",
            "5m",
            "--budget",
            "3",
            "--flags",
            "max_num_seqs=4/8/16",
            "--compare-pairs",
            "3",
            "--run-seconds",
            "8",
            "--max-runs",
            "3",
            "--max-time",
            "6m",
            timeout=1800,
        )
        rec, story = _after_tune(config, rec)
        print(f"-- {story}", flush=True)
        if rec is None:
            print("-- the apply step is skipped")
        else:
            _say(f"tuner apply-recommendation {rec['id']} --dry-run")
            _show(config, "apply-recommendation", str(rec["id"]), "--dry-run")
            _say(
                f"tuner apply-recommendation {rec['id']} --yes   (under a steady load of 16 clients: baseline "
                f"{BASELINE_S}s, drain, restart, health gate, observe 30s (up to 90s while inconclusive), verdict)"
            )
            # 16 clients keep 16 requests in flight through the baseline, the restart (retrying while the server is
            # down) and the observation: more than the old and the new --max-num-seqs, so both windows are
            # saturated and the verdict compares what matters, the server's capacity, like with like.
            # 512-token answers: more of each second goes to the engine's own core, less to HTTP and clients.
            load = _load_process(url, 0, 16, max_tokens=512, steady=True)
            print(
                f"-- 16 clients until the apply is done; the baseline window ({BASELINE_S}s) fills before it starts",
                flush=True,
            )
            time.sleep(BASELINE_S + 2)
            scrapes, queued = _wait_for_baseline(config, BASELINE_S, MIN_BASELINE_SCRAPES, limit_s=180)
            print(
                f"-- the last {BASELINE_S}s hold {scrapes} stored scrapes (a loaded CPU vLLM answers /metrics "
                "late: the apply itself then waits until its baseline holds the scrapes a verdict needs); "
                + (
                    f"requests queued for {queued:.0%} of their time: the flags in force are at their limit"
                    if queued is not None
                    else "the clients did not keep the server's slots full: the verdict will say what it saw"
                ),
                flush=True,
            )
            _show(config, "apply-recommendation", str(rec["id"]), "--yes", timeout=900)
            load.send_signal(signal.SIGUSR1)  # stop sending; what is in flight finishes
            _finish_load(load)
            _say("tuner journal --brief")
            _show(config, "journal", "--brief")

        _say("tuner's own /metrics (excerpt)")
        body = _own_metrics(f"http://127.0.0.1:{own_port}/metrics", applied=rec is not None, limit_s=60)
        print(
            "\n".join(
                line
                for line in body.splitlines()
                if line.startswith(
                    (
                        "tuner_target_up",
                        "tuner_kv_cache",
                        "tuner_ttft_seconds",
                        "tuner_requests_waiting",
                        "tuner_goodput",
                        "tuner_gpu_telemetry",
                        "tuner_applies_total",
                        "tuner_managed_server_up",
                    )
                )
            )
        )
        return 0
    finally:
        stop(daemon, 15)
        stopped = _tuner(config, "managed", "stop", timeout=120)
        _say(f"stopped tuner, then vLLM ({stopped.stdout.strip() or stopped.stderr.strip()}); data kept in {workdir}")


def _after_tune(config: Path, advised: dict | None) -> tuple[dict | None, str]:
    """What the demo applies after tuning, and why. Tune compared the advisor's proposal with the flags in force in
    turns, whichever measured higher one after the other: proposal better (a stored recommendation) -> the demo
    applies it; proposal worse -> nothing (tune's measurement says keep the flags in force); no difference
    measurable at tune's budget -> the advisor's proposal, said to be unresolved, for the live verdict to judge."""
    from tuner.store import recommendations as recs
    from tuner.store import tuning as tj

    cfg = load_config(config)
    engine = open_engine(cfg.store.url)
    try:
        run = tj.latest_run(engine, MODEL_NAME)
        result = run.result if run is not None else {}
        rid = result.get("recommendation_id")
        if rid:
            r = recs.get_recommendation(engine, rid)
            return {
                "id": r.id,
                "diff": dict(r.diff),
            }, f"tune measured a winner: {result.get('verdict')}; it is what the demo applies"
    finally:
        engine.dispose()
    said = result.get("verdict") or "tune measured nothing"
    if advised is None:
        return None, f"tune: {said}. The demo applies nothing: the advisor proposed no flag change"
    cmp = result.get("comparison") or {}
    compared = cmp.get("flags") or {}
    if cmp.get("outcome") == "a_better" and all(compared.get(k) == v for k, v in advised["diff"].items()):
        return None, (
            f"tune: {said}. The demo applies nothing: compared in turns, the flags in force served more within the "
            f"SLO than the advisor's proposal {advised['diff']}"
        )
    return advised, (
        f"tune: {said}. The demo applies the advisor's proposal {advised['diff']} anyway, to show the "
        "apply; the live verdict judges it on production's own traffic"
    )


def _wait_for_baseline(config: Path, window_s: float, want: int, *, limit_s: float) -> tuple[int, float | None]:
    """Wait (at most limit_s) until the last window_s seconds hold ``want`` stored scrapes and show the requests
    queueing (the share of their time spent queued, as the apply's baseline reads it, at least
    SATURATED_QUEUE_TIME_SHARE); how many scrapes they hold, and that share where it got there (None where it did
    not). A minute in which the clients' requests did not reach the engine is a baseline of an idle server, not of
    the flags at their limit (on 2 cores they reached it in bursts while vLLM's engine core busy-waited beside its
    API server, before tuner ran the engine core at a lower priority: tuner/apply/managed.py, yield_engine_core)."""
    cfg = load_config(config)
    target = next(t for t in cfg.targets if t.name == MODEL_NAME)
    store = Store(open_engine(cfg.store.url), retention=cfg.store.retention)
    deadline = time.monotonic() + limit_s
    while True:
        now = time.time()
        w = store.window(MODEL_NAME, now - window_s, now)
        stamps = {
            ts
            for e in w.engines
            for (name, _), pts in e.series.items()
            if name == VLLM_REQUEST_SUCCESS_TOTAL
            for ts, _ in pts
        }
        load = profile(w, slo=target.slo)
        share = load.queue_time_share if load is not None else None
        queued = share if share is not None and share >= SATURATED_QUEUE_TIME_SHARE else None
        if (len(stamps) >= want and queued is not None) or time.monotonic() >= deadline:
            return len(stamps), queued
        time.sleep(2.5)


def _own_metrics(url: str, *, applied: bool, limit_s: float) -> str:
    """tuner's /metrics once it shows the target up and, after an apply, the apply counted (each refreshed every
    5 s by jobs a loaded 2-core host can run seconds late: waited for, not slept on); the last body after limit_s."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            body = http.get(url, timeout_s=5, max_bytes=2**20).body.decode()
        except ScrapeError:
            body = ""
        up = _demo_samples(body, "tuner_target_up") == [1.0]
        if (up and (not applied or _applies_counted(body) >= 1)) or time.monotonic() >= deadline:
            return body
        time.sleep(1)


def _applies_counted(body: str) -> int:
    """The demo target's finished applies that tuner's /metrics counts, by any outcome an apply ends with. The
    family is exported at 0 for every outcome from the start, and a tuning run on the target counts as ``unchanged``
    (the demo's own runs beside production and is not counted): neither is the demo's apply."""
    applied = {o.value for o in ApplyOutcome} - {ApplyOutcome.UNCHANGED.value}
    return int(sum(_demo_samples(body, "tuner_applies_total", lambda labels: labels.get("outcome") in applied)))


def _demo_samples(body: str, name: str, where: Callable[[dict[str, str]], bool] = lambda labels: True) -> list[float]:
    """The values of ``name``'s samples for the demo's target in tuner's /metrics ``body`` whose labels ``where``
    takes; [] where the body is cut short (not a whole exposition)."""
    try:
        families = list(text_string_to_metric_families(body))
    except ValueError:
        return []
    return [
        s.value
        for f in families
        for s in f.samples
        if s.name == name and s.labels.get("target") == MODEL_NAME and where(s.labels)
    ]


def _healthy(url: str) -> bool:
    try:
        return http.get(url + "/health", timeout_s=3, max_bytes=1024).status == 200
    except Exception:  # noqa: BLE001 (not up yet)
        return False
