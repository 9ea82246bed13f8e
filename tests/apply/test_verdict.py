"""The apply verdict: its statistics, its rules, and its answers on real recorded before/after series.

tests/fixtures/verdict/ was recorded from real servers by scripts/record_verdict_fixtures.py; each case.json says
what the client itself measured and which outcome the case must get.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.apply.verdict import CONFIDENT, MIN_SCRAPES, bootstrap_p_up, judge, rank_p_up
from tuner.cli import main
from tuner.signals.load import Interval, LoadProfile
from tuner.signals.promql import histogram_quantile

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf)


def _cum(counts: list[float]) -> tuple[float, ...]:
    out, total = [], 0.0
    for c in counts:
        total += c
        out.append(total)
    return tuple(out)


def _profile(
    *,
    rate: float,
    saturated: bool,
    e2e: list[float],
    ttft: list[float] | None = None,
    attainment: float | None = None,
    offered: float | None = None,
    n_intervals: int = 12,
    jitter: float = 0.1,
) -> LoadProfile:
    """A vLLM window: n 2-second intervals finishing about ``rate`` requests/s, latency histograms as given."""
    intervals = tuple(
        Interval(2.0, rate * 2 * (1 + jitter * ((i % 3) - 1)), rate * 2 * 64, True) for i in range(n_intervals)
    )
    finished = math.fsum(iv.finished for iv in intervals)
    secs = 2.0 * n_intervals
    hists = {"e2e": (BOUNDS, _cum(e2e)), "ttft": (BOUNDS, _cum(ttft or e2e))}
    return LoadProfile(
        backend="vllm",
        start=0.0,
        end=secs,
        samples=n_intervals + 1,
        finished=finished,
        aborted=0.0,
        generated_tokens=finished * 64,
        served_rps=finished / secs,
        offered_rps=offered or finished / secs,
        capacity_rps=finished / secs,
        tokens_per_s=finished * 64 / secs,
        capacity_tokens_per_s=finished * 64 / secs,
        queued_share=0.5 if saturated else 0.0,
        mean_in_flight=None,
        queue_time_share=0.5 if saturated else 0.0,
        waiting_share=0.5 if saturated else 0.0,
        saturated=saturated,
        slo_attainment=attainment,
        slo_goodput_rps=finished / secs * attainment if attainment is not None else None,
        ttft_p99=histogram_quantile(0.99, *hists["ttft"]),
        e2e_p99=histogram_quantile(0.99, *hists["e2e"]),
        ttft_p50=histogram_quantile(0.5, *hists["ttft"]),
        e2e_p50=histogram_quantile(0.5, *hists["e2e"]),
        seconds_per_token=None,
        intervals=intervals,
        hists=hists,
    )


def _said(v, kind: str, word: str) -> bool:
    """Whether the verdict's reason holds a clause of that kind and word (and its text is in the reason)."""
    return any(c.kind == kind and c.word == word and c.text in v.reason for c in v.clauses)


# ---- the statistics -----------------------------------------------------------------------------------------


def test_rank_test_over_buckets():
    same = _cum([10, 20, 30, 5, 0, 0, 0, 0])
    assert rank_p_up(BOUNDS, same, same) == pytest.approx(0.5)
    slower = _cum([0, 5, 10, 30, 20, 0, 0, 0])
    assert rank_p_up(BOUNDS, same, slower) > 0.999  # after is larger
    assert rank_p_up(BOUNDS, slower, same) < 0.001
    # Hand-computed: before one obs in bucket 0, after one in bucket 1: U = 1, mean 0.5, ties none ->
    # var = 1*1/12*(3 - 0) = 0.25, z = 1 -> Phi(1) = 0.8413
    assert rank_p_up(BOUNDS, _cum([1, 0, 0, 0, 0, 0, 0, 0]), _cum([0, 1, 0, 0, 0, 0, 0, 0])) == pytest.approx(
        0.8413, abs=1e-4
    )
    assert rank_p_up(BOUNDS, _cum([0] * 8), same) == 0.5  # nothing to compare


