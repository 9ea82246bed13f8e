"""The verdict on the recorded corpus: every pair judged as `tuner judge` judges it, against the clients' truth.

tests/apply/verdict_corpus.py says where the corpus comes from and how the truth is read from the client side
only. A third of the recordings was set aside at random before any case was recorded or any verdict code changed
(tests/fixtures/verdict_corpus/held_back.json): their pairs carry ``-held`` in their ids, and
bench/verdict_corpus.py reports their score apart.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from tests.apply import verdict_corpus as corpus
from tuner.app.judge import read_series
from tuner.apply.verdict import Verdict, judge
from tuner.cli import main
from tuner.collect.scrape import snapshot_from_text
from tuner.config import Slo
from tuner.signals.load import profile
from tuner.store.db import open_engine, upgrade
from tuner.store.store import Store
from tuner.store.window import TargetWindow

MIN_REQUESTS = 20  # `tuner judge`'s default


@cache
def _windows(recording: str) -> tuple[TargetWindow, TargetWindow]:
    """Both sides of a recording read through tuner's own ingest into a store, once per recording."""
    meta = corpus.meta(recording)
    engine = open_engine("sqlite://")
    upgrade(engine)
    store = Store(engine)
    out = []
    for side in ("before", "after"):
        store.ensure_target(side, meta["backend"], "")
        series = read_series(corpus.CORPUS / recording / side)
        for ts, text, slots in series:
            store.ingest(snapshot_from_text(meta["backend"], text, target=side, ts=ts, slots=slots))
        out.append(store.window(side, series[0][0], series[-1][0]))
    engine.dispose()
    return out[0], out[1]


def _slo(pair: corpus.Pair) -> Slo | None:
    if pair.slo is None:
        return None
    budgets = corpus.meta(pair.recording)["slos"][pair.slo]
    return Slo.model_validate({k: f"{v}s" if k.endswith("_p99") else v for k, v in budgets.items()})


def judge_pair(pair: corpus.Pair) -> Verdict:
    before, after = _windows(pair.recording)
    slo = _slo(pair)
    return judge(profile(before, slo=slo), profile(after, slo=slo), min_requests=MIN_REQUESTS)


def test_the_corpus_is_what_the_issue_asks_for():
    """At least 30 pairs, from both servers, every load shape of the plan, a third of the recordings held back."""
    pairs = corpus.pairs()
    recs = corpus.recordings()
    assert len(pairs) >= 30 and len(recs) >= 20, (len(pairs), len(recs))
    assert {corpus.meta(r)["backend"] for r in recs} == {"vllm", "llamacpp"}
    held = corpus.held_back()
    assert held <= set(recs) and 0.3 <= len(held) / len(recs) <= 0.4, (held, recs)
    truths = {p.id: corpus.truth(p)[0] for p in pairs}
    # the corpus holds pairs that must be kept, must be rolled back, and must be inconclusive
    assert frozenset({"kept"}) in truths.values() and frozenset({"rolled_back"}) in truths.values()
    assert frozenset({"inconclusive"}) in truths.values()


@pytest.mark.parametrize("pair", corpus.pairs(), ids=lambda p: p.id)
def test_each_pair_is_judged_as_its_clients_measured(pair: corpus.Pair):
    allowed, why = corpus.truth(pair)
    v = judge_pair(pair)
    assert v.outcome in allowed, f"{v.outcome} not in {sorted(allowed)}: {why}\nverdict: {v.reason}"
    assert not corpus.clauses_contradicting_their_numbers(v), (corpus.clauses_contradicting_their_numbers(v), v.reason)
    if v.slo is not None:  # the SLO line is there whenever the SLO was measured on both sides
        assert v.slo.line().startswith("SLO ") and v.slo.objective == pytest.approx(0.99)


def test_tuner_judge_gives_the_same_verdict_as_the_corpus_test(capsys):
    """The corpus test reads each recording once for all its SLOs; `tuner judge` on the directories agrees."""
    pair = next(p for p in corpus.pairs() if p.slo == "tight" and not p.held_back)
    slo = corpus.meta(pair.recording)["slos"]["tight"]
    case = corpus.CORPUS / pair.recording
    capsys.readouterr()
    assert (
        main(
            [
                "judge",
                "--before",
                str(case / "before"),
                "--after",
                str(case / "after"),
                "--backend",
                "vllm",
                "--slo-ttft-p99",
                f"{slo['ttft_p99']}s",
                "--slo-e2e-p99",
                f"{slo['e2e_p99']}s",
                "--json",
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    v = judge_pair(pair)
    assert (got["outcome"], got["reason"]) == (v.outcome, v.reason)
    assert got["slo"]["line"] == v.slo.line()  # type: ignore[union-attr]
    assert (
        main(
            [
                "judge",
                "--before",
                str(case / "before"),
                "--after",
                str(case / "after"),
                "--backend",
                "vllm",
                "--slo-ttft-p99",
                f"{slo['ttft_p99']}s",
                "--slo-e2e-p99",
                f"{slo['e2e_p99']}s",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == v.slo.line()  # type: ignore[union-attr]  # the SLO line first
    assert printed[1].startswith(f"{v.outcome} (confidence")


def test_recordings_hold_their_own_truth_and_are_whole():
    """Every recording has both sides with enough scrapes and the clients' per-request record beside them."""
    for rec in corpus.recordings():
        meta = corpus.meta(rec)
        for side in ("before", "after"):
            reqs = meta[side]["client"]["requests"]
            assert reqs and all({"sent", "ttft", "e2e", "tokens", "failed"} <= set(r) for r in reqs), rec
            assert len(list((corpus.CORPUS / rec / side).glob("*.txt.gz"))) >= 2, (rec, side)
            assert Path(corpus.CORPUS / rec / side).is_dir()
