"""Faults against a RUNNING `tuner run` (a real child process, real HTTP, real SQLite): it keeps serving.

Each fault is injected for real: targets that refuse, hang, trickle, send 100 MB, answer 500 or garbage, an
Alertmanager that is down, the SQLite file held by another process's ``BEGIN EXCLUSIVE``, and a full disk
(RLIMIT_FSIZE on the daemon process: the kernel refuses writes past the limit with EFBIG, as a full
filesystem refuses them with ENOSPC; no mount needed), and the wall clock stepping back and forward (an
LD_PRELOAD shim, tests/reliability/clockshift.c, offsets CLOCK_REALTIME of the running process only). Healthy targets replay recorded real vLLM expositions
and must keep being stored, and each fault must show up as target health + last error (`tuner status --json`)
or as tuner_job_error on tuner's own /metrics. tests/daemon/test_daemon.py covers the same bad targets in-process.
"""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tests.helpers import VLLM_DIR, Route, serve
from tuner.lab.proc import AlertSink, TunerProcess, free_port, wait_for
from tuner.lab.replay import ReplayExposition, ReplayServer

GOOD = (VLLM_DIR / "metrics_after_load.txt").read_text(encoding="utf-8")
ALWAYS = """groups:
  - name: reliability
    interval: 1s
    rules:
      - {alert: KVSeen, signal: kv_cache_usage, op: ">=", threshold: 0, window: 1m, backend: vllm}
"""


def _stored_scrapes(db, target: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(
            "SELECT COUNT(*) FROM scrapes s JOIN targets t ON t.id = s.target_id "
            "WHERE t.name = ? AND s.health != 'down'",
            (target,),
        ).fetchone()[0]


def _integrity(db) -> str:
    with sqlite3.connect(db, timeout=10) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


EXPECT = {  # bad target -> a fragment of the error tuner records for it
    "refuses": "connection refused",
    "hangs": "no complete answer",
    "trickles": "no complete answer",
    "huge": "max_body_bytes",
    "http500": "HTTP 500",
    "garbage": "line 1",
}


def test_bad_targets_and_a_down_alertmanager_never_stop_the_good_targets(tmp_path):
    am_port = free_port()  # nothing listens here until the Alertmanager "comes back"
    with ExitStack() as stack:
        goods = {n: stack.enter_context(ReplayServer(ReplayExposition(GOOD))).url for n in ("good-a", "good-b")}
        bad = {
            "hangs": {"/metrics": Route(delay_s=60)},
            "trickles": {"/metrics": Route(body=GOOD, trickle=(64, 0.05))},  # 53 KB at 1.3 KB/s
            "huge": {"/metrics": Route(stream=lambda: (b"#" * 65536 for _ in range(1600)))},  # 100 MB, no length
            "http500": {"/metrics": Route(status=500, body=b"engine dead")},
            "garbage": {"/metrics": Route(body=b"\x00\x01<html>not metrics</html>")},
        }
        urls = {
            **goods,
            **{n: stack.enter_context(serve(r)) for n, r in bad.items()},
            "refuses": f"http://127.0.0.1:{free_port()}",
        }
        tuner = TunerProcess(
            tmp_path,
            {n: ("vllm", u) for n, u in urls.items()},
            rules=ALWAYS,
            alertmanagers=[f"http://127.0.0.1:{am_port}"],
        )
        tuner.start()
        stack.callback(tuner.stop)

        def every_fault_recorded() -> bool:
            st = tuner.status()
            return all(st.get(n, {}).get("health") and st[n]["health"]["consecutive_failures"] >= 2 for n in EXPECT)

        wait_for(every_fault_recorded, 40, "every bad target to fail twice")
        status = tuner.status()
        for name, fragment in EXPECT.items():
            h = status[name]["health"]
            assert h["health"] == "down" and fragment in h["last_error"], (name, h)
        for name in goods:
            assert status[name]["health"]["health"] == "up", status[name]
            assert _stored_scrapes(tuner.db, name) >= 5, name  # 500 ms scrapes went on throughout
        wait_for(lambda: tuner.metric("tuner_target_up", target="hangs") == 0.0, 10, "tuner_target_up")
        for name in urls:
            assert tuner.metric("tuner_target_up", target=name) == (1.0 if name in goods else 0.0), name

        # Alertmanager down: the alert fired, its notification waits in the outbox, the job error says so.
        am = f"notify:http://127.0.0.1:{am_port}"
        wait_for(lambda: tuner.metric("tuner_job_error", job=am) == 1.0, 15, "the notify job error")
        assert "KVSeen" in tuner.cli("alerts", "list").stdout
        sink = AlertSink(am_port)  # Alertmanager back: the queued alerts arrive, the error clears
        stack.callback(sink.close)
        wait_for(lambda: {a["labels"]["target"] for a in sink.alerts()} >= set(goods), 30, "queued alerts")
        wait_for(lambda: tuner.metric("tuner_job_error", job=am) is None, 10, "the notify error to clear")
        assert tuner.alive(), tuner.log_tail()
        assert tuner.stop() == 0, tuner.log_tail()


def test_database_locked_by_another_process(tmp_path):
    with ReplayServer(ReplayExposition(GOOD)) as server:
        tuner = TunerProcess(tmp_path, {"good": ("vllm", server.url)}).start()
        try:
            wait_for(lambda: _stored_scrapes(tuner.db, "good") >= 3, 20, "first scrapes")
            # Another process takes the write lock for longer than tuner's busy_timeout (5 s).
            locker = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sqlite3, sys, time\n"
                    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True)\n"
                    "time.sleep(float(sys.argv[2])); c.execute('COMMIT')",
                    str(tuner.db),
                    "8",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert locker.stdout.readline().strip() == "locked"
            locked_at = _stored_scrapes(tuner.db, "good")
            wait_for(lambda: tuner.metric("tuner_job_error", job="store:good") == 1.0, 10, "the store job error")
            assert tuner.alive() and _stored_scrapes(tuner.db, "good") == locked_at  # nothing written, nothing died
            assert locker.wait(15) == 0
            # Lock released: writes resume and the error clears.
            wait_for(lambda: _stored_scrapes(tuner.db, "good") >= locked_at + 3, 15, "scrapes after the lock")
            wait_for(lambda: tuner.metric("tuner_job_error", job="store:good") is None, 10, "the error to clear")
            assert tuner.status()["good"]["health"]["health"] == "up"
            assert tuner.stop() == 0, tuner.log_tail()
        finally:
            tuner.stop()
    assert _integrity(tuner.db) == "ok"