def test_bootstrap_is_seeded_and_sees_a_shift():
    a = [Interval(2.0, f, 0.0, True) for f in (4, 5, 6, 5, 4, 6, 5, 5)]
    b = [Interval(2.0, f, 0.0, True) for f in (8, 9, 10, 9, 8, 10, 9, 9)]
    assert bootstrap_p_up(a, b, "finished") == bootstrap_p_up(a, b, "finished") > 0.999
    assert bootstrap_p_up(b, a, "finished") < 0.001
    assert 0.3 < bootstrap_p_up(a, list(reversed(a)), "finished") < 0.7


# ---- the rules ------------------------------------------------------------------------------------------------

FAST = [40, 30, 20, 10, 0, 0, 0, 0]
SLOW = [0, 0, 10, 20, 30, 40, 0, 0]


def test_a_window_of_too_few_scrapes_judges_nothing():
    """A daemon starved on a loaded machine scraped 3 times after a change: a bootstrap over two intervals is
    sure of anything (a clean-clone demo run kept a change whose capacity had fallen 12% on 3 scrapes). Inconclusive
    (the apply observes on); with MIN_SCRAPES scrapes on each side the same windows are judged."""
    before = _profile(rate=3.0, saturated=True, e2e=SLOW, attainment=0.5)
    for n, outcome in ((2, "inconclusive"), (MIN_SCRAPES - 2, "inconclusive"), (MIN_SCRAPES - 1, "kept")):
        after = _profile(rate=8.0, saturated=False, e2e=FAST, attainment=1.0, n_intervals=n)
        v = judge(before, after, min_requests=20)
        assert v.outcome == outcome, (n, v)
        if outcome == "inconclusive":
            assert f"too few scrapes to judge: {n + 1} after the change" in v.reason and v.confidence == 0.0
        v = judge(after, before, min_requests=20)
        assert (v.outcome == "inconclusive") == (outcome == "inconclusive"), (n, v)


def test_saturated_before_more_capacity_is_kept_even_if_per_request_speed_fell():
    before = _profile(rate=3.0, saturated=True, e2e=SLOW, attainment=0.5)
    after = _profile(rate=8.0, saturated=False, e2e=FAST, attainment=1.0)
    v = judge(before, after, min_requests=20)
    assert v.outcome == "kept" and v.confidence >= CONFIDENT, v
    assert _said(v, "queue", "gone") and v.before["saturated"] and not v.after["saturated"]


def test_saturated_both_sides_less_capacity_is_rolled_back():
    v = judge(
        _profile(rate=6.0, saturated=True, e2e=SLOW), _profile(rate=2.0, saturated=True, e2e=SLOW), min_requests=20
    )
    assert v.outcome == "rolled_back" and _said(v, "capacity", "fell") and v.confidence >= CONFIDENT


def test_saturated_both_sides_same_capacity_is_inconclusive():
    v = judge(
        _profile(rate=5.0, saturated=True, e2e=SLOW), _profile(rate=5.0, saturated=True, e2e=SLOW), min_requests=20
    )
    assert v.outcome == "inconclusive" and _said(v, "capacity", "held") and "noise" in v.reason
    assert v.confidence < CONFIDENT


def _tokens(p: LoadProfile, per_request: float, budgets: dict[str, float]) -> LoadProfile:
    """The same window with ``per_request`` tokens generated per finished request and the SLO's budgets."""
    intervals = tuple(dataclasses.replace(iv, generated=iv.finished * per_request) for iv in p.intervals)
    tokens = math.fsum(iv.generated for iv in intervals) / (p.end - p.start)
    return dataclasses.replace(
        p,
        intervals=intervals,
        tokens_per_s=tokens,
        slo_budgets=budgets,
        slo_token_goodput_tps=tokens * p.slo_attainment if p.slo_attainment is not None else None,
    )


