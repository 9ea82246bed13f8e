"""Derived signals from a window of points: each expected value worked out by hand in the comment beside it."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from tuner.config import Slo
from tuner.signals.derive import compute_signals
from tuner.store.window import EngineWindow, HistPoint, HistSeries, TargetWindow

S = 1000  # ms
BOUNDS = (0.1, 0.5, 1.0, 5.0, math.inf)


def _counter(per_step: float, n: int = 13, step_s: int = 5, start: float = 0.0):
    return tuple((i * step_s * S, start + per_step * i) for i in range(n))


def _hist(per_step_counts: tuple[float, ...], n: int = 13, step_s: int = 5) -> HistSeries:
    cum = []
    running = 0.0
    for c in per_step_counts:
        running += c
        cum.append(running)
    return HistSeries(
        BOUNDS, tuple(HistPoint(i * step_s * S, tuple(c * i for c in cum), 0.0, cum[-1] * i) for i in range(n))
    )


def _window(engine: EngineWindow, backend: str = "vllm") -> TargetWindow:
    # 13 points at 0..60 s and a window [0, 60 s]: samples on both ends, so no extrapolation.
    return TargetWindow(target="t", backend=backend, start_ms=0, end_ms=60 * S, engines=(engine,), health=None)


def _vllm_engine(**hists: HistSeries) -> EngineWindow:
    series = {
        ("vllm:prompt_tokens_total", ()): _counter(500),  # 500 per 5 s -> 100 tokens/s
        ("vllm:generation_tokens_total", ()): _counter(250),  # 50 tokens/s
        ("vllm:request_success_total", (("finished_reason", "length"),)): _counter(10),  # 2/s
        ("vllm:request_success_total", (("finished_reason", "stop"),)): _counter(5),  # 1/s
        ("vllm:num_preemptions_total", ()): _counter(1),  # 0.2/s
        ("vllm:prefix_cache_queries_total", ()): _counter(400),
        ("vllm:prefix_cache_hits_total", ()): _counter(100),  # 100/400 = 0.25
        ("vllm:kv_cache_usage_perc", ()): tuple((i * 5 * S, v) for i, v in enumerate([0.2, 0.97, 0.5])),
        ("vllm:num_requests_running", ()): ((0, 4.0), (5 * S, 8.0)),
        ("vllm:num_requests_waiting", ()): ((0, 12.0), (5 * S, 3.0)),
        ("process_start_time_seconds", ()): ((0, 100.0), (5 * S, 100.0), (10 * S, 200.0)),
    }
    default = {
        "vllm:time_to_first_token_seconds": _hist((10, 60, 20, 8, 2)),
        "vllm:e2e_request_latency_seconds": _hist((0, 10, 40, 45, 5)),
    }
    default.update(hists)
    return EngineWindow(engine="0", model_name="m", series=series, hists={(k, ()): v for k, v in default.items()})


def test_rates_ratios_and_latest_values():
    sig = compute_signals(_window(_vllm_engine())).engines[0]
    assert sig.prompt_tokens_per_s == pytest.approx(100)
    assert sig.generation_tokens_per_s == pytest.approx(50)
    assert sig.requests_per_s == pytest.approx(3)  # summed over finished_reason
    assert sig.preemptions_per_s == pytest.approx(0.2)
    assert sig.prefix_cache_hit_ratio == pytest.approx(0.25)
    assert sig.kv_cache_usage == 0.5 and sig.kv_cache_usage_max == 0.97
    assert (sig.requests_running, sig.requests_waiting, sig.requests_waiting_max) == (8.0, 3.0, 12.0)
    assert sig.restarts == 1


def test_quantiles_from_bucket_increases():
    sig = compute_signals(_window(_vllm_engine())).engines[0]
    # TTFT: per step 10 <= 0.1, 70 <= 0.5, 90 <= 1, 98 <= 5, 100 total; over 12 steps x12 (scale-free).
    # P50: rank 50 of 100 in (0.1, 0.5]: 0.1 + 0.4 * 40/60.  P99: rank 99 in (5, +Inf]: 5.
    assert sig.ttft_p50 == pytest.approx(0.1 + 0.4 * 40 / 60)
    assert sig.ttft_p95 == pytest.approx(1.0 + 4.0 * 5 / 8)  # rank 95 in (1, 5]: 1 + 4 * (95-90)/8
    assert sig.ttft_p99 == 5.0
    assert sig.requests_in_window == pytest.approx(100 * 12)
    assert sig.itl_p99 is None  # no inter-token histogram in the window: unknown, not zero


def test_goodput_bounds_from_slo():
    slo = Slo(ttft_p99=timedelta(seconds=0.5), e2e_p99=timedelta(seconds=3))
    sig = compute_signals(_window(_vllm_engine()), slo=slo).engines[0]
    # TTFT <= 0.5 s: 70% exactly (a bucket bound). E2E <= 3 s falls inside (1, 5]: between 50% and 95%.
    # Joint: at least 0.70 + 0.50 - 1 = 0.20, at most min(0.70, 0.95) = 0.70.
    assert sig.goodput_ratio == pytest.approx(0.20)
    assert sig.goodput_ratio_upper == pytest.approx(0.70)


def test_no_slo_no_goodput_and_empty_window_is_none():
    empty = EngineWindow(engine="0", model_name="m", series={}, hists={})
    sig = compute_signals(_window(empty)).engines[0]
    assert sig.goodput_ratio is None and sig.prompt_tokens_per_s is None and sig.ttft_p50 is None
    assert sig.samples == 0


def test_llamacpp_reads_its_own_series():
    engine = EngineWindow(
        engine="0",
        model_name="m",
        series={
            ("llamacpp:tokens_predicted_total", ()): _counter(60),  # 12 tokens/s
            ("llamacpp:requests_deferred", ()): ((0, 0.0), (5 * S, 6.0)),
            ("llamacpp:requests_processing", ()): ((0, 2.0),),
            ("tuner:kv_cache_usage", ()): ((0, 0.4),),
            ("tuner:slots_total", ()): ((0, 2.0),),
        },
        hists={},
    )
    sig = compute_signals(_window(engine, "llamacpp")).engines[0]
    assert sig.generation_tokens_per_s == pytest.approx(12)
    assert (sig.requests_waiting, sig.requests_running, sig.kv_cache_usage, sig.slots_total) == (6.0, 2.0, 0.4, 2.0)
    assert sig.ttft_p99 is None  # llama-server serves no latency histograms


def test_as_json_has_no_nan():
    sig = compute_signals(_window(_vllm_engine()))
    flat = sig.as_json()["engines"][0]
    assert all(v is None or not (isinstance(v, float) and math.isnan(v)) for v in flat.values())


def test_goodput_lower_bound_never_exceeds_upper():
    """Seen on a real vLLM run: every TTFT within budget (1.0) and 31 of 48 E2E within budget gave a
    lower bound of fsum([1.0, 31/48]) - 1 = 0.6458333333333335, an ulp above the upper bound 31/48."""
    engine = _vllm_engine(
        **{
            "vllm:time_to_first_token_seconds": _hist((48, 0, 0, 0, 0)),
            "vllm:e2e_request_latency_seconds": _hist((0, 10, 21, 12, 5)),
        }
    )
    slo = Slo(ttft_p99=timedelta(seconds=5), e2e_p99=timedelta(seconds=1))
    sig = compute_signals(_window(engine), slo=slo).engines[0]
    assert sig.goodput_ratio_upper == 31 / 48
    assert sig.goodput_ratio == sig.goodput_ratio_upper  # equal: the bounds meet when one share is 1


def test_the_series_the_signal_book_reads_give_the_signals_of_every_series(tmp_path):
    """SignalBook windows hold SIGNAL_METRICS only: the signals must be those of the whole window, on recorded
    vLLM and llama-server scrapes with counters advancing, an SLO set, and a restart in the middle."""
    from dataclasses import replace

    from tests.helpers import migrated_store, store_recorded_history
    from tuner.signals.derive import SIGNAL_METRICS

    store = migrated_store(tmp_path)
    t0 = store_recorded_history(store, 1_700_000_000.0)
    slo = Slo(ttft_p99=timedelta(seconds=0.5), itl_p99=timedelta(seconds=0.05), e2e_p99=timedelta(seconds=4))
    for target in ("v", "l"):
        for span in (60, 300):
            full = compute_signals(store.window(target, t0 - span, t0), slo=slo)
            book = compute_signals(store.window(target, t0 - span, t0, metrics=SIGNAL_METRICS), slo=slo)
            assert all(e.samples > 0 for e in book.engines)
            assert book == replace(
                full, engines=tuple(replace(e, samples=b.samples) for e, b in zip(full.engines, book.engines))
            )
            assert len(book.engines) == len(full.engines)
            assert any(v is not None for e in book.engines for v in (e.ttft_p99, e.generation_tokens_per_s))
            assert (target, span, any(e.restarts for e in book.engines)) in {
                ("v", 60, False),
                ("v", 300, True),
                ("l", 60, False),
                ("l", 300, False),
            }


def test_each_histogram_increase_worked_out_once_gives_the_quantiles_worked_out_alone(tmp_path):
    """compute_signals shares one bucket increase per histogram between its quantiles, goodput and request
    counts; every quantile must equal the one computed on its own."""
    from tests.helpers import VLLM_DIR, migrated_store
    from tuner.collect import vllm
    from tuner.lab.replay import ReplayExposition
    from tuner.signals.derive import LATENCY_HISTOGRAMS, QUANTILES, quantile

    store = migrated_store(tmp_path)
    replay = ReplayExposition((VLLM_DIR / "metrics_under_load.txt").read_text(), growth=0.07)
    for k in range(20):
        store.ingest(vllm.snapshot_from_text(replay.render().decode(), target="v", ts=1_700_000_000.0 + 5 * k))
    window = store.window("v", 1_700_000_000.0, 1_700_000_095.0)
    sig = compute_signals(window)
    checked = 0
    for e, ew in zip(sig.engines, window.engines):
        for prefix, metric in LATENCY_HISTOGRAMS.items():
            for q in QUANTILES:
                alone = quantile(ew, metric, q, window.start_ms, window.end_ms)
                assert getattr(e, f"{prefix}_p{round(q * 100)}") == alone
                checked += alone is not None
    assert checked >= 6  # the recorded load filled two of the latency histograms (all three quantiles each)


def test_a_groups_signals_are_what_its_replicas_served_together(tmp_path):
    """Two replicas of a group scraped over the same 5 minutes (recorded vLLM expositions, one under KV pressure
    with requests waiting, one after a load, replayed at different growth; the second restarts midway): the group's rates are the sum of the replicas', its P99s and goodput come
    from their histogram increases summed bucket by bucket, waiting adds up, KV use is the fullest replica's."""
    import re

    from tests.helpers import VLLM_DIR, migrated_store
    from tuner.collect import vllm
    from tuner.lab.replay import ReplayExposition
    from tuner.signals.derive import SIGNAL_METRICS, group_signals
    from tuner.signals.promql import bucket_increase, fraction_le, histogram_quantile

    store = migrated_store(tmp_path)
    t0 = 1_800_000_000.0
    r1 = ReplayExposition((VLLM_DIR / "metrics_kv_pressure.txt").read_text(), growth=0.05)
    text = (VLLM_DIR / "metrics_after_load.txt").read_text()
    r2 = ReplayExposition(text, growth=0.3)
    for i in range(61):
        store.ingest(vllm.snapshot_from_text(r1.render().decode(), target="g.r1", ts=t0 + 5 * i))
        if i == 30:  # r2 restarts: its counters start again, its start time moves
            r2 = ReplayExposition(
                re.sub(
                    r"^(process_start_time_seconds) (\S+)$", lambda m: f"{m[1]} {float(m[2]) + 900}", text, flags=re.M
                ),
                growth=0.3,
            )
        store.ingest(vllm.snapshot_from_text(r2.render().decode(), target="g.r2", ts=t0 + 5 * i + 2))
    lo, hi = t0 + 10, t0 + 290
    slo = Slo(ttft_p99=timedelta(seconds=1), e2e_p99=timedelta(seconds=20))
    windows = [store.window(n, lo, hi, metrics=SIGNAL_METRICS) for n in ("g.r1", "g.r2")]
    one = [compute_signals(w, slo=slo).engines[0] for w in windows]
    g = group_signals("g", windows, slo=slo)
    assert g.target == "g" and [e.engine for e in g.engines] == ["all"]
    e = g.engines[0]
    for name in ("requests_per_s", "generation_tokens_per_s", "prompt_tokens_per_s", "preemptions_per_s"):
        want = getattr(one[0], name) + getattr(one[1], name)
        assert getattr(e, name) == pytest.approx(want, rel=1e-12), name
    assert e.requests_waiting == one[0].requests_waiting + one[1].requests_waiting
    assert e.requests_running == one[0].requests_running + one[1].requests_running
    assert e.kv_cache_usage == max(one[0].kv_cache_usage, one[1].kv_cache_usage)
    assert e.restarts == 1 == one[0].restarts + one[1].restarts
    # the P99 of what both served, from the buckets summed (not an average of the two P99s)
    lo_ms, hi_ms = windows[0].start_ms, windows[0].end_ms
    for prefix, metric in (("e2e", "vllm:e2e_request_latency_seconds"), ("ttft", "vllm:time_to_first_token_seconds")):
        hs = [w.engines[0].hists[(metric, ())] for w in windows]
        summed = [a + b for a, b in zip(*(bucket_increase(h, lo_ms, hi_ms) for h in hs))]
        assert getattr(e, f"{prefix}_p99") == pytest.approx(histogram_quantile(0.99, hs[0].bounds, summed), rel=1e-12)
        if prefix == "e2e":
            assert e.requests_in_window == pytest.approx(summed[-1], rel=1e-12)
            e2e_share = fraction_le(20.0, hs[0].bounds, summed)
    # one replica much busier than the other: the group's P99 is not the mean of theirs
    assert e.e2e_p99 != pytest.approx((one[0].e2e_p99 + one[1].e2e_p99) / 2)
    assert e.goodput_ratio is not None and e.goodput_ratio <= e2e_share[1] + 1e-12
    with pytest.raises(ValueError, match="different ranges"):
        group_signals("g", [windows[0], store.window("g.r2", lo, hi - 5, metrics=SIGNAL_METRICS)])


