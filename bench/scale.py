"""tuner vs Prometheus 2.42 side by side: the same endpoints, the same interval, the same time.

For each target count: start the farm (bench/farm.py), then ``tuner run`` and ``prometheus`` (both on
127.0.0.1, generated configs), let both settle for one interval, then measure over ``duration``:
CPU seconds (utime+stime+cutime+cstime from /proc/<pid>/stat), peak RSS (VmHWM), scrapes done vs
scheduled, scrape lag, samples stored. Every process is stopped on the way out, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner import procfs  # noqa: E402
from tuner.apply.launch import free_port  # noqa: E402
from tuner.lab.proc import wait_for  # noqa: E402

PROMETHEUS = os.environ.get("PROMETHEUS", "prometheus")


# ---- /proc ---------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` (its own CPU and its waited-for children's)."""
    st = procfs.stat(pid)
    if st is None:
        raise ProcessLookupError(f"pid {pid} is gone")
    return (st.cpu_ticks + st.cutime + st.cstime) / procfs.CLK_TCK


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ---- processes -----------------------------------------------------------------------------------


@dataclass
class Procs:
    """Every process the bench started; ``stop_all`` ends them (SIGTERM, then SIGKILL) by pid."""

    started: list[subprocess.Popen] = field(default_factory=list)
    pidfile: Path | None = None

    def start(self, argv: list[str], log: Path, **kw: object) -> subprocess.Popen:
        with open(log, "wb") as out:
            p = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, **kw
            )  # type: ignore[call-overload]
        self.started.append(p)
        if self.pidfile:
            self.pidfile.write_text("".join(f"{q.pid}\n" for q in self.started))
        return p

    def stop(self, p: subprocess.Popen, timeout: float = 15.0) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def stop_all(self) -> None:
        for p in reversed(self.started):
            self.stop(p)
        self.started.clear()
        if self.pidfile:
            self.pidfile.write_text("")


def get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # 127.0.0.1 only
        return r.read()


def answers(url: str) -> bool:
    """True once url answers (a process still starting refuses or resets the connection)."""
    try:
        get(url, 2)
        return True
    except OSError:
        return False


# ---- what each scraper reports -------------------------------------------------------------------


def prom_metrics(port: int) -> dict[str, float]:
    """Prometheus's own /metrics, flattened to ``name{labels}`` -> value."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(get(f"http://127.0.0.1:{port}/metrics").decode()):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = float(s.value)
    return out


def prom_query(port: int, q: str, at: float | None = None) -> float | None:
    params = {"query": q} | ({"time": f"{at:.3f}"} if at is not None else {})
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    res = json.loads(get(url))["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def lateness_ms(stamps: list[int], interval_ms: int) -> list[int]:
    """How late each of one target's scrapes ran against its own schedule (phase + k x interval). The phase is the
    least-late scrape of the bulk, found around the interval's circle from the median offset (so a target whose
    phase sits at the interval's edge, scrapes at 4.99 s and 0.01 s past a mark, is not read as 5 s late: the
    bench's 1,000-target runs until 2026-11-24 reported a lateness p99 of ~4.9 s from exactly that); lateness is
    then one-sided (a scheduler never runs a job early), in [0, interval)."""
    if not stamps:
        return []
    half = interval_ms / 2

    def around(ts: float, ref: float) -> float:
        return (ts - ref + half) % interval_ms - half

    first = around(stamps[0], 0.0)
    offsets = sorted(around(ts, first) for ts in stamps)
    centre = first + offsets[len(offsets) // 2]
    bulk = [w for w in (around(ts, centre) for ts in stamps) if abs(w) <= interval_ms / 4]
    phase = centre + min(bulk)
    return [round((ts - phase) % interval_ms) for ts in stamps]


def tuner_db_counts(db: Path, lo_ms: int, hi_ms: int, interval_ms: int) -> dict[str, float]:
    """Scrapes, rows and values tuner stored with lo <= ts < hi, and the lag of each scrape."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        q = lambda sql: con.execute(sql, (lo_ms, hi_ms)).fetchone()[0]  # noqa: E731
        plain = q("SELECT COUNT(*) FROM samples WHERE ts_ms >= ? AND ts_ms < ?")
        hist = q("SELECT COUNT(*) FROM hist_samples WHERE ts_ms >= ? AND ts_ms < ?")
        # A histogram row holds every bucket plus count and sum: count them as Prometheus would.
        buckets = q(
            "SELECT COALESCE(SUM(json_array_length(r.bounds) + 2), 0) FROM hist_samples h "
            "JOIN series r ON r.id = h.series_id WHERE h.ts_ms >= ? AND h.ts_ms < ?"
        )
        ok = q("SELECT COUNT(*) FROM scrapes WHERE health != 'down' AND ts_ms >= ? AND ts_ms < ?")
        failed = q("SELECT COUNT(*) FROM scrapes WHERE health = 'down' AND ts_ms >= ? AND ts_ms < ?")
        gaps = [
            r[0]
            for r in con.execute(
                "SELECT ts_ms - LAG(ts_ms) OVER (PARTITION BY target_id ORDER BY ts_ms) FROM scrapes "
                "WHERE ts_ms >= ? AND ts_ms < ?",
                (lo_ms, hi_ms),
            )
            if r[0] is not None
        ]
        # Lateness against each target's own schedule: its least-late scrape in the run sets the phase.
        by_target: dict[int, list[int]] = {}
        for tid, ts in con.execute(
            "SELECT target_id, ts_ms FROM scrapes WHERE ts_ms >= ? - ? AND ts_ms < ?", (lo_ms, 600_000, hi_ms)
        ):
            by_target.setdefault(tid, []).append(ts)
        late = []
        for stamps in by_target.values():
            late += [d for ts, d in zip(stamps, lateness_ms(stamps, interval_ms)) if ts >= lo_ms]
        durations = sorted(
            r[0] for r in con.execute("SELECT duration_s FROM scrapes WHERE ts_ms >= ? AND ts_ms < ?", (lo_ms, hi_ms))
        )
    finally:
        con.close()
    return {
        "rows": plain + hist,
        "values": plain + buckets,
        "ok": ok,
        "failed": failed,
        "gaps_ms": sorted(gaps),
        "durations": durations,
        "late_ms": sorted(late),
    }  # type: ignore[dict-item]


