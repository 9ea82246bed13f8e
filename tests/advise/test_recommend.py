"""Merge, renew and expire; the recommendations store; the CLI commands (plan, recommendations list/show)."""

from __future__ import annotations

import json

import pytest

from tuner.advise.recommend import Previous, diff_key, evaluate
from tuner.cli import main
from tuner.errors import RecommendationNotFoundError
from tuner.store import recommendations as recs

from .test_scenarios import MODELS, inputs_from

QUEUE = {
    "name": "queue",
    "backend": "vllm",
    "flags": {"max_num_seqs": 2},
    "live": {"kv_cache_size_tokens": "195200"},
    "observed": {"running_max": 2, "waiting_max": 6, "kv_usage_max": 0.1, "mean_request_tokens": 400},
    "gpu": {"vendor": "nvidia"},
}
RECOVERED = {**QUEUE, "observed": {"running_max": 1, "waiting_max": 0, "kv_usage_max": 0.05}}


def test_a_stored_proposal_is_renewed_while_the_symptom_lasts_and_expires_after():
    key = diff_key({"max_num_seqs": 4})
    again = evaluate(inputs_from(QUEUE), [Previous(7, key)])
    assert again.refreshed == {key: 7} and again.expired == ()
    gone = evaluate(inputs_from(RECOVERED), [Previous(7, key)])
    assert gone.emitted == () and gone.expired == (7,)


def test_no_data_expires_nothing():
    sc = {**RECOVERED}
    inp = inputs_from(sc)
    from dataclasses import replace

    empty = replace(inp, signals=replace(inp.signals, samples=0))
    assert evaluate(empty, [Previous(7, diff_key({"max_num_seqs": 4}))]).expired == ()


def _add(engine, target="t", now=1000.0, diff=None):
    diff = diff or {"max_num_seqs": 4}
    return recs.add_recommendation(
        engine,
        target=target,
        now=now,
        rules=["vllm.queue_with_kv_room"],
        diff_key=diff_key(diff),
        diff=diff,
        current={"max_num_seqs": 2},
        evidence=[{"rule": "vllm.queue_with_kv_room", "thresholds": []}],
        expected_effect="more",
        risk="low",
        confidence=0.8,
        rank=1,
        memory_check={"ok": True, "reason": "r"},
    )


def test_store_round_trip_status_and_filters(store):
    a = _add(store.engine)
    b = _add(store.engine, target="u", now=2000.0, diff={"max_num_seqs": 8})
    got = recs.get_recommendation(store.engine, a)
    assert (got.status, got.diff, got.current, got.created_ms) == (
        "proposed",
        {"max_num_seqs": 4},
        {"max_num_seqs": 2},
        1_000_000,
    )
    recs.set_status(store.engine, a, "rejected", now=3000.0, note="operator said no")
    assert recs.get_recommendation(store.engine, a).note == "operator said no"
    assert [r.id for r in recs.list_recommendations(store.engine)] == [b, a]  # newest first
    assert [r.id for r in recs.proposed_for(store.engine, "u")] == [b]
    assert recs.list_recommendations(store.engine, status="rejected")[0].id == a
    with pytest.raises(ValueError):
        recs.set_status(store.engine, a, "maybe", now=1.0)
    with pytest.raises(RecommendationNotFoundError):
        recs.set_status(store.engine, 999, "expired", now=1.0)


def test_cli_plan_json_contract(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                str(MODELS / "llama-3-8b"),
                "--gpu-memory-gib",
                "24",
                "--gpu-memory-utilization",
                "0.85",
                "--max-model-len",
                "8192",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert {"weights_bytes", "kv_bytes_per_token", "kv_capacity_tokens", "max_concurrency", "fits"} <= set(out)
    assert (out["kv_capacity_tokens"], out["fits"]) == (30_752, True)  # derived in test_memory.py
    assert main(["plan", "--model", str(MODELS / "llama-3-70b"), "--gpu-memory-gib", "24"]) == 1  # does not fit
    assert "NO" in capsys.readouterr().out


def test_cli_plan_bad_input_is_one_line(capsys, tmp_path):
    assert main(["plan", "--model", str(tmp_path / "none"), "--gpu-memory-gib", "24"]) == 2
    err = capsys.readouterr().err
    assert "expected a model directory" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exited:  # refused as the command line is parsed, as argparse refuses
        main(["plan", "--model", str(MODELS / "llama-3-8b"), "--gpu-memory-gib", "24", "--gpu-memory-utilization", "2"])
    assert exited.value.code == 2
    assert (
        "argument --gpu-memory-utilization: expected a number above 0 and at most 1, got '2'"
        in capsys.readouterr().err.splitlines()[-1]
    )


def test_cli_recommendations_list_and_show(store, tmp_path, capsys):
    config = tmp_path / "tuner.yaml"
    config.write_text(f"store: {{url: '{store.engine.url}'}}\n")
    rid = _add(store.engine)
    assert main(["--config", str(config), "recommendations", "list", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [rid]
    assert main(["--config", str(config), "recommendations", "show", str(rid)]) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs: 2 -> 4" in text and "vllm.queue_with_kv_room" in text
    assert main(["--config", str(config), "recommendations", "show", "42"]) == 2
    assert "no recommendation with id 42" in capsys.readouterr().err
    assert main(["--config", str(config), "recommendations", "list", "--status", "maybe"]) == 2


def test_cli_recommend_flag_errors_name_the_flag(store, tmp_path, capsys):
    config = tmp_path / "tuner.yaml"
    config.write_text(
        f"store: {{url: '{store.engine.url}'}}\ntargets:\n  - {{name: v, backend: vllm, url: 'http://127.0.0.1:9'}}\n"
    )
    assert main(["--config", str(config), "recommend", "v", "--flag", "max_num_seqs=0"]) == 2
    assert "max_num_seqs" in capsys.readouterr().err
    assert main(["--config", str(config), "recommend", "v", "--flag", "trust_remote_code=1"]) == 2
    assert "allow-list" in capsys.readouterr().err


def test_renewing_a_proposal_keeps_the_measurement_tune_added(store):
    from tuner.advise.recommend import Outcome
    from tuner.app.recommend import persist

    rid = _add(store.engine)
    tune_ev = {"rule": "tune", "capacity_rps": 4.2, "baseline_capacity_rps": 2.0}
    got = recs.get_recommendation(store.engine, rid)
    recs.renew_recommendation(
        store.engine,
        rid,
        now=1500.0,
        rules=[*got.rules, "tune"],
        evidence=got.evidence + [tune_ev],
        confidence=0.9,
        memory_check=got.memory_check,
        current={"max_num_seqs": 1},
    )  # as if it had been seen against other flags before
    out = evaluate(inputs_from(QUEUE), [Previous(rid, diff_key({"max_num_seqs": 4}))])
    assert out.refreshed  # the rule still proposes it: renewed in place
    persist(store.engine, "t", Outcome(out.emitted, (), {diff_key({"max_num_seqs": 4}): rid}, ()), 2000.0)
    again = recs.get_recommendation(store.engine, rid)
    assert "tune" in again.rules and again.evidence[-1] == tune_ev and again.updated_ms == 2_000_000
    # seen again against today's flags: what it was proposed against is today's (the apply judges staleness by it)
    assert again.current == dict(out.emitted[0].current) and again.current != {"max_num_seqs": 1}
