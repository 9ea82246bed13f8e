"""Races on the apply journal, run as races: two real processes released at the same instant by a barrier, many
trials, every one counted.

  * two applies of one target (or of two replicas of one group) at once: at most one opens (the journal's unique
    index over a target's open apply, tuner/store/journal.py);
  * two reconcilers of one apply left by a dead tuner at once: one claims it (compare-and-set), the other leaves it
    alone; the hook that restores the server runs once.

Each worker opens its own engine on the same SQLite file, as two tuner processes do. No sleeps: the parent and the
two workers meet at a barrier before and after every trial.
"""

from __future__ import annotations

import multiprocessing
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tuner.apply.flow import Applier
from tuner.config import parse_config
from tuner.errors import ApplyError
from tuner.store import journal as jr
from tuner.store import recommendations as recs
from tuner.store.db import open_engine
from tuner.store.store import Store

_FORK = multiprocessing.get_context("fork")  # the workers inherit the test's imports; each opens its own engine

# Targets applied by hand (no managed section, no hook): an apply opens, journals and waits for a person, so a trial
# costs milliseconds. The group "g" has a balancer and two replicas, g.r1 and g.r2.
CONFIG = """\
targets:
  - {name: t, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}
  - name: g
    backend: vllm
    url: http://127.0.0.1:9
    flags: {max-num-seqs: 4}
    balancer: {socket: SOCKET, backend: g}
    replicas: [{name: r1, url: 'http://127.0.0.1:10'}, {name: r2, url: 'http://127.0.0.1:11'}]
"""


def _config(tmp_path: Path) -> str:
    return CONFIG.replace("SOCKET", str(tmp_path / "haproxy.sock"))


def _left_by_dead_tuner(store: Store, target: str, kind: str, mode: str, old: int, new: int) -> int:
    """What a tuner killed mid-apply leaves: an open journal entry whose owner is gone (pid 1 with another start
    time: not alive)."""
    return jr.begin_apply(
        store.engine,
        target=target,
        recommendation_id=None,
        kind=kind,
        mode=mode,
        now=time.time(),
        diff={} if old == new else {"max_num_seqs": new},
        old_flags={"max_num_seqs": old},
        new_flags={"max_num_seqs": new},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )


def _rec(store: Store, target: str) -> int:
    return recs.add_recommendation(
        store.engine,
        target=target,
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


def _worker(db: str, cfg_text: str, cfg_dir: str, action: str, args: list, barrier, results) -> None:
    """One tuner process: for each trial, wait for the start, do ``action``, say what happened, wait for the end."""
    engine = open_engine(f"sqlite:///{db}")
    store = Store(engine)
    ap = Applier(parse_config(cfg_text), store, Path(cfg_dir), say=lambda m: None)
    got = []
    for arg in args:
        barrier.wait(60)
        try:
            if action == "apply":
                ap.apply(arg)
                got.append("opened")
            else:
                got.append(f"reconciled {len(ap.reconcile())}")
        except ApplyError as exc:
            got.append(f"refused: {exc}")
        except Exception as exc:  # noqa: BLE001  (an IntegrityError traceback is what this test must not see)
            got.append(f"error: {type(exc).__name__}: {exc}")
        barrier.wait(60)  # both are done with this trial
        barrier.wait(60)  # the parent has counted and cleaned up
    results.put(got)
    engine.dispose()


def _race(tmp_path: Path, cfg_text: str, action: str, per_worker: list[list], between) -> list[list[str]]:
    """Run the two workers through the trials; ``between(i)`` runs in the parent after each trial."""
    barrier, results = _FORK.Barrier(3), _FORK.Queue()
    db = str(tmp_path / "tuner.db")
    procs = [
        _FORK.Process(target=_worker, args=(db, cfg_text, str(tmp_path), action, args, barrier, results))
        for args in per_worker
    ]
    for p in procs:
        p.start()
    try:
        for i in range(len(per_worker[0])):
            barrier.wait(60)  # go: both workers at once
            barrier.wait(60)  # both finished the trial
            between(i)
            barrier.wait(60)
        out = [results.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return out


TRIALS = 50


@pytest.mark.parametrize("first, second", [("t", "t"), ("g.r1", "g.r2")], ids=["one target", "two replicas"])
def test_two_processes_never_both_open_an_apply_on_one_target_or_group(tmp_path, store, first, second):
    """Before the fix both opened an apply in most trials (the journal selected open applies, then inserted)."""
    (tmp_path / "haproxy.sock").touch()
    per_worker = [[_rec(store, first) for _ in range(TRIALS)], [_rec(store, second) for _ in range(TRIALS)]]
    opened: list[int] = []

    def between(i: int) -> None:
        open_now = jr.open_applies(store.engine)
        opened.append(len(open_now))
        for a in open_now:  # free the target for the next trial
            jr.finish(store.engine, a.id, "failed", "cancelled by the test", now=time.time())

    got = _race(tmp_path, _config(tmp_path), "apply", per_worker, between)
    doubles = sum(1 for n in opened if n > 1)
    assert doubles == 0, f"{doubles}/{TRIALS} trials opened two applies at once"
    assert opened == [1] * TRIALS  # and never none: one of the two always goes ahead
    for a, b in zip(*got):
        assert sorted([a.split(":")[0], b.split(":")[0]]) == ["opened", "refused"], (a, b)
    # the refusal names the apply that holds the target (or the group) and what to do
    refusal = next(g for w in got for g in w if g.startswith("refused"))
    assert "apply #" in refusal and ("in progress" in refusal), refusal
    if first != second:
        assert "group g" in refusal, refusal


@contextmanager
def _completions() -> Iterator[str]:
    """A real local HTTP server answering a completion, as vLLM does: what the health gate asks for."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = b'{"choices": [{"text": " hi"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


# The hook an operator would write to restart a server, reduced to what this test counts: one line per run.
HOOK = textwrap.dedent("""\
    import sys
    with open(sys.argv[1], "a") as f:
        f.write(" ".join(sys.argv[2:]) + "\\n")
""")


def test_two_reconcilers_restore_an_apply_left_by_a_dead_tuner_once(tmp_path, store):
    """`tuner run` reconciling at start while `tuner reconcile` (or an apply-recommendation) does: before the fix
    both claimed the apply and both ran the restore hook."""
    trials = 60
    runs = tmp_path / "hook.runs"
    (tmp_path / "hook.py").write_text(HOOK)
    with _completions() as url:  # the server the hook "restarts": passes the health gate
        cfg = (
            f"targets:\n  - name: h\n    backend: vllm\n    url: {url}\n    flags: {{max-num-seqs: 4}}\n"
            f"    apply: {{hook: {{command: ['{sys.executable}', '{tmp_path / 'hook.py'}', '{runs}', "
            "'{target}', '{flags}']}}\n"
        )
        left: list[int] = []

        def dead_apply() -> int:  # killed while starting the new flags
            aid = _left_by_dead_tuner(store, "h", "apply", "manual", 4, 8)
            jr.step(store.engine, aid, "starting", "", now=time.time(), state="starting")
            return aid

        left.append(dead_apply())
        hook_runs: list[int] = []
        closed: list[bool] = []

        def between(i: int) -> None:
            a = jr.get_apply(store.engine, left[-1])
            hook_runs.append([s["step"] for s in a.steps].count("hook"))
            closed.append(a.state == "done")
            if i + 1 < trials:
                left.append(dead_apply())

        got = _race(tmp_path, cfg, "reconcile", [[None] * trials, [None] * trials], between)
    twice = sum(1 for n in hook_runs if n > 1)
    assert twice == 0, f"{twice}/{trials} dead applies restored twice (the hook ran {hook_runs})"
    assert len(runs.read_text().splitlines()) == trials  # the hook itself ran once per dead apply
    assert all(closed) and all(w.startswith("reconciled") for g in got for w in g), got
    for aid in left:
        steps = [s["step"] for s in jr.get_apply(store.engine, aid).steps]
        assert steps.count("reconcile") == 1 and steps.count("restoring") == 1, steps


def test_an_apply_in_flight_is_not_reconciled_by_another_thread_of_its_own_tuner(tmp_path, store):
    """The daemon runs API applies, auto applies and the reconcile of each auto step on threads of one process: the
    journal names that process as the owner of all of them, alive. An apply still being carried out is not a
    leftover: before, the auto step of any target reconciled (restored) the applies other threads were doing."""
    (tmp_path / "haproxy.sock").touch()
    cfg = parse_config(_config(tmp_path))
    api = Applier(cfg, store, tmp_path, say=lambda m: None)
    auto = Applier(cfg, store, tmp_path, say=lambda m: None)  # the daemon's other applier, same process
    opened = api.open_apply(_rec(store, "t"))  # open, not yet carried out (the API's thread is about to)
    assert auto.reconcile() == []
    assert [s["step"] for s in jr.get_apply(store.engine, opened.id).steps] == ["planned"]
    assert opened.run().state == "awaiting_manual"
    # a leftover of this very process (its thread gone without closing it) is still reconciled
    left = api.open_apply(_rec(store, "g.r1"))
    left.run()  # awaiting a person: never reconciled
    jr.step(store.engine, left.id, "applied_by_hand", "", now=time.time(), state="health_check")
    [line] = auto.reconcile()
    assert f"apply #{left.id} g.r1" in line and jr.get_apply(store.engine, left.id).state == "done"


def test_a_dead_shadow_tune_is_closed_unchanged_and_counts_as_no_apply(tmp_path, store):
    """A tuner killed during a shadow tune leaves its hold open; reconcile closes it without touching production,
    as `unchanged` (it once read `rolled_back`: a rollback mark on the dashboards for a run that changed nothing)."""
    cfg = "targets:\n  - {name: v, backend: vllm, url: 'http://127.0.0.1:9', flags: {max-num-seqs: 4}}\n"
    aid = _left_by_dead_tuner(store, "v", "tune", "shadow", 4, 4)
    [line] = Applier(parse_config(cfg), store, tmp_path, say=lambda m: None).reconcile()
    a = jr.get_apply(store.engine, aid)
    assert (a.state, a.outcome) == ("done", "unchanged") and "not touched" in a.note, (a, line)
    assert not any(s["step"] in ("restoring", "draining", "starting") for s in a.steps), a.steps
    assert jr.outcome_counts(store.engine) == {}  # beside production: no apply at all
