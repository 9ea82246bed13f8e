"""stalled_requests and token goodput over recorded real scrapes (tests/fixtures/stall/: a vLLM CPU whose engine
core was stopped with SIGSTOP, a llama-server through a long generation), and stall_reason."""

from __future__ import annotations

import json

import pytest

from tests.helpers import FIXTURES, fixture_text, migrated_store
from tuner.collect.scrape import snapshot_from_text
from tuner.config import Slo
from tuner.signals.derive import compute_signals, stall_reason
from tuner.store.window import TargetHealth

T0 = 1_800_000_000.0


def _signals(tmp_path, backend: str, bodies: list[str], every_s: float = 15.0, slo: Slo | None = None):
    """The signals over a window of scrapes of these recorded bodies, one every ``every_s``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = migrated_store(tmp_path)
    for i, text in enumerate(bodies):
        store.ingest(snapshot_from_text(backend, text, target="t", ts=T0 + i * every_s))
    end = T0 + (len(bodies) - 1) * every_s
    return compute_signals(store.window("t", T0, end), slo=slo)


def test_a_stopped_engine_core_has_its_requests_in_flight_stalled(tmp_path):
    """Scraped twice while the engine core was stopped (the recorded bodies are the same then: the counters stop,
    the gauges stay): every request in flight is stalled. Across the stop, or after SIGCONT, the engine moved."""
    stopped = fixture_text("stall/vllm_metrics_stopped.txt")
    sig = _signals(tmp_path / "a", "vllm", [stopped] * 5)
    (e,) = sig.engines
    assert e.requests_running == 2 and e.requests_waiting == 4 and e.stalled_requests == 6
    assert e.generation_tokens_per_s == 0
    assert stall_reason(sig) == (
        "6 requests in flight on engine 0 (tiny-llama) and no token generated, no request finished in 60s"
    )
    moving = _signals(tmp_path / "b", "vllm", [fixture_text("stall/vllm_metrics_before_stop.txt"), stopped])
    assert moving.engines[0].stalled_requests == 0 and stall_reason(moving) is None
    resumed = _signals(tmp_path / "c", "vllm", [stopped, fixture_text("stall/vllm_metrics_resumed.txt")])
    assert resumed.engines[0].stalled_requests == 0


def test_an_idle_server_and_a_single_scrape_are_not_stalled(tmp_path):
    idle = fixture_text("vllm-0.32-cpu/metrics_idle.txt")
    assert _signals(tmp_path / "a", "vllm", [idle] * 3).engines[0].stalled_requests == 0  # nothing in flight
    one = _signals(tmp_path / "b", "vllm", [fixture_text("stall/vllm_metrics_stopped.txt")])
    assert one.engines[0].stalled_requests is None  # one scrape cannot tell whether anything moved


def test_llama_server_progress_is_its_decode_calls_not_tokens_predicted(tmp_path):
    """Recorded through one 450-token request: tokens_predicted_total stays put until it finishes, n_decode_total
    moves at every decode: the request is not stalled."""
    rows = [json.loads(line) for line in (FIXTURES / "stall" / "llama_counters_during_generation.jsonl").open()]
    mid = [r for r in rows if r["llamacpp:requests_processing"] > 0]
    assert mid[0]["llamacpp:tokens_predicted_total"] == mid[-1]["llamacpp:tokens_predicted_total"]
    assert mid[-1]["llamacpp:n_decode_total"] > mid[0]["llamacpp:n_decode_total"]

    def body(r: dict) -> str:
        return "".join(
            f"# TYPE {n} {'counter' if n.endswith('_total') else 'gauge'}\n{n} {r[n]}\n"
            for n in (
                "llamacpp:requests_processing",
                "llamacpp:requests_deferred",
                "llamacpp:n_decode_total",
                "llamacpp:tokens_predicted_total",
            )
        )

    sig = _signals(tmp_path / "a", "llamacpp", [body(mid[0]), body(mid[-1])], every_s=1.0)
    assert sig.engines[0].requests_running == 1 and sig.engines[0].stalled_requests == 0
    stuck = _signals(tmp_path / "b", "llamacpp", [body(mid[-1])] * 3, every_s=1.0)
    assert stuck.engines[0].stalled_requests == 1


def test_stall_reason_of_a_llama_server_whose_metrics_hang_while_its_health_answers():
    from tuner.signals.derive import TargetSignals

    def sig(health: str, healthy: bool | None) -> TargetSignals:
        return TargetSignals("t", "llamacpp", 60, T0, TargetHealth(health, "timed out", 0, None, 1.0, 3, healthy), ())

    assert "/health answers 200 while /metrics does not (timed out)" == stall_reason(sig("down", True))
    assert stall_reason(sig("down", None)) is None  # nothing answered: down, not stalled
    assert stall_reason(sig("up", True)) is None


def test_token_goodput_is_generated_tokens_per_second_times_the_share_within_the_slo(tmp_path):
    bodies = [fixture_text("vllm-0.32-cpu/metrics_idle.txt"), fixture_text("vllm-0.32-cpu/metrics_after_load.txt")]
    e = _signals(tmp_path / "a", "vllm", bodies, slo=Slo(ttft_p99="2s", e2e_p99="60s")).engines[0]
    assert e.goodput_ratio is not None and e.generation_tokens_per_s
    assert e.token_goodput_per_s == pytest.approx(e.generation_tokens_per_s * e.goodput_ratio)
    strict = _signals(tmp_path / "b", "vllm", bodies, slo=Slo(ttft_p99="10ms")).engines[0]
    assert strict.token_goodput_per_s < e.token_goodput_per_s
    assert _signals(tmp_path / "c", "vllm", bodies).engines[0].token_goodput_per_s is None  # no SLO, no goodput
