"""The `tuner` command as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.helpers import FIXTURES, fixture_text, slot_tokens
from tuner.config import parse_config
from tuner.daemon import Daemon
from tuner.lab.replay import ReplayExposition, ReplayServer

VLLM = FIXTURES / "vllm-0.32-cpu"
LLAMA = FIXTURES / "llama-server"


def tuner(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, timeout=120, **kw)


def _line_value(text: str, name: str) -> float:
    """The value of the first sample line of ``name`` (any labels), read straight from the exposition."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


@pytest.mark.parametrize("fixture", sorted(p.name for p in VLLM.glob("metrics_*.txt")))
def test_snapshot_contract_vllm(fixture):
    path = VLLM / fixture
    proc = tuner("snapshot", "--file", str(path), "--backend", "vllm", "--json")
    assert proc.returncode == 0, proc.stderr
    objs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(objs) >= 1
    obj = objs[0]
    text = path.read_text()
    for key, metric in (
        ("kv_cache_usage", "vllm:kv_cache_usage_perc"),
        ("requests_running", "vllm:num_requests_running"),
        ("requests_waiting", "vllm:num_requests_waiting"),
        ("preemptions_total", "vllm:num_preemptions_total"),
        ("prompt_tokens_total", "vllm:prompt_tokens_total"),
        ("generation_tokens_total", "vllm:generation_tokens_total"),
        ("prefix_cache_hits_total", "vllm:prefix_cache_hits_total"),
        ("prefix_cache_queries_total", "vllm:prefix_cache_queries_total"),
    ):
        assert isinstance(obj[key], (int, float)) and not isinstance(obj[key], bool), key
        assert obj[key] == _line_value(text, metric), key
    assert obj["model_name"] and obj["engine"] == "0"
    for label in (
        "block_size",
        "num_gpu_blocks",
        "kv_cache_size_tokens",
        "gpu_memory_utilization",
        "enable_prefix_caching",
    ):
        assert re.search(rf'{label}="{re.escape(obj["config"][label])}"', text), label


@pytest.mark.parametrize("stage", ["idle", "mid_load", "after_load"])
def test_snapshot_contract_llamacpp_with_slots(stage):
    metrics, slots_file = LLAMA / f"metrics_{stage}.txt", LLAMA / f"slots_{stage}.json"
    proc = tuner("snapshot", "--file", str(metrics), "--slots-file", str(slots_file), "--backend", "llamacpp", "--json")
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout.splitlines()[0])
    text = metrics.read_text()
    for key in ("requests_processing", "requests_deferred", "prompt_tokens_total", "tokens_predicted_total"):
        assert obj[key] == _line_value(text, f"llamacpp:{key}"), key
    slots = json.loads(slots_file.read_text())
    busy = [s for s in slots if s["is_processing"]]
    in_use = sum(slot_tokens(s) for s in busy)
    assert obj["slots_total"] == len(slots) and obj["slots_busy"] == len(busy)
    assert obj["kv_cache_usage"] == pytest.approx(in_use / (len(slots) * slots[0]["n_ctx"]))


def test_snapshot_of_invalid_exposition_names_the_line(tmp_path):
    lines = fixture_text("vllm-0.32-cpu/metrics_after_load.txt").splitlines()
    lines[41] = 'vllm:num_requests_running{engine="0" oops'
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines))
    proc = tuner("snapshot", "--file", str(bad), "--backend", "vllm", "--json")
    assert proc.returncode != 0
    assert proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "line 42" in err[0] and "Traceback" not in proc.stderr


def test_bad_config_names_file_and_key(tmp_path):
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text("targets:\n  - {name: a, backend: vllm, url: 'http://127.0.0.1:1', scrape_intervall: 5s}\n")
    proc = tuner("--config", str(cfg), "status")
    assert proc.returncode == 2
    assert str(cfg) in proc.stderr and "targets[0].scrape_intervall" in proc.stderr