def test_saturated_both_sides_token_goodput_decides_where_the_slo_is_per_token():
    """Requests finish as fast and as often within the SLO, but each carries twice the tokens: where the SLO budgets
    inter-token latency, tokens within the SLO are the goodput that counts, and it doubled (kept); halved, it rolls
    back. Without an ITL budget the same windows stay inconclusive, as before token goodput was a KPI."""
    before = _profile(rate=5.0, saturated=True, e2e=SLOW, attainment=0.9)
    after = _profile(rate=5.0, saturated=True, e2e=SLOW, attainment=0.9)
    itl = {"itl": 0.05}
    v = judge(_tokens(before, 64, itl), _tokens(after, 128, itl), min_requests=20)
    assert v.outcome == "kept" and v.confidence >= CONFIDENT, v.reason
    assert _said(v, "goodput", "rose") and _said(v, "capacity", "held") and "SLO token goodput" in v.reason
    v = judge(_tokens(before, 128, itl), _tokens(after, 64, itl), min_requests=20)
    assert v.outcome == "rolled_back" and _said(v, "goodput", "fell"), v.reason
    v = judge(_tokens(before, 64, {"e2e": 30.0}), _tokens(after, 128, {"e2e": 30.0}), min_requests=20)
    assert v.outcome == "inconclusive" and "token goodput" not in v.reason, v.reason


def test_queue_appears_under_the_same_load_is_rolled_back_but_not_when_the_load_rose():
    before = _profile(rate=5.0, saturated=False, e2e=FAST)
    v = judge(before, _profile(rate=2.0, saturated=True, e2e=SLOW, offered=5.0), min_requests=20)
    assert v.outcome == "rolled_back" and _said(v, "queue", "appeared") and _said(v, "sustained", "below")
    v = judge(before, _profile(rate=5.5, saturated=True, e2e=SLOW, offered=11.0), min_requests=20)
    assert v.outcome == "inconclusive" and _said(v, "queue", "appeared") and _said(v, "load", "rose")
    assert "offered load rose" in v.reason


def test_below_capacity_latency_at_matched_and_unmatched_load():
    fast, slow = _profile(rate=4.0, saturated=False, e2e=FAST), _profile(rate=4.0, saturated=False, e2e=SLOW)
    assert judge(fast, slow, min_requests=20).outcome == "rolled_back"
    assert judge(slow, fast, min_requests=20).outcome == "kept"
    assert judge(fast, fast, min_requests=20).outcome == "inconclusive"
    # Slower under twice the load: cannot tell. Faster under twice the load: better whatever the load did.
    double_slow = _profile(rate=8.0, saturated=False, e2e=SLOW)
    double_fast = _profile(rate=8.0, saturated=False, e2e=FAST)
    v = judge(fast, double_slow, min_requests=20)
    assert v.outcome == "inconclusive" and _said(v, "load", "rose") and "beyond the 1.25x" in v.reason
    assert judge(slow, double_fast, min_requests=20).outcome == "kept"


def test_a_latency_shift_too_small_for_the_slo_does_not_count():
    """The demo's real case: 2.4x the load served at 100% attainment, the E2E median down, and the TTFT median
    up by a few milliseconds, significant to the rank test. Under a 2 s TTFT budget that shift changes nothing."""
    import dataclasses

    tiny = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, math.inf)
    before = _profile(rate=1.3, saturated=False, e2e=SLOW, attainment=0.94)
    after = _profile(rate=3.2, saturated=False, e2e=FAST, attainment=1.0)
    ttft_b, ttft_a = (tiny, _cum([40, 40, 10, 5, 3, 2, 0, 0, 0])), (tiny, _cum([10, 60, 20, 5, 3, 2, 0, 0, 0]))

    def with_ttft(p: LoadProfile, hist, budgets) -> LoadProfile:
        return dataclasses.replace(
            p, hists={**p.hists, "ttft": hist}, ttft_p50=histogram_quantile(0.5, *hist), slo_budgets=budgets
        )

    no_slo = judge(with_ttft(before, ttft_b, {}), with_ttft(after, ttft_a, {}), min_requests=20)
    assert no_slo.outcome == "inconclusive" and "P50 TTFT" in no_slo.reason  # without a budget: +50% is a shift
    slo = {"ttft": 2.0, "e2e": 10.0}
    v = judge(with_ttft(before, ttft_b, slo), with_ttft(after, ttft_a, slo), min_requests=20)
    assert v.outcome == "kept" and _said(v, "load", "rose"), v
    # a shift of a whole 5% of the budget still counts
    tight = {"ttft": 0.05, "e2e": 10.0}  # 5% of 50 ms = 2.5 ms < the 4.2 ms shift of the median
    assert (
        judge(with_ttft(before, ttft_b, tight), with_ttft(after, ttft_a, tight), min_requests=20).outcome
        == "inconclusive"
    )


