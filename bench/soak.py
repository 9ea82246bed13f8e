"""A long life under churn, outages, reloads and racing applies: does `tuner run` lose or double anything?

    python bench/soak.py --minutes 60 [--targets 50] [--churn 6] [--am-period 150] [--work DIR] [--no-write]

One `tuner run` scrapes ``--targets`` endpoints of bench/farm.py every 5 s; each endpoint renames its
``model_name`` label every ``--churn`` scrapes (new series, engine configs and alerts keep coming, old ones go
quiet). Retention is short (raw 10m, rollup 20m, rollup_step 1m) so the daemon's retention job (every 10 min)
prunes many times. Beside the default pack, a rule group fires on every engine seen (so each churn fires and
resolves 2 x ``--targets`` alerts). The notifications go to a real Alertmanager (prometheus-alertmanager) through a
recording proxy (it forwards each POST and keeps a hash of every body Alertmanager accepted); Alertmanager
itself sends to a webhook here. Then, until the time is up:

  * Alertmanager is stopped for ``--am-period`` seconds, started for as long, and so on (down half the time);
  * every minute the rule file is rewritten, good and broken in turn (broken: not UTF-8, a NaN threshold, a YAML
    syntax error, an unknown signal, missing), and the daemon gets SIGHUP; each reload's outcome is read from
    tuner's /metrics (``tuner_job_error{job="rules"}``: set after a broken file, cleared after a good one);
  * every minute a recommendation is stored for target ``soak-00`` (its route is a hook: a tiny script that logs
    each invocation's start and end), and two POST /api/v1/recommendations/ID/apply are sent at the same instant;
  * every minute the store's file size and row counts, tuner's RSS and its outbox are sampled.

At the end Alertmanager stays up until the outbox is empty, and tuner is stopped with SIGTERM. Reported: crashes
(the daemon exiting before it is stopped, or not exiting 0), double applies (two 202s to one race; hook runs that
overlap; two applies of one recommendation; applies of the target that overlap in the journal; hook runs the
journal does not hold), duplicate notifications (a body Alertmanager accepted twice; Alertmanager's own count of
alerts received against what the proxy saw accepted), notifications lost (each alert transition the daemon
recorded, read from alert_events every minute, found in an accepted POST), tracebacks in the daemon's log, and
whether the store is flat after retention (the peak of the last quarter of the run against the quarter before,
once retention has pruned at the rollup age). The numbers go to bench/results/YYYY-MM-DD-HHMM-soak.md
(``--no-write``: printed only) and the summary row `soak` of bench/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from bench.summary import results_path, update_readme  # noqa: E402
from tuner.apply.flow import flags_in_force  # noqa: E402
from tuner.apply.launch import free_port  # noqa: E402
from tuner.config import load_config  # noqa: E402
from tuner.lab.proc import wait_for  # noqa: E402
from tuner.store import journal as jr  # noqa: E402
from tuner.store import recommendations as recs  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "metrics_under_load.txt"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "prometheus-alertmanager"
TOKEN = "soak-token-0123456789abcdef0123"
APPLY_TARGET = "soak-00"
RETENTION = {"raw": "10m", "rollup": "20m", "rollup_step": "1m"}
RETENTION_EVERY_MIN = 10  # the daemon's retention job runs this often (tuner/daemon/jobs.py)
RESEND_S = 60.0  # alerting.resend_delay
NOTIFY_TIMEOUT_S = 5.0  # tuner's POST to Alertmanager gives up after this (tuner/notify/alertmanager.py)
# What retention prunes: judged flat once it has settled.
PRUNED = (
    "samples",
    "hist_samples",
    "scrapes",
    "series",
    "engine_configs",
    "alert_events",
    "alert_states",
    "alert_outbox",
)
# The apply journal and the proposals it applied: an audit kept by design, one entry an apply (the soak makes one a
# minute, sixty times auto mode's default budget); counted, not judged.
JOURNAL = ("applies", "apply_steps", "recommendations")
TABLES = PRUNED + JOURNAL

GOOD_RULES = """groups:
  - name: soak
    interval: 5s
    rules:
      - alert: SoakEngineSeen      # one per engine and model_name: each churn fires a new one, the old resolves
        signal: kv_cache_usage
        op: ">="
        threshold: 0
        window: 20s
        for: 0s
        backend: vllm
        labels: {severity: info}
        annotations: {summary: "{{ $labels.target }} serves {{ $labels.model_name }}"}