def _scraped_four_times(tmp_path, cfg_text: str, store) -> Daemon:
    """Write the config and let a daemon scrape every target four times, 0.3 s apart (real servers: the points
    need distinct timestamps for rates)."""
    (tmp_path / "tuner.yaml").write_text(cfg_text)
    daemon = Daemon(parse_config(cfg_text), store)
    for _ in range(4):
        for t in daemon.cfg.targets:
            daemon.scraping.scrape_once(t)
        time.sleep(0.3)
    return daemon


def test_status_and_signals_read_what_the_daemon_stored(tmp_path, store):
    text = fixture_text("vllm-0.32-cpu/metrics_after_load.txt")
    with ReplayServer(ReplayExposition(text, growth=0.05)) as server:
        cfg_text = (
            f"store: {{url: '{store.engine.url}'}}\n"
            f"targets:\n  - {{name: v, backend: vllm, url: '{server.url}', slo: {{e2e_p99: 10s}}}}\n"
            f"  - {{name: gone, backend: vllm, url: 'http://127.0.0.1:9'}}\n"
        )
        _scraped_four_times(tmp_path, cfg_text, store)
    proc = tuner("--config", str(tmp_path / "tuner.yaml"), "status")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:] if line.strip()}
    kv = _line_value(text, "vllm:kv_cache_usage_perc")
    assert f"{kv * 100:.1f}%" in rows["v"] and " up " in rows["v"]
    assert " down " in rows["gone"] and "connection refused" in rows["gone"]
    sig = tuner("--config", str(tmp_path / "tuner.yaml"), "signals", "v", "--window", "5m", "--json")
    assert sig.returncode == 0, sig.stderr
    engine = json.loads(sig.stdout)["engines"][0]
    # The replay grows every counter by 5% of its recorded value per scrape, so over the window the
    # prompt-token counter rose and the rate is positive; quantiles exist because the histograms grew.
    assert engine["prompt_tokens_per_s"] > 0 and engine["e2e_p99"] > 0 and engine["goodput_ratio"] is not None
    unknown = tuner("--config", str(tmp_path / "tuner.yaml"), "signals", "nope")
    assert unknown.returncode == 2 and "known targets: v, gone" in unknown.stderr


def test_status_shows_the_peaks_a_late_scrape_missed_and_the_last_apply(tmp_path, store):
    """Under load the last scrape of a busy server can read 0 running / 0 waiting (issue 16: RUN/WAIT 0/0 with
    a 2.3 s queue): status shows the window's peaks, and the last apply with its outcome."""
    from tuner.collect.snapshots import EngineSnapshot, TargetSnapshot
    from tuner.store import journal as jr

    now = time.time()
    for ago, running, waiting, kv in ((40, 4, 12, 0.53), (20, 4, 3, 0.31), (1, 0, 0, 0.02)):
        values = {
            ("vllm:num_requests_running", ()): running,
            ("vllm:num_requests_waiting", ()): waiting,
            ("vllm:kv_cache_usage_perc", ()): kv,
        }
        e = EngineSnapshot(backend="vllm", engine="0", model_name="m", values=values, histograms={})
        store.ingest(TargetSnapshot(target="v", backend="vllm", ts=now - ago, duration_s=0.01, engines=(e,)))
    aid = jr.begin_apply(
        store.engine,
        target="v",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=now - 30,
        diff={"max_num_seqs": 8},
        old_flags={"max_num_seqs": 4},
        new_flags={"max_num_seqs": 8},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    jr.finish(store.engine, aid, "kept", "capacity rose", now=now - 10)
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: '{store.engine.url}'}}\ntargets:\n  - {{name: v, backend: vllm, url: 'http://127.0.0.1:9'}}\n"
    )
    proc = tuner("--config", str(cfg), "status", "--window", "5m")  # 5m: a loaded host can take 20 s to start tuner
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[1], proc.stdout.splitlines()[2]
    assert "RUN/WAIT PEAK" in header and "QUEUED P99" in header and "LAST APPLY" in header
    assert "4/12" in row and "53.0%" in row, row  # the peaks, not the last scrape's 0/0 and 2.0%
    assert f"#{aid} max_num_seqs=8 kept" in row, row
    js = tuner("--config", str(cfg), "status", "--window", "5m", "--json")
    [target] = json.loads(js.stdout)["targets"]
    assert target["engines"][0]["requests_waiting_max"] == 12 and target["engines"][0]["requests_running_max"] == 4
    assert target["last_apply"]["outcome"] == "kept" and target["last_apply"]["diff"] == {"max_num_seqs": 8}


