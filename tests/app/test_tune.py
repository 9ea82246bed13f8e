"""`tuner tune`'s refusals and its crash safety, without a trial server: every refusal names what to fix, and a
trial server left by a dead tuner is stopped (a real process, found again by pid and kernel start time)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tuner.app.tune import TuneRequest, reap_orphans, tune
from tuner.apply import managed as mg
from tuner.apply.flow import Applier, own_identity
from tuner.apply.servers import busy
from tuner.config import parse_config
from tuner.errors import ConfigError, NothingToMeasureError, TargetBusyError
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store import tuning as tj
from tuner.store.db import open_engine
from tuner.tune.space import Hardware


def _cfg(tmp_path, target: str) -> object:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "m.gguf").write_bytes(b"")  # never read: every case is refused before the model is
    (model / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "hidden_size": 128, '
        '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
        '"intermediate_size": 256, "vocab_size": 4096, "max_position_embeddings": 2048}'
    )
    return parse_config(f"targets:\n{target.replace('MODEL', str(model))}")


VLLM = (
    "  - name: v\n    backend: vllm\n    url: http://127.0.0.1:9\n    slo: {e2e_p99: 4s}\n"
    "    managed: {model: MODEL, flags: {max_num_seqs: 2}, env: {VLLM_CPU_KVCACHE_SPACE: '1'}}\n"
)


LLAMA = (
    "  - name: l\n    backend: llamacpp\n    url: http://127.0.0.1:9\n    slo: {e2e_p99: 4s}\n"
    "    managed: {model: MODEL/m.gguf, flags: {parallel: 2}}\n"
)


AT_0300 = datetime(2026, 11, 23, 3, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    "target,req,key",
    [
        (
            "  - name: l\n    backend: llamacpp\n    url: http://127.0.0.1:9\n    slo: {e2e_p99: 4s}\n",
            TuneRequest("l"),
            "targets[l].managed",
        ),
        (LLAMA, TuneRequest("l"), "--client-python"),
        (LLAMA, TuneRequest("l", client_python=sys.executable), "--tokenizer"),
        (LLAMA, TuneRequest("l", client_python=sys.executable, tokenizer="t"), "--workload"),  # no request lengths
        (
            "  - name: v\n    backend: vllm\n    url: http://127.0.0.1:9\n    slo: {e2e_p99: 4s}\n",
            TuneRequest("v"),
            "targets[v].managed",
        ),
        (VLLM.replace("    slo: {e2e_p99: 4s}\n", ""), TuneRequest("v"), "targets[v].slo"),
        (VLLM, TuneRequest("v", budget=0), "--budget"),
        (VLLM, TuneRequest("v", on_target=True), "targets[v].apply.maintenance_windows"),  # none configured
        (
            VLLM.replace("    managed:", "    apply: {maintenance_windows: ['daily 04:00-05:00']}\n    managed:"),
            TuneRequest("v", on_target=True),
            "targets[v].apply.maintenance_windows",
        ),  # closed at 03:00
        (
            VLLM.replace("    managed:", "    apply: {maintenance_windows: ['daily 02:00-03:10']}\n    managed:"),
            TuneRequest("v", on_target=True),
            "targets[v].apply.maintenance_windows",
        ),  # 10 min left < drain + start
        (VLLM, TuneRequest("v", sampler="bayes"), "--sampler"),
        (VLLM, TuneRequest("v", resume=True), "--resume"),
        (VLLM, TuneRequest("v"), "--workload"),  # no stored traffic and no file
        (VLLM, TuneRequest("v", workload_file="/nonexistent/wl.yaml"), ""),
    ],
)
def test_refusals_name_what_to_fix(tmp_path, store, target, req, key):
    cfg = _cfg(tmp_path, target)
    with pytest.raises(ConfigError) as err:
        tune(cfg, store, req, config_dir=tmp_path, say=lambda m: None, clock=lambda: AT_0300)
    assert err.value.key == key, str(err.value)
    assert tj.latest_run(store.engine, req.target) is None or key == ""  # nothing started, nothing journaled


def test_a_trial_server_left_running_by_a_dead_tuner_is_stopped_and_its_trial_marked(tmp_path, store):
    # A real process in its own session standing in for a trial server (what matters: found by pid + start time).
    sleeper = mg.start_server([sys.executable, "-c", "import time; time.sleep(600)"], {}, tmp_path / "s.log")
    run = tj.begin_run(store.engine, target="v", now=time.time(), request={}, workload={}, slo={}, baseline_flags={})
    tid = tj.begin_trial(store.engine, run, now=time.time(), flags={"max_num_seqs": 4}, seed="", url="u")
    tj.trial_started(store.engine, tid, pid=sleeper.pid, proc_start=sleeper.start)
    gone = tj.begin_trial(store.engine, run, now=time.time(), flags={"max_num_seqs": 8}, seed="", url="u")
    tj.trial_started(store.engine, gone, pid=sleeper.pid, proc_start=sleeper.start + 1)  # a recycled pid: not ours
    said = []
    assert reap_orphans(store, said.append, time.time()) == 1
    assert sleeper.gone() and "pid" in said[0]
    assert [t.status for t in tj.trials(store.engine, run)] == ["interrupted", "interrupted"]
    assert tj.orphans(store.engine, alive=mg.is_alive) == []


def test_a_trial_server_dies_with_the_tuner_that_started_it(tmp_path):
    # The parent here is a short-lived Python that starts a server with die_with_parent and is then SIGKILLed.
    code = (
        "import sys, time; from pathlib import Path; from tuner.apply import managed as mg; "
        "r = mg.start_server([sys.executable, '-c', 'import time; time.sleep(600)'], {}, "
        f"Path({str(tmp_path / 's.log')!r}), die_with_parent=True); print(r.pid, r.start, flush=True); "
        "time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid, start = map(int, parent.stdout.readline().split())
    assert mg.is_alive(pid, start)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while mg.is_alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mg.is_alive(pid, start)


def test_what_a_trial_server_started_dies_with_the_tuner_too(tmp_path):
    """PR_SET_PDEATHSIG reaches only the server itself: vLLM's engine core and worker, children in the server's
    process group, were seen running 13 minutes after their tuner died. The group's sentinel kills them too."""
    child_pid = tmp_path / "child.pid"
    server = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(child_pid)!r}, 'w').write(str(c.pid)); time.sleep(600)"
    )
    code = (
        "import sys, time; from pathlib import Path; from tuner.apply import managed as mg; "
        f"r = mg.start_server([sys.executable, '-c', {server!r}], {{}}, "
        f"Path({str(tmp_path / 's.log')!r}), die_with_parent=True); print(r.pid, flush=True); "
        "time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pgid = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while not (child_pid.exists() and child_pid.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(child_pid.read_text())
    assert os.getpgid(child) == pgid  # the engine-like child is in the server's group
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while mg._group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mg._group_alive(pgid)  # the server and the child it started, both gone


def test_a_stopped_trial_server_leaves_no_sentinel_behind(tmp_path):
    from tuner.apply.launch import ServerProcess

    proc = ServerProcess.start(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env=None,
        log_path=tmp_path / "s.log",
        die_with_parent=True,
    )
    # Only the watcher of this server's group counts: other tests on the machine may run watchers of their own.
    # Between its fork and its exec the watcher's /proc cmdline is still this process's: wait for the exec.
    deadline = time.monotonic() + 10
    while not _sentinels(group=proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_sentinels(group=proc.pid)) == 1
    proc.stop(grace_s=1)
    deadline = time.monotonic() + 10
    while _sentinels(group=proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _sentinels(group=proc.pid)


def test_a_trial_server_stopped_as_tune_stops_it_leaves_no_sentinel_behind(tmp_path):
    """tune stops its trial servers with managed.stop_server, not ServerProcess.stop: the sentinel must go there too.
    Seen in a corpus bench: one watcher per finished trial still running 31 minutes on (ten of them, 9.4 MB each),
    each to kill its group id when tuner exits, by when the kernel may have handed that id to another process."""
    from tuner.lab.proc import wait_for

    r = mg.start_server(
        [sys.executable, "-c", "import time; time.sleep(600)"], {}, tmp_path / "s.log", die_with_parent=True
    )
    wait_for(lambda: _sentinels(group=r.pid), 10, "the server's sentinel")  # once it has exec'd
    mg.stop_server(r, grace_s=1)
    assert not mg._group_alive(r.pid)
    wait_for(lambda: not _sentinels(group=r.pid), 10, "the sentinel to go with its stopped server")


def _sentinels(group: int | None = None) -> set[int]:
    """Pids of running group watchers (of process group ``group`` only, when given)."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if b"os.killpg(int(sys.argv[1])" in cmd and (group is None or cmd.split(b"\0")[-2] == str(group).encode()):
                out.add(int(d))
    return out


def _first_tuner(db: str, log: str, started, stop) -> None:
    """A `tuner tune` at work, reduced to what it journals: its run (owned by it), a trial, the trial's server."""
    engine = open_engine(f"sqlite:///{db}")
    run = tj.begin_run(
        engine, target="v", now=time.time(), request={}, workload={}, slo={}, baseline_flags={}, owner=own_identity()
    )
    tid = tj.begin_trial(engine, run, now=time.time(), flags={"max_num_seqs": 4}, seed="", url="u")
    # not die_with_parent: when this tuner dies, its server is left running, as after a kill -9 of a whole group
    server = mg.start_server([sys.executable, "-c", "import time; time.sleep(600)"], {}, Path(log))
    tj.trial_started(engine, tid, pid=server.pid, proc_start=server.start)
    started.put((run, tid, server.pid, server.start))
    stop.wait(120)
    os._exit(1)  # dies mid-trial: nothing finished, nothing cleaned up


def test_a_second_tune_leaves_the_trial_servers_of_a_tune_still_running_alone(tmp_path, store):
    """Before the fix the second `tuner tune` (any target) stopped every trial journaled running: the live trial
    server of a tune at work in another process was killed under it. Now each run records its tuner; the trials
    of a live tuner are left alone, and once that tuner is dead the next tune reaps them."""
    ctx = multiprocessing.get_context("fork")
    started, stop = ctx.Queue(), ctx.Event()
    first = ctx.Process(target=_first_tuner, args=(store.engine.url.database, str(tmp_path / "s.log"), started, stop))
    first.start()
    try:
        run, _, pid, start = started.get(timeout=60)
        said: list[str] = []
        assert reap_orphans(store, said.append, time.time()) == 0, said  # what a second `tuner tune` does first
        assert mg.is_alive(pid, start) and [t.status for t in tj.trials(store.engine, run)] == ["running"]
        assert tj.get_run(store.engine, run).owner == (first.pid, mg.proc_start_time(first.pid))
    finally:
        stop.set()
        first.join(30)
    assert reap_orphans(store, said.append, time.time()) == 1  # its tuner is gone: the server is an orphan now
    assert not mg.is_alive(pid, start) and [t.status for t in tj.trials(store.engine, run)] == ["interrupted"]


WORKLOAD = "input_len: 64\noutput_len: 16\nrate_rps: 1\n"


def test_a_tune_is_refused_while_an_apply_holds_the_target_and_holds_it_against_applies(tmp_path, store):
    """The apply journal's hold covers tuning runs: a tune does not start while an apply (or another tune) holds
    the target, and while a tune beside production runs, an apply of the target is refused with the tune's entry
    named, while the supervisor keeps production up (a shadow tune does not touch it)."""
    cfg = _cfg(tmp_path, VLLM)
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    req = TuneRequest("v", workload_file=str(tmp_path / "w.yaml"), client_python=sys.executable, budget=1)
    me = own_identity()
    aid = jr.begin_apply(
        store.engine,
        target="v",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=time.time(),
        diff={},
        old_flags={},
        new_flags={},
        old_argv=[],
        new_argv=[],
        owner_pid=me[0],
        owner_start=me[1],
    )  # a live tuner's apply
    with pytest.raises(TargetBusyError, match=f"target 'v' has apply #{aid} in progress"):
        tune(cfg, store, req, config_dir=tmp_path, say=lambda m: None)
    assert tj.latest_run(store.engine, "v") is None  # refused before anything was journaled
    jr.finish(store.engine, aid, "kept", "", now=time.time())

    rid = recs.add_recommendation(
        store.engine,
        target="v",
        now=time.time(),
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 4},
        current={"max_num_seqs": 2},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    ap = Applier(cfg, store, tmp_path, say=lambda m: None)
    seen: list[str] = []

    def meanwhile(line: str) -> None:  # the tune's progress: its search is about to start, the target is held
        if line.startswith("tuning v:"):
            try:
                ap.open_apply(rid)
                seen.append("apply opened")
            except TargetBusyError as exc:
                seen.append(str(exc))
            seen.append(f"supervisor sees busy: {busy(store.engine, cfg, cfg.targets[0], shadow=False)}")

    tune(cfg, store, req, config_dir=tmp_path, say=meanwhile)  # no vLLM here: its one trial crashes at once
    assert len(seen) == 2 and "(tune, shadow) in progress" in seen[0], seen
    assert seen[1] == "supervisor sees busy: []"
    [entry] = [a for a in jr.list_applies(store.engine, target="v") if a.kind == "tune"]
    assert entry.state == "done" and entry.mode == "shadow" and "not touched" in entry.note, entry
    assert entry.outcome == "unchanged", entry  # no rollback on a dashboard: nothing was applied
    from tuner.app.status import _last_apply

    assert _last_apply(store, "v").id == aid  # `tuner status` shows the last apply, not a tune that changed nothing
    assert ap.open_apply(rid).id > entry.id  # free again once the tune ended


def test_nothing_to_measure_is_an_error_naming_the_binding_constraint_and_the_fix(tmp_path, store):
    """The issue's RAG case: a workload whose longest request reads 1000 + 200 tokens (the buckets' edges) against
    flags in force with max-model-len 1024, max-model-len the only flag searched: every candidate pruned. It used
    to print a table of pruned rows and exit 0; now nothing starts, nothing is journaled, and one line says why."""
    cfg = _cfg(tmp_path, VLLM.replace("flags: {max_num_seqs: 2}", "flags: {max_num_seqs: 2, max_model_len: 1024}"))
    wl = tmp_path / "wl.yaml"
    wl.write_text("input_len: 752\noutput_len: 80\nmax_prompt_tokens: 1000\nmax_output_tokens: 200\n")
    said: list[str] = []
    with pytest.raises(NothingToMeasureError) as err:
        tune(
            cfg,
            store,
            TuneRequest("v", workload_file=str(wl), flags=("max_model_len",)),
            config_dir=tmp_path,
            say=said.append,
            clock=lambda: AT_0300,
        )
    msg = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in msg
    assert "max-model-len 1024 < the workload's longest request (1200 tokens)" in msg
    assert "the flags in force among them" in msg and "search a larger max_model_len" in msg
    assert "max_request_tokens" in msg  # or lower the workload's longest request
    assert tj.latest_run(store.engine, "v") is None  # nothing journaled, no server started
    # the pruned are counted by reason, one line each, not one row per point
    counts = [line for line in said if line.startswith("pruned")]
    assert counts == [
        "pruned     1 x len_below_longest: max-model-len 1024 < the workload's longest request (1200 tokens)"
    ], said


def test_the_same_workload_with_its_proven_longest_request_is_measurable(tmp_path, store):
    """With max_request_tokens (what `tuner workload` writes when the window served every request at 1024) the flags
    in force are feasible: the run gets past the feasibility check to its first trial (whose server cannot start:
    the executable does not exist)."""
    cfg = _cfg(
        tmp_path,
        VLLM.replace(
            "flags: {max_num_seqs: 2}", "flags: {max_num_seqs: 2, max_model_len: 1024}, executable: /nonexistent/python"
        ),
    )
    wl = tmp_path / "wl.yaml"
    wl.write_text(
        "input_len: 752\noutput_len: 80\nmax_prompt_tokens: 1000\nmax_output_tokens: 200\nmax_request_tokens: 1024\n"
    )
    said: list[str] = []
    with pytest.raises(Exception) as err:
        tune(
            cfg,
            store,
            TuneRequest("v", workload_file=str(wl), flags=("max_model_len",)),
            config_dir=tmp_path,
            say=said.append,
            clock=lambda: AT_0300,
        )
    assert not isinstance(err.value, NothingToMeasureError)
    assert any(line.startswith("trial 1/8 (baseline): max_model_len=1024") for line in said), said


def test_a_backend_switch_is_no_candidate_and_says_why():
    """The advisor's `backend: vllm -> llamacpp` ran as vLLM with the baseline's argv, labelled backend=llamacpp."""
    from tuner.tune.space import Hardware, feasible, not_applied

    v = feasible("vllm", {"max_num_seqs": 4, "backend": "llamacpp"}, model=None, hardware=Hardware(), longest=10)
    assert not v.ok and v.kind == "not_applied" and "not a tune candidate" in v.reason
    assert "llamacpp" in not_applied("vllm", {"backend": "llamacpp"})
    assert not_applied("vllm", {"max_num_seqs": 4}) == ""


def test_the_advisors_backend_switch_from_real_scrapes_is_said_at_set_up_and_never_run(tmp_path, store):
    """A vLLM target whose store holds recorded real vLLM scrapes: the advisor proposes `backend: vllm -> llamacpp`
    (no GPU here) beside its flag changes. Tune says at set-up why the switch is no candidate and journals no trial
    labelled with it; the run goes on to its first trial (whose server cannot start: the executable does not
    exist). Once that switch ran as vLLM with the baseline's argv, labelled backend=llamacpp."""
    from tests.helpers import store_recorded_history

    end = store_recorded_history(store, AT_0300 - 200, fixtures=("metrics_after_load.txt",))
    cfg = _cfg(
        tmp_path, VLLM.replace("flags: {max_num_seqs: 2}", "flags: {max_num_seqs: 1}, executable: /nonexistent/python")
    )
    wl = tmp_path / "wl.yaml"
    wl.write_text("input_len: 16\noutput_len: 32\nrange_ratio: 0.2\nrate_rps: 2\n")
    said: list[str] = []
    with pytest.raises(Exception) as err:
        tune(
            cfg,
            store,
            TuneRequest("v", workload_file=str(wl), flags=("max_num_seqs",), budget=3),
            config_dir=tmp_path,
            say=said.append,
            clock=lambda: end,
        )
    assert not isinstance(err.value, NothingToMeasureError)
    switch = [line for line in said if line.startswith("the advisor's backend=llamacpp")]
    assert len(switch) == 1 and "backend vllm -> llamacpp is not a tune candidate" in switch[0], said
    assert any(line.startswith("trial 1/3 (baseline): max_num_seqs=1") for line in said), said
    run = tj.latest_run(store.engine, "v")
    assert run is not None and not any("backend" in t.flags for t in tj.trials(store.engine, run.id))


@pytest.mark.parametrize(
    "target,flags",
    [
        (
            VLLM,
            {
                "max_num_seqs": 8,
                "enable_prefix_caching": False,
                "enable_chunked_prefill": True,
                "max_num_batched_tokens": 2048,
            },
        ),
        (LLAMA, {"parallel": 4, "ctx_size": 4096, "flash_attn": "on", "ubatch_size": 256}),
    ],
)
def test_a_trial_argv_carries_each_candidate_flag_and_a_dropped_one_is_caught(tmp_path, target, flags):
    from tuner.tune.space import missing_from_argv

    cfg = _cfg(tmp_path, target)
    t = cfg.targets[0]
    argv = mg.build_argv(t, flags)
    assert missing_from_argv(t.backend, flags, argv) == []
    other = "llamacpp" if t.backend == "vllm" else "vllm"
    assert missing_from_argv(t.backend, {**flags, "backend": other}, argv) == [f"backend={other} (no server flag)"]
    name = next(iter(flags))
    assert missing_from_argv(t.backend, flags, mg.build_argv(t, {k: v for k, v in flags.items() if k != name}))


def _recommended(tmp_path, store, result, noise_check=True):  # type: ignore[no-untyped-def]
    """What `tuner tune` decides from ``result`` (the flags in force: 2 sequences): its verdict and what it stored."""
    from tuner.app.tune import _Ctx, _recommend
    from tuner.store import recommendations as recs

    cfg = _cfg(tmp_path, VLLM)
    req = TuneRequest("v", noise_check=noise_check)
    ctx = _Ctx(cfg, store, cfg.targets[0], req, tmp_path, say=lambda m: None, clock=lambda: AT_0300, run_id=1)
    rid = _recommend(ctx, result, {"max_num_seqs": 2})
    stored = recs.list_recommendations(store.engine, target="v")
    assert (rid is None) == (stored == [])
    return result["verdict"], stored


def _decided(tmp_path, store, base_interval, best_interval, comparison=None, noise_check=True):
    """What `tuner tune` stores for a winner measured at ``best_interval`` against the flags in force at
    ``base_interval`` (each [highest rate met, lowest rate missed]), with or without a comparison in turns."""
    result = {
        "best": {
            "flags": {"max_num_seqs": 8},
            "capacity_rps": best_interval[0] or 0.0,
            "interval": best_interval,
            "ttft_p99": 0.5,
            "e2e_p99": 2.0,
        },
        "baseline": {"flags": {"max_num_seqs": 2}, "capacity_rps": base_interval[0] or 0.0, "interval": base_interval},
        "comparison": comparison,
        "trials": [{"flags": {"max_num_seqs": 8}, "memory": {}}],
        "counts": {},
        "workload": {},
        "slo": {},
    }
    return _recommended(tmp_path, store, result, noise_check)


def test_a_ranking_is_claimed_only_beyond_the_intervals(tmp_path, store):
    # 2.6 against 2.0 (+30%) measured one after the other, but the flags in force missed only at 3.0, above the
    # winner's 2.6: the intervals overlap, nothing is stored (it used to be: +30% beat the 15% margin)
    verdict, stored = _decided(tmp_path, store, [2.0, 3.0], [2.6, 3.0])
    assert stored == [] and "not beyond the two measurements' intervals" in verdict
    # the winner met 3.5, which the flags in force missed (2.3): beyond both intervals, stored, marked unconfirmed
    verdict, stored = _decided(tmp_path, store, [2.0, 2.3], [3.5, 4.0])
    assert len(stored) == 1 and stored[0].confidence == 0.6 and "not compared in turns" in verdict


def test_a_winner_over_flags_that_served_nothing_says_so_and_why_it_was_not_compared(tmp_path, store):
    # held-back long-gen from one sequence (bench/results/2026-11-28-0220-tune-corpus.md): the flags in force met no
    # rate down to the floor, 8 sequences met 3.31; the verdict read "(+inf%)" and blamed a budget of 3 it had
    verdict, stored = _decided(tmp_path, store, [None, 0.2206], [3.31, 3.93])
    assert len(stored) == 1 and "inf" not in verdict, verdict
    assert "0 -> 3.31 req/s within the SLO (the flags in force met no rate down to 0.221 req/s)" in verdict
    assert verdict.endswith("not compared in turns (a budget of 3 or more compares them)"), verdict


def test_with_the_comparison_switched_off_that_is_the_reason_given_not_the_budget(tmp_path, store):
    verdict, stored = _decided(tmp_path, store, [None, 0.2206], [3.31, 3.93], noise_check=False)
    assert len(stored) == 1 and verdict.endswith("not compared in turns (--no-noise-check)"), verdict


def test_when_both_served_nothing_down_to_the_floor_nothing_is_claimed(tmp_path, store):
    verdict, stored = _decided(tmp_path, store, [None, 0.2206], [None, 0.2206])
    assert stored == [] and "not beyond the two measurements' intervals" in verdict and "inf" not in verdict, verdict


def test_flags_in_force_that_missed_no_rate_are_not_ranked_and_the_verdict_says_what_would_rank_them(tmp_path, store):
    """Held-back drawn-8289-2 on llama-server from its defaults (bench/results/2026-11-30-0738-tune-corpus-llama.md):
    the defaults met every rate up to 3.48 req/s in their runs, one sequence measured 13.9 (13.9-21.1), and the
    verdict said "+300%, not beyond the two measurements' intervals" as if the two had been ranked. Nothing is
    stored (a capacity with no top may lie above 13.9), and the verdict says the defaults' capacity was not bracketed
    and what would bracket it."""
    for noise_check, settle in ((False, "--no-noise-check turned it off"), (True, "a budget of 3 or more runs one")):
        verdict, stored = _decided(tmp_path, store, [3.48, None], [13.9, 21.1], noise_check=noise_check)
        assert stored == [] and verdict.startswith("keep the flags in force"), verdict
        assert "met every rate tried, up to 3.48 req/s" in verdict and "not bracketed in 6 runs" in verdict, verdict
        assert "--max-runs" in verdict and settle in verdict, verdict
    # a bracketed base says its bracket, as before, and one that met nothing says nothing of a top
    verdict, _ = _decided(tmp_path, store, [2.0, 3.0], [2.6, 3.0])
    assert "(the flags in force met up to 2 and missed 3)" in verdict and "not bracketed" not in verdict, verdict
    verdict, _ = _decided(tmp_path, store, [None, 0.2206], [None, 0.2206])
    assert "not bracketed" not in verdict, verdict


def test_a_winner_is_stored_only_when_the_comparison_in_turns_confirms_it(tmp_path, store):
    same = {"outcome": "same", "confidence": 0.0, "reason": "at 2.65 req/s ... both serve it", "runs": {}}
    verdict, stored = _decided(tmp_path, store, [2.0, 2.3], [3.5, 4.0], same)
    assert stored == [] and "compared in turns at 2.65 req/s" in verdict and "keep the flags in force" in verdict
    better = {
        "outcome": "b_better",
        "confidence": 0.998,
        "reason": "at 2.65 req/s ... (confidence 0.998)",
        "runs": {"A": [], "B": []},
    }
    verdict, stored = _decided(tmp_path, store, [2.0, 2.3], [3.5, 4.0], better)
    assert len(stored) == 1 and stored[0].confidence == pytest.approx(0.99) and "confirmed in turns" in verdict
    assert stored[0].evidence[-1]["comparison"]["outcome"] == "b_better"
    assert "runs" not in stored[0].evidence[-1]["comparison"]


@pytest.mark.parametrize(
    "vs_best,said",
    [
        (
            "not separable",
            "no difference measurable at this budget: the flags in force measured 0.861 req/s within the "
            "SLO (0.861-1.22), the next best, max_num_seqs=8, 0.861, not separable from them (their "
            "intervals overlap)",
        ),
        (
            "below",
            "the flags in force are the best found: the flags in force measured 0.861 req/s within the SLO "
            "(0.861-1.22), the next best, max_num_seqs=8, 0.861, below them beyond both intervals (measured one "
            "after the other, not compared in turns)",
        ),
    ],
)
def test_when_the_flags_in_force_measure_highest_the_verdict_says_whether_anything_is_separable(
    tmp_path, store, vs_best, said
):
    """The demo's run: both 4 and 8 sequences measured 0.861 req/s (brackets 0.861-1.22 and 0.861-1.28)."""
    from tuner.app.tune import _Ctx, _recommend

    cfg = _cfg(tmp_path, VLLM)
    ctx = _Ctx(cfg, store, cfg.targets[0], TuneRequest("v"), tmp_path, say=lambda m: None, clock=lambda: AT_0300)
    result = {
        "best": {"flags": {"max_num_seqs": 2}, "capacity_rps": 0.8608, "interval": [0.8608, 1.22]},
        "baseline": {"flags": {"max_num_seqs": 2}, "capacity_rps": 0.8608, "interval": [0.8608, 1.22]},
        "trials": [
            {"flags": {"max_num_seqs": 2}, "status": "measured", "capacity_rps": 0.8608, "vs_best": "best"},
            {"flags": {"max_num_seqs": 8}, "status": "measured", "capacity_rps": 0.8608, "vs_best": vs_best},
        ],
        "comparison": None,
    }
    assert _recommend(ctx, result, {"max_num_seqs": 2}) is None
    assert result["verdict"] == said


@pytest.mark.parametrize(
    "base,best,want",
    [
        (
            {"lo_rps": 0.583, "hi_rps": 1.167},
            1.871,
            (1.167 * 1.871) ** 0.5,
        ),  # the demo's: between 1.167 (missed) and 1.871
        ({"lo_rps": 2.0, "hi_rps": 3.0}, 2.6, 2.6),  # overlapping intervals: at the winner's own capacity
        ({"lo_rps": 2.0, "hi_rps": None}, 2.6, 2.6),  # the flags in force missed nothing
    ],
)
def test_the_comparison_runs_where_the_two_measurements_predict_different_outcomes(base, best, want):
    """The demo's first comparison ran at sqrt(0.583 x 1.871) = 1.04 req/s, inside the flags in force's own interval
    (they met 0.583 and missed 1.167): both served it, which said nothing of the difference."""
    from tuner.app.tune import _compare_rate

    assert _compare_rate(base, best) == pytest.approx(want)


def _point(seqs: int, cap: float, missed: float | None):  # type: ignore[no-untyped-def]
    from tuner.tune.search import Outcome, Point

    return Point({"max_num_seqs": seqs}, Outcome("measured", cap, {"lo_rps": cap, "hi_rps": missed}))


@pytest.mark.parametrize(
    "caps,want",
    [
        # the candidate measured higher: compared between the rate the flags in force missed and its own capacity
        ({2: (1.0, 1.5), 8: (2.0, 3.0)}, (8, (1.5 * 2.0) ** 0.5)),
        # the flags in force measured higher (the demo's run: 4 at 0.99, 8 at 0.625): the runner-up is compared too,
        # between the rate it missed and the flags in force's capacity
        ({2: (0.99, 1.3), 8: (0.625, 0.8), 16: (0.5, 0.7)}, (8, (0.8 * 0.99) ** 0.5)),
        ({2: (0.99, 1.3), 8: (0.99, 1.3)}, (8, 0.99)),  # a tie: at the capacity both met
        ({2: (1.0, 1.5)}, None),  # nothing else measured: nothing to compare
        ({8: (1.0, 1.5), 16: (2.0, None)}, None),  # the flags in force not measured
    ],
)
def test_the_comparison_in_turns_settles_the_difference_whichever_way_it_was_measured(caps, want):
    """A "worse" measured one after the other on fresh servers minutes apart is no more a ranking than a "better":
    the demo's tune said 8 sequences were below the flags in force beyond both intervals (0.625 vs 0.99 req/s), and
    the live verdict then kept 8 with +38% capacity. The runner-up is compared in turns as a winner would be."""
    from tuner.app.tune import _contest

    measured = [_point(k, *v) for k, v in caps.items()]
    got = _contest(measured, {"max_num_seqs": 2})
    if want is None:
        assert got is None
    else:
        assert got is not None and got[0].flags["max_num_seqs"] == want[0] and got[1] == pytest.approx(want[1])


def _judged(tmp_path, store, comparison):  # type: ignore[no-untyped-def]
    """What `tuner tune` decides when the flags in force (2 sequences) measured 0.99 req/s one after the other and
    the runner-up (8) 0.625, and the two were then compared in turns."""
    base = {"flags": {"max_num_seqs": 2}, "capacity_rps": 0.99, "interval": [0.99, 1.3], "ttft_p99": 0.4}
    runner = {"flags": {"max_num_seqs": 8}, "capacity_rps": 0.625, "interval": [0.625, 0.8], "ttft_p99": 0.9}
    result = {
        "best": {**base, "e2e_p99": 2.0},
        "baseline": {k: base[k] for k in ("flags", "capacity_rps", "interval")},
        "comparison": {"flags": {"max_num_seqs": 8}, "rate_rps": 0.89, "runs": {}, **comparison},
        "trials": [
            {**base, "status": "measured", "vs_best": "best", "memory": {}},
            {**runner, "status": "measured", "vs_best": "below", "memory": {"fits": True}},
        ],
        "counts": {},
        "workload": {},
        "slo": {},
    }
    return _recommended(tmp_path, store, result)


def test_a_runner_up_is_kept_out_or_stored_by_what_the_comparison_in_turns_found(tmp_path, store):
    worse = {"outcome": "a_better", "confidence": 0.99, "reason": "at 0.89 req/s ... (confidence 0.990)"}
    verdict, stored = _judged(tmp_path, store, worse)
    assert stored == [] and verdict.startswith(
        "keep the flags in force: the flags in force serve more within the SLO than max_num_seqs=8"
    )
    assert "0.99 -> 0.625 req/s within the SLO one after the other, and compared in turns at 0.89 req/s" in verdict
    undecided = {"outcome": "undecided", "confidence": 0.5, "reason": "at 0.89 req/s ... no difference measurable"}
    verdict, stored = _judged(tmp_path, store, undecided)
    assert stored == [] and "no difference measurable at this budget between them and max_num_seqs=8" in verdict
    # measured below one after the other, but in turns it served the rate the flags in force missed: in turns decides
    better = {"outcome": "b_better", "confidence": 0.97, "reason": "at 0.89 req/s ... (confidence 0.970)"}
    verdict, stored = _judged(tmp_path, store, better)
    assert len(stored) == 1 and stored[0].diff == {"max_num_seqs": 8} and stored[0].confidence == pytest.approx(0.97)
    assert "measured one after the other, but confirmed in turns" in verdict
    assert stored[0].expected_effect.startswith("serves 0.89 req/s within the SLO where the flags in force do not")
    ev = stored[0].evidence[-1]
    assert (ev["capacity_rps"], ev["baseline_capacity_rps"], ev["comparison"]["outcome"]) == (0.625, 0.99, "b_better")
    assert stored[0].memory_check["after"] == {"fits": True}  # the runner-up's own memory check, not the base's


@pytest.mark.parametrize(
    "outcome,base_says,candidate_says",
    [("a_better", "better", "worse"), ("b_better", "worse", "better"), ("same", "same", "same")],
)
def test_the_table_says_how_the_two_configs_compared_in_turns_fared_there(outcome, base_says, candidate_says):
    """A clean-clone demo: max_num_seqs=8 measured 2.95 req/s one after the other against 1.47 for the flags in force
    ("best" and "below"), then in turns at 2.48 req/s met the SLO for 26/40 against 39/40; the verdict kept the flags
    in force while the table still called 8 the best. Each of the two compared rows now says how it fared in turns;
    the rows not compared say nothing of it."""
    from tuner.app.tune import mark_in_turns
    from tuner.cli.tune import result_lines

    def row(seqs: int, cap: float, interval: list[float], vs_best: str) -> dict:
        flags = {"max_model_len": 1024, "max_num_seqs": seqs}
        return {"flags": flags, "capacity_rps": cap, "interval": interval, "vs_best": vs_best, "ttft_p99": 0.9,
                "e2e_p99": 3.0, "status": "measured", "seed": "", "note": ""}  # fmt: skip

    trials = [
        row(8, 2.95, [2.95, 5.89], "best"),
        row(16, 2.2, [2.2, 2.6], "below"),
        row(4, 1.47, [1.47, 2.08], "below"),
    ]
    comparison = {"flags": {"max_num_seqs": 8, "max_model_len": 1024}, "outcome": outcome, "reason": "at 2.48 req/s"}
    mark_in_turns(trials, {"max_num_seqs": 4, "max_model_len": 1024}, comparison)
    assert [t.get("in_turns") for t in trials] == [candidate_says, None, base_says]
    result = {
        "trials": trials,
        "baseline": {"capacity_rps": 1.47},
        "best": {"capacity_rps": 2.95},
        "comparison": {**comparison, "pairs": 1, "requests_per_run": 40},
        "verdict": "keep the flags in force",
    }
    lines = "\n".join(result_lines(result)).splitlines()
    cells = {line.split()[2]: line for line in lines if line[:1].isdigit()}  # by max_num_seqs=N
    assert f"best, {candidate_says} in turns" in cells["max_num_seqs=8"]
    assert f"below, {base_says} in turns" in cells["max_num_seqs=4"]
    assert "in turns" not in cells["max_num_seqs=16"]
    assert "best: 2.95 req/s (one after the other; the verdict below weighs the comparison in turns)" in lines[-3]
    mark_in_turns(trials := [row(8, 2.95, [2.95, 5.89], "best")], {"max_num_seqs": 4, "max_model_len": 1024}, None)
    assert "in_turns" not in trials[0]  # no comparison, nothing said of one


def test_the_comparison_line_says_which_rates_it_ran_at_when_it_moved():
    from tuner.cli.tune import result_lines

    def runs(*spec: tuple[float, int]) -> list[dict]:
        return [{"rate_rps": r, "sent": n, "good": n} for r, n in spec]

    base = {"trials": [], "baseline": {"capacity_rps": 5.6}, "best": {"capacity_rps": 11.2}, "verdict": "-"}
    one = {"outcome": "b_better", "reason": "r", "pairs": 2, "requests_per_run": 89, "runs": {"A": runs((11.2, 89))}}
    assert "compared in turns (2 pairs of 89 requests): b_better: r" in result_lines({**base, "comparison": one})
    moved = {**one, "requests_per_run": 63, "runs": {"A": runs((11.2, 89), (7.92, 63), (7.92, 63))}, "pairs": 3}
    line = next(x for x in result_lines({**base, "comparison": moved}) if x.startswith("compared in turns"))
    assert line.startswith(
        "compared in turns (3 pairs: 1 at 11.2 req/s (89 requests a run), 2 at 7.92 req/s (63 requests a run))"
    ), line


@pytest.mark.parametrize(
    "backend,flags,hw,want",
    [
        ("vllm", {"max_num_seqs": 8, "max_model_len": 1024}, Hardware(cpu_kv_cache_bytes=2**30), 8),
        # left out: the 128 vLLM's API server runs on a CPU host (x the tensor-parallel size), 1024 on an H100
        ("vllm", {"max_model_len": 1024}, Hardware(cpu_kv_cache_bytes=2**30), 128),
        ("vllm", {"tensor_parallel_size": 2}, Hardware(cpu_kv_cache_bytes=2**30), 256),
        ("vllm", {}, Hardware(gpu_memory_bytes=80 * 2**30, gpu_name="NVIDIA H100 80GB HBM3"), 1024),
        ("vllm", {}, Hardware(gpu_memory_bytes=80 * 2**30, gpu_name="NVIDIA A100-SXM4-80GB"), 256),
        ("llamacpp", {"parallel": 4}, Hardware(), 4),
        ("llamacpp", {"ctx_size": 1024}, Hardware(), None),  # its default is its build's: not assumed
    ],
)
def test_a_trial_search_is_sized_by_the_sequences_its_server_really_runs(backend, flags, hw, want):
    from tuner.app.tune import _slots

    assert _slots(backend, flags, hw) == want


def test_a_llama_trial_left_at_its_builds_default_is_sized_by_the_slots_it_says_it_runs():
    """--parallel left out: the ladder takes the slot count from the trial server's own /props (``total_slots``); a
    search from llama-server's defaults knew none and doubled from the workload's rate until its runs ran out
    (bench/results/2026-11-30-0738-tune-corpus-llama.md). A --parallel given wins; a server that does not answer, or
    answers without a positive whole count, leaves it unknown. The loopback server answers a recorded /props (the slot
    count is read off a real server in tests/integration/test_tune_real.py; here only its parsing)."""
    import json

    from tests.helpers import LLAMA_DIR, Route, serve
    from tuner.app.tune import _slots

    recorded = (LLAMA_DIR / "props.json").read_bytes()
    cases = [
        (recorded, json.loads(recorded)["total_slots"]),
        (json.dumps({"total_slots": 0}).encode(), None),
        (json.dumps({"total_slots": True}).encode(), None),
        (json.dumps({"total_slots": "4"}).encode(), None),
        (json.dumps([4]).encode(), None),
        (b"not json", None),
    ]
    for body, want in cases:
        with serve({"/props": Route(body=body, content_type="application/json")}) as url:
            said: list[str] = []
            assert _slots("llamacpp", {"ctx_size": 1024}, Hardware(), url, say=said.append) == want, body[:40]
            assert said == [f"  {want or 'no'} slots, as the server says (--parallel left out: its build's default)"]
            assert _slots("llamacpp", {"parallel": 8}, Hardware(), url, say=said.append) == 8
            assert len(said) == 1  # a --parallel given is in the trial's own line already
    assert json.loads(recorded)["total_slots"] == 2  # the recording's --parallel 2 (tests/fixtures/README.md)
    with serve({}) as url:
        pass  # nothing listens there now
    assert _slots("llamacpp", {}, Hardware(), url) is None


def test_a_search_from_vllms_defaults_brackets_a_capacity_far_above_the_served_rate():
    """The held-back tiny-out shape (256 in, 4 out) was served at 5.3 req/s; its capacity here was 50-60x that. From
    vLLM's defaults the search knew no slots count, doubled from 5.3 for its 5 runs and ended at 84.7 req/s with every
    rate met (both searches read exactly 84.7: a lower bound, not a capacity). Sized by the 128 sequences vLLM runs
    on a CPU host, the same 5 runs bracket the capacity."""
    from tests.tune.test_capacity import TimedRun
    from tuner.app.tune import _slots
    from tuner.tune.capacity import Ladder, find_capacity

    true_cap, mean_e2e = 300.0, 0.05

    def measure(rate: float) -> TimedRun:
        good = 200 if rate <= true_cap else int(200 * max(0.0, 1 - (rate / true_cap - 1) * 4))
        return TimedRun(rate, 200, good, good / 200, mean_e2e_s=mean_e2e)

    blind = find_capacity(measure, 0.95, start_rps=5.2947, max_runs=5, slots=None)
    assert blind.hi_rps is None and blind.capacity_rps == pytest.approx(Ladder.for_tolerance(0.15).nearest(5.2947) * 16)
    slots = _slots("vllm", {"max_model_len": 1024}, Hardware(cpu_kv_cache_bytes=2**30))
    cap = find_capacity(measure, 0.95, start_rps=5.2947, max_runs=5, slots=slots)
    assert cap.hi_rps is not None and cap.lo_rps is not None and cap.lo_rps <= true_cap < cap.hi_rps
    assert cap.capacity_rps > 2 * blind.capacity_rps


@pytest.mark.parametrize("burstiness,rate,want", [(1.0, 2.0, 40), (1.0, 8.0, 80), (0.5, 8.0, 160), (0.21, 5.19, 243)])
def test_a_run_of_bursty_traffic_sends_more_requests_and_keeps_the_poisson_floor(burstiness, rate, want):
    """Ten seconds at ``rate``, at least the 40 requests a 0.95 objective needs, times the workload's burst factor
    (tuner/tune/compare.py): drawn-2161-2 (burstiness 0.21) at 5.19 req/s sent 51 requests a run and its five servers
    read 4.76-6.73 req/s; the same run is 243 requests now. The floor rate is the Poisson run's: a bursty workload's
    runs are longer by design."""
    from types import SimpleNamespace

    from tuner.app.tune import _run_size

    ctx = SimpleNamespace(
        target=SimpleNamespace(slo=SimpleNamespace(objective=0.95)),
        req=SimpleNamespace(min_prompts=30, run_s=10.0),
        workload=SimpleNamespace(burstiness=burstiness),
    )
    assert _run_size(ctx, rate) == want
    assert _run_size(ctx, 0.0, bursts=False) == 40


@pytest.mark.parametrize(
    "detail,want_interval,want",
    [
        ({"lo_rps": 2.5, "hi_rps": 3.0}, [2.5, 3.0], "below"),
        # missed 3.0 while the server stepped 1.5x slower than when it met 2.5: at that speed the miss says 4.5
        ({"lo_rps": 2.5, "hi_rps": 3.0, "hi_same_speed_rps": 4.5}, [2.5, 4.5], "not separable"),
        ({"lo_rps": 2.5, "hi_rps": 3.0, "hi_same_speed_rps": 3.0}, [2.5, 3.0], "below"),
        ({"lo_rps": 2.5, "hi_rps": None, "hi_same_speed_rps": None}, [2.5, None], "not separable"),
    ],
)
def test_a_miss_on_a_slower_host_is_no_ranking(detail, want_interval, want):
    """A config that missed a rate the best met is ranked below it only where it missed at the speed it met at:
    five fresh servers given the same run stepped 6.5-9.9 ms at eight sequences here and met the SLO in that order
    (bench/results/2026-11-28-2232-host-drift.md)."""
    from tuner.app.tune import _interval, _vs_best
    from tuner.tune.search import Outcome, Point

    p = Point({"max_num_seqs": 2}, Outcome("measured", 2.5, detail))
    best = Point({"max_num_seqs": 8}, Outcome("measured", 4.0, {"lo_rps": 4.0, "hi_rps": 4.4}))
    assert _interval(detail) == want_interval
    assert _vs_best(p, best) == want


def test_each_measured_trial_reports_where_its_runs_crossed_the_objective():
    """The table and the JSON give each measured trial's crossing beside its capacity and interval: the rate the
    search's own runs say attainment crossed the objective (tuner/tune/capacity.py), read from the search itself."""
    import math

    from tuner.app.tune import _trial_json
    from tuner.cli.tune import result_lines
    from tuner.tune.capacity import find_capacity
    from tuner.tune.search import Outcome, Point

    shares = {2.0: 1.0, 4.0: 1.0, 5.28: 0.99, 6.07: 0.85, 8.0: 0.2}  # by the rate at or above: met up to 5.28

    class Run:
        def __init__(self, rate: float) -> None:
            self.rate_rps, self.sent = rate, 100
            self.good = round(100 * next(v for k, v in sorted(shares.items()) if k >= rate - 1e-3))
            self.attainment, self.ttft_p99, self.e2e_p99 = self.good / 100, 0.5, 2.0

        def as_json(self) -> dict:
            return dict(vars(self))

    cap = find_capacity(Run, 0.95, start_rps=2.0, tolerance=0.15, max_runs=8)
    assert (cap.lo_rps, cap.hi_rps) == (pytest.approx(5.278, abs=0.01), pytest.approx(6.063, abs=0.01))
    # 0.99 at 5.28, 0.85 at 6.06: 0.95 lies 0.04 / 0.14 of the way up, in log rate
    want = math.exp(math.log(cap.lo_rps) + (math.log(cap.hi_rps) - math.log(cap.lo_rps)) * 0.04 / 0.14)
    tr = _trial_json(Point({"max_num_seqs": 8}, Outcome("measured", cap.capacity_rps, cap.as_json())))
    assert tr["crossing_rps"] == pytest.approx(want) and cap.capacity_rps < want < cap.hi_rps
    result = {"trials": [{**tr, "vs_best": "best"}], "baseline": {"capacity_rps": 5.28}, "best": None, "verdict": "-"}
    header, row = result_lines(result)[0].splitlines()[:2]
    assert header.split()[4] == "crossing" and f"{want:.3g}" in row.split()
