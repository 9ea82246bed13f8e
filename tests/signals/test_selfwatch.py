"""tuner's own signals from tuner's own series: the arithmetic of their PromQL twins (the scenarios in
tests/rules/scenarios/ hold tuner and promtool equal on it; these pin the edges)."""

from __future__ import annotations

import pytest

from tuner.signals.selfwatch import LOOKBACK_MS, self_signal


def _points(series: dict[str, dict[str, list[tuple[int, float]]]]):
    return lambda metric: series.get(metric, {})


def test_a_gauge_is_its_newest_sample_within_the_lookback():
    pts = _points({"tuner_applies_last_hour": {"t": [(0, 2.0), (15_000, 4.0)]}})
    assert self_signal("applies_per_hour", "t", 300, 20_000, pts) == 4.0
    assert self_signal("applies_per_hour", "t", 300, 15_000 + LOOKBACK_MS + 1, pts) is None  # too old: no sample
    assert self_signal("applies_per_hour", "other", 300, 20_000, pts) is None


def test_scrape_errors_per_minute_is_the_rate_over_the_window_times_60():
    # one failure a step of 15 s over a whole 5-minute window: 4 a minute
    pts = _points(
        {
            "tuner_scrape_failures_total": {
                "a": [(i * 15_000, float(i)) for i in range(41)],
                "b": [(i * 15_000, 0.0) for i in range(41)],
            }
        }
    )
    assert self_signal("scrape_errors_per_minute", "a", 300, 600_000, pts) == pytest.approx(4.0)
    assert self_signal("scrape_errors_per_minute", "b", 300, 600_000, pts) == 0.0
    assert self_signal("all_scrape_errors_per_minute", "", 300, 600_000, pts) == pytest.approx(4.0)
    assert self_signal("scrape_errors_per_minute", "a", 300, 0, pts) is None  # one point: no rate


def test_outbox_growth_is_now_above_the_windows_low_point():
    pts = _points({"tuner_alert_notifications_queued": {"": [(0, 3.0), (15_000, 1.0), (30_000, 6.0)]}})
    assert self_signal("notifications_queued_growth", "", 600, 30_000, pts) == 5.0
    assert self_signal("notifications_queued_growth", "", 10, 30_000, pts) == 0.0  # only the newest in a 10 s window


def test_auto_evaluations_missed_counts_intervals_since_the_last_one():
    pts = _points(
        {
            "tuner_auto_last_evaluation_timestamp_seconds": {"t": [(90_000, 90.0)]},
            "tuner_auto_interval_seconds": {"t": [(90_000, 30.0)]},
        }
    )
    assert self_signal("auto_evaluations_missed", "t", 300, 195_000, pts) == 3.5
    with pytest.raises(KeyError, match="not one of tuner's own signals"):
        self_signal("kv_cache_usage", "t", 300, 0, pts)