def quantile(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


# ---- one run -------------------------------------------------------------------------------------


def run_one(
    n: int,
    interval_s: float,
    duration_s: float,
    fixture: Path,
    work: Path,
    procs: Procs,
    profile: bool = False,
    signals: bool = True,
    source: str = "direct",
    warmup_s: float | None = None,
) -> dict[str, object]:
    """tuner and Prometheus over the same ``n`` endpoints. ``source="prometheus"``: tuner reads every target
    from that Prometheus instead (the fleet path), and after the run both ways of reading it are timed in this
    process: the whole fleet in one call (what the daemon does) and one target at a time."""
    work.mkdir(parents=True, exist_ok=True)
    ports_file = work / "ports.txt"
    farm_log = work / "farm.log"
    farm = procs.start(
        [
            sys.executable,
            str(ROOT / "bench" / "farm.py"),
            "--targets",
            str(n),
            "--fixture",
            str(fixture),
            "--ports-file",
            str(ports_file),
        ],
        farm_log,
    )
    wait_for(ports_file.exists, 120, "the farm's ports", proc=farm, log=farm_log, every_s=0.2)
    ports = ports_file.read_text().split()

    timeout_s = min(3.0, interval_s)
    tuner_port, prom_port = free_port(), free_port()
    db = work / "tuner.db"
    cfg = {
        "store": {"url": f"sqlite:///{db}"},
        "listen": f"127.0.0.1:{tuner_port}",
        "gpu": {"source": "none"},
        "defaults": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{timeout_s:g}s"},
        "targets": [
            {"name": f"t{i:04d}", "backend": "vllm", "url": f"http://127.0.0.1:{p}"} for i, p in enumerate(ports)
        ],
    }
    if source == "prometheus":
        cfg["prometheus"] = {"url": f"http://127.0.0.1:{prom_port}"}
        for t in cfg["targets"]:  # type: ignore[union-attr]
            t["source"] = "prometheus"  # type: ignore[index]
    (work / "tuner.yaml").write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    tuner_bin = str(Path(sys.executable).parent / "tuner")
    subprocess.run([tuner_bin, "--config", str(work / "tuner.yaml"), "db", "upgrade"], check=True, capture_output=True)
    # Each series carries its target's name, as the exported rules expect. Where tuner evaluates its rules,
    # Prometheus evaluates the same pack (`tuner alerts export`) on the same interval: the same work each side.
    prom_cfg: dict[str, object] = {
        "global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{timeout_s:g}s"},
        "scrape_configs": [
            {
                "job_name": "vllm",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{p}"], "labels": {"target": f"t{i:04d}"}} for i, p in enumerate(ports)
                ],
            }
        ],
    }
    if signals and source == "direct":
        subprocess.run(
            [tuner_bin, "--config", str(work / "tuner.yaml"), "alerts", "export", "-o", str(work / "prom-rules.yml")],
            check=True,
            capture_output=True,
        )
        prom_cfg["global"]["evaluation_interval"] = "15s"  # type: ignore[index]  # tuner's default
        prom_cfg["rule_files"] = [str(work / "prom-rules.yml")]
    (work / "prometheus.yml").write_text(json.dumps(prom_cfg, indent=1))
    tuner_log, prom_log = work / "tuner.log", work / "prometheus.log"
    tuner_argv = [tuner_bin] if signals else [sys.executable, str(ROOT / "bench" / "tuner_nosignals.py")]
    tuner = procs.start([*tuner_argv, "--config", str(work / "tuner.yaml"), "--log-level", "WARNING", "run"], tuner_log)
    prom = procs.start(
        [
            PROMETHEUS,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
        prom_log,
    )
    wait_for(
        lambda: answers(f"http://127.0.0.1:{tuner_port}/metrics"),
        120,
        "tuner's /metrics",
        proc=tuner,
        log=tuner_log,
        every_s=0.2,
    )
    wait_for(
        lambda: answers(f"http://127.0.0.1:{prom_port}/-/ready"),
        120,
        "prometheus to be ready",
        proc=prom,
        log=prom_log,
        every_s=0.2,
    )
    # Both spread first scrapes over one interval: measure from the second interval on (or after ``warmup_s``:
    # tuner's alert rules read up to 5 minutes of history each evaluation, so their cost grows until it is there).
    warmup_s = interval_s * 1.5 if warmup_s is None else max(warmup_s, interval_s * 1.5)
    time.sleep(warmup_s)

    pids = {"tuner": tuner.pid, "prometheus": prom.pid, "farm": farm.pid}
    load_start = loadavg()
    m0 = prom_metrics(prom_port)
    t0, c0 = time.time(), {k: cpu_seconds(p) for k, p in pids.items()}
    spy = start_profiler(tuner.pid, duration_s, work / "tuner.pyspy.txt", procs) if profile else None
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:  # bounded: ends at the deadline, or when a scraper dies
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        for name, p in (("tuner", tuner), ("prometheus", prom), ("farm", farm)):
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode} during the run; see {work}")
    t1, c1 = time.time(), {k: cpu_seconds(p) for k, p in pids.items()}
    rss = {k: peak_rss_bytes(p) for k, p in pids.items()}
    m1 = prom_metrics(prom_port)
    load_end = loadavg()
    q99 = f"prometheus_target_interval_length_seconds{{interval={interval_s:g}s,quantile=0.99}}"
    q50 = f"prometheus_target_interval_length_seconds{{interval={interval_s:g}s,quantile=0.5}}"
    prom_dur = prom_query(prom_port, "quantile(0.99, scrape_duration_seconds)")
    # Scrapes Prometheus stored in (t0, t1]: one `up` sample each.
    prom_scrapes = prom_query(prom_port, f"sum(count_over_time(up[{int((t1 - t0) * 1000)}ms]))", at=t1) or 0.0
    if spy is not None:
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            procs.stop(spy)
    procs.stop(tuner)  # tuner's in-flight scrapes finish; then its store is read
    reads = read_costs(work / "tuner.yaml", prom.pid) if source == "prometheus" else {}
    procs.stop(prom)
    procs.stop(farm)

    elapsed = t1 - t0
    scheduled = n * elapsed / interval_s
    tdb = tuner_db_counts(db, int(t0 * 1000), int(t1 * 1000), int(interval_s * 1000))
    late = [x / 1000 for x in tdb["late_ms"]]  # type: ignore[union-attr]
    gaps = [g / 1000 - interval_s for g in tdb["gaps_ms"]]  # type: ignore[union-attr]
    prom_samples = (
        (
            m1["prometheus_tsdb_head_samples_appended_total{type=float}"]
            - m0["prometheus_tsdb_head_samples_appended_total{type=float}"]
        )
        if "prometheus_tsdb_head_samples_appended_total{type=float}" in m1
        else m1["prometheus_tsdb_head_samples_appended_total"] - m0["prometheus_tsdb_head_samples_appended_total"]
    )
    tuner_scrapes = tdb["ok"]
    spy_out = work / "tuner.pyspy.txt"
    return {
        "profile": profile_summary(spy_out) if profile and spy_out.exists() else [],
        "targets": n,
        "signals": signals,
        "source": source,
        "reads": reads,
        "interval_s": interval_s,
        "warmup_s": warmup_s,
        "elapsed_s": elapsed,
        "scheduled": scheduled,
        "load_start": load_start,
        "load_end": load_end,
        "cpu_s": {k: c1[k] - c0[k] for k in pids},
        "peak_rss": rss,
        "tuner": {
            "scrapes_ok": tuner_scrapes,
            "scrapes_failed": tdb["failed"],
            "rows": tdb["rows"],
            "values": tdb["values"],
            "lag_p50_s": quantile(gaps, 0.5),
            "lag_p99_s": quantile(gaps, 0.99),
            "lag_max_s": gaps[-1] if gaps else None,
            "late_p50_s": quantile(late, 0.5),
            "late_p99_s": quantile(late, 0.99),
            "duration_p99_s": quantile(tdb["durations"], 0.99),
        },  # type: ignore[arg-type]
        "prometheus": {
            "scrapes_ok": prom_scrapes,
            "samples": prom_samples,
            "lag_p50_s": (m1.get(q50, float("nan")) - interval_s),
            "lag_p99_s": (m1.get(q99, float("nan")) - interval_s),
            "duration_p99_s": prom_dur,
        },
    }


