"""A rolling apply changes every replica of a group, so its verdict reads what the whole group served.

The data are real vLLM CPU runs (tests/fixtures/verdict) stored as tuner's scrapes would have stored two replicas
of one group behind a balancer, each scraped at its own phase: replica r1 is ``same_restart`` (the same flags
restarted: 378 then 344 requests answered to 8 clients), replica r2 is ``fewer_seqs`` (671 then 186 to 12 clients).
The clients' own counts (case.json, measured in the same recording) say what the group served: 1,049 requests
before and 530 after, to the same 20 clients; the group fell by half, so the roll must be undone, although r1 alone
(what a verdict on the recommendation's replica would read) did not get worse beyond its noise.

The route here is a stand-in with the rolling route's name whose restore does nothing: draining and restarting
replicas through a real HAProxy is tests/integration/test_rolling_haproxy.py's and test_rolling_vllm.py's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tuner.app.judge import read_series
from tuner.apply.flow import Applier, Plan
from tuner.apply.verdict import judge
from tuner.collect import vllm
from tuner.config import parse_config
from tuner.signals.load import group_profile, profile
from tuner.store import journal as jr

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
PHASE_S = 0.37  # r2 is scraped this long after r1


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class RollingStandIn:
    """The rolling route's name and kind (restarts, no outage); restoring is not what this test is about."""

    name, restarts, outage, whole_group = "rolling", True, False, True

    def restore(self, ap, aid, p) -> bool:
        return True


def _clients(case: str) -> tuple[int, int, int, int]:
    c = json.loads((CASES / case / "case.json").read_text())
    return c["before"]["client"]["ok"], c["after"]["client"]["ok"], c["before"]["clients"], c["after"]["clients"]


def _store_group(store) -> tuple[float, float, float]:
    """r1 and r2 stored, r2's scrapes moved onto r1's time line at another phase: (before start, before end,
    after start)."""
    r1 = {k: read_series(CASES / "same_restart" / k) for k in ("before", "after")}
    r2 = {k: read_series(CASES / "fewer_seqs" / k) for k in ("before", "after")}
    for name in ("chat.r1", "chat.r2"):
        store.ensure_target(name, "vllm", "http://127.0.0.1:9")
    for part in ("before", "after"):
        shift = r1[part][0][0] - r2[part][0][0] + PHASE_S
        for ts, text, _ in r1[part]:
            store.ingest(vllm.snapshot_from_text(text, target="chat.r1", ts=ts))
        for ts, text, _ in r2[part]:
            store.ingest(vllm.snapshot_from_text(text, target="chat.r2", ts=ts + shift))
    before_end = max(r1["before"][-1][0], r2["before"][-1][0] + r1["before"][0][0] - r2["before"][0][0] + PHASE_S)
    return r1["before"][0][0], before_end, r1["after"][0][0]


_CONFIG = (
    "targets:\n  - name: chat\n    backend: vllm\n    url: http://127.0.0.1:8\n"
    "    slo: {ttft_p99: 2s, e2e_p99: 10s}\n"
    "    balancer: {socket: /nonexistent.sock, backend: chat}\n"
    "    replicas:\n      - {name: r1, url: 'http://127.0.0.1:9'}\n"
    "      - {name: r2, url: 'http://127.0.0.1:10'}\n"
    "    apply: {baseline: 30s, observe: 25s, observe_max: 25s, on_inconclusive: keep_new}\n"
)


def _config():
    return parse_config(_CONFIG)


def test_the_group_profile_holds_every_replica_s_requests_and_tokens(store):
    b0, b1, _ = _store_group(store)
    lo, hi = b0 - 1, b1 + 1
    w1, w2 = store.window("chat.r1", lo, hi), store.window("chat.r2", lo, hi)
    p1, p2, g = profile(w1), profile(w2), group_profile("chat", [w1, w2])
    assert p1 and p2 and g
    # the sums over the window are the replicas' sums, exactly; the intervals run between both replicas' scrapes
    for k in ("finished", "generated_tokens", "aborted"):
        assert math.isclose(getattr(g, k), getattr(p1, k) + getattr(p2, k), rel_tol=1e-12), k
    assert g.samples == p1.samples + p2.samples
    assert math.isclose(math.fsum(iv.finished for iv in g.intervals), p1.finished + p2.finished, rel_tol=1e-12)
    # latency histograms summed bucket by bucket
    for k in ("ttft", "e2e"):
        assert g.hists[k][1] == tuple(a + b for a, b in zip(p1.hists[k][1], p2.hists[k][1])), k
    # the group's capacity is about the two replicas' together (each over its own busy intervals)
    assert 0.8 < g.capacity_rps / (p1.capacity_rps + p2.capacity_rps) < 1.25, (g.capacity_rps, p1, p2)
    # windows over different ranges are not one group's
    assert group_profile("chat", [w1, store.window("chat.r2", lo, hi + 5)]) is None


