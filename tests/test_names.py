"""Names as data (issue 41, item 4): each vocabulary and each engine metric name is spelled in one module.

An apply's outcome, an alert's state and a trial's status are StrEnums owned by the module that stores them; every
vLLM/llama-server metric name is a constant of tuner/names.py that tuner/collect/catalogue.py builds its table from.
The walk below fails on a bare vocabulary word or an engine metric name typed as a string anywhere else in tuner/
(docstrings aside: they describe, they do not decide). The members themselves must be their strings byte for byte
wherever tuner shows them: a stored row, a JSON answer, a PromQL label value or a log line does not change.
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest
from sqlalchemy import Column, MetaData, String, Table, create_engine, insert, select

from tuner import names
from tuner.collect import catalogue
from tuner.names import StrEnum
from tuner.rules.state import AlertState
from tuner.store.journal import OUTCOMES, STATES, ApplyOutcome, ApplyState, ApplyStep, ServerState
from tuner.store.recommendations import STATUSES, RecStatus
from tuner.store.tuning import TRIAL_STATUSES, RunState, TrialStatus

TUNER = Path(__file__).resolve().parents[1] / "tuner"

ENUMS: tuple[type[StrEnum], ...] = (
    ApplyOutcome,
    ApplyState,
    ApplyStep,
    ServerState,
    RecStatus,
    AlertState,
    TrialStatus,
    RunState,
)

# Words that mean one thing in tuner, and the modules that own them. Words several vocabularies share ("done",
# "failed", "running", "crashed", "stopped", "starting": a Kubernetes rollout, a trial, a managed server, an apply step,
# a log line) are left out: the check must not flag a word that is not the enum's.
OWNED = {
    "kept": "store/journal.py",
    "rolled_back": "store/journal.py",
    "inconclusive": "store/journal.py",
    "given_up": "store/journal.py",
    "reconcile_found": "store/journal.py",  # apply steps no other vocabulary uses
    "restore_failed": "store/journal.py",
    "restore_by_hand": "store/journal.py",
    "start_failed": "store/journal.py",
    "settle_failed": "store/journal.py",
    "in_rotation": "store/journal.py",
    "inactive": "rules/state.py",
    "pending": "rules/state.py",
    "firing": "rules/state.py",
    "measured": "store/tuning.py",
    "pruned": "store/tuning.py",
    "interrupted": "store/tuning.py",
    "compared": "store/tuning.py",
}
# "rolled_back" is also a recommendation status
ALSO = {"rolled_back": {"store/recommendations.py"}}

METRIC = re.compile(r"\b(?:vllm|llamacpp):[a-z_]")
METRIC_OWNERS = {"names.py", "collect/catalogue.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (or other bare string statements)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.add(id(node.value))
    return out


def _strings(root: Path):
    """(path relative to root, line, text) of each string constant in root's Python files, f-string parts included,
    docstrings left out."""
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                yield path.relative_to(root).as_posix(), node.lineno, node.value


def vocabulary_literals(root: Path = TUNER) -> list[str]:
    return [
        f"{rel}:{line}: {text!r}"
        for rel, line, text in _strings(root)
        if text in OWNED and rel != OWNED[text] and rel not in ALSO.get(text, set())
    ]


def metric_literals(root: Path = TUNER) -> list[str]:
    return [
        f"{rel}:{line}: {text!r}"
        for rel, line, text in _strings(root)
        if METRIC.search(text) and rel not in METRIC_OWNERS
    ]


def test_no_vocabulary_word_is_typed_outside_its_owner():
    assert vocabulary_literals() == []


def test_no_engine_metric_name_is_typed_outside_the_catalogue():
    assert metric_literals() == []


def test_the_walk_sees_what_it_looks_for(tmp_path):
    (tmp_path / "m.py").write_text(
        '"""vllm:num_requests_running, rolled_back: a docstring says what it likes."""\n'
        'x = "rolled_back"\n'
        'q = f"rate(vllm:request_success_total{{sel}}[{w}])"\n'
        'ok = "vllm: the cpu_bind value, not a metric"\n'
    )
    assert vocabulary_literals(tmp_path) == ["m.py:2: 'rolled_back'"]
    assert metric_literals(tmp_path) == ["m.py:3: 'rate(vllm:request_success_total{sel}['"]


def test_every_engine_name_is_in_the_catalogue_and_every_canonical_one_has_a_name():
    consts = {v for k, v in vars(names).items() if k.startswith(("VLLM_", "LLAMACPP_")) and not k.endswith("_PREFIX")}
    canonical = {s.name for s in catalogue.VLLM + catalogue.LLAMACPP if ":" in s.name}
    assert consts == canonical
    for s in catalogue.VLLM + catalogue.LLAMACPP:
        prefix = names.VLLM_PREFIX if s.backend == "vllm" else names.LLAMACPP_PREFIX
        assert s.name.startswith(prefix) or ":" not in s.name


def test_the_tuples_the_store_checks_against_are_unchanged():
    assert STATES == (
        "planned",
        "draining",
        "starting",
        "health_check",
        "observing",
        "awaiting_manual",
        "tuning",
        "done",
    )
    assert OUTCOMES == ("kept", "rolled_back", "inconclusive", "failed", "unchanged")
    assert STATUSES == ("proposed", "applied", "rejected", "expired", "rolled_back", "failed")
    assert TRIAL_STATUSES == ("running", "measured", "crashed", "pruned", "interrupted", "compared")


MEMBERS = [m for e in ENUMS for m in e]


@pytest.mark.parametrize("m", MEMBERS, ids=[f"{type(m).__name__}.{m.name}" for m in MEMBERS])
def test_a_member_is_its_string_wherever_it_is_shown(m):
    s = m.value
    assert type(s) is str
    assert m == s and s == m and hash(m) == hash(s) and {s: 1}[m] == 1 and m in {s} and m in (s,)
    assert str(m) == s and f"{m}" == s and format(m) == s
    assert "{}".format(m) == s and "%s" % m == s  # noqa: UP031, UP032 (str.format and logging's %s, as tuner uses them)
    assert f"{m:>20}|" == f"{s:>20}|" and f"{m!s}" == s
    assert repr(m) == repr(s) and f"{m!r}" == repr(s)
    assert json.dumps(m) == json.dumps(s)
    assert json.dumps({m: [m]}) == json.dumps({s: [s]})
    assert json.dumps({m: m}, indent=1, sort_keys=True) == json.dumps({s: s}, indent=1, sort_keys=True)
    assert ", ".join([m, m]) == f"{s}, {s}" and m + "x" == s + "x" and m.upper() == s.upper()
    assert sorted([m, "a", "z"]) == sorted([s, "a", "z"])
    assert type(m)(s) is m and pickle.loads(pickle.dumps(m)) is m


def test_a_member_binds_and_reads_back_as_its_string():
    engine = create_engine("sqlite://")
    t = Table("t", MetaData(), Column("v", String(16)))
    t.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(t), [{"v": m} for m in MEMBERS])
        back = list(conn.execute(select(t.c.v)).scalars())
        assert back == [m.value for m in MEMBERS] and all(type(v) is str for v in back)
        hits = conn.execute(select(t.c.v).where(t.c.v == ApplyOutcome.ROLLED_BACK)).scalars().all()
        assert hits == ["rolled_back"] * 2  # the apply outcome's and the recommendation status's
