"""`tuner tune` on real vLLM CPU servers, with vLLM's own benchmark client, killed with -9 mid-trial and resumed.

What must hold, from what the run itself measured:
  * each trial's capacity is the highest rate whose runs met the objective, and every rate tried above it missed;
  * tuner's count of requests within the SLO equals vLLM's own goodput accounting on the same result files;
  * the winner is the trial with the highest measured capacity, and a recommendation is stored exactly when it
    beats the flags in force by more than the margin, with the measured numbers as its evidence;
  * kill -9 of tuner mid-trial leaves no trial server running (PR_SET_PDEATHSIG), and --resume keeps the finished
    trial and measures only what was left;
  * every trial server runs each flag of its candidate (its argv, read from /proc while it runs), and a vLLM trial's
    worker computes on the cores placed for it, the benchmark client on the others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import realservers
from conftest import require

from tuner import procfs
from tuner.app.tune import TuneRequest, _interval
from tuner.apply import managed as mg
from tuner.config import Slo
from tuner.store import recommendations as recs
from tuner.store import tuning as tj
from tuner.store.db import open_engine
from tuner.tune import speed
from tuner.tune.bench import attainment

OBJECTIVE = 0.95


def _config(tmp: Path) -> Path:
    cfg = tmp / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp / 'tuner.db'}'}}\n"
        "targets:\n"
        "  - name: tiny\n    backend: vllm\n    url: http://127.0.0.1:1\n"
        f"    slo: {{ttft_p99: 1s, e2e_p99: 4s, objective: {OBJECTIVE}}}\n"
        "    managed:\n"
        f"      model: {realservers.TINY_MODEL.path()}\n      executable: {realservers.VLLM_PYTHON.path()}\n"
        "      flags: {max_num_seqs: 1, max_model_len: 1024}\n"
        "      extra_args: {enforce-eager: true}\n"
        f"      env: {{VLLM_CPU_KVCACHE_SPACE: '1', HF_HUB_OFFLINE: '1', VLLM_CACHE_ROOT: '{tmp / 'vc'}'}}\n"
        f"      start_timeout: {int(realservers.VLLM_START_TIMEOUT_S)}s\n"
    )
    (tmp / "wl.yaml").write_text("input_len: 64\noutput_len: 64\nrange_ratio: 0.2\nrate_rps: 2\n")
    return cfg


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _group_alive(pgid: int) -> bool:
    return mg._group_alive(pgid)


def test_tune_measures_ranks_and_recommends_right_and_survives_kill9(tmp_path):
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    cfg = _config(tmp_path)
    tuner = [sys.executable, "-m", "tuner.cli", "-c", str(cfg)]
    subprocess.run(tuner + ["db", "upgrade"], check=True, capture_output=True)
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    argv = tuner + [
        "tune",
        "tiny",
        "--workload",
        str(tmp_path / "wl.yaml"),
        "--flags",
        "max_num_seqs=1/8",
        "--budget",
        "2",
        "--no-noise-check",
        "--run-seconds",
        "8",
        "--max-runs",
        "4",
        "--json",
    ]
    log = open(tmp_path / "tune-1.log", "w")
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)

    def second_trial_running():
        run = tj.latest_run(engine, "tiny")
        trials = tj.trials(engine, run.id) if run else []
        started = [t for t in trials if t.seq == 2 and t.status == "running" and t.pid]
        return started[0] if started else None

    try:  # every trial server's argv and cores are read while it runs (the checks of the llama-server test below)
        seen, trial = _watch_trials(engine, first, "tiny", until=second_trial_running, timeout=900)
        assert trial is not None, "tuner exited before its second trial's server started"
        _wait(lambda: first.poll() is not None or (tmp_path / "logs").exists(), 5, "the trial log")
        time.sleep(1.0)  # let it be mid-start: the kill lands while tuner waits on the server
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        log.close()
    # The trial server and its engine process die with tuner: nothing is left for anyone to find.
    _wait(lambda: not _group_alive(trial.pid), 60, f"trial server group {trial.pid} to go with its tuner")
    assert tj.trials(engine, trial.run_id)[1].status == "running"  # the journal shows what was cut short

    resumed = subprocess.Popen(argv + ["--resume"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _watch_trials(engine, resumed, "tiny", seen)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    out, err = resumed.communicate()
    assert resumed.returncode == 0, err[-3000:]
    result = json.loads(out)
    trials = tj.trials(engine, trial.run_id)
    assert [t.status for t in trials] == ["measured", "interrupted", "measured"], [t.status for t in trials]
    _check_trial_processes("vllm", [t for t in trials if t.pid], seen)
    assert trials[0].flags["max_num_seqs"] == 1 and trials[2].flags["max_num_seqs"] == 8  # trial 1 was kept
    assert not any(_group_alive(t.pid) for t in trials if t.pid)
    assert result["counts"] == {"measured": 2, "crashed": 0, "pruned": 0}

    check_decisions(
        engine,
        result,
        [trials[0], trials[2]],
        "max_num_seqs",
        baseline=1,
        slo=Slo(ttft_p99="1s", e2e_p99="4s", objective=OBJECTIVE),
    )


def check_decisions(engine, result, measured, flag, *, baseline, slo):  # type: ignore[no-untyped-def]
    """What a tuning run decided follows from what it measured (the checks of the module docstring)."""
    for t in measured:
        steps, runs = t.detail["steps"], t.detail["runs"]
        cap = t.capacity_rps
        assert cap > 0, t.detail["note"]
        at_cap = [s for s in steps if s["rate_rps"] == cap]
        assert at_cap and all(s["passed"] and s["attainment"] >= slo.objective for s in at_cap)
        assert all(not s["passed"] for s in steps if s["rate_rps"] > cap)  # every rate above it missed
        assert max(s["rate_rps"] for s in steps if s["passed"]) == cap
        for r in runs:  # tuner's count against vLLM's own goodput accounting, on the same file
            data = json.loads(Path(r["result_file"]).read_text())
            good, sent = attainment(data, slo)
            assert (good, sent) == (r["good"], r["sent"])
            assert good == round(data["request_goodput"] * data["duration"]), r["result_file"]
            # requests in flight (what the gallop's first step is sized from): Little's law on the client's numbers
            assert r["in_flight"] == pytest.approx(data["request_throughput"] * data["mean_e2el_ms"] / 1000)
        assert t.detail["in_flight"] == next(r["in_flight"] for r in runs if r["rate_rps"] == cap)
        # the runs that met the capacity read the server's speed from the client's timings (tuner/tune/speed.py), and
        # the interval reaches the missed rate at their speed exactly where the runs that missed stepped slower
        assert all(r["step_s"] for r in runs if r["rate_rps"] == cap), [r["step_s"] for r in runs]
        hi = t.detail["hi_rps"]
        if hi is not None:
            at = {rate: speed.pooled(r["step_s"] for r in runs if r["rate_rps"] == rate) for rate in (cap, hi)}
            slower = speed.slowdown(at[cap], at[hi])
            tolerance = TuneRequest(target="").tolerance  # tune's default: the test passes no --tolerance
            want = hi * slower if slower is not None and slower > 1 + tolerance else hi
            assert t.detail["hi_same_speed_rps"] == pytest.approx(want)

    caps = {t.flags[flag]: t.capacity_rps for t in measured}
    best = max(caps, key=lambda k: caps[k])
    assert result["best"]["flags"][flag] == best and result["best"]["capacity_rps"] == caps[best]
    assert result["baseline"]["capacity_rps"] == caps[baseline]
    stored = recs.list_recommendations(engine, target=result["target"])

    # stored only beyond the measurement's reach: confirmed in turns, or (no comparison) the winner met a rate the
    # flags in force missed and gained 15% or more
    # (the one compared in turns is judged: the winner, or the runner-up when the flags in force measured highest)
    # the intervals as tuner reports them: the miss at the met rate's speed (hi_same_speed_rps, checked above)
    base_missed = _interval(next(t for t in measured if t.flags[flag] == baseline).detail)[1]
    judged = best
    if result["comparison"] is not None:
        judged = result["comparison"]["flags"][flag]
        assert judged != baseline and judged == max((k for k in caps if k != baseline), key=lambda k: caps[k])
        beyond = result["comparison"]["outcome"] == "b_better"
    else:
        beyond = base_missed is not None and caps[best] >= base_missed and caps[best] >= caps[baseline] * 1.15
    assert result["best"]["interval"] == _interval(next(t for t in measured if t.flags[flag] == best).detail)
    assert result["best"]["interval"][0] == caps[best]
    if judged != baseline and beyond:
        assert len(stored) == 1 and stored[0].diff == {flag: judged}
        ev = stored[0].evidence[0]
        assert (ev["capacity_rps"], ev["baseline_capacity_rps"]) == (caps[judged], caps[baseline])
        assert result["recommendation_id"] == stored[0].id
    else:
        assert stored == [] and result["recommendation_id"] is None
    # the session's own account of what ran and where, for whoever reads the log
    print(json.dumps({"capacities": caps, "verdict": result.get("verdict")}))


def test_tune_a_real_llama_server_with_the_same_client(tmp_path):
    """tune measures and ranks llama-server configs with vLLM's benchmark client, and each trial's own command line
    (read from /proc while it runs) carries every flag of its candidate, flash-attention's value included. (vLLM's
    trials are read the same way in the kill -9 test above; the advisor's backend switch, said at set-up and never
    run, is tests/app/test_tune.py's.)"""
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n"
        "targets:\n"
        "  - name: llama\n    backend: llamacpp\n    url: http://127.0.0.1:1\n"
        f"    slo: {{e2e_p99: 4s, objective: {OBJECTIVE}}}\n"
        f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n      executable: {realservers.LLAMA_SERVER.path()}\n"
        "      flags: {parallel: 1, ctx_size: 1024, flash_attn: 'off'}\n      extra_args: {'-t': 1}\n"
    )
    # The client writes its prompts with the tiny HF model's tokenizer; the GGUF's own vocabulary reads them as
    # more tokens, so the lengths are small enough for a 512-token slot either way.
    (tmp_path / "wl.yaml").write_text("input_len: 16\noutput_len: 64\nrange_ratio: 0.2\nrate_rps: 2\n")
    tuner = [sys.executable, "-m", "tuner.cli", "-c", str(cfg)]
    subprocess.run(tuner + ["db", "upgrade"], check=True, capture_output=True)
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    proc = subprocess.Popen(
        tuner
        + [
            "tune",
            "llama",
            "--workload",
            str(tmp_path / "wl.yaml"),
            "--flags",
            "parallel=1/2,flash_attn",
            "--budget",
            "2",
            "--no-noise-check",
            "--run-seconds",
            "8",
            "--max-runs",
            "4",
            "--client-python",
            str(realservers.VLLM_PYTHON.path()),
            "--tokenizer",
            str(realservers.TINY_MODEL.path()),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen, _ = _watch_trials(engine, proc, "llama", timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    trials = tj.trials(engine, result["run_id"])
    assert [(t.flags["parallel"], t.flags["flash_attn"], t.status) for t in trials] == [
        (1, "off", "measured"),
        (2, "off", "measured"),  # the gallop's step along --parallel
    ], [(t.flags, t.status, t.detail.get("error")) for t in trials]
    _check_trial_processes("llamacpp", trials, seen)
    check_decisions(engine, result, trials, "parallel", baseline=1, slo=Slo(e2e_p99="4s", objective=OBJECTIVE))


def test_a_llama_server_left_at_its_builds_default_says_how_many_slots_it_runs(llama_server_factory):
    """With --parallel left out, llama-server runs its build's default slot count, which no flag says: the count
    tune's ladder is sized by (``_slots``) is what the real server reports on /props, and what its own log says it
    started with (``n_slots = N``); a --parallel given is that number in all three."""
    import re

    from tuner.app.tune import _slots
    from tuner.tune.space import Hardware

    for flags, given in (({"--parallel": None}, {}), ({"--parallel": 3}, {"parallel": 3})):
        server = llama_server_factory(flags=flags)
        assert ("--parallel" in server.process.argv) == bool(given)
        read = _slots("llamacpp", given, Hardware(), server.url)
        logged = re.findall(r"n_slots\s*=\s*(\d+)", Path(server.process.log_path).read_text())
        assert read is not None and logged and {int(n) for n in logged} == {read}, (read, logged)
        assert read == given.get("parallel", read)
        server.stop()


def _llama_on_target_config(tmp: Path, port: int, window: str) -> Path:
    cfg = tmp / f"tuner-{abs(hash(window))}.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp / 'tuner.db'}'}}\n"
        "targets:\n"
        f"  - name: llama\n    backend: llamacpp\n    url: http://127.0.0.1:{port}\n"
        f"    slo: {{e2e_p99: 4s, objective: {OBJECTIVE}}}\n"
        f"    apply: {{maintenance_windows: ['{window}']}}\n"
        f"    managed:\n      model: {realservers.TINY_GGUF.path()}\n      executable: {realservers.LLAMA_SERVER.path()}\n"
        "      flags: {parallel: 1, ctx_size: 1024}\n      extra_args: {'-t': 1}\n"
        f"      log_dir: {tmp / 'logs'}\n      start_timeout: 60s\n      drain_timeout: 5s\n"
    )
    return cfg


def test_tune_on_target_only_in_its_window_restores_production_and_survives_kill9(tmp_path):
    """--on-target on a real llama-server: refused outside the target's maintenance window with production untouched;
    inside it, trials run on production's own port while production is down; kill -9 mid-trial leaves production to
    the next reconcile, which starts it again with the flags in force; --resume finishes and production is back,
    healthy, with the flags in force, and the journal shows the session as one `tune` entry."""
    require(realservers.LLAMA_SERVER, realservers.TINY_GGUF, realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    from datetime import datetime, timedelta, timezone

    from tuner.apply.launch import free_port
    from tuner.store import journal as jr

    port = free_port()
    now = datetime.now(timezone.utc)
    hhmm = lambda d: (now + d).strftime("%H:%M")  # noqa: E731
    open_now = _llama_on_target_config(tmp_path, port, f"daily {hhmm(timedelta(hours=-1))}-{hhmm(timedelta(hours=2))}")
    closed = _llama_on_target_config(tmp_path, port, f"daily {hhmm(timedelta(hours=3))}-{hhmm(timedelta(hours=4))}")
    (tmp_path / "wl.yaml").write_text("input_len: 16\noutput_len: 64\nrange_ratio: 0.2\nrate_rps: 2\n")
    tuner = [sys.executable, "-m", "tuner.cli", "-c"]
    subprocess.run(tuner + [str(open_now), "db", "upgrade"], check=True, capture_output=True)
    started = subprocess.run(
        tuner + [str(open_now), "managed", "start", "llama"], capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr[-2000:]
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    prod = jr.get_managed(engine, "llama")
    assert prod is not None and prod.pid and mg.is_alive(prod.pid, prod.proc_start)
    in_force = mg.proc_argv(prod.pid)
    tune = [
        "tune",
        "llama",
        "--on-target",
        "--workload",
        str(tmp_path / "wl.yaml"),
        "--flags",
        "parallel=1/2",
        "--budget",
        "2",
        "--no-noise-check",
        "--run-seconds",
        "6",
        "--max-runs",
        "3",
        "--client-python",
        str(realservers.VLLM_PYTHON.path()),
        "--tokenizer",
        str(realservers.TINY_MODEL.path()),
        "--json",
    ]
    try:
        # Outside the window: refused, naming the key; production never touched.
        out = subprocess.run(tuner + [str(closed)] + tune, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "targets[llama].apply.maintenance_windows" in out.stderr, out.stderr[-2000:]
        assert mg.is_alive(prod.pid, prod.proc_start) and jr.open_applies(engine) == []

        # Inside it: production drained, the first trial on its own port; kill -9 while the trial server serves.
        log = open(tmp_path / "tune-on-target-1.log", "w")
        first = subprocess.Popen(tuner + [str(open_now)] + tune, stdout=subprocess.PIPE, stderr=log, text=True)

        def trial_running():
            run = tj.latest_run(engine, "llama")
            live = [t for t in (tj.trials(engine, run.id) if run else []) if t.status == "running" and t.pid]
            return live[0] if live and mg.is_alive(live[0].pid, live[0].proc_start) else None

        try:
            trial = _wait(trial_running, 300, "an on-target trial server")
            assert trial.url == f"http://127.0.0.1:{port}"  # production's own port
            assert not mg.is_alive(prod.pid, prod.proc_start)  # production was drained for it
            (lock,) = jr.open_applies(engine)
            assert lock.kind == "tune" and lock.target == "llama"
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
            log.close()
        _wait(lambda: not _group_alive(trial.pid), 60, "the trial server to go with its tuner")
        assert mg.find_by_argv(in_force) is None  # production is down until someone reconciles

        rec = subprocess.run(tuner + [str(open_now), "reconcile"], capture_output=True, text=True, timeout=180)
        assert rec.returncode == 0, rec.stderr[-2000:]
        back = jr.get_managed(engine, "llama")
        assert back is not None and back.pid and mg.is_alive(back.pid, back.proc_start)
        assert mg.proc_argv(back.pid) == in_force and jr.open_applies(engine) == []
        (entry,) = [a for a in jr.list_applies(engine, target="llama") if a.kind == "tune"]
        assert entry.state == "done" and entry.outcome == "unchanged" and "reconciled" in entry.note, entry

        # --resume, still inside the window: the rest of the trials, then production back with the flags in force.
        out = subprocess.run(tuner + [str(open_now)] + tune + ["--resume"], capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout)
        trials = tj.trials(engine, result["run_id"])
        measured = [t for t in trials if t.status == "measured"]
        assert sorted(t.flags["parallel"] for t in measured) == [1, 2], [(t.flags, t.status) for t in trials]
        assert all(t.url == f"http://127.0.0.1:{port}" for t in trials if t.pid)
        check_decisions(engine, result, measured, "parallel", baseline=1, slo=Slo(e2e_p99="4s", objective=OBJECTIVE))
        final = jr.get_managed(engine, "llama")
        assert final is not None and final.pid and mg.is_alive(final.pid, final.proc_start)
        assert mg.proc_argv(final.pid) == in_force
        mg.health_gate(realservers_target(port))
        entries = [a for a in jr.list_applies(engine, target="llama") if a.kind == "tune"]
        assert len(entries) == 2 and all((a.state, a.outcome) == ("done", "unchanged") for a in entries)
        assert jr.open_applies(engine) == []
        assert "restored and healthy" in entries[0].note, entries[0].note  # newest first
    finally:
        subprocess.run(tuner + [str(open_now), "managed", "stop", "llama"], capture_output=True, timeout=120)


def realservers_target(port: int):  # type: ignore[no-untyped-def]
    """A minimal target for the health gate (a real completion through the server)."""
    from tuner.config import Target

    return Target(name="llama", backend="llamacpp", url=f"http://127.0.0.1:{port}")


# How each server spells the flags tune searches: written out here, not taken from tuner, so a trial labelled with a
# flag its server never got is caught by a reading of its own command line.
_SPELLING = {
    "vllm": {
        n: "--" + n.replace("_", "-")
        for n in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "enable_prefix_caching",
            "enable_chunked_prefill",
            "max_model_len",
        )
    },
    "llamacpp": {
        "parallel": "--parallel",
        "ctx_size": "-c",
        "batch_size": "-b",
        "ubatch_size": "-ub",
        "flash_attn": "-fa",
    },
}


def _carried(backend: str, flags: dict, argv: list[str]) -> list[str]:
    """The flags of ``flags`` that ``argv`` does not carry (a switch off is --no-<name>)."""
    missing = []
    for name, value in flags.items():
        flag = _SPELLING[backend].get(name)
        if flag is None:
            missing.append(f"{name}={value}")
        elif value is True:
            missing += [] if flag in argv else [f"{name}=true"]
        elif value is False:
            missing += [] if "--no-" + flag[2:] in argv else [f"{name}=false"]
        elif not any(a == flag and b == str(value) for a, b in zip(argv, argv[1:])):
            missing.append(f"{name}={value}")
    return missing


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for child in procfs.pids():
        st = procfs.stat(child)
        if st is not None:
            kids.setdefault(st.ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _threads_cpus(pid: int) -> set[str]:
    """The Cpus_allowed_list of every thread of ``pid``, as the kernel writes it."""
    out = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {
                line.split(":\t")[1]
                for line in (task / "status").read_text().splitlines()
                if line.startswith("Cpus_allowed_list")
            }
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _watch_trials(engine, proc, target, seen=None, until=None, timeout=1200.0):  # type: ignore[no-untyped-def]
    """Each trial server's argv, read from /proc/<pid>/cmdline while it runs, until ``proc`` exits (or ``until()``
    returns something, which is returned too); for vLLM also the CPUs its worker's threads and the benchmark
    client's may run on (the last reading while it ran)."""
    seen = {} if seen is None else seen
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"tuner still running after {timeout:g}s"
        # asked before the scan, so that what it finds (a trial that just started) is scanned before it returns: asked
        # after, a trial that started between the two went unread (CI dry run of 8d6a5d3: "trial 2 ran too briefly")
        found = until() if until is not None else None
        run = tj.latest_run(engine, target)
        for t in tj.trials(engine, run.id) if run else []:
            if t.status == "running" and t.pid and mg.is_alive(t.pid, t.proc_start):
                got = seen.setdefault(t.id, {})
                if "argv" not in got:
                    argv = mg.proc_argv(t.pid)
                    if argv:
                        got["argv"] = argv
                workers = [p for p in _descendants(t.pid) if _comm(p) == "VLLM::Worker"]
                cpus = _threads_cpus(workers[0]) if workers else set()
                if cpus:
                    got["worker"] = cpus
                clients = [p for p in _descendants(proc.pid) if b"vllm.benchmarks.serve" in _cmdline(p)]
                cpus = _threads_cpus(clients[0]) if clients else set()
                if cpus:
                    got["client"] = cpus
        if found:
            return seen, found
        time.sleep(0.05)
    return seen, None


def _check_trial_processes(backend: str, started: list, seen: dict[int, dict], *, placed_too: bool = True) -> None:  # type: ignore[type-arg]
    """Each trial server ran every flag of its candidate (its argv, read from /proc while it ran); a vLLM trial's
    worker computed on the cores placed for it, the benchmark client on the others."""
    for t in started:
        assert "argv" in seen.get(t.id, {}), f"trial {t.seq} ran too briefly to be read"
        assert _carried(backend, t.flags, seen[t.id]["argv"]) == [], (t.flags, seen[t.id]["argv"])
        if backend != "vllm" or not placed_too or t.status != "measured":
            continue
        placed = t.detail["placement"]
        assert seen[t.id]["worker"] == {",".join(map(str, placed["worker_cpus"]))}, (seen[t.id], placed)
        client = {
            c
            for lst in seen[t.id]["client"]
            for part in lst.split(",")
            for c in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)
        }
        if placed["client_cpus"]:  # a core of its own
            assert client <= set(placed["client_cpus"]) and not client & set(placed["worker_cpus"]), (
                seen[t.id],
                placed,
            )
        else:  # every other core has a pinned process: the client runs where the kernel puts it
            assert client == set(os.sched_getaffinity(0)), (seen[t.id], placed)