@pytest.mark.parametrize(
    "only",
    [
        {"goodput_ratio"},
        {"ttft_p99"},
        {"e2e_p50", "requests_in_window"},
        {"requests_queued"},
        {"requests_per_s", "prefix_cache_hit_ratio"},
        {"kv_cache_usage"},
        {"restarts"},
        set(),
    ],
)
def test_a_derivation_of_some_fields_gives_those_as_the_whole_one_and_leaves_the_rest_out(tmp_path, only):
    """compute_signals(only=...) for an alert group's own window: each field asked for equals the whole
    derivation's, on recorded vLLM and llama-server scrapes with an SLO and a restart; the costly fields no one
    asked for are None; gauges, restarts and the sample count are always there."""
    from dataclasses import fields as dc_fields

    from tests.helpers import migrated_store, store_recorded_history
    from tuner.signals.derive import ALWAYS_DERIVED, EngineSignals

    store = migrated_store(tmp_path)
    t0 = store_recorded_history(store, 1_700_000_000.0)
    slo = Slo(ttft_p99=timedelta(seconds=0.5), itl_p99=timedelta(seconds=0.05), e2e_p99=timedelta(seconds=4))
    always = ALWAYS_DERIVED
    costly = {f.name for f in dc_fields(EngineSignals)} - always
    # worked out together: a histogram's three quantiles, goodput's two bounds, the queue count and its bound
    together = [{f"{p}_p50", f"{p}_p95", f"{p}_p99"} for p in ("ttft", "itl", "e2e", "queue")] + [
        {"goodput_ratio", "goodput_ratio_upper"},
        {"requests_queued", "queued_over_s"},
    ]
    asked = set(only).union(*(g for g in together if g & set(only)))
    left_out = 0
    for target in ("v", "l"):
        window = store.window(target, t0 - 300, t0)
        whole = compute_signals(window, slo=slo)
        some = compute_signals(window, slo=slo, only=only)
        assert (some.target, some.health, len(some.engines)) == (whole.target, whole.health, len(whole.engines))
        for e, w in zip(some.engines, whole.engines):
            for name in always | asked:
                assert getattr(e, name) == getattr(w, name), name
            for name in costly - asked:
                assert getattr(e, name) is None, name
                left_out += getattr(w, name) is not None
    assert left_out > 0  # the whole derivation had figures the partial one did not work out