"""
# Each broken file the reload must refuse, keeping the last good set: (what, bytes or None for a missing file).
BROKEN_RULES: list[tuple[str, bytes | None]] = [
    ("not UTF-8", b"groups:\n  - name: soak\n    rules: []\n# \xff\xfe\xfd latin-1 \xe9\n"),
    ("a NaN threshold", GOOD_RULES.replace("threshold: 0", "threshold: .nan").encode()),
    ("a YAML syntax error", b"groups:\n  - name: soak\n    rules: [\n"),
    ("an unknown signal", GOOD_RULES.replace("signal: kv_cache_usage", "signal: no_such_signal").encode()),
    ("missing", None),
]

HOOK = """import fcntl, json, os, sys, time
start = time.time()
time.sleep(0.5)  # a restart takes a while: two runs at once would overlap
with open(sys.argv[1], "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps({"pid": os.getpid(), "start": start, "end": time.time(), "argv": sys.argv[2:]}) + "\\n")
"""


# ---- the parts ----------------------------------------------------------------------------------------------------


class Proxy:
    """Between tuner and Alertmanager: forwards each POST and keeps, for every body Alertmanager accepted (2xx), its
    sha256, how long Alertmanager took to answer and its alerts. While Alertmanager is down it drops the connection
    unanswered, as a dead Alertmanager's port would."""

    def __init__(self, upstream_port: int) -> None:
        self.accepted: list[tuple[str, float]] = []  # (body_key, seconds Alertmanager took), in order
        self.alerts: list[dict] = []  # every alert of every accepted body
        self.bodies: list[tuple[float, bytes]] = []  # (when, body) accepted: kept in the work directory
        self.refused = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                began = time.monotonic()
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                    conn.request("POST", self.path, body, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    answer, status = resp.read(), resp.status
                    conn.close()
                except OSError:
                    with proxy.lock:
                        proxy.refused += 1
                    self.close_connection = True
                    return
                if 200 <= status < 300:
                    with proxy.lock:
                        proxy.accepted.append((body_key(body), time.monotonic() - began))
                        proxy.alerts.extend(json.loads(body))
                        proxy.bodies.append((time.time(), body))
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Webhook:
    """Alertmanager's receiver: counts the notifications it sends and the alerts in them."""

    def __init__(self) -> None:
        self.notifications = 0
        self.alerts = 0
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                hook.notifications += 1
                hook.alerts += len(body.get("alerts", []))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Alertmanager:
    """A real Alertmanager on a fixed port, stopped and started; its alerts-received counter summed over its lives."""

    def __init__(self, home: Path, webhook_url: str) -> None:
        self.home, self.port = home, free_port()
        self.proc: subprocess.Popen | None = None
        self.received = 0.0  # alertmanager_alerts_received_total over every life, read before each stop
        self.starts = 0
        home.mkdir(parents=True, exist_ok=True)
        (home / "am.yml").write_text(
            json.dumps(
                {
                    "route": {
                        "receiver": "hook",
                        "group_by": ["alertname", "target"],
                        "group_wait": "1s",
                        "group_interval": "5s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
                }
            )
        )

    def _get(self, path: str) -> tuple[int, bytes] | None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3)
            conn.request("GET", path)
            resp = conn.getresponse()
            out = resp.status, resp.read()
            conn.close()
            return out
        except OSError:
            return None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "nice",
                "-n",
                "5",
                ALERTMANAGER,
                f"--config.file={self.home / 'am.yml'}",
                f"--storage.path={self.home / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=open(self.home / "am.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        wait_for(
            lambda: (self._get("/-/ready") or (0, b""))[0] == 200,
            60,
            "Alertmanager ready",
            proc=self.proc,
            log=self.home / "am.log",
        )
        self.starts += 1

    def received_now(self) -> float:
        got = self._get("/metrics")
        if got is None:
            return 0.0
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in got[1].decode().splitlines()
            if line.startswith("alertmanager_alerts_received_total")
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.received += self.received_now()
            self.proc.terminate()
            self.proc.wait(30)
        self.proc = None

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# ---- the outbox's rows, counted as tuner queues them ------------------------------------------------------------

# Every notification tuner queues is a row of alert_outbox, deleted once an Alertmanager took it. Two rows can hold
# the same bytes (a batch of resolved alerts resent a resend delay later, several of them queued while Alertmanager
# was down), so a body's hash alone cannot tell a second row from the same row posted twice. A trigger the soak
# adds to the store (outside tuner's schema) copies each new row's payload into soak_outbox_audit, and the soak
# moves them out every minute (the table stays small): how many rows held each body, against how many times
# Alertmanager accepted it.
AUDIT = """
CREATE TABLE IF NOT EXISTS soak_outbox_audit (id INTEGER PRIMARY KEY AUTOINCREMENT, payload TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS soak_outbox_audit AFTER INSERT ON alert_outbox
BEGIN INSERT INTO soak_outbox_audit (payload) VALUES (new.payload); END;
"""


def body_key(body: bytes | str) -> str:
    """A body's identity, whatever its JSON spacing: sha256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(json.loads(body), sort_keys=True).encode()).hexdigest()


def drain_audit(db: Path, queued: dict[str, int]) -> None:
    """Count the rows tuner queued since the last call (by body) into ``queued``, and delete them from the audit."""
    conn = sqlite3.connect(db, timeout=60)
    try:
        rows = conn.execute("SELECT id, payload FROM soak_outbox_audit ORDER BY id").fetchall()
        for _, payload in rows:
            k = body_key(payload)
            queued[k] = queued.get(k, 0) + 1
        if rows:
            with conn:
                conn.execute("DELETE FROM soak_outbox_audit WHERE id <= ?", (rows[-1][0],))
    finally:
        conn.close()


def sent_against_queued(accepted: dict[str, int], queued: dict[str, int]) -> tuple[int, int]:
    """(bodies Alertmanager accepted more often than tuner queued them: duplicates, rows queued that Alertmanager
    never accepted), summed over bodies."""
    dup = sum(max(0, n - queued.get(k, 0)) for k, n in accepted.items())
    never = sum(max(0, n - accepted.get(k, 0)) for k, n in queued.items())
    return dup, never


# ---- what is measured, and the verdicts over it --------------------------------------------------------------------


@dataclass
class Race:
    minute: float
    rec_id: int
    statuses: list[int]
    errors: list[str]


@dataclass
class Reload:
    minute: float
    what: str  # "good" or the kind of broken file
    expected_error: bool
    got_error: bool | None  # None: the daemon said nothing in time
    seconds: float = 0.0  # until /metrics showed the outcome

    @property
    def ok(self) -> bool:
        return self.got_error is self.expected_error


@dataclass
class Sample:
    minute: float
    file_bytes: int
    rows: dict[str, int]
    rss_bytes: int
    outbox: float | None


@dataclass
class Soak:
    races: list[Race] = field(default_factory=list)
    reloads: list[Reload] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    transitions: dict[int, tuple[str, str, str, int]] = field(default_factory=dict)  # event id -> labels, from, to, ts
    am_downs: int = 0
    exit_code: int | None = None


def overlapping(runs: list[tuple[float, float]]) -> int:
    """How many of these (start, end) intervals begin before the one before them (sorted by start) has ended."""
    runs = sorted(runs)
    out, end = 0, float("-inf")
    for s, e in runs:
        if s < end:
            out += 1
        end = max(end, e)
    return out


def double_applies(races: list[Race], hook_runs: list[dict], applies: list[jr.StoredApply]) -> dict[str, int]:
    """Every way an apply could have run twice, counted (0 each: none did)."""
    by_rec: dict[int, int] = {}
    for a in applies:
        if a.recommendation_id is not None and a.kind == "apply":
            by_rec[a.recommendation_id] = by_rec.get(a.recommendation_id, 0) + 1
    spans = [(a.created_ms / 1000, a.updated_ms / 1000 if a.state == "done" else float("inf")) for a in applies]
    journaled_hooks = sum(1 for a in applies for s in a.steps if s["step"] == "hook")
    return {
        "races with two 202s": sum(1 for r in races if r.statuses.count(202) > 1),
        "hook runs overlapping another": overlapping([(h["start"], h["end"]) for h in hook_runs]),
        "recommendations applied twice": sum(1 for n in by_rec.values() if n > 1),
        "applies overlapping another in the journal": overlapping(spans),
        "hook runs the journal does not hold": max(0, len(hook_runs) - journaled_hooks),
    }


def flat(samples: list[Sample], settle_min: float, *, tolerance: float = 0.10) -> dict[str, tuple[float, float, bool]]:
    """The store after retention has settled: for the file size and the rows of each table retention prunes, (the peak of the quarter of
    the run before the last, the peak of the last quarter, last <= (1 + tolerance) x before). Empty when the run is
    too short to have a settled half (settle_min: when retention has pruned at the rollup age)."""
    settled = [s for s in samples if s.minute >= settle_min]
    if len(settled) < 4:
        return {}
    mid = settled[len(settled) // 2].minute
    before, last = [s for s in settled if s.minute < mid], [s for s in settled if s.minute >= mid]
    out = {}
    for key in ("file_bytes", *PRUNED):

        def value(s: Sample, key: str = key) -> float:
            return float(s.file_bytes if key == "file_bytes" else s.rows.get(key, 0))

        a, b = max(map(value, before)), max(map(value, last))
        out[key] = (a, b, b <= (1 + tolerance) * a + 64)  # + 64: a table of a few rows may hold a few more
    return out


def _ts(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ---- the run ------------------------------------------------------------------------------------------------------


def _config(work: Path, ports: list[int], am_url: str, listen: int, hook_log: Path) -> Path:
    hook = [sys.executable, str(work / "hook.py"), str(hook_log), "{target}", "{flags}"]
    lines = [
        f"store: {{url: 'sqlite:///{work / 'tuner.db'}', retention: {json.dumps(RETENTION)}}}",
        f"listen: 127.0.0.1:{listen}",
        "defaults: {scrape_interval: 5s, scrape_timeout: 3s}",
        "gpu: {source: none}",
        f"api: {{token_file: '{work / 'token'}'}}",
        "alerting: "
        + json.dumps(
            {
                "rule_files": [str(ROOT / "alerts" / "default.yaml"), "rules.yaml"],
                "evaluation_interval": "15s",
                "resend_delay": f"{RESEND_S:g}s",
                "alertmanagers": [am_url],
            }
        ),
        "targets:",
    ]
    for i, port in enumerate(ports):
        name = f"soak-{i:02d}"
        lines.append(f"  - {{name: {name}, backend: vllm, url: 'http://127.0.0.1:{port}', flags: {{max-num-seqs: 4}}")
        if name == APPLY_TARGET:
            lines[-1] += ", apply: " + json.dumps(
                {
                    "hook": {"command": hook, "timeout": "1m"},
                    "baseline": "1m",
                    "observe": "40s",
                    "observe_max": "40s",
                    "on_inconclusive": "keep",
                    "min_requests": 0,
                    "max_restarts_per_hour": 1000,
                }
            )
        lines[-1] += "}"
    (work / "token").write_text(TOKEN + "\n")
    os.chmod(work / "token", 0o600)
    (work / "hook.py").write_text(HOOK)
    (work / "rules.yaml").write_text(GOOD_RULES)
    cfg = work / "tuner.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def _tuner(*args: str, cfg: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _metric(port: int, name: str, **labels: str) -> float | None | bool:
    """A sample of tuner's /metrics: its value; None when absent; False when /metrics did not answer."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except OSError:
        return False
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return None


def _post(port: int, path: str, barrier: threading.Barrier, out: list, i: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.connect()
        barrier.wait(30)  # both connected: the two requests leave at the same instant
        conn.request("POST", path, headers={"Authorization": f"Bearer {TOKEN}", "Content-Length": "0"})
        resp = conn.getresponse()
        out[i] = (resp.status, resp.read().decode(errors="replace")[:300])
    except Exception as exc:  # noqa: BLE001  (counted: a race must be answered)
        out[i] = (0, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def race(engine: Any, cfg: Any, port: int, minute: float) -> Race:
    """Store a proposal for the apply target against its flags in force, and send two applies of it at once."""
    t = cfg.target(APPLY_TARGET)
    now_flags = flags_in_force(engine, t)
    cur = int(now_flags.get("max_num_seqs", 4))
    diff = {"max_num_seqs": 8 if cur == 4 else 4}
    rec_id = recs.add_recommendation(
        engine,
        target=APPLY_TARGET,
        now=time.time(),
        rules=["soak"],
        diff_key=json.dumps(diff, sort_keys=True),
        diff=diff,
        current={"max_num_seqs": cur},
        evidence=[],
        expected_effect="soak",
        risk="none",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    barrier, out = threading.Barrier(2), [(0, ""), (0, "")]
    threads = [
        threading.Thread(target=_post, args=(port, f"/api/v1/recommendations/{rec_id}/apply", barrier, out, i))
        for i in range(2)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    return Race(minute, rec_id, [s for s, _ in out], [e for s, e in out if s != 202])


def sample(db: Path, pid: int, port: int, minute: float) -> Sample:
    size = sum(p.stat().st_size for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists())
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        conn.close()
    try:
        rss = next(
            int(line.split()[1]) * 1024
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
    except (OSError, StopIteration):
        rss = 0
    queued = _metric(port, "tuner_alert_notifications_queued")
    return Sample(minute, size, rows, rss, queued if isinstance(queued, float) else None)


def read_transitions(db: Path, soak: Soak) -> None:
    """New alert_events rows (retention prunes them later): every transition the daemon recorded."""
    last = max(soak.transitions, default=0)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        for eid, labels, frm, to, ts in conn.execute(
            "SELECT id, labels, from_state, to_state, ts_ms FROM alert_events WHERE id > ? ORDER BY id", (last,)
        ):
            soak.transitions[eid] = (json.dumps(json.loads(labels), sort_keys=True), frm, to, ts)
    finally:
        conn.close()


def run(args: argparse.Namespace, work: Path) -> tuple[Soak, dict[str, Any]]:
    soak = Soak()
    started = time.time()
    ports_file = work / "ports.txt"
    farm = subprocess.Popen(
        [
            "nice",
            "-n",
            "5",
            sys.executable,
            str(ROOT / "bench" / "farm.py"),
            "--targets",
            str(args.targets),
            "--fixture",
            str(FIXTURE),
            "--ports-file",
            str(ports_file),
            "--churn",
            str(args.churn),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "farm.log", "ab"),
    )
    webhook = Webhook()
    am = Alertmanager(work / "am", webhook.url)
    proxy = Proxy(am.port)
    listen = free_port()
    tuner: subprocess.Popen | None = None
    log = work / "tuner.log"
    try:
        wait_for(ports_file.exists, 60, "the farm's ports", proc=farm, log=work / "farm.log")
        ports = [int(p) for p in ports_file.read_text().split()]
        cfg_path = _config(work, ports, proxy.url, listen, work / "hook.log")
        up = _tuner("db", "upgrade", cfg=cfg_path)
        assert up.returncode == 0, up.stderr
        with sqlite3.connect(work / "tuner.db") as conn:
            conn.executescript(AUDIT)
        queued: dict[str, int] = {}
        cfg = load_config(cfg_path)
        engine = open_engine(f"sqlite:///{work / 'tuner.db'}")
        am.start()

        def start_tuner() -> subprocess.Popen:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", "--config", str(cfg_path), "run"],
                stdout=subprocess.DEVNULL,
                stderr=open(log, "ab"),
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            wait_for(
                lambda: _metric(listen, "tuner_scrapes_total") is not False, 120, "tuner's /metrics", proc=proc, log=log
            )
            return proc

        tuner = start_tuner()
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_am = t0 + args.am_period
        next_hup = t0 + 60
        next_race = t0 + 30
        next_sample = t0
        hups = 0
        print(f"soak: {args.targets} targets, {args.minutes:g} min; work {work}; tuner log {log}", flush=True)
        while time.monotonic() < end:
            now = time.monotonic()
            minute = (now - t0) / 60
            if tuner.poll() is not None:
                soak.crashes.append(
                    f"minute {minute:.1f}: exited {tuner.returncode}: "
                    + " | ".join(log.read_text(errors="replace").splitlines()[-3:])
                )
                print(f"  CRASH {soak.crashes[-1]}", flush=True)
                tuner = start_tuner()
            if now >= next_am:
                if am.up:
                    am.stop()
                    soak.am_downs += 1
                else:
                    am.start()
                next_am += args.am_period
            if now >= next_hup:
                good = hups % 2 == 0
                what, data = ("good", GOOD_RULES.encode()) if good else BROKEN_RULES[(hups // 2) % len(BROKEN_RULES)]
                rules = work / "rules.yaml"
                if data is None:
                    rules.unlink(missing_ok=True)
                else:
                    rules.write_bytes(data)
                tuner.send_signal(signal.SIGHUP)
                got: bool | None = None
                hup_at = time.monotonic()
                while time.monotonic() < hup_at + 90:
                    v = _metric(listen, "tuner_job_error", job="rules")
                    if v is not False and bool(v) is (not good):
                        got = not good
                        break
                    time.sleep(0.5)
                soak.reloads.append(Reload(minute, what, not good, got, time.monotonic() - hup_at))
                hups += 1
                next_hup += 60
            if now >= next_race:
                r = race(engine, cfg, listen, minute)
                soak.races.append(r)
                next_race += 60
            if now >= next_sample:
                s = sample(work / "tuner.db", tuner.pid, listen, minute)
                read_transitions(work / "tuner.db", soak)
                drain_audit(work / "tuner.db", queued)
                soak.samples.append(s)
                r = soak.races[-1].statuses if soak.races else []
                print(
                    f"  min {minute:5.1f}: store {s.file_bytes / 2**20:6.1f} MiB, samples {s.rows['samples']:,}, "
                    f"series {s.rows['series']:,}, outbox {s.outbox}, rss {s.rss_bytes / 2**20:.0f} MiB, "
                    f"AM {'up' if am.up else 'down'}, last race {r}, reloads ok "
                    f"{sum(x.ok for x in soak.reloads)}/{len(soak.reloads)}",
                    flush=True,
                )
                next_sample += 60
            time.sleep(0.5)
        # the end: Alertmanager up until tuner's outbox is empty, then a clean stop
        if not am.up:
            am.start()
        drained = True
        try:
            wait_for(
                lambda: _metric(listen, "tuner_alert_notifications_queued") == 0.0,
                600,
                "the outbox drained",
                proc=tuner,
                log=log,
                every_s=1.0,
            )
        except AssertionError as exc:
            drained = False
            print(f"  {exc}", flush=True)
        read_transitions(work / "tuner.db", soak)
        last_eval = time.time()
        tuner.send_signal(signal.SIGTERM)
        soak.exit_code = tuner.wait(120)
        tuner = None
        time.sleep(2)  # Alertmanager's last webhook notifications
        am.stop()
        drain_audit(work / "tuner.db", queued)
        applies = jr.list_applies(engine, target=APPLY_TARGET, limit=100000)
        hook_log = work / "hook.log"
        hook_runs = [json.loads(line) for line in hook_log.read_text().splitlines()] if hook_log.exists() else []
        engine.dispose()
        with proxy.lock:
            accepted = list(proxy.accepted)
            alerts = list(proxy.alerts)
            with open(work / "accepted.jsonl", "w") as f:
                for when, body in proxy.bodies:
                    f.write(json.dumps({"at": when, "alerts": json.loads(body)}) + "\n")
        text = log.read_text(errors="replace")
        facts = {
            "started": started,
            "ended": time.time(),
            "drained": drained,
            "applies": applies,
            "hook_runs": hook_runs,
            "accepted": accepted,
            "queued": queued,
            "alerts_accepted": alerts,
            "am_received": am.received,
            "am_starts": am.starts,
            "refused": proxy.refused,
            "webhook": (webhook.notifications, webhook.alerts),
            "tracebacks": text.count("Traceback"),
            "log_lines": len(text.splitlines()),
            "last_eval": last_eval,
            "dropped": sum(int(m) for m in re.findall(r"dropped (\d+) notification", text))
            + text.count("; dropping notification"),
            "errors": sorted({line.split(" ", 3)[-1][:160] for line in text.splitlines() if " ERROR " in line}),
        }
        return soak, facts
    finally:
        if tuner is not None and tuner.poll() is None:
            tuner.terminate()
            tuner.wait(60)
        am.stop()
        farm.terminate()
        farm.wait(30)
        proxy.close()
        webhook.close()


# ---- the report ---------------------------------------------------------------------------------------------------


def report(args: argparse.Namespace, soak: Soak, facts: dict[str, Any], command: str) -> tuple[str, dict[str, Any]]:
    doubles = double_applies(soak.races, facts["hook_runs"], facts["applies"])
    by_body: dict[str, int] = {}
    for k, _ in facts["accepted"]:
        by_body[k] = by_body.get(k, 0) + 1
    dup_bodies, never = sent_against_queued(by_body, facts["queued"])
    bodies = len(facts["accepted"])
    rows = sum(facts["queued"].values())
    slow = sum(1 for _, took in facts["accepted"] if took >= NOTIFY_TIMEOUT_S * 0.95)
    dropped = facts["dropped"]
    n_alerts = len(facts["alerts_accepted"])
    lost = lost_notifications(soak.transitions, facts["alerts_accepted"], facts["last_eval"])
    settle = float(RETENTION_EVERY_MIN + 20)  # the rollup age (20m) and one retention run after it
    flatness = flat(soak.samples, settle)
    first, last = (soak.samples[0], soak.samples[-1]) if soak.samples else (None, None)
    reload_bad = [r for r in soak.reloads if not r.ok]
    statuses: dict[str, int] = {}
    for r in soak.races:
        key = "+".join(str(s) for s in sorted(r.statuses))
        statuses[key] = statuses.get(key, 0) + 1
    outcomes: dict[str, int] = {}
    for a in facts["applies"]:
        outcomes[a.outcome or a.state] = outcomes.get(a.outcome or a.state, 0) + 1
    store_flat = (
        "n/a (shorter than the rollup age + a retention run + two samples)"
        if not flatness
        else "yes"
        if all(ok for _, _, ok in flatness.values())
        else "NO: " + ", ".join(k for k, (_, _, ok) in flatness.items() if not ok)
    )
    summary = {
        "crashes": len(soak.crashes) + (soak.exit_code not in (0, None)),
        "double applies": sum(doubles.values()),
        "duplicate notifications": dup_bodies,
        "notifications lost": len(lost) + max(0, never - dropped),
        "tracebacks": facts["tracebacks"],
        "store flat after retention": store_flat,
    }
    load = os.getloadavg()
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "tuner"], capture_output=True, text=True
    ).stdout.strip()
    when = datetime.fromtimestamp(facts["started"], timezone.utc)
    lines = [
        f"## {when:%Y-%m-%d %H:%M} UTC",
        "",
        f"Command: `{command}`, on tuner {rev}{' (with uncommitted changes in tuner/)' if dirty else ''}.",
        "",
        f"- machine: {os.cpu_count()} CPUs, shared (other engineers' tests beside it); Python "
        f"{sys.version.split()[0]}; Alertmanager: {ALERTMANAGER}",
        f"- load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"- {args.targets} targets (bench/farm.py, model_name renamed every {args.churn} scrapes), scraped every "
        f"5 s; retention raw {RETENTION['raw']}, rollup {RETENTION['rollup']}, step {RETENTION['rollup_step']}; "
        f"Alertmanager stopped and started every {args.am_period:g} s ({soak.am_downs} outages, "
        f"{facts['am_starts']} starts); SIGHUP every minute, good and broken rule files in turn; two applies "
        f"racing every minute",
        "",
        "### Verdict",
        "",
        "| what | count |",
        "|---|---|",
        f"| minutes | {args.minutes:g} |",
    ]
    lines += [f"| {k} | {v} |" for k, v in summary.items()]
    lines += [
        "",
        "### Applies racing",
        "",
        f"{len(soak.races)} races of two POST /api/v1/recommendations/ID/apply at once; answers: "
        + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))
        + f". Applies journaled: {len(facts['applies'])} ("
        + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        + f"); hook runs: {len(facts['hook_runs'])}.",
        "",
        "| double-apply check | count |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in doubles.items()]
    refusals = sorted({e.split(";")[0][:120] for r in soak.races for e in r.errors})
    if refusals:
        lines += ["", "Refusals seen (first clause): " + "; ".join(f"`{e}`" for e in refusals[:8])]
    lines += [
        "",
        "### Notifications",
        "",
        f"- notifications tuner queued (outbox rows): {rows:,}; bodies Alertmanager accepted: {bodies:,} "
        f"({n_alerts:,} alerts); accepted more often than queued (duplicates): {dup_bodies}; queued and never "
        f"accepted: {never} (dropped by tuner and logged: {dropped}); Alertmanager answers slower than "
        f"tuner's {NOTIFY_TIMEOUT_S:g} s timeout (tuner would send again what it had taken): {slow}",
        f"- Alertmanager's own alerts_received_total over its {facts['am_starts']} lives: "
        f"{facts['am_received']:,.0f} (against {n_alerts:,} in the accepted bodies)",
        f"- POSTs dropped while Alertmanager was down: {facts['refused']:,}; outbox drained at the end: "
        f"{'yes' if facts['drained'] else 'NO'}",
        f"- alert transitions the daemon recorded: {len(soak.transitions):,}; with no accepted notification: "
        f"{len(lost)}" + (f" (e.g. {lost[0]})" if lost else ""),
        f"- Alertmanager's webhook got {facts['webhook'][0]:,} notifications ({facts['webhook'][1]:,} alerts)",
        "",
        "### Rule reloads (SIGHUP)",
        "",
        f"{len(soak.reloads)} reloads, {sum(r.ok for r in soak.reloads)} as expected (a broken file keeps the "
        f'last good rules and sets tuner_job_error{{job="rules"}}; a good one clears it); the outcome '
        f"showed on /metrics after {max((r.seconds for r in soak.reloads), default=0):.1f} s at most"
        + (
            "; not as expected: " + ", ".join(f"minute {r.minute:.0f} {r.what}" for r in reload_bad)
            if reload_bad
            else ""
        ),
        "",
        "### Store",
        "",
    ]
    if first is not None and last is not None:
        lines += [
            f"File (with WAL) {first.file_bytes / 2**20:.1f} MiB at minute {first.minute:.0f}, "
            f"{last.file_bytes / 2**20:.1f} MiB at minute {last.minute:.0f}; tuner's RSS "
            f"{first.rss_bytes / 2**20:.0f} -> {last.rss_bytes / 2**20:.0f} MiB.",
            "",
        ]
    if flatness:
        lines += [
            f"After retention settled (minute {settle:g} on), the peak of each half:",
            "",
            "| what | first half | second half | flat (≤ 1.10×) |",
            "|---|---:|---:|---|",
        ]
        lines += [f"| {k} | {a:,.0f} | {b:,.0f} | {'yes' if ok else 'NO'} |" for k, (a, b, ok) in flatness.items()]
        lines.append("")
    if last is not None:
        lines += [
            "The apply journal, kept by design and not judged (an entry an apply; the soak applies once a minute): "
            + ", ".join(f"{t} {last.rows.get(t, 0):,}" for t in JOURNAL)
            + " at the end.",
            "",
        ]
    lines += [
        "| minute | file MiB | samples | hist_samples | series | engine_configs | alert_events | outbox | RSS MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    step = max(1, len(soak.samples) // 20)
    for s in soak.samples[::step] + ([soak.samples[-1]] if soak.samples and (len(soak.samples) - 1) % step else []):
        lines.append(
            f"| {s.minute:.0f} | {s.file_bytes / 2**20:.1f} | {s.rows['samples']:,} | "
            f"{s.rows['hist_samples']:,} | {s.rows['series']:,} | {s.rows['engine_configs']:,} | "
            f"{s.rows['alert_events']:,} | {s.rows['alert_outbox']:,} | {s.rss_bytes / 2**20:.0f} |"
        )
    lines += [
        "",
        "### The daemon's log",
        "",
        f"{facts['log_lines']:,} lines, {facts['tracebacks']} tracebacks; crashes: "
        + ("; ".join(soak.crashes) if soak.crashes else "none")
        + f"; exit code at SIGTERM: {soak.exit_code}.",
    ]
    if facts["errors"]:
        lines += ["", "ERROR lines (distinct, first 160 characters):", ""]
        lines += [f"- `{e}`" for e in facts["errors"][:15]]
    return "\n".join(lines) + "\n", summary


def lost_notifications(
    transitions: dict[int, tuple[str, str, str, int]], alerts: list[dict], until: float
) -> list[str]:
    """Transitions to firing, and resolutions, that no accepted notification carried: each firing must reach
    Alertmanager as an alert with its labels and startsAt = the firing time; each resolution as one with its labels
    and endsAt = the resolution time (tuner/rules/evaluate.py payload; to the second, either way). Transitions in the
    last 30 s before ``until`` are left out (their notification may still have been on its way at the stop)."""
    firing: set[tuple[str, int]] = set()  # (labels, startsAt second)
    resolved: set[tuple[str, int]] = set()  # (labels, endsAt second)
    for a in alerts:
        labels = json.dumps(a.get("labels", {}), sort_keys=True)
        starts, ends = _ts(a.get("startsAt")), _ts(a.get("endsAt"))
        if starts is not None:
            firing.add((labels, int(starts)))
        if ends is not None:
            resolved.add((labels, int(ends)))
    missing = []
    for _eid, (labels, frm, to, ts_ms) in sorted(transitions.items()):
        if ts_ms / 1000 > until - 30:
            continue
        sec = ts_ms // 1000
        if to == "firing":
            if not any((labels, sec + d) in firing for d in (-1, 0, 1)):
                missing.append(f"firing {labels} at {ts_ms}")
        elif to == "inactive" and frm == "firing":
            if not any((labels, sec + d) in resolved for d in (-1, 0, 1)):
                missing.append(f"resolved {labels} at {ts_ms}")
    return missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--targets", type=int, default=50)
    ap.add_argument("--churn", type=int, default=6, help="scrapes between two model_name renames of a target")
    ap.add_argument("--am-period", type=float, default=150.0, help="seconds Alertmanager is up, then down, ...")
    ap.add_argument("--work", type=Path, help="work directory (default: a new temporary one, removed unless failed)")
    ap.add_argument("--no-write", action="store_true", help="print the results only; no file in bench/results/")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tuner-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    command = "python bench/soak.py " + " ".join(sys.argv[1:])
    soak, facts = run(args, work)
    text, summary = report(args, soak, facts, command)
    print(text)
    if not args.no_write:
        path = results_path("soak", datetime.fromtimestamp(facts["started"], timezone.utc))
        path.write_text(f"# Soak: {args.minutes:g} minutes, {args.targets} targets\n\n" + text, encoding="utf-8")
        print(f"written {path}")
        update_readme()
    bad = any(v != 0 for k, v in summary.items() if k != "store flat after retention") or summary[
        "store flat after retention"
    ].startswith("NO")
    if not bad and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
