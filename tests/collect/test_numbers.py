"""The compiled split (collect/_numbers.c) against the regex it replaces, on the same inputs.

The layout fast path splits a body at its line-final numbers. Compiled, that is one pass in C; without a C
compiler, a regex. Both must give the same pieces and the same numbers on every recorded exposition, on the
fuzz corpus (tests/reliability/test_fuzz.py's near-valid and raw expositions) and on generated text made of
the characters that matter (spaces, newlines, number characters); the shape hash must tell different pieces
apart and match equal ones. tests/collect/test_layout.py runs the whole layout path both ways against the full
parse.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.test_fuzz import _exposition_case
from tuner.collect import layout

FIXTURES = Path(__file__).parent.parent / "fixtures"
RECORDED = sorted(FIXTURES.glob("*/metrics_*.txt"))

try:
    from tuner.collect import _numbers  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: CI must not be
    _numbers = None
    pytestmark = pytest.mark.skipif(not os.environ.get("CI"), reason="tuner was built without its C split")

SETTINGS = settings(
    max_examples=3000, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)


def _regex_split(text: str) -> tuple[list[str], list[str]]:
    parts = layout._NUMBER_AT_EOL.split(text)
    return parts[0::2], parts[1::2]


def _same_numbers(a: list[float] | None, b: list[float] | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x == y and math.copysign(1, x) == math.copysign(1, y) for x, y in zip(a, b))


def _check(text: str) -> None:
    assert _numbers is not None, "tuner was built without its C split (is there a C compiler?)"
    assert _numbers.split(text) == _regex_split(text)
    shape, count, numbers = _numbers.scan(text)
    _, regex_count, regex_numbers = layout._scan_regex(text)
    assert count == regex_count
    assert _same_numbers(numbers, regex_numbers), (numbers, regex_numbers)


def test_the_compiled_split_is_what_the_daemon_uses() -> None:
    assert _numbers is not None, "tuner was built without its C split (is there a C compiler?)"
    assert layout.COMPILED is _numbers.scan or os.environ.get("TUNER_PURE_PYTHON")


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recorded_exposition_splits_the_same(path: Path) -> None:
    text = path.read_text()
    _check(text)
    assert len(_numbers.scan(text)[2]) > 10  # type: ignore[union-attr]


@SETTINGS
@given(_exposition_case())
def test_the_fuzz_corpus_splits_the_same(case: tuple[str, bytes]) -> None:
    _check(case[1].decode("utf-8", "replace"))


_PIECE = st.text(alphabet=' \n\r\t-+.eE0123456789xé{}="_', max_size=12)
_TOKEN = st.sampled_from(
    [
        "1",
        "-0",
        "+7",
        "5.",
        ".5",
        "1e3",
        "1E-3",
        "1e",
        "+-1",
        ".",
        "-",
        "e",
        "1e400",
        "-1e400",
        "0.1.2",
        "007",
        "1e+",
        "12345678901234567890",
        "4.9e-324",
        "1e-400",
    ]
)


@SETTINGS
@given(st.lists(st.tuples(_PIECE, _TOKEN), max_size=12), _PIECE)
def test_generated_text_splits_the_same(lines: list[tuple[str, str]], tail: str) -> None:
    _check("".join(f"{piece} {token}\n" for piece, token in lines) + tail)
    _check("".join(f"{piece} {token}" + ("\n" if i % 2 else "") for i, (piece, token) in enumerate(lines)) + tail)


@SETTINGS
@given(st.lists(_PIECE, min_size=1, max_size=8), st.lists(_PIECE, min_size=1, max_size=8), st.data())
def test_the_shape_is_the_pieces(a: list[str], b: list[str], data: st.DataObject) -> None:
    """Same pieces, other numbers: the same shape. Other pieces: another shape."""
    assert _numbers is not None

    def body(pieces: list[str]) -> str:
        numbers = data.draw(st.lists(st.integers(0, 10**6), min_size=len(pieces), max_size=len(pieces)))
        return "".join(f"{p} {n}\n" for p, n in zip(pieces, numbers))

    first, second, other = body(a), body(a), body(b)
    if _regex_split(first)[0] != _regex_split(second)[0]:  # a piece that is itself a number line splits further
        return
    assert _numbers.scan(first)[0] == _numbers.scan(second)[0]
    if _regex_split(first)[0] != _regex_split(other)[0]:
        assert _numbers.scan(first)[0] != _numbers.scan(other)[0]


def test_a_lone_surrogate_is_refused_and_the_layout_misses() -> None:
    assert _numbers is not None
    with pytest.raises(UnicodeEncodeError):
        _numbers.scan("a 1\n\ud800 2\n")
    path = FIXTURES / "vllm-0.32-cpu" / "metrics_under_load.txt"
    layouts = layout.Layouts()
    text = path.read_text()
    layout.engines_from_text(text, "vllm", target="t", default_model="m", layouts=layouts)
    assert layouts.read(("t", "vllm", "m"), text) is not None
    assert layouts.read(("t", "vllm", "m"), text + "# \ud800\n") is None


def _float_or_none(token: str) -> float | None:
    try:
        x = float(token) + 0.0
    except ValueError:
        return None
    return x if math.isfinite(x) else None


_EDGES = [
    "9007199254740992",
    "9007199254740993",
    "900719925474099.3",
    "562949953421311",
    "562949953421312.5",
    "1e22",
    "1e23",
    "1.5e22",
    "123456789012345e-22",
    "123456789012345e-23",
    "0e999",
    "-0e-999",
    "1e-22",
    "0.000000000000000000000001",
    "4.35",
    "0.1",
    "0.3",
    "2.186776576e+09",
    "1.7952445989416175e+09",
    "00000000000000000000000000001.5",
    "1.00000000000000000000000000",
    "-.0",
    "+.5e-3",
    "5.E2",
    "1e0001",
]
_LITERAL = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.tuples(st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 20), st.sampled_from("efg")).map(
        lambda t: f"{t[0]:.{t[1]}{t[2]}}"
    ),
    st.integers(-(10**20), 10**20).map(str),
    st.text(alphabet="-+0123456789.eE", min_size=1, max_size=25),
    st.sampled_from(_EDGES),
)


@SETTINGS
@given(_LITERAL)
def test_a_number_reads_as_float_reads_it(token: str) -> None:
    """The compiled reader's own path for short literals (and CPython's for the rest) against float()."""
    assert _numbers is not None
    assert _same_numbers(_numbers.scan(f"x {token}\n")[2], _wrap(_float_or_none(token)))


def _wrap(x: float | None) -> list[float] | None:
    return None if x is None else [x]


@pytest.mark.parametrize("token", _EDGES)
def test_edge_literals_read_as_float_reads_them(token: str) -> None:
    assert _numbers is not None
    assert _same_numbers(_numbers.scan(f"x {token}\n")[2], _wrap(_float_or_none(token)))
