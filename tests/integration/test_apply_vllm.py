"""Apply against a real vLLM (CPU build) that tuner manages: the whole loop, a start vLLM refuses, and tuner killed
while the new server is still starting.

One managed vLLM and one `tuner run` serve the module (a vLLM start costs ~30 s on 2 cores); the tests run in
file order and each leaves the server running and healthy for the next.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import realservers
import requests
from conftest import require
from test_apply_llama import propose, start_daemon, stop_daemon, tuner, wait_for

from tuner import procfs
from tuner.apply.launch import free_port
from tuner.apply.managed import group_pids, proc_argv
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.db import open_engine
from tuner.store.store import Store


class Managed:
    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg = root / "tuner.yaml"
        self.engine = open_engine(f"sqlite:///{root / 'tuner.db'}")

    def pid(self) -> int | None:
        st = jr.get_managed(self.engine, "tiny")
        return st.pid if st is not None and st.pid is not None and proc_argv(st.pid) is not None else None

    def healthy(self) -> bool:
        try:
            return requests.get(self.url + "/health", timeout=5, proxies={"http": ""}).ok
        except requests.RequestException:
            return False

    def scraped(self) -> bool:
        """Whether the daemon has stored a scrape of the server up: a load sent after it spans two scrapes at least,
        so the apply's baseline sees its requests finish (a fast load before the first scrape it would not)."""
        h = Store(self.engine).health("tiny")
        return h is not None and h.health == "up"

    def cache_config(self) -> dict[str, str]:
        text = requests.get(self.url + "/metrics", timeout=10, proxies={"http": ""}).text
        line = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
        return dict(re.findall(r'(\w+)="([^"]*)"', line))


@pytest.fixture(scope="module")
def managed_vllm(tmp_path_factory: pytest.TempPathFactory):
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    m = Managed(tmp_path_factory.mktemp("apply-vllm"))
    m.cfg.write_text(
        f"store: {{url: 'sqlite:///{m.root / 'tuner.db'}'}}\n"
        f"listen: 127.0.0.1:{free_port()}\n"
        "defaults: {scrape_interval: 2s, scrape_timeout: 2s}\n"
        "targets:\n"
        f"  - name: tiny\n    backend: vllm\n    url: {m.url}\n"
        "    slo: {ttft_p99: 5s, e2e_p99: 30s}\n"
        f"    managed:\n      model: {realservers.TINY_MODEL.path()}\n"
        f"      executable: {realservers.VLLM_PYTHON.path()}\n"
        "      flags: {max_num_seqs: 2, max_model_len: 1024, enable_prefix_caching: false}\n"
        "      extra_args: {enforce-eager: true}\n"
        f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{m.root / 'vllm-cache'}'}}\n"
        "      drain_timeout: 20s\n      start_timeout: 5m\n"
        # about how an apply happens: a verdict that cannot tell (no load after it) keeps the new flags here
        "    apply: {observe: 10s, observe_max: 10s, on_inconclusive: keep_new, baseline: 1m, min_requests: 1, "
        "max_restarts_per_hour: 50}\n"
    )
    tuner(m.cfg, "db", "upgrade")
    daemon = start_daemon(m.cfg, m.root / "run.log")
    try:
        wait_for(lambda: m.pid() and m.healthy() and m.scraped(), 300, "the daemon to start the managed vLLM, scraped")
        yield m
    finally:
        stop_daemon(daemon)
        tuner(m.cfg, "managed", "stop", check=False, timeout=120)