def test_disk_full(tmp_path):
    """RLIMIT_FSIZE (set in the child before exec) caps every file tuner writes, the WAL included."""
    with ReplayServer(ReplayExposition(GOOD)) as server:
        tuner = TunerProcess(tmp_path, {"good": ("vllm", server.url)})
        limit = tuner.db.stat().st_size + 256 * 1024

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        tuner.start(preexec_fn=cap)
        try:
            wait_for(lambda: tuner.metric("tuner_job_error", job="store:good") == 1.0, 30, "the disk-full error")
            stored = _stored_scrapes(tuner.db, "good")
            assert stored >= 1 and tuner.alive(), tuner.log_tail()
            errors = [x for x in tuner.log_tail(200).splitlines() if "store:good:" in x]
            assert errors and ("disk I/O error" in errors[-1] or "disk is full" in errors[-1]), errors
            time.sleep(2)  # it keeps running, and keeps failing to write, without dying
            assert tuner.alive() and tuner.metric("tuner_job_error", job="store:good") == 1.0
            assert tuner.stop() == 0, tuner.log_tail()
        finally:
            tuner.stop()
        assert _integrity(tuner.db) == "ok" and _stored_scrapes(tuner.db, "good") == stored
        # Space again (no limit): the same database takes writes, nothing committed before was lost.
        tuner.start()
        try:
            wait_for(lambda: _stored_scrapes(tuner.db, "good") >= stored + 3, 20, "scrapes after the disk-full")
            assert tuner.metric("tuner_job_error", job="store:good") is None
        finally:
            assert tuner.stop() == 0
    assert _integrity(tuner.db) == "ok"


def _clockshift(tmp_path) -> str:
    """Build tests/reliability/clockshift.c (an LD_PRELOAD shim that offsets CLOCK_REALTIME) with gcc.

    libfaketime 0.9.10 (Debian 12) was tried first: under it Python 3.11's time.sleep fails with EINVAL
    (or hangs with the monotonic clock faked too), so it cannot run tuner at all.
    """
    from tests.conftest import require_tool

    cc = require_tool("gcc")  # scripts/install-llama-server.sh installs it
    lib = tmp_path / "libclockshift.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(Path(__file__).with_name("clockshift.c")), "-ldl"],
        check=True,
        capture_output=True,
    )
    return str(lib)


def test_wall_clock_steps_back_and_forward(tmp_path):
    """The wall clock of the running daemon steps back an hour, then forward two: scraping never stops."""
    offset = tmp_path / "clock-offset"
    offset.write_text("0\n")
    env = {**os.environ, "LD_PRELOAD": _clockshift(tmp_path), "CLOCKSHIFT_FILE": str(offset)}
    with ReplayServer(ReplayExposition(GOOD)) as server:
        tuner = TunerProcess(tmp_path, {"good": ("vllm", server.url)}).start(env=env)
        try:
            wait_for(lambda: server.exposition.scrapes >= 3, 20, "first scrapes")
            for step in (-3600, +7200):
                offset.write_text(f"{tuner_offset(offset) + step}\n")
                before = server.exposition.scrapes
                # 500 ms scrapes: ~8 in 4 s; a scheduler waiting on the old wall clock would do none for an hour
                wait_for(lambda: server.exposition.scrapes >= before + 5, 8, f"scrapes after a {step:+d} s step")  # noqa: B023
                assert tuner.alive(), tuner.log_tail()
            with sqlite3.connect(tuner.db) as conn:
                ts = [t for (t,) in conn.execute("SELECT ts_ms FROM scrapes ORDER BY id")]
            assert any(b < a - 3_000_000 for a, b in zip(ts, ts[1:])), "no scrape stored at the stepped-back time"
            assert tuner.status()["good"]["health"]["health"] == "up"
            assert tuner.stop() == 0, tuner.log_tail()
        finally:
            tuner.stop()
    assert _integrity(tuner.db) == "ok"


def tuner_offset(path) -> float:
    return float(path.read_text().strip() or 0)
