"""What an apply cost its clients, as the journal records it and `tuner journal` prints it."""

from __future__ import annotations

from tuner.cli.apply import _cost_line
from tuner.apply.flow import Applier
from tuner.store import journal as jr

T0 = 1_790_000_000.0


def _apply(store, steps: list[tuple[str, float]]) -> int:
    aid = jr.begin_apply(store.engine, target="t", recommendation_id=None, kind="apply", mode="managed", now=T0,
                         diff={"max_num_seqs": 8}, old_flags={"max_num_seqs": 4}, new_flags={"max_num_seqs": 8},
                         old_argv=[], new_argv=[], owner_pid=1, owner_start=1)
    for name, at in steps:
        jr.step(store.engine, aid, name, "", now=T0 + at)
    return aid


def test_the_cost_is_the_outage_and_the_arrivals_it_met(store):
    aid = _apply(store, [("baseline", 0), ("draining", 2.0), ("stopped", 9.5), ("starting", 9.6),
                         ("health_check", 10.0), ("healthy", 37.5)])
    base = {"offered_rps": 3.2, "in_flight_at_drain": 14}
    cost = Applier._cost(jr.get_apply(store.engine, aid), base)
    assert cost == {"outage_s": 35.5, "arrivals_during_outage": 113.6}  # 3.2 req/s x 35.5 s
    jr.set_kpis(store.engine, aid, now=T0 + 70, baseline=base, after=cost)
    line = _cost_line(jr.get_apply(store.engine, aid))
    assert line is not None
    assert line.startswith("served nothing for 35.5s") and "14 request(s) in flight when the drain began" in line
    assert "about 113.6 request(s) arrived meanwhile at 3.2 req/s" in line


def test_no_cost_line_without_a_measured_outage(store):
    # never healthy (a failed start) or by hand (no drain): no outage, no estimate, no line
    aid = _apply(store, [("baseline", 0), ("draining", 2.0), ("stopped", 9.5), ("start_failed", 20.0)])
    assert Applier._cost(jr.get_apply(store.engine, aid), {"offered_rps": 3.2}) == {}
    assert _cost_line(jr.get_apply(store.engine, aid)) is None
    jr.finish(store.engine, aid, "failed", "", now=T0 + 21)
    # an unknown offered load (too few scrapes before) still gives the outage, without an arrivals estimate
    aid2 = _apply(store, [("draining", 100.0), ("healthy", 130.0)])
    assert Applier._cost(jr.get_apply(store.engine, aid2), {}) == {"outage_s": 30.0}
