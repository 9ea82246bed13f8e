"""What an apply cost its clients, as the journal records it and `tuner journal` prints it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import fixture_text
from tuner.apply import observe
from tuner.apply.flow import Applier
from tuner.cli.apply import _cost_line
from tuner.config import parse_config
from tuner.lab.replay import ReplayExposition, ReplayServer
from tuner.store import journal as jr

T0 = 1_790_000_000.0


def _apply(store, steps: list[tuple[str, float]]) -> int:
    aid = jr.begin_apply(
        store.engine,
        target="t",
        recommendation_id=None,
        kind="apply",
        mode="managed",
        now=T0,
        diff={"max_num_seqs": 8},
        old_flags={"max_num_seqs": 4},
        new_flags={"max_num_seqs": 8},
        old_argv=[],
        new_argv=[],
        owner_pid=1,
        owner_start=1,
    )
    for name, at in steps:
        jr.step(store.engine, aid, name, "", now=T0 + at)
    return aid


def test_the_cost_is_the_outage_and_the_arrivals_it_met(store):
    aid = _apply(
        store,
        [
            ("baseline", 0),
            ("draining", 2.0),
            ("stopped", 9.5),
            ("starting", 9.6),
            ("health_check", 10.0),
            ("healthy", 37.5),
        ],
    )
    base = {"offered_rps": 3.2, "in_flight_at_drain": 14, "mean_in_flight": 15.26}
    cost = observe.cost(jr.get_apply(store.engine, aid), base)
    assert cost == {"outage_s": 35.5, "arrivals_during_outage": 113.6}  # 3.2 req/s x 35.5 s
    jr.set_kpis(store.engine, aid, now=T0 + 70, baseline=base, after=cost)
    line = _cost_line(jr.get_apply(store.engine, aid))
    assert line is not None
    assert line.startswith("served nothing for 35.5s")
    assert "request(s) in flight: 14 read from its gauges when the drain began, 15.3 on average" in line
    assert "about 113.6 request(s) arrived meanwhile at 3.2 req/s" in line


def test_no_cost_line_without_a_measured_outage(store):
    # never healthy (a failed start) or by hand (no drain): no outage, no estimate, no line
    aid = _apply(store, [("baseline", 0), ("draining", 2.0), ("stopped", 9.5), ("start_failed", 20.0)])
    assert observe.cost(jr.get_apply(store.engine, aid), {"offered_rps": 3.2}) == {}
    assert _cost_line(jr.get_apply(store.engine, aid)) is None
    jr.finish(store.engine, aid, "failed", "", now=T0 + 21)
    # an unknown offered load (too few scrapes before) still gives the outage, without an arrivals estimate
    aid2 = _apply(store, [("draining", 100.0), ("healthy", 130.0)])
    assert observe.cost(jr.get_apply(store.engine, aid2), {}) == {"outage_s": 30.0}
    # the gauges did not answer before the drain: the baseline's Little's-law mean still says how many were in
    jr.set_kpis(
        store.engine,
        aid2,
        now=T0 + 140,
        baseline={"in_flight_at_drain": None, "mean_in_flight": 7.04},
        after={"outage_s": 30.0},
    )
    line = _cost_line(jr.get_apply(store.engine, aid2))
    assert line is not None and "request(s) in flight: 7.0 on average over the baseline" in line, line


@pytest.mark.parametrize(
    "backend, fixture, running, waiting",
    [
        ("vllm", "vllm-0.32-cpu/metrics_under_load.txt", "vllm:num_requests_running", "vllm:num_requests_waiting"),
        ("llamacpp", "llama-server/metrics_mid_load.txt", "llamacpp:requests_processing", "llamacpp:requests_deferred"),
    ],
)
def test_in_flight_at_the_drain_is_read_from_the_server_for_either_backend(
    store, tmp_path, backend, fixture, running, waiting
):
    """A recorded loaded exposition served over HTTP: in flight = running + waiting as the server exports them
    (llama-server: processing + deferred). A llama-server apply once died here on a vLLM-only field name."""
    text = fixture_text(fixture)
    expected = sum(
        float(m.group(1))
        for name in (running, waiting)
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    )
    with ReplayServer(ReplayExposition(text, growth=0.0)) as server:
        cfg = parse_config(f"targets:\n  - {{name: t, backend: {backend}, url: '{server.url}'}}\n")
        ap = Applier(cfg, store, Path(tmp_path), say=lambda m: None)
        assert ap.in_flight(cfg.targets[0]) == round(expected) and expected > 0
    # nobody answering: unknown, not an error that stops the apply
    cfg = parse_config("targets:\n  - {name: t, backend: llamacpp, url: 'http://127.0.0.1:9'}\n")
    assert Applier(cfg, store, Path(tmp_path), say=lambda m: None).in_flight(cfg.targets[0]) is None