def read_costs(config: Path, prom_pid: int, rounds: int = 3, alone: int = 50) -> dict[str, float]:
    """CPU per target of reading targets from Prometheus, here and in Prometheus: the whole fleet in one
    scrape_fleet call, and ``alone`` of them one scrape_via_prometheus call each (the old per-target job)."""
    from tuner.collect.promsource import scrape_fleet, scrape_via_prometheus
    from tuner.config import load_config

    cfg = load_config(config)
    assert cfg.prometheus is not None
    url, targets = cfg.prometheus.url, list(cfg.targets)
    out: dict[str, float] = {}
    for label, calls in (
        ("fleet", [lambda: scrape_fleet(url, targets, timeout_s=60)] * rounds),
        ("alone", [lambda t=t: scrape_via_prometheus(url, t, timeout_s=60) for t in targets[:alone]]),
    ):
        n = len(targets) * rounds if label == "fleet" else min(alone, len(targets))
        c0, p0, w0 = time.process_time(), cpu_seconds(prom_pid), time.monotonic()
        for call in calls:
            call()
        out[f"{label}_us"] = (time.process_time() - c0) / n * 1e6
        out[f"{label}_prometheus_us"] = (cpu_seconds(prom_pid) - p0) / n * 1e6
        out[f"{label}_wall_us"] = (time.monotonic() - w0) / n * 1e6
    return out


