"""kill -9 a real `tuner run` at random moments, over and over; after each kill check that nothing was lost.

    python bench/reliability.py --kills 100 [--fuzz] [--seed 1] [--surface ingest|apply] [--work DIR] [--json]

``--fuzz`` first runs the fuzzers of tests/reliability/test_fuzz.py (the same inputs as CI) and prints their counts.

Surface ``ingest``: two targets replay a recorded vLLM exposition (counters advancing), a third flaps between
200 and HTTP 500 every ~2 s; scrapes every 200 ms; two rules evaluated every second, one that fires once
and stays firing (KVSeen, for: 1s) and one that fires and resolves with the flapping target (Flapping,
up == 0). Alertmanager is stood in for by a local receiver that keeps every POST. A reader in this process
polls the database and remembers every sample it saw committed.

Each cycle starts `tuner run`, waits until it has stored a new scrape, sleeps a random 0-1.5 s (so the kill
lands during ingest, evaluation or a notification), sends SIGKILL, then checks:
  - the database opens and ``PRAGMA integrity_check`` says ok;
  - every sample the reader saw committed is still there (samples and histogram samples);
  - alert_events has no duplicated or missing transition (each event starts where the previous one ended);
and at the end, after one clean run that drains the outbox, that the notifications hold each firing's start
exactly once (no firing lost, no firing sent twice with different starts). Re-deliveries of the same
notification (sent, then killed before it was marked sent) are counted; Alertmanager deduplicates them.

Surface ``apply`` (bench/reliability_apply.py): kill -9 the tuner doing an apply on a managed llama-server, then
reconcile, and check the server, the journal and the recommendation agree. Others plug in through SURFACES.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from bench.reliability_apply import ApplySurface  # noqa: E402  (kill -9 during an apply)
from tuner.lab.proc import AlertSink, TunerProcess, wait_for  # noqa: E402
from tuner.lab.replay import ReplayExposition, ReplayServer  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu" / "metrics_after_load.txt"
RULES = """groups:
  - name: reliability
    interval: 1s
    rules:
      - {alert: KVSeen, signal: kv_cache_usage, op: ">=", threshold: 0, window: 1m, for: 1s, backend: vllm}
      - {alert: Flapping, signal: up, op: "==", threshold: 0, window: 1m}
