"""What the demo applies after its tune step, read from the store as the demo reads it: one story, whichever way the
comparison in turns went (tests/integration/test_demo.py runs the whole demo on a real vLLM; this holds each branch
of the decision, which one real run cannot)."""

from __future__ import annotations

import pytest

from tuner.lab.demo import MODEL_NAME, _after_tune
from tuner.store import recommendations as recs
from tuner.store import tuning as tj

ADVISED = {"id": 1, "diff": {"max_num_seqs": 8}}


def _tuned(tmp_path, store, outcome: str | None, *, stored: bool = False, compared: int = 8):  # type: ignore[no-untyped-def]
    cfg = tmp_path / "tuner.yaml"
    cfg.write_text(
        f"store: {{url: 'sqlite:///{tmp_path / 'tuner.db'}'}}\n"
        f"targets:\n  - name: {MODEL_NAME}\n    backend: vllm\n    url: http://127.0.0.1:1\n"
    )
    rid = None
    if stored:
        rid = recs.add_recommendation(
            store.engine,
            target=MODEL_NAME,
            now=1.0,
            rules=["tune"],
            diff_key="max_num_seqs=8",
            diff={"max_num_seqs": 8},
            current={"max_num_seqs": 4},
            evidence=[],
            expected_effect="",
            risk="",
            confidence=0.97,
            rank=1,
            memory_check={},
        )
    run = tj.begin_run(
        store.engine, target=MODEL_NAME, now=1.0, request={}, workload={}, slo={}, baseline_flags={"max_num_seqs": 4}
    )
    comparison = None if outcome is None else {"outcome": outcome, "flags": {"max_num_seqs": compared}}
    result = {"verdict": f"the verdict ({outcome})", "comparison": comparison, "recommendation_id": rid}
    tj.finish_run(store.engine, run, now=2.0, state=tj.RunState.DONE, result=result)
    return _after_tune(cfg, dict(ADVISED)), rid


def test_a_winner_measured_in_turns_is_what_the_demo_applies(tmp_path, store):
    (rec, story), rid = _tuned(tmp_path, store, "b_better", stored=True)
    assert rec == {"id": rid, "diff": {"max_num_seqs": 8}} and story.startswith("tune measured a winner")


def test_a_proposal_measured_worse_in_turns_is_not_applied(tmp_path, store):
    """The demo once applied 8 sequences "anyway" after tune measured them below the flags in force: two stories."""
    (rec, story), _ = _tuned(tmp_path, store, "a_better")
    assert rec is None and story.startswith("tune: the verdict (a_better). The demo applies nothing")


@pytest.mark.parametrize("outcome", ["same", "undecided", None])
def test_no_difference_measurable_is_said_before_the_advisors_proposal_is_applied(tmp_path, store, outcome):
    (rec, story), _ = _tuned(tmp_path, store, outcome)
    assert rec == ADVISED and f"the verdict ({outcome}). The demo applies the advisor's proposal" in story


def test_without_a_proposal_nothing_is_applied(tmp_path, store):
    _tuned(tmp_path, store, "same")
    rec, story = _after_tune(tmp_path / "tuner.yaml", None)
    assert rec is None and "the advisor proposed no flag change" in story


def test_a_loss_in_turns_of_another_candidate_says_nothing_of_the_proposal(tmp_path, store):
    """The flags in force beat 16 sequences in turns; the advisor's 8 was not the one compared: no claim on it."""
    (rec, story), _ = _tuned(tmp_path, store, "a_better", compared=16)
    assert rec == ADVISED and "The demo applies the advisor's proposal" in story


def test_the_demo_waits_for_its_apply_to_be_counted_not_for_the_family_exported_at_zero():
    """What the demo waits for before it shows tuner's /metrics (tuner/lab/demo.py, _own_metrics): its apply counted.
    The bodies are tuner's own exporter's (TunerCollector), before and after the apply-status job counts it: the
    family is there at 0 from the start, and a tuning run on the target counts as ``unchanged``, not as an apply."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tuner.config import parse_config
    from tuner.daemon.metrics import TunerCollector
    from tuner.daemon.state import DaemonState
    from tuner.lab.demo import _applies_counted

    cfg = parse_config(f"targets:\n  - name: {MODEL_NAME}\n    backend: vllm\n    url: http://127.0.0.1:1\n")

    def body(applies: dict[tuple[str, str], int]) -> str:
        registry = CollectorRegistry()
        registry.register(TunerCollector(DaemonState(targets={t.name: t for t in cfg.targets}, applies=applies)))
        return generate_latest(registry).decode()

    before = body({(MODEL_NAME, "unchanged"): 1})  # a tuning run's hold is counted; no apply yet
    assert "tuner_applies_total{" in before and _applies_counted(before) == 0
    assert _applies_counted(body({(MODEL_NAME, "unchanged"): 1, (MODEL_NAME, "kept"): 1})) == 1
    assert _applies_counted(body({(MODEL_NAME, "rolled_back"): 1, ("other", "kept"): 3})) == 1  # this target's only
    assert _applies_counted("") == 0 and _applies_counted(before[: len(before) // 2] + "{") == 0  # cut short


def test_the_demo_reads_its_target_up_from_the_exposition_not_from_its_text():
    """The demo shows tuner's /metrics once ``tuner_target_up`` is 1 for its target: read through prometheus_client's
    parser (whatever order the labels or the value's spelling), this target's sample only."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from tuner.lab.demo import _demo_samples

    def body(ups: dict[str, float]) -> str:
        class Up:
            def collect(self):
                g = GaugeMetricFamily("tuner_target_up", "up", labels=["target"])
                for name, v in ups.items():
                    g.add_metric([name], v)
                yield g

        registry = CollectorRegistry()
        registry.register(Up())
        return generate_latest(registry).decode()

    assert _demo_samples(body({"other": 0.0, MODEL_NAME: 1.0}), "tuner_target_up") == [1.0]
    assert _demo_samples(body({MODEL_NAME: 0.0, "other": 1.0}), "tuner_target_up") == [0.0]
    assert _demo_samples(body({"other": 1.0}), "tuner_target_up") == []
    spelled = f'tuner_target_up{{target="{MODEL_NAME}"}} 1\n'  # another exporter's spelling of the same sample
    assert _demo_samples(spelled, "tuner_target_up") == [1.0] and _demo_samples(spelled[:20] + "{", "x") == []
