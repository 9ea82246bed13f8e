"""The daemon's record of its own series: bounded to what the rules over tuner's own loop read."""

from __future__ import annotations

from tuner.app.selfwatch import SelfSeries, keep_for
from tuner.rules.model import default_rule_files, load_rule_files, parse_rules


def test_history_is_kept_for_the_longest_window_and_a_step_back_starts_it_over():
    own = SelfSeries(keep_s=60)
    for i in range(20):
        own.record("tuner_scrape_failures_total", "t", i * 5_000, float(i))
    pts = own.points("tuner_scrape_failures_total")["t"]
    assert pts[0] == (35_000, 7.0) and pts[-1] == (95_000, 19.0)  # 60 s before the newest, and no older
    own.record("tuner_scrape_failures_total", "t", 10_000, 0.0)  # the wall clock stepped back
    assert own.points("tuner_scrape_failures_total")["t"] == ((10_000, 0.0),)


def test_keep_for_the_default_pack_is_its_longest_self_window():
    assert keep_for(load_rule_files(default_rule_files())) == 600 + 30  # AlertOutboxGrowing's 10m window
    assert keep_for(parse_rules("groups: [{name: g, rules: []}]")) == 300 + 30  # a gauge's lookback at least