def test_too_little_traffic_is_inconclusive_with_zero_confidence():
    v = judge(
        _profile(rate=0.1, saturated=False, e2e=[1, 0, 0, 0, 0, 0, 0, 0]),
        _profile(rate=5.0, saturated=False, e2e=FAST),
        min_requests=20,
    )
    assert v.outcome == "inconclusive" and "too little traffic" in v.reason and v.confidence == 0.0
    assert judge(None, _profile(rate=5.0, saturated=False, e2e=FAST), min_requests=20).outcome == "inconclusive"


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    rate=st.floats(1.0, 20.0),
    gain=st.floats(0.0, 3.0),
    sat_before=st.booleans(),
    sat_after=st.booleans(),
    shift=st.integers(0, 3),
    attainment=st.floats(0.0, 1.0),
    att_gain=st.floats(0.0, 1.0),
)
def test_a_change_better_on_every_kpi_is_never_rolled_back(
    rate, gain, sat_before, sat_after, shift, attainment, att_gain
):
    """Capacity and goodput up or equal, latency down or equal, attainment up or equal, a queue no worse."""
    before_lat = [0, 0, 10, 20, 30, 40, 0, 0]
    after_lat = before_lat[shift:] + [0] * shift  # moved to faster buckets
    sat_after = sat_after and sat_before  # a queue that appears is not "better"
    before = _profile(rate=rate, saturated=sat_before, e2e=before_lat, attainment=attainment)
    after = _profile(
        rate=rate * (1 + gain),
        saturated=sat_after,
        e2e=after_lat,
        attainment=min(1.0, attainment + att_gain),
        offered=rate * (1 + gain),
    )
    assert judge(before, after, min_requests=5).outcome != "rolled_back"


# ---- recorded truth -------------------------------------------------------------------------------------------


def _cases() -> list[Path]:
    return sorted(p for p in CASES.iterdir() if (p / "case.json").exists()) if CASES.exists() else []


@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.name)
def test_judge_on_recorded_real_series(case: Path, capsys):
    meta = json.loads((case / "case.json").read_text())
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
                meta["backend"],
                "--slo-ttft-p99",
                "2s",
                "--slo-e2e-p99",
                "10s",
                "--json",
            ]
        )
        == 0
    )
    v = json.loads(capsys.readouterr().out)
    assert set(v) >= {"outcome", "reason", "confidence", "test", "before", "after"}
    for side in ("before", "after"):
        assert {
            "saturated",
            "offered_rps",
            "served_rps",
            "slo_goodput_rps",
            "slo_attainment",
            "ttft_p99",
            "e2e_p99",
        } <= set(v[side])
    expected = meta["expected"]
    if expected == "not rolled_back":
        assert v["outcome"] != "rolled_back", v
    else:
        assert v["outcome"] == expected, v
    # The verdict agrees with what the client itself measured in the same run.
    tput = {s: meta[s]["client"]["completion_tokens"] / meta[s]["client"]["wall_s"] for s in ("before", "after")}
    if v["outcome"] == "kept":
        assert tput["after"] > tput["before"], (tput, v)
    if v["outcome"] == "rolled_back":
        assert tput["after"] < tput["before"], (tput, v)
    assert 0.0 <= v["confidence"] <= 1.0
    if meta["backend"] == "vllm":  # Little's law over the E2E histogram against the clients that kept it busy
        for side in ("before", "after"):
            mean, clients = v[side]["mean_in_flight"], meta[side]["clients"]
            # closed-loop clients hold at most one request each; requests that finish in a window began a little
            # before it, so a window's sum may run over by a fraction of one request's E2E. (No lower bound: on
            # 2 cores the clients spend much of their turn outside the server, e.g. 12 clients kept 3.6 inside.)
            assert 0.0 < mean <= 1.25 * clients, (side, mean, clients)
        if meta["after"]["clients"] > meta["before"]["clients"] and meta["before"]["flags"] == meta["after"]["flags"]:
            assert v["after"]["mean_in_flight"] > v["before"]["mean_in_flight"], v  # more clients, same server


def test_recorded_cases_cover_every_outcome():
    found = {json.loads((c / "case.json").read_text())["expected"] for c in _cases()}
    assert {"kept", "rolled_back", "inconclusive", "not rolled_back"} <= found, found