# ---- where tuner's time goes ---------------------------------------------------------------------

_STAGES = (  # (stage, frame substring); a stack counts for the first stage it contains
    ("scrape: HTTP GET /metrics + /health", "get (tuner/collect/http.py"),
    ("scrape: read by the learned layout", "read (tuner/collect/layout.py"),
    ("scrape: learn a new layout", "learn (tuner/collect/layout.py"),
    ("scrape: parse exposition (new shape)", "parse_exposition (tuner/collect/exposition.py"),
    ("scrape: assemble engines (new shape)", "assemble_engines (tuner/collect/assemble.py"),
    ("store: write (one transaction per batch)", "write (tuner/store/store.py"),
    ("signals: store.window", "window (tuner/store/store.py"),
    ("signals: compute_signals", "compute_signals (tuner/signals/derive.py"),
    ("rules: evaluate (signals aside)", "evaluate_group (tuner/app/alerting.py"),
    ("retention", "apply_retention (tuner/store/retention.py"),
    ("exporter /metrics", "tuner/daemon/metrics.py"),
    ("scrape job (the rest)", "scrape_once (tuner/daemon/scraping.py"),
    ("scheduler (tuner's scrape loop + its worker pool)", "tuner/daemon/scrapeloop.py"),
    ("scheduler (APScheduler)", "apscheduler/"),
    ("worker threads (idle or between jobs)", "concurrent/futures/thread.py"),
)


def profile_summary(raw: Path) -> list[tuple[str, float]]:
    """py-spy raw (collapsed) stacks → share of active samples per stage, largest first."""
    totals: dict[str, int] = {}
    all_ = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        all_ += n
        stage = next((name for name, frag in _STAGES if frag in stack), "other")
        totals[stage] = totals.get(stage, 0) + n
    return sorted(((k, v / all_) for k, v in totals.items()), key=lambda kv: -kv[1]) if all_ else []


def start_profiler(pid: int, seconds: float, out: Path, procs: Procs) -> subprocess.Popen | None:
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return None
    return procs.start(
        [
            str(spy),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "50",
            # --gil: only the thread holding the GIL, i.e. where tuner's Python CPU goes. In
            # --nonblocking mode py-spy cannot ask the OS which threads run, and its heuristic
            # counts threads blocked on a lock or a socket as busy (py-spy issue #480).
            "--gil",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out),
        ],
        out.with_suffix(".log"),
    )
