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
