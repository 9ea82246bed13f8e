"""llama-server collector: /metrics, /slots and /health from recorded files, over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FIXTURES, LLAMA_DIR, VLLM_DIR, Route, sample_lines, serve, slot_tokens
from tuner.collect import llamacpp
from tuner.collect.catalogue import lookup
from tuner.errors import ExpositionError, MetricsDisabledError, ScrapeError

METRICS = sorted(LLAMA_DIR.glob("metrics_*.txt"))
SLOTS = sorted(LLAMA_DIR.glob("slots_*.json"))


def _slots_json(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))


def _expected_slots(slots: list[dict[str, Any]]) -> tuple[int, int, int, int]:
    """(total, busy, tokens in use, n_ctx) straight from the JSON."""
    busy = [s for s in slots if s["is_processing"]]
    in_use = sum(slot_tokens(s) for s in busy)
    return len(slots), len(busy), in_use, max(s["n_ctx"] for s in slots)


@pytest.mark.parametrize("path", METRICS, ids=lambda p: p.stem)
def test_every_llamacpp_series_reaches_its_json_field(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    snap = llamacpp.snapshot_from_text(text, target="laptop", ts=0.0, model_name="tiny")
    assert snap.problems == ()
    (engine,) = snap.engines
    assert (engine.backend, engine.engine, engine.model_name) == ("llamacpp", "0", "tiny")
    got = engine.as_json()
    checked = 0
    for _, name, _, value in sample_lines(text):
        if not name.startswith("llamacpp:"):
            continue
        hit = lookup(name)
        assert hit is not None, f"{name} is not catalogued"  # test_catalogue says why in detail
        spec, _ = hit
        assert engine.total(spec.name) == value, name
        if spec.field is not None:
            assert got[spec.field] == value, name
            checked += 1
    assert checked >= 10  # prompt/predicted tokens and seconds, decode calls, gauges ...
    assert "config" not in got  # only vLLM reports a cache config


def test_model_name_defaults_to_the_target_name() -> None:
    text = (LLAMA_DIR / "metrics_idle.txt").read_text(encoding="utf-8")
    snap = llamacpp.snapshot_from_text(text, target="laptop", ts=0.0)
    assert snap.engines[0].model_name == "laptop"


def test_a_vllm_exposition_is_not_llama_server() -> None:
    text = (VLLM_DIR / "metrics_idle.txt").read_text(encoding="utf-8")
    with pytest.raises(ScrapeError, match=r"has no llamacpp:\* series"):
        llamacpp.snapshot_from_text(text, target="gpu-box", ts=0.0)


# ---- /slots -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SLOTS, ids=lambda p: p.stem)
def test_parse_slots_counts_from_the_json(path: Path) -> None:
    slots = _slots_json(path)
    total, busy, in_use, n_ctx = _expected_slots(slots)
    state = llamacpp.parse_slots(path.read_bytes())
    assert (state.slots_total, state.slots_busy, state.kv_tokens_in_use, state.slot_context_tokens) == (
        total,
        busy,
        in_use,
        n_ctx,
    )
    assert state.kv_cache_usage == in_use / (total * n_ctx)
    assert llamacpp.parse_slots(slots) == state  # already-decoded JSON reads the same


def test_mid_load_slots_are_busy() -> None:
    state = llamacpp.parse_slots((LLAMA_DIR / "slots_mid_load.json").read_bytes())
    assert state.slots_busy > 0 and 0 < state.kv_cache_usage < 1
    idle = llamacpp.parse_slots((LLAMA_DIR / "slots_idle.json").read_bytes())
    assert (idle.slots_busy, idle.kv_tokens_in_use, idle.kv_cache_usage) == (0, 0, 0.0)


def _busy_slot() -> dict[str, Any]:
    """The first busy slot of the recorded mid-load /slots."""
    return next(s for s in _slots_json(LLAMA_DIR / "slots_mid_load.json") if s["is_processing"])


def _variant(**changes: Any) -> list[dict[str, Any]]:
    """The recorded busy slot with fields changed; ``...`` removes the field."""
    slot = _busy_slot()
    for key, value in changes.items():
        if key == "n_decoded":
            slot["next_token"][0]["n_decoded"] = value
        elif value is ...:
            del slot[key]
        else:
            slot[key] = value
    return [slot]


@pytest.mark.parametrize(
    ("data", "names"),
    [
        pytest.param(b"<html>nope</html>", "/slots is not JSON", id="not-json"),
        pytest.param({"error": "no slots"}, "non-empty JSON list of slots, got dict", id="object"),
        pytest.param([], "non-empty JSON list of slots, got list", id="empty-list"),
        pytest.param([7], "/slots[0]: expected an object, got int", id="slot-not-object"),
        pytest.param(_variant(n_ctx=...), "/slots[0].n_ctx", id="n_ctx-missing"),
        pytest.param(_variant(n_ctx=0), "/slots[0].n_ctx", id="n_ctx-zero"),
        pytest.param(_variant(n_ctx=True), "/slots[0].n_ctx", id="n_ctx-bool"),
        pytest.param(_variant(n_ctx="512"), "/slots[0].n_ctx", id="n_ctx-string"),
        pytest.param(_variant(n_prompt_tokens=-1), "/slots[0].n_prompt_tokens", id="prompt-negative"),
        pytest.param(_variant(n_prompt_tokens=1.5), "/slots[0].n_prompt_tokens", id="prompt-float"),
        pytest.param(_variant(n_decoded="65"), "/slots[0].next_token.n_decoded", id="decoded-string"),
        # found by tests/reliability/test_fuzz.py: a 300-digit n_ctx overflowed float() (a traceback, not a problem)
        pytest.param(
            _variant(n_ctx=10**300), "/slots[0].n_ctx: expected a positive integer up to 2**53", id="n_ctx-huge"
        ),
        pytest.param(_variant(n_prompt_tokens=2**60), "/slots[0].n_prompt_tokens", id="prompt-huge"),
    ],
)
def test_bad_slots_json_names_the_field(data: Any, names: str) -> None:
    with pytest.raises(ExpositionError) as info:
        llamacpp.parse_slots(json.dumps(data) if isinstance(data, (list, dict)) else data)
    assert names in str(info.value)


# ---- scrape() over real HTTP ----------------------------------------------------------------------------


def _routes(metrics: str = "metrics_mid_load.txt", slots: str = "slots_mid_load.json") -> dict[str, Route]:
    return {
        "/health": Route(body=(LLAMA_DIR / "health_ok.json").read_bytes(), content_type="application/json"),
        "/metrics": Route(body=(LLAMA_DIR / metrics).read_bytes()),
        "/slots": Route(body=(LLAMA_DIR / slots).read_bytes(), content_type="application/json"),
    }


def test_scrape_gives_a_full_snapshot() -> None:
    routes = _routes()
    text = (LLAMA_DIR / "metrics_mid_load.txt").read_text(encoding="utf-8")
    total, busy, in_use, n_ctx = _expected_slots(_slots_json(LLAMA_DIR / "slots_mid_load.json"))
    with serve(routes) as url:
        snap = llamacpp.scrape(
            url, target="laptop", timeout_s=5, max_bytes=1 << 20, model_name="tiny", now=1_700_000_000.0
        )
    assert (snap.target, snap.backend, snap.ts, snap.healthy, snap.problems) == (
        "laptop",
        "llamacpp",
        1_700_000_000.0,
        True,
        (),
    )
    assert snap.body_bytes == len(text.encode())
    (engine,) = snap.engines
    got = engine.as_json()
    served = {name: value for _, name, _, value in sample_lines(text)}
    assert got["requests_processing"] == served["llamacpp:requests_processing"]
    assert got["tokens_predicted_total"] == served["llamacpp:tokens_predicted_total"]
    assert (got["slots_total"], got["slots_busy"], got["kv_tokens_in_use"], got["slot_context_tokens"]) == (
        total,
        busy,
        in_use,
        n_ctx,
    )
    assert got["kv_cache_usage"] == in_use / (total * n_ctx)
    assert snap.slots is not None and snap.slots.kv_tokens_in_use == in_use
    assert [r.hits for r in routes.values()] == [1, 1, 1]


def test_metrics_disabled_says_to_restart_with_metrics_flag() -> None:
    recorded = json.loads((LLAMA_DIR / "no_metrics_501.txt").read_text(encoding="utf-8"))
    routes = _routes()
    routes["/metrics"] = Route(status=recorded["status"], body=recorded["body"], content_type="application/json")
    assert recorded["status"] == 501
    with serve(routes) as url:
        with pytest.raises(MetricsDisabledError) as info:
            llamacpp.scrape(url, target="laptop", timeout_s=5, max_bytes=1 << 20)
    assert "restart it with --metrics" in str(info.value)
    assert f"{url}/metrics" in str(info.value)


def test_health_503_says_the_model_is_loading() -> None:
    routes = _routes()
    # what llama-server answers on /health while it loads the model
    routes["/health"] = Route(
        status=503,
        content_type="application/json",
        body='{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
    )
    with serve(routes) as url:
        with pytest.raises(ScrapeError, match="still loading the model"):
            llamacpp.scrape(url, target="laptop", timeout_s=5, max_bytes=1 << 20)
    assert routes["/metrics"].hits == 0  # no point asking


def test_slots_disabled_still_gives_a_snapshot_with_a_problem() -> None:
    routes = _routes()
    routes["/slots"] = Route(
        status=501,
        content_type="application/json",
        body='{"error":{"code":501,"message":"This server does not support slots endpoint."}}',
    )
    with serve(routes) as url:
        snap = llamacpp.scrape(url, target="laptop", timeout_s=5, max_bytes=1 << 20)
    assert snap.slots is None
    assert snap.problems == ("/slots answered HTTP 501 (started with --no-slots?); KV use cannot be derived",)
    (engine,) = snap.engines
    assert "kv_cache_usage" not in engine.as_json()
    text = (LLAMA_DIR / "metrics_mid_load.txt").read_text(encoding="utf-8")
    assert (
        engine.as_json()["requests_deferred"]
        == dict((n, v) for _, n, _, v in sample_lines(text))["llamacpp:requests_deferred"]
    )


def test_unreadable_slots_still_gives_a_snapshot_with_a_problem() -> None:
    routes = _routes()
    routes["/slots"] = Route(body="[]", content_type="application/json")
    with serve(routes) as url:
        snap = llamacpp.scrape(url, target="laptop", timeout_s=5, max_bytes=1 << 20)
    assert snap.slots is None
    assert len(snap.problems) == 1 and snap.problems[0].startswith("/slots: ")


@pytest.mark.parametrize(
    "slot, held",
    [
        # recorded mid-load slot: n_prompt_tokens already includes the 65 generated; 101 + 10 + 65 = 176
        (
            {
                "n_ctx": 512,
                "is_processing": True,
                "n_prompt_tokens": 175,
                "n_prompt_tokens_processed": 101,
                "n_prompt_tokens_cache": 10,
                "next_token": [{"n_decoded": 65}],
            },
            176,
        ),
        # an older build: n_prompt_tokens is the prompt only, no processed/cache fields: 100 + 50
        ({"n_ctx": 512, "is_processing": True, "n_prompt_tokens": 100, "next_token": [{"n_decoded": 50}]}, 150),
        # never more than the slot's context
        ({"n_ctx": 512, "is_processing": True, "n_prompt_tokens": 500, "next_token": [{"n_decoded": 400}]}, 512),
    ],
)
def test_slot_tokens_count_generated_tokens_once(slot: dict[str, Any], held: int) -> None:
    state = llamacpp.parse_slots([slot, {"n_ctx": 512, "is_processing": False, "n_prompt_tokens": 480}])
    assert state.kv_tokens_in_use == held
    assert state.kv_cache_usage == held / 1024


@pytest.mark.parametrize(
    ("data", "names"),
    [
        pytest.param(
            json.dumps([{**_variant(n_ctx=512)[0], "is_processing": True, "next_token": 1}]),
            "/slots[0].next_token: expected a list, got int",
            id="next_token-not-a-list",
        ),
        pytest.param("[" * 100_000, "/slots is not JSON tuner can read (nested too deeply)", id="nested-too-deeply"),
    ],
)
def test_slots_that_crashed_the_parser_are_named(data: str, names: str) -> None:
    """Found by tests/reliability/test_fuzz.py: these raised TypeError / RecursionError, so a scrape with a fine
    /metrics was recorded as an internal error instead of a snapshot with a /slots problem."""
    with pytest.raises(ExpositionError) as info:
        llamacpp.parse_slots(data)
    assert names in str(info.value)


def test_a_slot_loop_that_does_not_answer_metrics_while_health_answers_is_said_and_health_kept() -> None:
    """What a real llama-server with its slot loop stopped answered (tests/fixtures/stall/): /health 200 at once,
    /metrics nothing within the scrape timeout. The scrape fails, saying so, with /health's answer on the error."""
    recorded = json.loads((FIXTURES / "stall" / "llama_health_loop_stopped.json").read_text())
    assert recorded["status"] == 200
    routes = _routes()
    routes["/health"] = Route(body=recorded["body"], content_type="application/json")
    routes["/metrics"] = Route(delay_s=30)
    with serve(routes) as url:
        with pytest.raises(
            ScrapeError, match="/health answered 200: the loop that runs the slots does not answer"
        ) as info:
            llamacpp.scrape(url, target="laptop", timeout_s=0.5, max_bytes=1 << 20)
    assert info.value.healthy is True
    routes = _routes()
    routes["/health"] = Route(status=500, body="{}", content_type="application/json")
    routes["/metrics"] = Route(delay_s=30)
    with serve(routes) as url:
        with pytest.raises(ScrapeError) as info:
            llamacpp.scrape(url, target="laptop", timeout_s=0.5, max_bytes=1 << 20)
    assert info.value.healthy is None  # /health did not say it was fine: nothing kept