def test_judge_names_what_is_missing(tmp_path, capsys):
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    (tmp_path / "before" / "1700000000000.txt").write_text('vllm:num_requests_running{engine="0" 1\n')
    assert (
        main(["judge", "--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--backend", "vllm"])
        == 3
    )
    assert "before/1700000000000.txt" in capsys.readouterr().err
    (tmp_path / "before" / "1700000000000.txt").unlink()
    assert (
        main(["judge", "--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--backend", "vllm"])
        == 3
    )
    assert "0 readable exposition(s)" in capsys.readouterr().err
    assert (
        main(["judge", "--before", str(tmp_path / "nope"), "--after", str(tmp_path / "after"), "--backend", "vllm"])
        == 2
    )


def test_judge_a_configured_target_over_two_ranges_of_its_store(tmp_path, capsys):
    """`tuner judge TARGET --before A..B --after C..D`: the same verdict from the store tuner run filled."""
    from tuner.app.judge import read_series
    from tuner.collect import vllm
    from tuner.store.db import open_engine, upgrade
    from tuner.store.store import Store

    case = CASES / "queue_more_seqs"
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n"
        "targets:\n  - {name: chat, backend: vllm, url: 'http://127.0.0.1:9',"
        " slo: {ttft_p99: 2s, e2e_p99: 10s}}\n"
    )
    engine = open_engine(f"sqlite:///{tmp_path / 'tuner.db'}")
    upgrade(engine)
    store = Store(engine)
    store.ensure_target("chat", "vllm", "http://127.0.0.1:9")
    ranges = {}
    for side in ("before", "after"):  # recorded minutes apart, with a restart between: as tuner run stores them
        series = read_series(case / side)
        for ts, text, _ in series:
            store.ingest(vllm.snapshot_from_text(text, target="chat", ts=ts))
        ranges[side] = f"{series[0][0]:.3f}..{series[-1][0]:.3f}"
    engine.dispose()
    capsys.readouterr()
    assert (
        main(
            ["--config", str(cfg), "judge", "chat", "--before", ranges["before"], "--after", ranges["after"], "--json"]
        )
        == 0
    )
    v = json.loads(capsys.readouterr().out)
    assert v["outcome"] == "kept" and v["after"]["capacity_rps"] > v["before"]["capacity_rps"] * 2, v
    assert main(["--config", str(cfg), "judge", "chat", "--before", "oops", "--after", ranges["after"]]) == 2
    assert "--before" in capsys.readouterr().err


# ---- SLO first, and reasons made of facts, over generated load profiles -----------------------------------------


def _slo_profile(
    *,
    rate: float,
    offered: float,
    saturated: bool,
    attainment: float,
    n_intervals: int,
    e2e: list[float],
    objective: float,
    budgets: dict[str, float],
) -> LoadProfile:
    import dataclasses

    p = _profile(
        rate=rate, saturated=saturated, e2e=e2e, attainment=attainment, offered=offered, n_intervals=n_intervals
    )
    return dataclasses.replace(p, slo_objective=objective, slo_budgets=budgets)


LAT_SHAPES = [
    [40, 30, 20, 10, 0, 0, 0, 0],
    [0, 0, 10, 20, 30, 40, 0, 0],
    [5, 10, 20, 30, 20, 10, 5, 0],
    [0, 0, 0, 0, 10, 20, 40, 30],
]