"""


class FlappingServer:
    """/metrics answers the recorded exposition, or HTTP 500 while ``down`` (toggled by a thread)."""

    def __init__(self, text: str, period_s: float = 2.0) -> None:
        self.down = False
        server = self
        body = text.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                status, out = (500, b"down") if server.down else (200, body if self.path == "/metrics" else b"")
                self.send_response(status)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

        def flap() -> None:
            while not self.stop.wait(period_s):
                self.down = not self.down

        threading.Thread(target=flap, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class Reader(threading.Thread):
    """Polls the database like any reader would and remembers every sample key it saw committed."""

    def __init__(self, db: Path) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.seen: set[tuple[str, int, int]] = set()  # (table, series_id, ts_ms)
        self.pending: set[tuple[str, int, int]] = set()  # seen since the last check
        self.last_scrape_id = 0
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def run(self) -> None:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            while not self.halt.wait(0.05):
                self.poll(conn)
        finally:
            conn.close()

    def poll(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN")  # one snapshot: the scrape rows and their samples committed together
            rows = conn.execute(
                "SELECT id, target_id, ts_ms FROM scrapes WHERE id > ? AND health != 'down' ORDER BY id",
                (self.last_scrape_id,),
            ).fetchall()
            found = set()
            for _, target_id, ts_ms in rows:
                for table in ("samples", "hist_samples"):
                    found.update(
                        (table, sid, ts_ms)
                        for (sid,) in conn.execute(
                            f"SELECT s.series_id FROM {table} s JOIN series r ON r.id = s.series_id "  # noqa: S608
                            "WHERE r.target_id = ? AND s.ts_ms = ?",
                            (target_id, ts_ms),
                        )
                    )
            conn.execute("COMMIT")
        except sqlite3.OperationalError:  # locked during a checkpoint, or tables not there yet: next time
            conn.rollback()
            return
        if rows:
            with self.lock:
                self.last_scrape_id = rows[-1][0]
                self.seen |= found
                self.pending |= found

    def take_pending(self) -> set[tuple[str, int, int]]:
        with self.lock:
            out, self.pending = self.pending, set()
            return out

    def scrapes_seen(self) -> int:
        with self.lock:
            return self.last_scrape_id


def _present(db: Path, keys: set[tuple[str, int, int]]) -> int:
    """How many of ``keys`` are in the database."""
    with sqlite3.connect(db, timeout=30) as conn:
        have = {("samples", s, t) for s, t in conn.execute("SELECT series_id, ts_ms FROM samples")}
        have |= {("hist_samples", s, t) for s, t in conn.execute("SELECT series_id, ts_ms FROM hist_samples")}
    return len(keys & have)


def integrity(db: Path) -> str:
    with sqlite3.connect(db, timeout=30) as conn:
        return "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))


def event_chain_faults(db: Path) -> tuple[int, int, dict[str, set[int]]]:
    """(duplicated transitions, missing transitions, firing start times per label set) from alert_events."""
    dup = lost = 0
    firings: dict[str, set[int]] = defaultdict(set)
    last: dict[tuple[str, str], tuple[str, str]] = {}
    with sqlite3.connect(db, timeout=30) as conn:
        rows = conn.execute(
            "SELECT rule, fingerprint, labels, from_state, to_state, ts_ms FROM alert_events ORDER BY id"
        ).fetchall()
    for rule, fp, labels, frm, to, ts in rows:
        prev = last.get((rule, fp))
        expected_from = prev[1] if prev else "inactive"
        if frm != expected_from:
            if prev == (frm, to):
                dup += 1
            else:
                lost += 1
        last[(rule, fp)] = (frm, to)
        if to == "firing":
            firings[json.dumps(json.loads(labels), sort_keys=True)].add(ts)
    return dup, lost, firings


def _ms(iso: str) -> int:
    return int(round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000))


class Surface:
    """What runs under the kills, and how to check it. Subclass and add to SURFACES for another one."""

    name = "base"

    def __init__(self, work: Path) -> None:
        self.work = work

    def start(self) -> TunerProcess:
        raise NotImplementedError

    def check_after_kill(self) -> dict[str, int]:
        raise NotImplementedError

    def final(self) -> dict[str, int]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class IngestSurface(Surface):
    name = "ingest"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        text = FIXTURE.read_text(encoding="utf-8")
        self.servers = [ReplayServer(ReplayExposition(text)).__enter__() for _ in range(2)]
        self.flappy = FlappingServer(text)
        self.sink = AlertSink()
        targets = {f"replay-{i}": ("vllm", s.url) for i, s in enumerate(self.servers)}
        targets["flappy"] = ("vllm", self.flappy.url)
        self.tuner = TunerProcess(
            work, targets, interval="200ms", timeout="1s", rules=RULES, alertmanagers=[self.sink.url]
        )
        self.reader = Reader(self.tuner.db)
        self.reader.start()
        self.totals = {
            "samples_seen": 0,
            "samples_lost": 0,
            "integrity_failures": 0,
            "duplicate_transitions": 0,
            "missing_transitions": 0,
        }

    def start(self) -> TunerProcess:
        before = self.reader.scrapes_seen()
        self.tuner.start()
        # "During ingest": this incarnation has committed at least one scrape the reader saw.
        wait_for(lambda: self.reader.scrapes_seen() > before, 30, "a scrape from the new daemon")
        return self.tuner

    def check_after_kill(self) -> dict[str, int]:
        conn = sqlite3.connect(self.tuner.db, timeout=30)
        try:
            self.reader.poll(conn)  # anything committed just before the kill
        finally:
            conn.close()
        ok = integrity(self.tuner.db) == "ok"
        pending = self.reader.take_pending()
        lost = len(pending) - _present(self.tuner.db, pending)
        dup, missing, _ = event_chain_faults(self.tuner.db)
        self.totals["samples_seen"] = len(self.reader.seen)
        self.totals["samples_lost"] += lost
        self.totals["integrity_failures"] += 0 if ok else 1
        self.totals["duplicate_transitions"] = dup
        self.totals["missing_transitions"] = missing
        return {"lost": lost, "integrity_ok": int(ok), "dup": dup, "missing": missing}

    def final(self) -> dict[str, int]:
        """One clean run drains the outbox; then every firing must have reached the receiver exactly once."""
        self.tuner.start()
        wait_for(lambda: _outbox(self.tuner.db) == 0, 60, "the outbox to drain")
        self.tuner.stop()
        self.reader.halt.set()
        self.reader.join(5)
        all_lost = len(self.reader.seen) - _present(self.tuner.db, self.reader.seen)
        dup, missing, firings = event_chain_faults(self.tuner.db)
        sent: dict[str, set[int]] = defaultdict(set)
        deliveries = 0
        for a in self.sink.alerts():
            key = json.dumps(a["labels"], sort_keys=True)
            sent[key].add(_ms(a["startsAt"]))
            deliveries += 1
        firing_count = sum(len(v) for v in firings.values())
        notified_lost = sum(len(starts - sent.get(k, set())) for k, starts in firings.items())
        # A start that no firing transition has: the same firing announced again under a new start.
        notified_dup = sum(len(starts - firings.get(k, set())) for k, starts in sent.items())
        return {
            "samples_seen": len(self.reader.seen),
            "samples_lost_total": all_lost,
            "integrity_failures": self.totals["integrity_failures"] + (integrity(self.tuner.db) != "ok"),
            "alert_transitions": _count(self.tuner.db, "alert_events"),
            "firings": firing_count,
            "duplicate_transitions": dup,
            "missing_transitions": missing,
            "firings_not_notified": notified_lost,
            "firings_notified_twice": notified_dup,
            "notifications_received": deliveries,
            "posts_received": len(self.sink.posts),
            "scrapes_stored": _count(self.tuner.db, "scrapes"),
        }

    def close(self) -> None:
        self.reader.halt.set()
        if self.tuner.alive():
            self.tuner.stop()
        for s in self.servers:
            s.__exit__(None, None, None)
        self.flappy.close()
        self.sink.close()


def _outbox(db: Path) -> int:
    return _count(db, "alert_outbox")


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608 (fixed names)


SURFACES: dict[str, type] = {"ingest": IngestSurface, "apply": ApplySurface}


def run(
    kills: int, *, seed: int = 1, surface: str = "ingest", work: Path | None = None, max_delay_s: float = 1.5, log=print
) -> dict:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="tuner-kill9-")
        work = Path(tmp.name)
    s = SURFACES[surface](work)
    started = time.monotonic()
    survived = 0
    try:
        delay = getattr(s, "max_delay_s", max_delay_s)
        for i in range(1, kills + 1):
            proc = s.start()
            time.sleep(rng.uniform(0, delay))
            assert proc.proc is not None
            if proc.alive():
                os.kill(proc.proc.pid, signal.SIGKILL)
            else:  # an apply can finish before its kill; the surface counts that (ingest never ends by itself)
                assert s.name == "apply", proc.log_tail()
            proc.proc.wait(10)
            check = s.check_after_kill()
            survived += check["integrity_ok"] and not check["lost"]
            if i % 10 == 0 or i == kills or not check["integrity_ok"] or check["lost"]:
                log(f"kill {i}/{kills}: {check}")
        result = {
            "surface": surface,
            "kills": kills,
            "kills_survived": survived,
            "seed": seed,
            **s.final(),
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        s.close()
        if tmp is not None:
            tmp.cleanup()
    return result


def fuzz(log=print) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """Run the fuzzers of tests/reliability/test_fuzz.py (same inputs as CI) and return their counts."""
    os.environ.setdefault("TUNER_FUZZ_EXAMPLES", "10000")  # the suite runs 3,000 of the same inputs
    from tests.reliability import test_fuzz

    for name in sorted(dir(test_fuzz)):
        if name.startswith("test_fuzz_"):
            getattr(test_fuzz, name)()
            log(f"{name}: done")
    return dict(test_fuzz.RESULTS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--fuzz", action="store_true", help="first run the fuzzers (tests/reliability/test_fuzz.py)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--surface", choices=sorted(SURFACES), default="ingest")
    ap.add_argument("--work", type=Path, help="keep the database and logs here (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    fuzzed = fuzz(log) if args.fuzz else {}
    result = run(args.kills, seed=args.seed, surface=args.surface, work=args.work, log=log)
    if args.json:
        print(json.dumps({"fuzz": fuzzed, "kill9": result}))
    else:
        for surface, counts in fuzzed.items():
            print(f"fuzz {surface}: " + ", ".join(f"{k} {v:g}" for k, v in counts.items()))
        print("\n".join(f"{k}: {v}" for k, v in result.items()))
    bad = (
        result["integrity_failures"]
        or result["samples_lost_total"]
        or result.get("inconsistent")
        or result.get("orphans")
        or result["duplicate_transitions"]
        or result["missing_transitions"]
        or result["firings_not_notified"]
        or result["firings_notified_twice"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