def test_props_reads_what_the_server_says_of_its_config() -> None:
    """A recorded /props (a real llama-server at --parallel 2, -c 1024: tests/fixtures/README.md) gives its slots, one
    slot's context, its model and build; a field that is no positive whole count, or no text, is None, not a guess;
    a body that is no JSON object, a 404 or a dead port is None. tuner recommend and tuner tune both read it here."""
    recorded = json.loads((LLAMA_DIR / "props.json").read_bytes())
    routes = {"/props": Route(body=json.dumps(recorded), content_type="application/json")}
    with serve(routes) as url:
        said = llamacpp.props(url, timeout_s=5)
    assert said == llamacpp.Props(
        total_slots=recorded["total_slots"],
        n_ctx=recorded["default_generation_settings"]["n_ctx"],
        model_path=recorded["model_path"],
        build_info=recorded["build_info"],
    )
    assert (said.total_slots, said.n_ctx) == (2, 512)
    odd = {"total_slots": True, "default_generation_settings": [], "model_path": 3, "build_info": ""}
    with serve({"/props": Route(body=json.dumps(odd), content_type="application/json")}) as url:
        assert llamacpp.props(url, timeout_s=5) == llamacpp.Props(None, None, None, None)
    for body in (b"[2]", b"not json"):
        with serve({"/props": Route(body=body, content_type="application/json")}) as url:
            assert llamacpp.props(url, timeout_s=5) is None
    with serve({}) as url:
        assert llamacpp.props(url, timeout_s=5) is None  # 404
    assert llamacpp.props(url, timeout_s=1) is None  # nothing listens there now