@settings(max_examples=250, deadline=None, derandomize=True, database=None)
@given(
    rate_b=st.floats(0.5, 20.0),
    rate_gain=st.floats(0.3, 3.0),
    load_gain=st.floats(0.3, 3.0),
    sat_b=st.booleans(),
    sat_a=st.booleans(),
    att_b=st.floats(0.5, 1.0),
    att_a=st.floats(0.5, 1.0),
    n_b=st.integers(6, 40),
    n_a=st.integers(6, 40),
    lat_b=st.integers(0, 3),
    lat_a=st.integers(0, 3),
    objective=st.sampled_from([0.9, 0.95, 0.99, 0.999]),
    with_slo=st.booleans(),
)
def test_the_slo_rule_holds_and_every_clause_agrees_with_its_numbers(
    rate_b, rate_gain, load_gain, sat_b, sat_a, att_b, att_a, n_b, n_a, lat_b, lat_a, objective, with_slo
):
    """Over generated before/after windows: each clause's word agrees with the numbers it cites (no "rose" when it
    fell, no "a queue appeared" unless the after window is saturated and the before one not), and the outcome
    never contradicts the SLO rule, checked here from first principles (Wilson intervals and a two-proportion test
    written out below, not the verdict's own helpers)."""
    from tests.apply.verdict_corpus import clauses_contradicting_their_numbers, wilson

    budgets = {"ttft": 1.0, "e2e": 5.0}
    before = _slo_profile(
        rate=rate_b,
        offered=rate_b,
        saturated=sat_b,
        attainment=att_b,
        n_intervals=n_b,
        e2e=LAT_SHAPES[lat_b],
        objective=objective,
        budgets=budgets if with_slo else {},
    )
    after = _slo_profile(
        rate=rate_b * rate_gain,
        offered=rate_b * load_gain,
        saturated=sat_a,
        attainment=att_a,
        n_intervals=n_a,
        e2e=LAT_SHAPES[lat_a],
        objective=objective,
        budgets=budgets if with_slo else {},
    )
    if not with_slo:
        import dataclasses

        before = dataclasses.replace(before, slo_objective=None, slo_attainment=None, slo_goodput_rps=None)
        after = dataclasses.replace(after, slo_objective=None, slo_attainment=None, slo_goodput_rps=None)
    v = judge(before, after, min_requests=5)
    assert not clauses_contradicting_their_numbers(v), (clauses_contradicting_their_numbers(v), v.reason)
    for c in v.clauses:
        if c.kind == "load" and c.word in ("rose", "fell", "held"):
            assert (c.before, c.after) == (pytest.approx(before.offered), pytest.approx(after.offered))
    if not with_slo or before.finished < 5 or after.finished < 5:
        assert v.slo is None or with_slo
        return
    nb, na = before.finished, after.finished

    def status(p, n):
        return "met" if p >= objective else "breached" if wilson(p, n)[1] < objective else "unsure"

    pooled = (att_b * nb + att_a * na) / (nb + na)
    se = math.sqrt(pooled * (1 - pooled) * (1 / nb + 1 / na))
    p_fell = (
        0.5 * (1 + math.erf((att_b - att_a) / se / math.sqrt(2)))
        if se
        else 1.0
        if att_a < att_b
        else 0.0
        if att_a > att_b
        else 0.5
    )
    ratio = after.offered / before.offered
    sb, sa = status(att_b, nb), status(att_a, na)
    if sb == "met" and sa == "breached" and p_fell >= CONFIDENT and ratio <= 1.25:
        assert v.outcome == "rolled_back" and v.clauses[0].kind == "slo" and v.clauses[0].word == "broke", v
    if sb == "breached" and sa == "met" and 1 - p_fell >= CONFIDENT:
        assert v.outcome != "rolled_back", v  # cured is never undone
        if ratio >= 1 / 1.25:
            assert v.outcome == "kept" and v.clauses[0].word == "cured", v
    assert v.slo is not None and v.slo.line().startswith(f"SLO {objective:.4g} of requests")


def test_the_issue_case_a_queue_and_a_broken_slo_under_a_load_that_fell_is_rolled_back():
    """issue 38's recorded pair, as numbers: max-num-seqs 16 -> 2, offered 3.487 -> 3.412 req/s, a queue appeared,
    capacity 3.487 -> 3.161, attainment 100% -> 82.2% under TTFT P99 1.5 s / E2E P99 12 s. It was 'inconclusive: a
    queue appeared, but the offered load rose too'. The SLO broke at a load that fell: rolled_back, and no clause
    says the load rose."""
    budgets = {"ttft": 1.5, "e2e": 12.0}
    before = _slo_profile(
        rate=3.487,
        offered=3.487,
        saturated=False,
        attainment=1.0,
        n_intervals=30,
        e2e=LAT_SHAPES[0],
        objective=0.99,
        budgets=budgets,
    )
    after = _slo_profile(
        rate=3.161,
        offered=3.412,
        saturated=True,
        attainment=0.822,
        n_intervals=30,
        e2e=LAT_SHAPES[3],
        objective=0.99,
        budgets=budgets,
    )
    v = judge(before, after, min_requests=20)
    assert v.outcome == "rolled_back" and v.test.startswith("SLO attainment"), v
    assert [c.word for c in v.clauses if c.kind in ("slo", "load", "queue")] == ["broke", "held", "appeared"]
    assert "load rose" not in v.reason and v.reason.startswith("the SLO broke")
    assert v.slo is not None and v.slo.before.status == "met" and v.slo.after.status == "breached"
    # the same windows the other way round: a breach cured at no less load is kept
    back = judge(after, before, min_requests=20)
    assert back.outcome == "kept" and back.clauses[0].word == "cured", back


