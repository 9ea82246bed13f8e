"""The observe loop after an apply: an inconclusive verdict observes on, in steps of ``apply.observe``, up to
``apply.observe_max``; then ``apply.on_inconclusive`` decides. Time moves on an injected clock; the data the
verdict reads is a real vLLM CPU run (tests/fixtures/verdict/queue_more_seqs: max-num-seqs 2 -> 8 under a queue)
stored as tuner's scrapes would have stored it, with the first after-scrape landing late in the first step."""

from __future__ import annotations

from pathlib import Path

from tuner.app.judge import read_series
from tuner.apply.flow import Applier, Plan
from tuner.apply.routes import ROUTES
from tuner.collect import vllm
from tuner.config import parse_config
from tuner.store import journal as jr

CASE = Path(__file__).resolve().parents[1] / "fixtures" / "verdict" / "queue_more_seqs"
LATE_S = 4.5  # the first after-scrape comes this long after the health gate: one scrape in the first 5 s step


class FakeClock:
    """Wall time that moves only when the code under test sleeps."""

    def __init__(self, t: float) -> None:
        self.t = t
        self.slept = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.t += s
        self.slept += s


def _begin(store, now: float) -> int:  # type: ignore[no-untyped-def]
    """The journal's entry of the apply of max-num-seqs 2 -> 8 that the cases below observe."""
    return jr.begin_apply(
        store.engine,
        target="chat",
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=now,
        diff={"max_num_seqs": 8},
        old_flags={"max_num_seqs": 2},
        new_flags={"max_num_seqs": 8},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )


def _run(store, tmp_path, apply_yaml: str) -> tuple[jr.StoredApply, FakeClock]:
    cfg = parse_config(
        "targets:\n  - name: chat\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        "    slo: {ttft_p99: 2s, e2e_p99: 10s}\n"
        f"    apply: {{baseline: 30s, observe: 5s, {apply_yaml}}}\n"
    )
    store.ensure_target("chat", "vllm", "http://127.0.0.1:9")
    before, after = read_series(CASE / "before"), read_series(CASE / "after")
    for ts, text, _ in before + after:
        store.ingest(vllm.snapshot_from_text(text, target="chat", ts=ts))
    clock = FakeClock(after[0][0] - LATE_S)  # the health gate passed LATE_S before the first after-scrape
    ap = Applier(cfg, store, Path(tmp_path), say=lambda m: None, clock=clock, sleep=clock.sleep)
    t = cfg.targets[0]
    old, new = {"max_num_seqs": 2}, {"max_num_seqs": 8}
    plan = Plan(t, ROUTES["manual"], {"max_num_seqs": 8}, old, new, [], [])
    aid = _begin(store, clock())
    base = {"window": [before[0][0], before[-1][0]]}
    return ap.observe_and_judge(aid, plan, None, base), clock


def _details(a: jr.StoredApply, step: str) -> list[str]:
    return [s["detail"] for s in a.steps if s["step"] == step]


def test_inconclusive_first_step_observes_on_until_the_verdict_is_sure(store, tmp_path):
    a, clock = _run(store, tmp_path, "observe_max: 60s")
    on = [d for d in _details(a, "observing") if "observing on" in d]
    # The first 5 s hold one after-scrape: too little to judge; the loop went on instead of giving up...
    assert on and on[0].startswith("inconclusive after 5s"), a.steps
    # ...and stopped as soon as the verdict was sure, long before observe_max: 2 -> 8 under a queue is kept.
    assert a.outcome == "kept", (a.note, a.steps)
    assert 10.0 <= clock.slept < 60.0, clock.slept
    assert a.after["window"][1] - a.after["window"][0] == clock.slept  # judged on everything it observed
    assert a.note.startswith("capacity (req/s) rose"), a.note  # the client saw it too: 227 -> 613 requests in 25 s


def test_still_inconclusive_at_observe_max_keeps_the_previous_flags(store, tmp_path):
    a, clock = _run(store, tmp_path, "observe_max: 5s")
    assert clock.slept == 5.0 and not any("observing on" in d for d in _details(a, "observing"))
    assert _details(a, "verdict")[0].startswith("inconclusive"), a.steps
    # by hand: tuner cannot restart the server, so the note gives the command that restores the old flags; no data
    # judged nothing, which is inconclusive, never a failure (apply.on_inconclusive: rollback says what to do)
    assert a.outcome == "inconclusive" and "apply.on_inconclusive: rollback" in a.note, a.note
    assert "restart it by hand" in a.note and "--max-num-seqs 2" in a.note
    assert _details(a, "restore_by_hand") == ["--max-num-seqs 2"], a.steps
    from tuner.store import journal as jr

    assert not jr.new_flags_stand(a)  # the old flags are what should run now