def test_a_rolling_apply_is_judged_on_what_the_whole_group_served(store, tmp_path, capsys):
    b0, b1, a0 = _store_group(store)
    cfg = _config()
    r1 = cfg.target("chat.r1")
    clock = FakeClock(a0 - 0.5)
    ap = Applier(cfg, store, Path(tmp_path), say=lambda m: None, clock=clock, sleep=clock.sleep)
    old, new = {"max_num_seqs": 4}, {"max_num_seqs": 8}
    plan = Plan(r1, RollingStandIn(), {"max_num_seqs": 8}, old, new, [], [])  # type: ignore[arg-type]
    assert plan.whole_group
    aid = jr.begin_apply(
        store.engine,
        target=r1.name,
        recommendation_id=None,
        kind="apply",
        mode="manual",
        now=clock(),
        diff=plan.diff,
        old_flags=old,
        new_flags=new,
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    base = ap.observer.kpis(r1, b0 - 1, b1 + 1, group=plan.whole_group)  # what _carry_out journals before the switch
    jr.set_kpis(store.engine, aid, now=clock(), baseline=base)
    a = ap.observe_and_judge(aid, plan, None, base)

    # the facts, from the clients of the same recordings: the group answered half as many requests after
    ok1b, ok1a, n1b, n1a = _clients("same_restart")
    ok2b, ok2a, n2b, n2a = _clients("fewer_seqs")
    assert n1b + n2b == n1a + n2a  # the same offered load (closed-loop clients) before and after
    assert (ok1a + ok2a) / (ok1b + ok2b) < 0.6
    # r1 alone did not get worse beyond its noise: judged alone, the roll would have stood
    alone = ap.observer.judge_windows(r1, (b0 - 1, b1 + 1), tuple(a.after["window"]))
    assert alone.outcome != "rolled_back", alone
    # the decision: undone, on the group's numbers, and the journal holds the group's windows
    assert a.outcome == "rolled_back", (a.note, a.steps)
    # ...read on the group's numbers, which agree with the clients: it serves about half of what it did
    assert a.after["served_rps"] / a.baseline["served_rps"] < 0.6, (a.baseline, a.after)
    assert a.baseline["group"] == a.after["group"] == "chat"
    assert a.baseline["replicas"] == ["chat.r1", "chat.r2"]
    windows = [store.window(n, *a.after["window"]) for n in ("chat.r1", "chat.r2")]
    assert a.after["finished"] == round(profile(windows[0]).finished + profile(windows[1]).finished, 6)
    assert (
        judge(
            group_profile("chat", [store.window(n, b0 - 1, b1 + 1) for n in ("chat.r1", "chat.r2")]),
            group_profile("chat", windows),
            min_requests=r1.apply.min_requests,
        ).outcome
        == "rolled_back"
    )
    assert any("the replicas of chat together" in s["detail"] for s in a.steps if s["step"] == "observing")
    from tuner.cli.apply import _print_apply  # what `tuner journal chat.r1` prints of it

    _print_apply(a, steps=False)
    printed = capsys.readouterr().out
    assert "before: window=" in printed and "group=chat, replicas=chat.r1/chat.r2" in printed, printed


def test_tuner_judge_on_a_group_s_name_judges_its_replicas_together(tmp_path, capsys):
    from tuner.cli import main
    from tuner.store.db import open_engine, upgrade
    from tuner.store.store import Store

    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    upgrade(engine)
    b0, b1, a0 = _store_group(Store(engine))
    engine.dispose()
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n" + "\n".join(_CONFIG.splitlines()[:-1]) + "\n"
    )  # without the apply: line
    before, after = f"{b0 - 1:.3f}..{b1 + 1:.3f}", f"{a0 - 0.5:.3f}..{a0 + 24.5:.3f}"
    capsys.readouterr()
    verdicts = {}
    for name in ("chat", "chat.r1"):
        assert main(["--config", str(cfg), "judge", name, "--before", before, "--after", after, "--json"]) == 0
        verdicts[name] = json.loads(capsys.readouterr().out)
    # the group's served requests fell by about half (the clients': 1,049 -> 530); r1's alone did not fall so
    assert verdicts["chat"]["outcome"] == "rolled_back", verdicts["chat"]
    assert verdicts["chat"]["after"]["served_rps"] / verdicts["chat"]["before"]["served_rps"] < 0.6
    assert verdicts["chat.r1"]["outcome"] != "rolled_back", verdicts["chat.r1"]