def test_recommend_apply_and_see_it_in_cache_config_info(managed_vllm):
    m = managed_vllm
    first = m.pid()
    assert m.cache_config()["enable_prefix_caching"] == "False"
    # Shared prompts (one system prompt for all), 8 at a time against --max-num-seqs 2.
    realservers.run_load_process(
        m.url,
        model="tiny",
        n_requests=48,
        concurrency=8,
        prompt_tokens_approx=150,
        max_tokens=32,
        distinct_prompts=False,
        timeout_s=240,
    )
    time.sleep(4)
    out = json.loads(
        tuner(m.cfg, "recommend", "tiny", "--window", "2m", "--repeated-prefix-share", "0.8", "--json").stdout
    )
    rec = next(r for r in out["recommendations"] if r["diff"] == {"enable_prefix_caching": True})
    assert "vllm.prefix_caching_off" in rec["rules"]

    dry = tuner(m.cfg, "apply-recommendation", str(rec["id"]), "--dry-run").stdout
    assert "enable_prefix_caching: False -> True" in dry and "--enable-prefix-caching" in dry
    assert m.pid() == first

    proc = tuner(m.cfg, "apply-recommendation", str(rec["id"]), "--yes", "--json", check=False, timeout=600)
    a = json.loads(proc.stdout)
    steps = [s["step"] for s in a["steps"]]
    assert steps[:8] == [
        "planned",
        "baseline",
        "draining",
        "stopped",
        "starting",
        "health_check",
        "healthy",
        "observing",
    ], steps
    assert "exited after SIGTERM" in a["steps"][3]["detail"]  # drained by vLLM's own --shutdown-timeout
    assert a["baseline"]["finished"] and a["baseline"]["e2e_p99"] is not None
    assert a["state"] == "done" and a["outcome"] in ("kept", "rolled_back", "inconclusive")
    status = recs.get_recommendation(m.engine, rec["id"]).status
    now = m.pid()
    assert now not in (None, first)
    if a["outcome"] in ("kept", "inconclusive"):  # inconclusive keeps the new flags here (on_inconclusive)
        assert status == "applied" and proc.returncode == 0
        assert "--enable-prefix-caching" in proc_argv(now) and proc_argv(now) == a["new_argv"]
        assert m.cache_config()["enable_prefix_caching"] == "True"  # vLLM's own report of its live config
    else:
        assert status == "rolled_back" and proc_argv(now) == a["old_argv"]
        assert m.cache_config()["enable_prefix_caching"] == "False"
    assert "--shutdown-timeout" in proc_argv(now)
    assert f"apply #{a['id']}" in tuner(m.cfg, "journal", "tiny").stdout
    # The server the apply started (or restored) has its engine core 10 nice levels below the rest, every thread of
    # it: vLLM pinned its worker to a core of this CPU host, so the engine core's busy-wait gives way to the API
    # server (tuner/apply/managed.py, yield_engine_core). The API server and the worker run as started.
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the server inherits this test's (managed.nice is 0)
    yielded = min(19, base + 10)
    # Where the kernel schedules by session, the server's session yields as much to other sessions (its autogroup).
    by_session = procfs.schedules_by_session()  # the server leads a session of its own: it has an autogroup
    session = f", its session at nice {yielded}" if by_session else ""
    healthy = next(s["detail"] for s in a["steps"] if s["step"] == "healthy")
    assert healthy.endswith(f"; engine core at nice {yielded}{session}"), healthy
    assert procfs.autogroup_nice(now) == (yielded if by_session else None)
    group = group_pids(now)
    core = [p for p in group if Path(f"/proc/{p}/comm").read_text().startswith("VLLM::EngineCor")]
    assert len(core) == 1, [(p, Path(f"/proc/{p}/comm").read_text()) for p in group]
    assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{core[0]}/task")} == {yielded}
    assert {os.getpriority(os.PRIO_PROCESS, p) for p in group if p != core[0]} == {base}


def test_a_flag_combination_vllm_refuses_is_restored_with_its_error_line(managed_vllm):
    m = managed_vllm
    before = m.pid()
    argv_before = proc_argv(before)
    # the advisor would never propose this: vLLM refuses it at start-up
    rid = propose(m.engine, "tiny", {"max_num_seqs": 128, "max_num_batched_tokens": 64}, {"max_num_seqs": 2})
    proc = tuner(m.cfg, "apply-recommendation", str(rid), "--yes", "--json", check=False, timeout=600)
    assert proc.returncode == 8
    a = json.loads(proc.stdout)
    assert a["outcome"] == "failed"
    assert "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)" in a["note"], a["note"]
    assert "previous flags restored and healthy" in a["note"]
    r = recs.get_recommendation(m.engine, rid)
    assert r.status == "failed" and "max_num_batched_tokens (64)" in r.note
    now = m.pid()
    assert now != before and proc_argv(now) == argv_before  # the same flags, a new process
    assert m.healthy()


def test_tuner_killed_while_the_new_vllm_starts_is_reconciled(managed_vllm):
    m = managed_vllm
    argv_before = proc_argv(m.pid())
    rid = propose(m.engine, "tiny", {"max_num_seqs": 4}, {"max_num_seqs": 2})
    apply = subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "--config", str(m.cfg), "apply-recommendation", str(rid), "--yes"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def new_server_starting() -> bool:
        # The managed record names the new process a moment before the journal's health_check step is written
        # (Applier.launch: save_managed, then spawned): killed in between, the apply is still at "starting", a
        # different case (the CI run of 2026-11-25 hit it). Wait for both.
        argv = proc_argv(m.pid() or 0) or []
        started = "--max-num-seqs" in argv and argv[argv.index("--max-num-seqs") + 1] == "4"
        return started and any(a.state == "health_check" for a in jr.open_applies(m.engine))

    wait_for(new_server_starting, 120, "the new vLLM (--max-num-seqs 4) to be starting, its apply at health_check")
    apply.send_signal(signal.SIGKILL)
    apply.wait()
    (open_,) = jr.open_applies(m.engine)
    assert open_.state == "health_check"
    out = tuner(m.cfg, "reconcile", timeout=600).stdout
    a = jr.get_apply(m.engine, open_.id)
    assert a.state == "done", out
    # The new server was still loading: reconcile waited for it, found the new flags healthy, observed again.
    assert "server found with the new flags and healthy" in a.note, a.note
    assert a.outcome in ("kept", "rolled_back", "inconclusive")
    want = argv_before if a.outcome == "rolled_back" else a.new_argv
    assert proc_argv(m.pid()) == want
    assert not jr.open_applies(m.engine)
