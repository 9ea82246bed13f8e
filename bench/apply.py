"""Apply path on real servers: how long "apply -> healthy" takes, how much of it is tuner, what clients lose.

For each backend (vLLM CPU build on the tiny model, llama-server on the tiny GGUF) the script:
  1. starts the managed target's own argv directly with ServerProcess, N times, alternating the two flag
     values, and times it to /health 200 (polled every 50 ms) and one health-gate request: the server's own
     start time, without tuner;
  2. starts `tuner run` (which starts the managed server), runs a continuous load (C clients, each sending
     one completion of max_tokens at a time, retrying 0.2 s after a failure; every request recorded with its
     wall-clock start, end and outcome), and applies a recommendation flipping the flag between its two values
     with `tuner apply-recommendation ID --yes --json`, M times, while requests are in flight;
  3. splits each apply by its journal timestamps (planned, baseline, draining, stopped, starting,
     health_check, healthy) and classifies the requests against them.

Reported: apply -> healthy = planned -> healthy (the observation after `healthy` is excluded and shown on its
own, as is the CLI's start before `planned`); drain = draining -> stopped; server start = the direct starts'
median; tuner overhead = apply -> healthy - drain - server start (journal writes, argv building, baseline KPIs,
/health polling granularity, the health-gate request). In flight at the drain = started before `draining`,
not finished by then; lost = of those, not answered 200. Arrivals during the restart = started between
`draining` and `healthy`, failed ones split by what the client saw.

Usage: flock /tmp/tuner-heavy.lock .venv/bin/python bench/apply.py --backend both --applies 5
Needs: scripts/setup-real-servers.sh exports (TUNER_VLLM_PYTHON, TUNER_TINY_MODEL, TUNER_LLAMA_SERVER,
TUNER_TINY_GGUF).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner import procfs  # noqa: E402
from tuner.apply import managed as mg  # noqa: E402
from tuner.apply.launch import ServerProcess, free_port  # noqa: E402
from tuner.config import load_config  # noqa: E402
from tuner.lab.proc import wait_for  # noqa: E402
from tuner.store import journal as jr  # noqa: E402
from tuner.store import recommendations as recs  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402

TARGET = "bench"
# The flag each backend flips, its two values, and the fixed part of the managed section.
BACKENDS: dict[str, dict[str, Any]] = {
    "vllm": {
        "flag": "max_num_seqs",
        "values": (2, 3),
        "exe": "TUNER_VLLM_PYTHON",
        "model": "TUNER_TINY_MODEL",
        "flags": {"max_model_len": 1024},
        "extra_args": {"enforce-eager": True},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
        "start_timeout_s": 300,
    },
    "llamacpp": {
        "flag": "parallel",
        "values": (2, 3),
        "exe": "TUNER_LLAMA_SERVER",
        "model": "TUNER_TINY_GGUF",
        "flags": {"ctx_size": 2048},
        "extra_args": {"-t": 1},
        "env": {},
        "start_timeout_s": 60,
    },
}
PROMPT = (
    "Write a long story about the sea, the wind and the ships that sail between the islands "
    "in the north, and of the people who live there."
)


# ---- load ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    start: float  # wall clock, seconds
    end: float
    outcome: str  # ok | refused | reset | http NNN | timeout | bad body | error
    detail: str = ""
    request: tuple[int, int] = (0, 0)  # (client, its n-th request): a retry is another attempt of the same request


@dataclass
class Load:
    """C client threads, one request each at a time, recording every attempt; a failed request is sent again
    after 0.2 s (``Req.request`` tells attempts of one request apart from requests)."""

    port: int
    model: str
    concurrency: int
    max_tokens: int
    done: list[Req] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for _ in range(self.concurrency):
            th = threading.Thread(target=self._client, daemon=True)
            th.start()
            self._threads.append(th)

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=180)

    def _client(self) -> None:
        body = json.dumps(
            {"model": self.model, "prompt": PROMPT, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True}
        ).encode()
        me, n = threading.get_ident(), 0
        while not self._stop.is_set():
            r = dataclasses.replace(self._one(body), request=(me, n))
            with self._lock:
                self.done.append(r)
            if r.outcome != "ok":
                time.sleep(0.2)  # the same request again
            else:
                n += 1

    def _one(self, body: bytes) -> Req:
        t0 = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                return Req(t0, time.time(), f"http {resp.status}", data[:200].decode(errors="replace"))
            answer = json.loads(data)
            choice = (answer.get("choices") or [{}])[0]
            if "text" not in choice:
                return Req(t0, time.time(), "bad body", data[:200].decode(errors="replace"))
            return Req(
                t0,
                time.time(),
                "ok",
                f"{answer.get('usage', {}).get('completion_tokens')} tokens, finish {choice.get('finish_reason')}",
            )
        except ConnectionRefusedError:
            return Req(t0, time.time(), "refused")
        except (
            ConnectionResetError,
            BrokenPipeError,
            http.client.RemoteDisconnected,
            http.client.IncompleteRead,
        ) as exc:
            return Req(t0, time.time(), "reset", type(exc).__name__)
        except TimeoutError:
            return Req(t0, time.time(), "timeout")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            return Req(t0, time.time(), "error", f"{type(exc).__name__}: {exc}"[:200])
        finally:
            conn.close()


# ---- setup -------------------------------------------------------------------------------------------


def tuner_cli(cfg: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def write_config(root: Path, backend: str, port: int, drain_s: int) -> Path:
    b = BACKENDS[backend]
    exe, model = os.environ.get(b["exe"]), os.environ.get(b["model"])
    if not exe or not model:
        raise SystemExit(
            f'{b["exe"]} / {b["model"]} not set: eval "$(bash scripts/setup-real-servers.sh | grep ^export)" first'
        )
    env = dict(b["env"])
    if backend == "vllm":
        env["VLLM_CACHE_ROOT"] = str(root / "vllm-cache")
    doc = {
        "store": {"url": f"sqlite:///{root / 'tuner.db'}"},
        "listen": f"127.0.0.1:{free_port()}",
        "defaults": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "targets": [
            {
                "name": TARGET,
                "backend": backend,
                "url": f"http://127.0.0.1:{port}",
                "managed": {
                    "model": model,
                    "executable": exe,
                    "flags": {b["flag"]: b["values"][0], **b["flags"]},
                    "extra_args": b["extra_args"],
                    "env": env,
                    "drain_timeout": f"{drain_s}s",
                    "start_timeout": f"{b['start_timeout_s']}s",
                },
                # observe 1 s: the observation is not what is measured here (reported apart, excluded from totals)
                "apply": {"observe": "1s", "baseline": "30s", "min_requests": 0, "max_restarts_per_hour": 1000},
            }
        ],
    }
    return save_config(root, doc)


def save_config(root: Path, doc: dict[str, Any]) -> Path:
    """Write a tuner config (JSON is YAML) into root and migrate its store; its path."""
    cfg = root / "tuner.yaml"
    cfg.write_text(json.dumps(doc, indent=1))
    proc = tuner_cli(cfg, "db", "upgrade")
    if proc.returncode != 0:
        raise SystemExit(f"tuner db upgrade failed: {proc.stderr.strip()}")
    return cfg


def direct_starts(cfg: Path, backend: str, n: int) -> tuple[list[float], list[float]]:
    """The managed argv started by hand n times: seconds to /health 200, seconds for one health-gate request."""
    config = load_config(cfg)
    t = config.target(TARGET)
    b = BACKENDS[backend]
    starts, gates = [], []
    for i in range(n):
        flags = {**b["flags"], b["flag"]: b["values"][i % 2]}
        argv = mg.build_argv(t, flags)
        t0 = time.monotonic()
        proc = ServerProcess.start(argv, mg.server_env(t), cfg.parent / "logs" / f"direct-{i}.log")
        try:
            proc.wait_healthy(t.url, b["start_timeout_s"], interval=0.05)
            starts.append(time.monotonic() - t0)
            g0 = time.monotonic()
            mg.health_gate(t)
            gates.append(time.monotonic() - g0)
        finally:
            proc.stop(grace_s=30)
        print(
            f"  direct start {i + 1}/{n} ({b['flag']} {flags[b['flag']]}): /health 200 after "
            f"{starts[-1]:.2f}s, health gate {gates[-1] * 1000:.0f} ms",
            flush=True,
        )
    return starts, gates


def healthy(url: str, timeout: float = 2) -> bool:
    try:
        with mg._OPENER.open(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


# ---- one backend -----------------------------------------------------------------------------------------


@dataclass
class ApplyRun:
    steps: dict[str, float]  # first occurrence of each step, wall seconds
    cli_start: float
    cli_end: float
    outcome: str
    note: str
    stopped_detail: str
    exited: float | None  # wall time the old server process exited (zombie or gone), watched in /proc
    reaped: float | None  # ... and was reaped (gone from /proc)
    spawned: float | None  # wall time the new server process was created (kernel start time, 10 ms ticks)
    health_up: float | None  # first /health 200 after it went down (polled every 20 ms from here)
    cli_cpu_s: float  # CPU seconds the `tuner apply-recommendation` process used


class HealthWatch:
    """Polls /health every 20 ms: the first 200 after it stopped answering 200."""

    def __init__(self, url: str) -> None:
        self.url, self.up = url, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        down = False
        while not self._stop.is_set():
            ok = healthy(self.url, timeout=1)
            if not ok:
                down = True
            elif down:
                self.up = time.time()
                return
            time.sleep(0.02)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return self.up


def spawn_time(pid: int | None) -> float | None:
    """Wall time a process was created, from its kernel start time (clock ticks since boot)."""
    start = mg.proc_start_time(pid) if pid else None
    if start is None:
        return None
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    return boot + start / procfs.CLK_TCK


class ExitWatch:
    """Watches /proc/<pid>/stat every 10 ms: when the process exited (zombie or gone) and when it was reaped."""

    def __init__(self, pid: int | None) -> None:
        self.pid, self.exited, self.reaped = pid, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if pid is not None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            st = procfs.stat(self.pid)
            if st is None:
                now = time.time()
                self.exited, self.reaped = self.exited or now, now
                return
            if st.gone and self.exited is None:
                self.exited = time.time()
            time.sleep(0.01)

    def stop(self) -> tuple[float | None, float | None]:
        self._stop.set()
        if self.pid is not None:
            self._thread.join()
        return self.exited, self.reaped


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    b = BACKENDS[backend]
    root = Path(tempfile.mkdtemp(prefix=f"bench-apply-{backend}-"))
    port = free_port()
    drain_s = args.drain_timeout or (30 if backend == "vllm" else 10)
    cfg = write_config(root, backend, port, drain_s)
    print(f"{backend}: workdir {root}", flush=True)
    starts, gates = direct_starts(cfg, backend, args.direct_starts)
    engine = open_engine(f"sqlite:///{root / 'tuner.db'}")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "INFO", "run"],
        stdout=open(root / "run.log", "wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    load = Load(port, TARGET, args.concurrency, args.max_tokens)
    runs: list[ApplyRun] = []
    try:
        wait_for(
            lambda: (st := jr.get_managed(engine, TARGET)) and st.pid and healthy(f"http://127.0.0.1:{port}"),
            b["start_timeout_s"] + 30,
            "tuner run to start the managed server",
            proc=daemon,
            log=root / "run.log",
            every_s=0.3,
        )
        load.start()
        time.sleep(args.warmup)  # a baseline window with traffic, and every client busy
        for i in range(args.applies):
            current = jr.get_managed(engine, TARGET).flags[b["flag"]]
            new = b["values"][1] if current == b["values"][0] else b["values"][0]
            rid = recs.add_recommendation(
                engine,
                target=TARGET,
                now=time.time(),
                rules=["bench"],
                diff_key=json.dumps({b["flag"]: new}),
                diff={b["flag"]: new},
                current={b["flag"]: current},
                evidence=[],
                expected_effect="",
                risk="",
                confidence=1.0,
                rank=1,
                memory_check={"ok": True},
            )
            watch, hw = ExitWatch(jr.get_managed(engine, TARGET).pid), HealthWatch(f"http://127.0.0.1:{port}")
            cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            c0 = time.time()
            proc = tuner_cli(cfg, "apply-recommendation", str(rid), "--yes", "--json")
            c1 = time.time()
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            exited, reaped = watch.stop()
            up, spawned = hw.stop(), spawn_time(jr.get_managed(engine, TARGET).pid)
            try:
                a = json.loads(proc.stdout)
            except ValueError:
                raise SystemExit(
                    f"apply #{i + 1} printed no JSON (exit {proc.returncode}): {proc.stderr.strip()}"
                ) from None
            steps: dict[str, float] = {}
            for s in a["steps"]:
                steps.setdefault(s["step"], s["ts_ms"] / 1000)
            stopped = next((s["detail"] for s in a["steps"] if s["step"] == "stopped"), "")
            runs.append(
                ApplyRun(
                    steps,
                    c0,
                    c1,
                    a["outcome"],
                    a["note"],
                    stopped,
                    exited,
                    reaped,
                    spawned,
                    up,
                    cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
                )
            )
            total = steps.get("healthy", c1) - steps["planned"]
            print(
                f"  apply {i + 1}/{args.applies} {b['flag']} {current}->{new}: {a['outcome']}, planned->healthy "
                f"{total:.2f}s, stopped: {stopped}",
                flush=True,
            )
            time.sleep(args.gap)  # clients back at full concurrency before the next apply
    finally:
        load.stop()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        tuner_cli(cfg, "managed", "stop", timeout=120)
    return {
        "backend": backend,
        "flag": b["flag"],
        "drain_s": drain_s,
        "starts": starts,
        "gates": gates,
        "runs": runs,
        "reqs": sorted(load.done, key=lambda r: r.start),
        "workdir": str(root),
    }


# ---- analysis --------------------------------------------------------------------------------------------


def classify(runs: list[ApplyRun], reqs: list[Req]) -> list[dict[str, Any]]:
    """Per apply: requests in flight when the drain began, and arrivals during the drain and the restart."""
    out = []
    for r in runs:
        d, s, h = r.steps["draining"], r.steps.get("stopped", r.steps["draining"]), r.steps.get("healthy", r.cli_end)
        inflight = [q for q in reqs if q.start < d < q.end]
        c: dict[str, Any] = {"inflight": len(inflight), "inflight_lost": [q for q in inflight if q.outcome != "ok"]}
        for name, lo, hi in (("drain", d, s), ("restart", s, h)):
            arrived = [q for q in reqs if lo <= q.start < hi]
            c[name] = len(arrived)
            c[name + "_ok"] = sum(q.outcome == "ok" for q in arrived)
            c[name + "_refused"] = sum(q.outcome == "refused" for q in arrived)
            c[name + "_other"] = [q for q in arrived if q.outcome not in ("ok", "refused")]
        out.append(c)
    return out


def _kinds(reqs: Any) -> str:
    counts: dict[str, int] = {}
    for q in reqs:
        counts[q.outcome] = counts.get(q.outcome, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def outside(runs: list[ApplyRun], reqs: list[Req]) -> list[Req]:
    """Failed requests that neither were in flight at a drain nor arrived between a drain and healthy."""

    def covered(q: Req) -> bool:
        return any(
            q.start < r.steps["draining"] < q.end or r.steps["draining"] <= q.start < r.steps.get("healthy", r.cli_end)
            for r in runs
        )

    return [q for q in reqs if q.outcome != "ok" and not covered(q)]


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values) * 1000
    return f"{med:,.0f} ({min(values) * 1000:,.0f}–{max(values) * 1000:,.0f})"


def _count(n: int, failed: list[Req]) -> str:
    return f"{n}" + (f" ({_kinds(failed)})" if failed else "")


def summarize(res: dict[str, Any]) -> list[tuple[str, str]]:
    runs: list[ApplyRun] = res["runs"]
    ok = [
        r
        for r in runs
        if "healthy" in r.steps
        and "stopped" in r.steps
        and r.exited is not None
        and r.spawned is not None
        and r.health_up is not None
        and r.spawned <= r.health_up
    ]

    def seg(a: str, b: str) -> list[float]:
        return [r.steps[b] - r.steps[a] for r in ok]

    total = seg("planned", "healthy")
    server_drain = [r.exited - r.steps["draining"] for r in ok]  # type: ignore[operator]
    server_start = [r.health_up - r.spawned for r in ok]  # type: ignore[operator]
    overhead = [t - d - st for t, d, st in zip(total, server_drain, server_start)]
    cls = classify(runs, res["reqs"])
    outs = outside(runs, res["reqs"])

    def tot(key: str) -> int:
        return sum(c[key] for c in cls)

    def failed(key: str) -> list[Req]:
        return [q for c in cls for q in c[key]]

    return [
        ("applies (outcome)", f"{len(runs)} ({_kinds(Req(0, 0, r.outcome) for r in runs)})"),
        (
            "CLI start -> `planned` (imports, config, reconcile, plan; not in the total)",
            ms([r.steps["planned"] - r.cli_start for r in runs]),
        ),
        ("CPU used by the `tuner apply-recommendation` process (whole run)", ms([r.cli_cpu_s for r in runs])),
        ("**apply -> healthy** (`planned` -> `healthy`)", ms(total)),
        ("**drain** (`draining` -> old server process exited)", ms(server_drain)),
        ("  journal's drain (`draining` -> `stopped`)", ms(seg("draining", "stopped"))),
        ("**server start** in the apply (new process created -> /health 200, polled every 20 ms)", ms(server_start)),
        (f"server start, direct: same argv, no tuner (-> /health 200, n={len(res['starts'])})", ms(res["starts"])),
        ("health-gate request, direct (4-token completion)", ms(res["gates"])),
        ("**tuner overhead** (apply -> healthy − drain − server start in the apply)", ms(overhead)),
        ("  `planned` -> `baseline` (baseline KPIs + journal)", ms(seg("planned", "baseline"))),
        ("  `baseline` -> `draining` (journal)", ms(seg("baseline", "draining"))),
        (
            "  old process exited -> `stopped` (stop_server still waiting)",
            ms([r.steps["stopped"] - r.exited for r in ok]),
        ),  # type: ignore[operator]
        (
            "  `stopped` -> new process created (argv, 2 journal steps, state, spawn)",
            ms([r.spawned - r.steps["stopped"] for r in ok]),
        ),  # type: ignore[operator]
        (
            "  /health 200 -> `healthy` (tuner's /health poll every 0.25 s, gate request, journal)",
            ms([r.steps["healthy"] - r.health_up for r in ok]),
        ),  # type: ignore[operator]
        (
            "observation + verdict (`healthy` -> CLI exit; not in the total)",
            ms([r.cli_end - r.steps["healthy"] for r in ok]),
        ),
        ("requests in flight when the drain began", str(tot("inflight"))),
        (
            "**in-flight lost** (of those, not answered 200)",
            _count(len(failed("inflight_lost")), failed("inflight_lost")),
        ),
        ("arrivals during the drain (`draining` -> `stopped`)", str(tot("drain"))),
        ("  answered 200", str(tot("drain_ok"))),
        ("  failed: connection refused", str(tot("drain_refused"))),
        ("  **failed otherwise (accepted, then failed)**", _count(len(failed("drain_other")), failed("drain_other"))),
        ("arrivals during the restart (`stopped` -> `healthy`)", str(tot("restart"))),
        ("  **failed: connection refused**", str(tot("restart_refused"))),
        ("  failed otherwise", _count(len(failed("restart_other")), failed("restart_other"))),
        ("  answered 200", str(tot("restart_ok"))),
        ("failed requests outside those windows", _count(len(outs), outs)),
        ("requests in all (answered 200)", f"{len(res['reqs'])} ({sum(q.outcome == 'ok' for q in res['reqs'])})"),
    ]


def print_results(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print()
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, no GPU; Python {platform.python_version()}; "
        f"load average at end {os.getloadavg()[0]:.2f}"
    )
    print(
        f"Load: {args.concurrency} clients, each one completion of max_tokens {args.max_tokens} (ignore_eos) at "
        "a time, retrying 0.2 s after a failure. Times in ms: median (min–max)."
    )
    head = ["", *(f"{r['backend']} ({r['flag']} 2<->3, drain_timeout {r['drain_s']}s)" for r in results)]
    per = [summarize(r) for r in results]
    print("| " + " | ".join(head) + " |")
    print("|---" + "|---:" * len(results) + "|")
    for i, (label, _) in enumerate(per[0]):
        print("| " + " | ".join([label, *(p[i][1] for p in per)]) + " |")
    for r in results:
        print(f"\n{r['backend']} per apply (workdir {r['workdir']}):")
        cls = classify(r["runs"], r["reqs"])
        for n, (run, c) in enumerate(zip(r["runs"], cls), 1):
            st = run.steps
            marks = dict(
                st, old_exited=run.exited, old_reaped=run.reaped, new_spawned=run.spawned, health_200=run.health_up
            )
            seq = " ".join(
                f"{k}+{(v - st['planned']) * 1000:.0f}"
                for k, v in sorted(((k, v) for k, v in marks.items() if v is not None), key=lambda kv: kv[1])
                if k != "planned"
            )
            print(
                f"  {n}: {run.outcome}; ms after planned: {seq}; stopped: {run.stopped_detail}; in flight "
                f"{c['inflight']} lost {len(c['inflight_lost'])}; drain arrivals {c['drain']} (ok {c['drain_ok']}, "
                f"refused {c['drain_refused']}, other {_kinds(c['drain_other']) or 0}); restart arrivals "
                f"{c['restart']} (ok {c['restart_ok']}, refused {c['restart_refused']}, other "
                f"{_kinds(c['restart_other']) or 0}); CLI CPU {run.cli_cpu_s:.1f}s"
            )
        seen: dict[tuple[str, str], int] = {}
        for q in r["reqs"]:
            if q.outcome not in ("ok", "refused"):
                key = (q.outcome, q.detail[:160])
                seen[key] = seen.get(key, 0) + 1
        for (outcome, detail), n in sorted(seen.items(), key=lambda kv: -kv[1])[:4]:
            print(f"  clients saw {n}x: {outcome}: {detail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("vllm", "llamacpp", "both"), default="both")
    p.add_argument("--applies", type=int, default=5, help="applies per backend (flag alternating 2<->3)")
    p.add_argument("--direct-starts", type=int, default=3, help="direct server starts per backend, without tuner")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--drain-timeout", type=int, default=0, help="seconds; default 30 for vLLM, 10 for llama-server")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds of load before the first apply")
    p.add_argument("--gap", type=float, default=4.0, help="seconds between applies")
    args = p.parse_args()
    backends = ["vllm", "llamacpp"] if args.backend == "both" else [args.backend]
    results = [run_backend(b, args) for b in backends]
    print_results(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def requests_summary(attempts: list[Req]) -> dict[str, int]:
    """Per request, not per attempt: how many requests, how many needed more than one attempt (they met the
    outage and were sent again), how many never got an answer (still failing when the load stopped)."""
    by_request: dict[tuple[int, int], list[Req]] = {}
    for r in attempts:
        by_request.setdefault(r.request, []).append(r)
    return {
        "requests": len(by_request),
        "retried": sum(1 for rs in by_request.values() if len(rs) > 1),
        "lost": sum(1 for rs in by_request.values() if not any(r.outcome == "ok" for r in rs)),
        "attempts_failed": sum(1 for r in attempts if r.outcome != "ok"),
    }