def test_a_queue_that_sets_the_attainment_on_both_sides_is_judged_on_capacity_alone():
    """Corpus recording v18 (the same flags restarted, an open-loop load twice what they serve): the server read
    attainment 11% -> 0% (the clients 15.6% -> 14.7%), capacity +13%, not beyond the noise. Goodput fell with the
    attainment, which measured how long the queue had grown, not the flags: judged on capacity alone, never
    rolled back. Met before and breached after, the SLO decides first."""
    budgets = {"ttft": 5.0, "e2e": 15.0}
    before = _slo_profile(
        rate=4.06,
        offered=7.83,
        saturated=True,
        attainment=0.111,
        n_intervals=40,
        e2e=LAT_SHAPES[3],
        objective=0.99,
        budgets=budgets,
    )
    after = _slo_profile(
        rate=4.06,
        offered=7.66,
        saturated=True,
        attainment=0.0,
        n_intervals=40,
        e2e=LAT_SHAPES[3],
        objective=0.99,
        budgets=budgets,
    )
    v = judge(before, after, min_requests=20)
    assert v.outcome == "inconclusive" and not any(c.kind == "goodput" for c in v.clauses), v
    assert v.slo is not None and (v.slo.before.status, v.slo.after.status) == ("breached", "breached")
    met = _slo_profile(
        rate=4.06,
        offered=7.83,
        saturated=True,
        attainment=1.0,
        n_intervals=40,
        e2e=LAT_SHAPES[0],
        objective=0.5,
        budgets=budgets,
    )
    v = judge(met, after, min_requests=20)
    assert v.outcome == "rolled_back" and v.clauses[0].kind == "slo" and v.clauses[0].word == "broke", v


def test_a_budget_inside_a_bucket_is_doubt_not_a_breach():
    """The server's attainment is a lower bound at bucket resolution (a 1.5 s budget inside the 1-2.5 s bucket
    counts the bucket as missed). Corpus recording v05 read 98.0% at least and 100% at most where the clients
    measured 100%: that is not a breach beyond the noise, so neither an SLO that broke nor one breached on both
    sides."""
    import dataclasses

    budgets = {"ttft": 1.5, "e2e": 5.0}
    p = _slo_profile(
        rate=9.7,
        offered=9.8,
        saturated=True,
        attainment=0.98,
        n_intervals=40,
        e2e=LAT_SHAPES[0],
        objective=0.99,
        budgets=budgets,
    )
    doubt = dataclasses.replace(p, slo_attainment_hi=1.0)
    sure = dataclasses.replace(p, slo_attainment_hi=0.98)
    before = dataclasses.replace(p, slo_attainment=1.0, slo_attainment_hi=1.0)
    assert judge(before, doubt, min_requests=20).slo.after.status == "unsure"  # type: ignore[union-attr]
    v = judge(before, sure, min_requests=20)
    assert v.slo is not None and v.slo.after.status == "breached" and v.slo.broke and v.outcome == "rolled_back"
    assert "98.0%-100.0% (bucket resolution)" in judge(before, doubt, min_requests=20).slo.line()  # type: ignore[union-attr]