def test_commands_that_need_no_config_work_without_one(tmp_path):
    """Run where there is no tuner.yaml and no $TUNER_CONFIG, as a new user might."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "TUNER_CONFIG"}
    run = lambda *a: tuner(*a, cwd=tmp_path, env=env)  # noqa: E731
    exported = run("alerts", "export")
    assert exported.returncode == 0, exported.stderr
    assert "alert: KVCacheHigh" in exported.stdout  # the default pack
    checked = run("alerts", "check")
    assert checked.returncode == 0 and "alerts/default.yaml" in checked.stdout, checked.stderr
    verdict = FIXTURES / "verdict" / "trickle"
    judged = run(
        "judge", "--before", str(verdict / "before"), "--after", str(verdict / "after"), "--backend", "vllm", "--json"
    )
    assert judged.returncode == 0 and json.loads(judged.stdout)["outcome"] == "inconclusive", judged.stderr
    assert run("snapshot", "--file", str(VLLM / "metrics_idle.txt"), "--backend", "vllm").returncode == 0
    # a config that is named but missing is still an error that names it; so is one a command needs
    named = run("--config", "nope.yaml", "alerts", "export")
    assert named.returncode == 2 and "nope.yaml: no such file" in named.stderr
    needed = run("status")
    assert needed.returncode == 2 and "tuner.yaml: no such file; pass --config PATH" in needed.stderr


def test_tables_are_rich_on_a_terminal_and_plain_columns_when_piped():
    from tuner.cli.common import table

    rows = [["target", "state", "note"], ["chat", "up", "[apply #1] kept"], ["embed", "down", "-"]]
    plain = table(rows, tty=False)
    assert plain.splitlines() == ["target  state  note", "chat    up     [apply #1] kept", "embed   down   -"]
    boxed = table(rows, tty=True)
    lines = boxed.splitlines()
    assert len(lines) == 6 and lines[0][0] in "┏╭┌" and "[apply #1] kept" in boxed  # a cell is text, not markup
    assert all(w in lines[1] for w in ("target", "state", "note")) and "\x1b[" not in boxed  # no colour off a TTY


def test_a_replica_groups_signals_are_its_replicas_together_in_status_signals_and_metrics(tmp_path, store):
    """A group of two vLLM replicas (real HTTP servers replaying recorded expositions, one busier than the other):
    `tuner signals GROUP` gives what both served together, equal to the sum of `tuner signals` of each replica at
    the same instant; `tuner status` has a group row; the daemon exports the group's signals on /metrics."""
    from tuner.daemon.metrics import TunerCollector

    busy, calm = (fixture_text(f"vllm-0.32-cpu/{f}") for f in ("metrics_kv_pressure.txt", "metrics_after_load.txt"))
    with (
        ReplayServer(ReplayExposition(busy, growth=0.2)) as s1,
        ReplayServer(ReplayExposition(calm, growth=0.05)) as s2,
    ):
        cfg_text = (
            f"store: {{url: '{store.engine.url}'}}\n"
            "targets:\n  - name: chat\n    backend: vllm\n    url: 'http://127.0.0.1:9'\n"
            "    balancer: {socket: /nonexistent/haproxy.sock, backend: chat}\n"
            "    flags: {max_num_seqs: 4}\n"
            f"    replicas: [{{name: r1, url: '{s1.url}'}}, {{name: r2, url: '{s2.url}'}}]\n"
        )
        daemon = _scraped_four_times(tmp_path, cfg_text, store)
    at = str(time.time())
    got = {}
    for name in ("chat", "chat.r1", "chat.r2"):
        proc = tuner("--config", str(tmp_path / "tuner.yaml"), "signals", name, "--at", at, "--json")
        assert proc.returncode == 0, proc.stderr
        got[name] = json.loads(proc.stdout)["engines"][0]
    group, r1, r2 = got["chat"], got["chat.r1"], got["chat.r2"]
    assert group["engine"] == "all" and r1["requests_waiting"] == 9 and r2["requests_waiting"] == 0
    for key in ("requests_per_s", "prompt_tokens_per_s", "generation_tokens_per_s"):
        assert group[key] == pytest.approx(r1[key] + r2[key], rel=1e-9) and r1[key] > 0 and r2[key] > 0, key
    assert group["requests_waiting"] == 9 and group["kv_cache_usage"] == max(r1["kv_cache_usage"], r2["kv_cache_usage"])
    assert min(r1["e2e_p99"], r2["e2e_p99"]) <= group["e2e_p99"] <= max(r1["e2e_p99"], r2["e2e_p99"])
    proc = tuner("--config", str(tmp_path / "tuner.yaml"), "status")
    assert proc.returncode == 0, proc.stderr
    [row] = [line for line in proc.stdout.splitlines() if line.startswith("chat (group)")]
    assert "2/2 up" in row and "all/tiny-llama" in row, row
    js = json.loads(tuner("--config", str(tmp_path / "tuner.yaml"), "status", "--json").stdout)
    assert js["groups"][0]["replicas"] == ["chat.r1", "chat.r2"] and js["groups"][0]["replicas_up"] == 2
    daemon.signals_once()
    daemon.applying.status_once()  # the flags in force: max-num-seqs 4 on each replica, 8 for the group
    exported = {
        (m.name, s.labels.get("target"), s.labels.get("engine")): s.value
        for m in TunerCollector(daemon.state).collect()
        for s in m.samples
    }
    assert exported[("tuner_requests_waiting", "chat", "all")] == 9
    assert exported[("tuner_queue_to_max_num_seqs_ratio", "chat", "all")] == 9 / 8
    assert exported[("tuner_queue_to_max_num_seqs_ratio", "chat.r1", "0")] == 9 / 4
    assert exported[("tuner_requests_per_second", "chat", "all")] == pytest.approx(
        exported[("tuner_requests_per_second", "chat.r1", "0")]
        + exported[("tuner_requests_per_second", "chat.r2", "0")]
    )


