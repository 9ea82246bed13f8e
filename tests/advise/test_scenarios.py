"""Every rule, table-driven: tests/advise/scenarios/*.yaml give inputs and the exact recommendations expected.

Each scenario lists every recommendation that must be emitted (rules, diff, and rank/confidence where given) —
no more, no fewer — and candidates the safety filter must refuse, with a piece of the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.advise.diagnose import RULES, Inputs
from tuner.advise.facts import GpuFacts, Observed, ServerFacts, load_model
from tuner.advise.recommend import evaluate
from tuner.config import Slo
from tuner.flags import parse_version
from tuner.signals.derive import EngineSignals

HERE = Path(__file__).parent
MODELS = HERE.parent / "fixtures" / "models"
GIB = 2**30


def _scenarios():
    for path in sorted((HERE / "scenarios").glob("*.yaml")):
        for sc in yaml.safe_load(path.read_text()):
            yield pytest.param(sc, id=f"{path.stem}: {sc['name']}")


def inputs_from(sc: dict) -> Inputs:
    g = dict(sc.get("gpu") or {"vendor": "none"})
    for key in ("memory_total", "memory_used", "other_used"):
        if f"{key}_gib" in g:
            g[f"{key}_bytes"] = int(g.pop(f"{key}_gib") * GIB)
    if "fp8" not in g:
        g["fp8"] = any(tag in g.get("name", "") for tag in ("H100", "L4", "L40", "H200"))
    # Unless a scenario says otherwise the server is the vLLM recorded in tests/fixtures (0.32.0).
    server = sc.get("server") or ({"version": "0.32.0"} if sc["backend"] == "vllm" else {})
    host = sc.get("host_memory_available_gib")
    return Inputs(
        target="t",
        backend=sc["backend"],
        now=1_000_000.0,
        window_s=300.0,
        signals=EngineSignals(engine="0", model_name="m", samples=100, **(sc.get("signals") or {})),
        observed=Observed(**(sc.get("observed") or {})),
        flags=sc.get("flags") or {},
        model=load_model(MODELS / sc["model"]) if sc.get("model") else None,
        gpu=GpuFacts(**g),
        server=ServerFacts(
            version=parse_version(server.get("version")),
            help_options=frozenset(server["help"]) if "help" in server else None,
        ),
        live=sc.get("live") or {},
        slo=Slo(**sc["slo"]) if sc.get("slo") else None,
        startup_error=sc.get("startup_error"),
        repeated_prefix_share=sc.get("repeated_prefix_share"),
        host_memory_available_bytes=int(host * GIB) if host is not None else None,
        started_with=sc.get("started_with"),
    )


@pytest.mark.parametrize("sc", list(_scenarios()))
def test_scenario(sc):
    outcome = evaluate(inputs_from(sc))
    got = sorted(((list(r.rules), dict(r.diff)) for r in outcome.emitted), key=repr)
    want = sorted(((e["rules"], e["diff"]) for e in sc["expect"]), key=repr)
    assert got == want, f"suppressed: {[(s.rule, s.diff, s.reason) for s in outcome.suppressed]}"
    for e in sc["expect"]:
        rec = next(r for r in outcome.emitted if dict(r.diff) == e["diff"])
        if "rank" in e:
            assert rec.rank == e["rank"]
        if "confidence" in e:
            assert rec.confidence == e["confidence"]
        assert rec.memory.ok and rec.evidence and all(ev["thresholds"] for ev in rec.evidence)
    for s in sc.get("suppressed") or []:
        hits = [x for x in outcome.suppressed if x.rule == s["rule"] and x.diff == s["diff"]]
        assert hits, f"{s} not suppressed; suppressed: {outcome.suppressed}"
        assert s["reason"] in hits[0].reason


def test_every_rule_has_a_scenario_that_fires_it():
    fired = set()
    for param in _scenarios():
        fired |= {rule for r in evaluate(inputs_from(param.values[0])).emitted for rule in r.rules}
    assert fired == set(RULES)