def test_goodput_is_judged_on_the_attainment_within_its_buckets_not_on_their_lower_bound():
    """The README demo's apply (2026-11-28): both windows saturated, capacity 3.32 -> 5.84 req/s (P(up) 1.00). Before,
    8.2% of TTFTs were at most 1 s and 19.1% at most 2.5 s; after, every one lay between 1 and 2.5 s, against a 2 s
    budget. The lower bound read the after-window as 0% within the SLO, the verdict said "SLO goodput fell 0.272 ->
    0.000 (-100%)" and was inconclusive. Spread evenly within the bucket as histogram_quantile takes it, 2/3 of the
    after-window met 2 s against about 15% before: goodput rose, and the change is kept."""
    import dataclasses

    from tuner.signals.promql import fraction_le, fraction_le_linear

    budgets = {"ttft": 2.0, "e2e": 10.0}
    ttft_b = [0, 0, 0, 8.2, 10.9, 60.9, 20.0, 0]  # % per bucket of BOUNDS: 8.2 <= 1 s, 19.1 <= 2.5 s
    ttft_a = [0, 0, 0, 0, 100, 0, 0, 0]
    e2e = [0, 0, 0, 0, 10, 40, 50, 0]  # all within 10 s
    sides = []
    for rate, ttft in ((3.32, ttft_b), (5.84, ttft_a)):
        lo, hi = fraction_le(budgets["ttft"], BOUNDS, _cum(ttft))  # type: ignore[misc]
        est = fraction_le_linear(budgets["ttft"], BOUNDS, _cum(ttft))
        p = _profile(rate=rate, saturated=True, e2e=e2e, ttft=ttft, attainment=lo, n_intervals=20)
        sides.append(
            dataclasses.replace(
                p, slo_attainment_hi=hi, slo_attainment_est=est, slo_objective=0.95, slo_budgets=budgets
            )
        )
    before, after = sides
    assert (before.slo_attainment, before.slo_attainment_hi) == pytest.approx((0.082, 0.191))
    assert (after.slo_attainment, after.slo_attainment_hi, after.slo_attainment_est) == pytest.approx((0, 1, 2 / 3))
    v = judge(before, after, min_requests=20)
    assert v.outcome == "kept" and _said(v, "capacity", "rose") and _said(v, "goodput", "rose"), v.reason
    lo_b, hi_b, hi_a = (p.served_rps * x for p, x in ((before, 0.082), (before, 0.191), (after, 1.0)))  # type: ignore[operator]
    assert f"bound it to {lo_b:.3f}-{hi_b:.3f} -> 0.000-{hi_a:.3f})" in v.reason, v.reason
    assert "(-100%" not in v.reason
    # on the lower bound alone (no estimate), the same windows read as a fall, and the verdict as inconclusive
    bare = judge(
        dataclasses.replace(before, slo_attainment_est=None),
        dataclasses.replace(after, slo_attainment_est=None),
        min_requests=20,
    )
    assert bare.outcome == "inconclusive" and _said(bare, "goodput", "fell"), bare.reason


def test_a_goodput_up_from_nothing_reads_as_that_not_as_an_infinite_share():
    """The README demo (2026-11-28 13:03): the before-window met the SLO for none of 144 requests, and the verdict
    said "SLO goodput (req/s) rose: 0.000 -> 2.987 (+inf%, ...)"."""
    import dataclasses

    budgets = {"ttft": 2.0}
    ttft_b = [0, 0, 0, 0, 0, 40, 60, 0]  # every TTFT above 2.5 s
    ttft_a = [0, 0, 0, 0, 100, 0, 0, 0]  # every one in 1-2.5 s
    sides = []
    for rate, ttft in ((2.6, ttft_b), (4.5, ttft_a)):
        from tuner.signals.promql import fraction_le, fraction_le_linear

        lo, hi = fraction_le(2.0, BOUNDS, _cum(ttft))  # type: ignore[misc]
        p = _profile(rate=rate, saturated=True, e2e=ttft, ttft=ttft, attainment=lo, n_intervals=20)
        est = fraction_le_linear(2.0, BOUNDS, _cum(ttft))
        sides.append(
            dataclasses.replace(
                p, slo_attainment_hi=hi, slo_attainment_est=est, slo_objective=0.95, slo_budgets=budgets
            )
        )
    v = judge(*sides, min_requests=20)
    assert _said(v, "goodput", "rose") and "inf" not in v.reason, v.reason
    assert "SLO goodput (req/s) rose: 0.000 -> " in v.reason and "(up from 0, P(up) 1.00" in v.reason, v.reason