def test_journal_prints_the_slo_line_first(tmp_path, store):
    """An apply judged under an SLO: `tuner journal` says the objective and each window's attainment with its
    interval before anything else about it (issue 38), from what the journal itself holds."""
    from tuner.store import journal as jr

    now = time.time()
    aid = jr.begin_apply(
        store.engine,
        target="v",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=now - 30,
        diff={"max_num_seqs": 2},
        old_flags={"max_num_seqs": 16},
        new_flags={"max_num_seqs": 2},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    slo = {"slo_objective": 0.99, "slo_budgets": {"ttft": 1.5, "e2e": 12.0}}
    jr.set_kpis(
        store.engine,
        aid,
        now=now - 20,
        baseline={"slo_attainment": 1.0, "finished": 160, **slo},
        after={"slo_attainment": 0.822, "finished": 136, **slo},
    )
    jr.finish(store.engine, aid, "rolled_back", "the SLO broke", now=now - 10)
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: '{store.engine.url}'}}\ntargets:\n  - {{name: v, backend: vllm, url: 'http://127.0.0.1:9'}}\n"
    )
    proc = tuner("--config", str(cfg), "journal")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"apply #{aid} v apply"), lines
    # Wilson by hand: 0.822 of 136 -> centre 0.8132, half-width 0.0640; 1.0 of 160 -> lower 0.9766
    assert lines[1].strip() == (
        "SLO 0.99 of requests within TTFT P99 1.5s, E2E P99 12s: before 100.0% [97.7%, "
        "100.0%] of 160 (met), after 82.2% [74.9%, 87.7%] of 136 (breached) (95% Wilson "
        "intervals)"
    ), lines[1]
    assert lines[2].strip().startswith("state done, outcome rolled_back")
    assert "slo_budgets" not in proc.stdout  # said once, by the SLO line