def test_a_window_of_the_series_metrics_for_names_derives_each_field_as_a_window_of_every_series(tmp_path):
    """metrics_for(only) is what the signal book reads for an alert group's own window (and so what the store's
    head keeps that long): each field, asked alone, and every always-derived one but the sample count, must be the
    whole window's, on recorded vLLM and llama-server scrapes with an SLO and a restart, at two window lengths.
    A field whose series metrics_for leaves out fails here."""
    from dataclasses import fields as dc_fields

    from tests.helpers import migrated_store, store_recorded_history
    from tuner.signals.derive import ALWAYS_DERIVED, SIGNAL_METRICS, EngineSignals, metrics_for

    store = migrated_store(tmp_path)
    t0 = store_recorded_history(store, 1_700_000_000.0)
    slo = Slo(ttft_p99=timedelta(seconds=0.5), itl_p99=timedelta(seconds=0.05), e2e_p99=timedelta(seconds=4))
    names = [f.name for f in dc_fields(EngineSignals)]
    assert metrics_for(None) == SIGNAL_METRICS
    compared = 0
    for target in ("v", "l"):
        for span in (60, 300):
            whole = compute_signals(store.window(target, t0 - span, t0, metrics=SIGNAL_METRICS), slo=slo)
            for name in names:
                only = {name}
                metrics = metrics_for(only)
                assert metrics <= SIGNAL_METRICS
                some = compute_signals(store.window(target, t0 - span, t0, metrics=metrics), slo=slo, only=only)
                assert len(some.engines) == len(whole.engines), (target, name)
                for e, w in zip(some.engines, whole.engines):
                    for field in (ALWAYS_DERIVED - {"samples"}) | only:
                        if field == "samples":
                            continue
                        assert getattr(e, field) == getattr(w, field), (target, span, name, field)
                        compared += getattr(w, field) is not None
    assert compared > 100
    # and it reads less than every series for the fields the default pack's 10 m rules read
    assert metrics_for({"goodput_ratio", "restarts"}) < SIGNAL_METRICS
