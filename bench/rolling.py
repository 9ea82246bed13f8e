"""Applies under load, side by side in one run: one llama-server alone, a group of two behind a real HAProxy (a
rolling apply), and one llama-server behind HAProxy switched blue/green through a spare on the same host.

Same model, flags, client and load for both: tuner/lab/load.py clients that never retry (retry_for_s=0), 3 in
flight, each request on a fresh connection; tuner applies --parallel 2 -> 4 -> 2 ... (`tuner apply-recommendation
ID --yes`) N times per setup while the load runs. Reported per setup: requests answered and failed during the
applies, and from the apply journal: apply wall time (planned -> healthy, the observation excluded) and, for the
group, per replica (draining -> in_rotation) with its HAProxy drain (draining -> drained); for blue/green, the
spare's start until HAProxy says UP (starting -> in_rotation of chat~spare).

Fairness on 2 cores: every llama-server runs with -t 1; the single server and the group are measured one after
the other with the same client; nothing else runs.

  python bench/rolling.py --applies 3
Needs TUNER_LLAMA_SERVER and TUNER_TINY_GGUF (scripts/setup-real-servers.sh prints them) and haproxy
(scripts/install-haproxy.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.apply.balancer import HAProxy  # noqa: E402
from tuner.apply.launch import free_port  # noqa: E402
from tuner.lab.load import run_load  # noqa: E402
from tuner.lab.proc import wait_for  # noqa: E402
from tuner.store import recommendations as recs  # noqa: E402
from tuner.store.db import open_engine  # noqa: E402


def tuner(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", "--config", str(cfg), "--log-level", "WARNING", *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def config(work: Path, server: str, model: str, setup: str) -> tuple[Path, int]:
    front = free_port()
    own = free_port() if setup == "bluegreen" else front
    head = (
        f"store: {{url: 'sqlite:///{work / 'tuner.db'}'}}\n"
        "defaults: {scrape_interval: 1s, scrape_timeout: 1s}\ntargets:\n"
        f"  - name: chat\n    backend: llamacpp\n    url: http://127.0.0.1:{own}\n"
    )
    if setup == "bluegreen":
        head += (
            f"    balancer: {{socket: '{work / 'haproxy.sock'}', backend: chat, server: blue, "
            f"frontend: '127.0.0.1:{front}'}}\n"
        )
    if setup == "group":
        head += (
            f"    balancer: {{socket: '{work / 'haproxy.sock'}', backend: chat}}\n    replicas:\n"
            f"      - {{name: r1, url: 'http://127.0.0.1:{free_port()}'}}\n"
            f"      - {{name: r2, url: 'http://127.0.0.1:{free_port()}'}}\n"
        )
    cfg = work / "tuner.yaml"
    cfg.write_text(
        head + f"    managed:\n      model: {model}\n      executable: {server}\n"
        "      flags: {parallel: 2, ctx_size: 1024}\n      extra_args: {'-t': 1}\n"
        f"      drain_timeout: 5s\n      log_dir: {work / 'logs'}\n"
        "    apply: {observe: 4s, observe_max: 4s, baseline: 10s, on_inconclusive: keep_new, "
        "max_restarts_per_hour: 100}\n"
    )
    return cfg, front


def ts(a: dict, step: str, who: str = "", last: bool = False) -> float | None:
    hits = [s["ts_ms"] / 1000 for s in a["steps"] if s["step"] == step and s["detail"].startswith(who)]
    return (hits[-1] if last else hits[0]) if hits else None


def measure(work: Path, server: str, model: str, setup: str, applies: int) -> dict:
    work.mkdir(parents=True)
    group = setup == "group"
    cfg, front = config(work, server, model, setup)
    tuner(cfg, "db", "upgrade")
    names = ["chat.r1", "chat.r2"] if group else ["chat"]
    for n in names:
        out = tuner(cfg, "managed", "start", n)
        assert out.returncode == 0, out.stderr
    proxy = None
    if setup != "single":
        (work / "haproxy.cfg").write_text(tuner(cfg, "haproxy-config", "chat").stdout)
        proxy = subprocess.Popen(
            [shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", str(work / "haproxy.cfg")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        lb = HAProxy(str(work / "haproxy.sock"), "chat")
        wait_for(
            lambda: (work / "haproxy.sock").exists() and all(s.status == "UP" for s in lb.stats().values()),
            30,
            "the replicas UP in HAProxy",
            proc=proxy,
            every_s=0.2,
        )
    url = f"http://127.0.0.1:{front}"  # HAProxy's frontend, or the single server itself
    engine = open_engine(f"sqlite:///{work / 'tuner.db'}")
    stop, box = threading.Event(), {}
    load = threading.Thread(
        target=lambda: box.update(
            r=run_load(
                url,
                model="x",
                n_requests=10_000,
                concurrency=3,
                prompt_tokens_approx=32,
                max_tokens=24,
                timeout_s=1800,
                stop=stop,
            )
        )
    )
    load.start()
    time.sleep(3.0)
    rows = []
    try:
        for i in range(applies):
            value = 4 if i % 2 == 0 else 2
            rid = recs.add_recommendation(
                engine,
                target=names[0],
                now=time.time(),
                rules=["bench"],
                diff_key=str(i),
                diff={"parallel": value},
                current={"parallel": 6 - value},
                evidence=[],
                expected_effect="",
                risk="",
                confidence=0.9,
                rank=1,
                memory_check={"ok": True},
            )
            out = tuner(cfg, "apply-recommendation", str(rid), "--yes", "--json")
            a = json.loads(out.stdout)
            row = {"outcome": a["outcome"], "apply_s": round((ts(a, "healthy") or 0) - ts(a, "planned"), 2)}
            if group:
                row["replica_s"] = [round((ts(a, "in_rotation", n) or 0) - ts(a, "draining", n), 2) for n in names]
                row["haproxy_drain_s"] = [
                    round((ts(a, "drained", n) or ts(a, "drain_timeout", n) or 0) - ts(a, "draining", n), 2)
                    for n in names
                ]
            if setup == "bluegreen":
                row["spare_up_s"] = round(
                    (ts(a, "in_rotation", "chat~spare") or 0) - ts(a, "starting", "chat~spare"), 2
                )
            rows.append(row)
            time.sleep(2.0)
    finally:
        stop.set()
        load.join()
        if proxy:
            proxy.terminate()
        for n in names:
            tuner(cfg, "managed", "stop", n)
    r = box["r"]
    return {"ok": r.ok, "failed": r.failed, "errors": list(r.errors[:3]), "applies": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--applies", type=int, default=3)
    args = ap.parse_args()
    server, model = os.environ.get("TUNER_LLAMA_SERVER"), os.environ.get("TUNER_TINY_GGUF")
    if not server or not model:
        sys.exit("set TUNER_LLAMA_SERVER and TUNER_TINY_GGUF (scripts/setup-real-servers.sh prints them)")
    work = Path(tempfile.mkdtemp(prefix="rolling-bench-"))
    print(f"load average {os.getloadavg()[0]:.2f}; workdir {work}", flush=True)
    out = {}
    for name, setup in (
        ("single llama-server", "single"),
        ("2 replicas behind HAProxy", "group"),
        ("blue/green llama-server behind HAProxy", "bluegreen"),
    ):
        group = setup == "group"
        out[name] = measure(work / setup, server, model, setup, args.applies)
        res = out[name]
        applies = res["applies"]
        print(
            f"\n{name}: {res['ok']} requests answered, {res['failed']} failed during {len(applies)} applies "
            f"{res['errors']}"
        )
        print(
            f"  apply -> healthy: median {statistics.median(a['apply_s'] for a in applies):.1f}s "
            f"({', '.join(str(a['apply_s']) for a in applies)}); outcomes {[a['outcome'] for a in applies]}"
        )
        if group:
            per = [s for a in applies for s in a["replica_s"]]
            drains = [s for a in applies for s in a["haproxy_drain_s"]]
            print(
                f"  per replica (drain in HAProxy -> UP again): median {statistics.median(per):.1f}s; "
                f"HAProxy drain until idle: median {statistics.median(drains):.2f}s"
            )
        if setup == "bluegreen":
            print(
                f"  the spare's start until UP in HAProxy: median "
                f"{statistics.median(a['spare_up_s'] for a in applies):.1f}s"
            )
    print(f"\nload average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