def test_an_apply_of_a_held_group_is_refused_with_the_holder_named_and_exit_8(tmp_path, store):
    """One change at a time per replica group: an apply of g.r2 while apply #N holds g.r1 (a live tuner's) is
    refused in one line naming it, exit 8, and nothing is opened."""
    from tuner.apply.flow import own_identity
    from tuner.store import journal as jr
    from tuner.store import recommendations as recs

    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: '{store.engine.url}'}}\ntargets:\n  - name: g\n    backend: vllm\n"
        "    url: http://127.0.0.1:9\n    flags: {max-num-seqs: 4}\n"
        f"    balancer: {{socket: '{tmp_path / 'haproxy.sock'}', backend: g}}\n"
        "    replicas: [{name: r1, url: 'http://127.0.0.1:10'}, {name: r2, url: 'http://127.0.0.1:11'}]\n"
    )
    me = own_identity()
    holder = jr.begin_apply(
        store.engine,
        target="g.r1",
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
        group="g",
    )
    rid = recs.add_recommendation(
        store.engine,
        target="g.r2",
        now=time.time(),
        rules=["r"],
        diff_key="{}",
        diff={"max_num_seqs": 8},
        current={"max_num_seqs": 4},
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )
    proc = tuner("--config", str(cfg), "apply-recommendation", str(rid), "--yes")
    assert proc.returncode == 8, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        f"replica group g of target 'g.r2' has apply #{holder} on g.r1 in progress (one change at a time per target "
        "and per group); wait for it, or run `tuner reconcile` if the tuner doing it died"
    ), proc.stderr
    assert [a.id for a in jr.open_applies(store.engine)] == [holder]


def test_tune_hands_its_search_options_to_the_use_case(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from tuner.app.tune import TuneRequest
    from tuner.cli import main
    from tuner.cli import tune as cli_tune

    seen: list[TuneRequest] = []
    monkeypatch.setattr(cli_tune, "session", lambda args: SimpleNamespace(cfg=None, store=None, config_dir=tmp_path))
    monkeypatch.setattr(cli_tune, "tune", lambda cfg, store, req, **kw: seen.append(req) or {"run_id": 1})
    assert main(["tune", "v", "--run-seconds", "60", "--max-runs", "7", "--tolerance", "0.05", "--json"]) == 0
    assert (seen[-1].run_s, seen[-1].max_runs, seen[-1].tolerance) == (60.0, 7, 0.05)
    assert main(["tune", "v", "--json"]) == 0
    assert seen[-1].tolerance == 0.15
    assert seen[-1] == TuneRequest("v")  # every default of the command is the use case's
    assert main(["tune", "v", "--budget", "3", "--window", "5m", "--sampler", "grid", "--seed", "9", "--json"]) == 0
    assert (seen[-1].budget, seen[-1].window_s, seen[-1].sampler, seen[-1].seed) == (3, 300.0, "grid", 9)
    for bad in ("0", "1.5", "nan", "x"):
        with pytest.raises(SystemExit) as exc:
            main(["tune", "v", "--tolerance", bad])
        assert exc.value.code == 2 and "argument --tolerance" in capsys.readouterr().err


def test_a_proposal_reads_a_flag_the_server_runs_without_as_default_and_one_not_known_as_unknown():
    from tuner.cli.advise import _diff_text

    r = {
        "diff": {"parallel": 4, "ctx_size": 8192, "ubatch_size": 1024},
        "current": {"parallel": None, "ctx_size": 4096},
    }
    assert _diff_text(r) == "parallel: default -> 4, ctx_size: 4096 -> 8192, ubatch_size: ? -> 1024"
