"""The ``apply`` surface of bench/reliability.py: kill -9 the tuner doing an apply, at random moments, then reconcile.

A managed llama-server (real, tiny GGUF: it restarts in well under a second, so hundreds of applies fit in
minutes) flips between ``--parallel 2`` and ``--parallel 3``. Each cycle stores a recommendation for the other
value, starts ``tuner apply-recommendation ID --yes`` and SIGKILLs it 0-``max_delay_s`` later — during the
baseline, the drain, the start, the health gate or the observation — then runs ``tuner reconcile`` (what
``tuner run`` does at start) and checks:
  - the database opens and ``PRAGMA integrity_check`` says ok;
  - no apply is left open, and every apply ended kept, rolled_back, inconclusive or failed;
  - exactly one server runs on the port, healthy, and its argv is what the journal says is in force
    (the apply's new argv if kept, else the old one); the managed state records that process;
  - the recommendation's status matches the apply's outcome.
A cycle whose kill came after the apply had already finished is counted as such (nothing to reconcile).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.apply.launch import free_port  # noqa: E402
from tuner.apply.managed import proc_argv  # noqa: E402
from tuner.store import journal as jr  # noqa: E402
from tuner.store import recommendations as recs  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402


class _ApplyProcess:
    """The `tuner apply-recommendation` under the kill, shaped like tuner.lab.proc.TunerProcess for run()."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


def _healthy(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url + "/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


class ApplySurface:
    name = "apply"
    max_delay_s = 3.0  # from its entry's opening an apply here takes ~3 s (drain, ~0.5 s start, gate, 2 s observation)

    def __init__(self, work: Path) -> None:
        import os

        self.work = work
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        gguf = os.environ.get("TUNER_TINY_GGUF") or str(Path.home() / ".cache/tuner/models/tiny.gguf")
        binary = os.environ.get("TUNER_LLAMA_SERVER") or str(Path.home() / ".cache/tuner/llama.cpp/bin/llama-server")
        self.db = work / "tuner.db"
        self.config = work / "tuner.yaml"
        self.config.write_text(
            f"store: {{url: 'sqlite:///{self.db}'}}\nlisten: 127.0.0.1:{free_port()}\n"
            "targets:\n"
            f"  - name: llama\n    backend: llamacpp\n    url: {self.url}\n"
            f"    managed: {{model: '{gguf}', executable: '{binary}', flags: {{parallel: 2, ctx_size: 512}}, "
            "extra_args: {'-t': 1}, drain_timeout: 2s, start_timeout: 60s}\n"
            "    apply: {observe: 2s, observe_max: 2s, baseline: 30s, min_requests: 0, max_restarts_per_hour: 100000}\n"
        )
        self._cli("db", "upgrade")
        self._cli("managed", "start")
        self.engine = open_engine(f"sqlite:///{self.db}")
        self.log = work / "apply.log"
        self.current: int | None = None
        self.totals = {
            "applies_started": 0,
            "killed_mid_apply": 0,
            "finished_before_kill": 0,
            "reconciled": 0,
            "inconsistent": 0,
            "integrity_failures": 0,
            "orphans": 0,
            "kept": 0,
            "rolled_back": 0,
            "failed": 0,
        }
        self.findings: dict[str, int] = {}

    def _cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tuner.cli", "--config", str(self.config), "--log-level", "WARNING", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def _parallel_in_force(self) -> int:
        st = jr.get_managed(self.engine, "llama")
        return int(st.flags["parallel"]) if st else 2

    def start(self) -> _ApplyProcess:
        new = 3 if self._parallel_in_force() == 2 else 2
        self.current = recs.add_recommendation(
            self.engine,
            target="llama",
            now=time.time(),
            rules=["kill9"],
            diff_key=json.dumps({"parallel": new}),
            diff={"parallel": new},
            current={"parallel": 5 - new},
            evidence=[],
            expected_effect="",
            risk="",
            confidence=0.9,
            rank=1,
            memory_check={"ok": True},
        )
        self.totals["applies_started"] += 1
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuner.cli",
                "--config",
                str(self.config),
                "apply-recommendation",
                str(self.current),
                "--yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "ab"),
            stdin=subprocess.DEVNULL,
        )
        # The kill is timed from the moment the apply's entry opens, not from the process start: the interpreter and
        # tuner's imports take 1-3 s depending on the host's load, which pushed every kill of one CI run into the
        # observation (the last step).
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not any(a.recommendation_id == self.current for a in jr.list_applies(self.engine, limit=3))
        ):
            time.sleep(0.02)
        return _ApplyProcess(proc, self.log)

    def _servers_on_port(self) -> list[int]:
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = proc_argv(int(entry.name)) or []
                if "--port" in argv and argv[argv.index("--port") + 1] == str(self.port) and "-m" in argv:
                    out.append(int(entry.name))
        return out

    def check_after_kill(self) -> dict[str, int]:
        applies = [a for a in jr.list_applies(self.engine, limit=3) if a.recommendation_id == self.current]
        was_open = bool(applies) and applies[0].state != "done"
        if was_open:
            self.totals["killed_mid_apply"] += 1
            self.findings[applies[0].state] = self.findings.get(applies[0].state, 0) + 1
        elif applies:
            self.totals["finished_before_kill"] += 1
        rc = self._cli("reconcile", timeout=300)
        self.totals["reconciled"] += was_open and rc.returncode == 0
        with sqlite3.connect(self.db, timeout=30) as conn:
            ok = conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        self.totals["integrity_failures"] += not ok
        problems = []
        if jr.open_applies(self.engine):
            problems.append("an apply is still open")
        a = jr.list_applies(self.engine, limit=1)
        servers = self._servers_on_port()
        if len(servers) != 1:
            problems.append(f"{len(servers)} servers on the port")
            self.totals["orphans"] += max(0, len(servers) - 1)
        st = jr.get_managed(self.engine, "llama")
        if st is None or st.pid not in servers or not _healthy(self.url):
            problems.append("the managed state does not point at one healthy server")
        if a and a[0].recommendation_id == self.current:
            a0 = a[0]
            self.totals[a0.outcome or "failed"] = self.totals.get(a0.outcome or "failed", 0) + 1
            want = a0.new_argv if a0.outcome == "kept" else a0.old_argv
            if servers and proc_argv(servers[0]) != want:
                problems.append(f"server argv is not the journal's ({a0.outcome})")
            status = recs.get_recommendation(self.engine, self.current).status
            expected = {
                "kept": ("applied",),
                "rolled_back": ("rolled_back", "proposed"),
                "inconclusive": ("rolled_back", "proposed"),
                "failed": ("failed",),
            }
            if status not in expected.get(a0.outcome or "", ()):
                problems.append(f"recommendation {status} after outcome {a0.outcome}")
        if problems:
            self.totals["inconsistent"] += 1
            print(
                f"inconsistent: {problems}; reconcile said: {rc.stdout.strip()[-300:]} {rc.stderr.strip()[-300:]}",
                file=sys.stderr,
            )
        return {"lost": len(problems), "integrity_ok": int(ok), "was_open": int(was_open)}

    def final(self) -> dict[str, object]:
        return {
            **self.totals,
            "killed_at_step": dict(sorted(self.findings.items())),
            "integrity_failures": self.totals["integrity_failures"],
            "samples_lost_total": 0,
            "duplicate_transitions": 0,
            "missing_transitions": 0,
            "firings_not_notified": 0,
            "firings_notified_twice": 0,
        }

    def close(self) -> None:
        self._cli("managed", "stop")