def test_still_inconclusive_at_observe_max_with_keep_new_keeps_the_change(store, tmp_path):
    a, clock = _run(store, tmp_path, "observe_max: 5s, on_inconclusive: keep_new")
    assert clock.slept == 5.0
    assert a.outcome == "inconclusive" and "restore" not in a.note, a.note


def _baseline_case(store, tmp_path, on_inconclusive: str, first: int):  # type: ignore[no-untyped-def]
    """The real run's window before, of which only the first ``first`` scrapes are stored when the apply takes its
    baseline; the rest land as the clock reaches them (a daemon catching up with a loaded server)."""
    cfg = parse_config(
        "defaults: {scrape_interval: 2s}\n"
        "targets:\n  - name: chat\n    backend: vllm\n    url: http://127.0.0.1:9\n"
        "    slo: {ttft_p99: 2s, e2e_p99: 10s}\n"
        f"    apply: {{baseline: 30s, observe: 5s, on_inconclusive: {on_inconclusive}}}\n"
    )
    store.ensure_target("chat", "vllm", "http://127.0.0.1:9")
    before = read_series(CASE / "before")
    for ts, text, _ in before[:first]:
        store.ingest(vllm.snapshot_from_text(text, target="chat", ts=ts))
    late = list(before[first:])
    clock = FakeClock(before[first - 1][0] + 0.5)

    def sleep(s: float) -> None:
        clock.sleep(s)
        while late and late[0][0] <= clock():
            ts, text, _ = late.pop(0)
            store.ingest(vllm.snapshot_from_text(text, target="chat", ts=ts))

    ap = Applier(cfg, store, Path(tmp_path), say=lambda m: None, clock=clock, sleep=sleep)
    return ap, _begin(store, clock()), cfg.targets[0], clock, before


def test_an_apply_that_would_roll_back_an_undecided_verdict_waits_for_a_baseline_it_can_judge(store, tmp_path):
    """The demo's apply took its baseline while a loaded CPU vLLM answered /metrics late: 4 scrapes in 60 s, so
    the verdict could only say "too few scrapes to judge" and the change was undone, a restart for nothing. With an
    undecided verdict rolled back, the apply waits, a scrape interval at a time, until the window holds
    MIN_SCRAPES, and journals why it waited."""
    from tuner.apply.verdict import MIN_SCRAPES

    ap, aid, t, clock, before = _baseline_case(store, tmp_path, "rollback", first=3)
    assert ap.observer.kpis(t, clock() - 30, clock())["samples"] == 3 < MIN_SCRAPES  # what the apply starts from
    base = ap.observer.baseline(aid, t, group=False, wait=True)
    assert base["samples"] >= MIN_SCRAPES and base["finished"] > 0, base
    # it waited no longer than the scrapes took to land: the sixth stored scrape is the one it waited for
    assert before[MIN_SCRAPES - 1][0] <= clock() < before[MIN_SCRAPES - 1][0] + 2.0 + 1e-9, clock()
    waits = _details(jr.get_apply(store.engine, aid), "baseline_wait")
    assert len(waits) == 1 and "hold 3 stored scrapes, the verdict needs 6" in waits[0], waits


def test_an_apply_that_keeps_an_undecided_change_or_is_told_not_to_wait_takes_the_window_as_it_is(store, tmp_path):
    ap, aid, t, clock, _ = _baseline_case(store, tmp_path, "keep", first=3)
    start = clock()
    assert ap.observer.baseline(aid, t, group=False, wait=False)["samples"] == 3
    assert clock() == start and _details(jr.get_apply(store.engine, aid), "baseline_wait") == []


def test_the_wait_for_a_baseline_is_bounded_by_one_more_window(store, tmp_path):
    """Scrapes that never come (the daemon is stopped): the apply waits at most one more baseline window (here less:
    its window slides past the traffic it held), then goes on with what it has, and the verdict says what it
    lacked."""
    ap, aid, t, clock, _ = _baseline_case(store, tmp_path, "rollback", first=3)
    ap.sleep = clock.sleep  # nothing lands while it waits
    start = clock()
    base = ap.observer.baseline(aid, t, group=False, wait=True)
    assert base.get("samples", 0) <= 3 and 0 < clock() - start <= 30.0 + 2.0, (base.get("samples"), clock() - start)
    assert len(_details(jr.get_apply(store.engine, aid), "baseline_wait")) == 1
