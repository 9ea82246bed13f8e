"""The exposition fast path gives exactly prometheus_client's samples, or declines and lets it parse.

Equal means: the same samples in the same order, each with the same family name and type, sample
name, labels, value (bit for bit, NaN and -0.0 included) and line number.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers import FIXTURES
from tuner.collect import exposition
from tuner.collect.exposition import RawSample, fast_samples, parse_exposition, reference_samples
from tuner.errors import ExpositionError

TEXT_FIXTURES = sorted(p for p in FIXTURES.rglob("*.txt"))


def _key(samples: list[RawSample]) -> list[tuple]:
    return [(f, t, n, sorted(lbl.items()), repr(float(v)), line) for f, t, n, lbl, v, line in samples]


def _reference(text: str) -> list[RawSample] | None:
    try:
        return list(reference_samples(text))
    except (ValueError, IndexError, TypeError, KeyError, AttributeError):
        return None


@pytest.mark.parametrize("path", TEXT_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recorded_exposition_takes_the_fast_path_with_identical_samples(path) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text(encoding="utf-8")
    fast, ref = fast_samples(text), _reference(text)
    if ref is None:  # a recorded error body (llama-server without --metrics): the reference's to reject
        assert fast is None
        return
    assert fast is not None, "a real server's exposition should be in the fast path's form"
    assert _key(fast) == _key(ref)


@pytest.mark.parametrize("path", TEXT_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_parse_exposition_is_the_same_with_and_without_the_fast_path(path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    text = path.read_text(encoding="utf-8")

    def outcome() -> object:
        try:
            got = parse_exposition(text)
        except ExpositionError as exc:
            return str(exc)
        return got.samples, got.problems, got.sample_count

    fast = outcome()
    monkeypatch.setattr(exposition, "fast_samples", lambda _text: None)
    assert fast == outcome()


# ---- generated expositions -----------------------------------------------------------------------

_BASES = ["vllm:a", "b", "c_total", "vllm:h", "_total", "x:y"]
_SUFFIXES = ["", "_total", "_bucket", "_count", "_sum", "_created"]
_TYPES = ["counter", "gauge", "histogram", "summary", "untyped", "info", "bogus"]
_VALUES = [
    "0",
    "1",
    "-0",
    "-0.0",
    "1.5",
    "2.",
    ".5",
    "1e3",
    "1E-2",
    "+3",
    "01",
    "+Inf",
    "-Inf",
    "Inf",
    "NaN",
    "nan",
    "inf",
    "1_0",
    "0x1",
    "1.0.0",
    "",
    "١",
    "12345678901234567890123",
    "1e400",
]
_LABEL_VALUES = ["", "0", "a b", "a,b", "}", "{", "=", "# x", "é", "a\\\\b", 'a\\"b', "a\\nb", "\t"]
_SEPARATORS = [" ", " ", " ", "  ", "\t"]

_label = st.tuples(
    st.sampled_from(["engine", "model_name", "le", "a", "__x", "A_1", "bad-name"]), st.sampled_from(_LABEL_VALUES)
)


@st.composite
def _sample_line(draw) -> str:  # type: ignore[no-untyped-def]
    name = draw(st.sampled_from(_BASES)) + draw(st.sampled_from(_SUFFIXES))
    labels = draw(st.lists(_label, max_size=3))
    head = name
    if labels or draw(st.booleans()):
        body = ",".join(f'{k}="{v}"' for k, v in labels)
        head += "{" + body + draw(st.sampled_from(["", "", ","])) + "}"
    line = head + draw(st.sampled_from(_SEPARATORS)) + draw(st.sampled_from(_VALUES))
    if draw(st.integers(0, 9)) == 0:
        line += draw(st.sampled_from([" 1700000000000", " ", "\r", ' # {a="b"} 1']))
    return line


@st.composite
def _comment_line(draw) -> str:  # type: ignore[no-untyped-def]
    name = draw(st.sampled_from(_BASES)) + draw(st.sampled_from(["", "", "_total", "_bucket"]))
    kind = draw(st.sampled_from(["HELP", "TYPE", "TYPE", "EOF", "other"]))
    if kind == "HELP":
        return f"# HELP {name}" + draw(st.sampled_from(["", " some help", ' a "quoted\\n" help', "  two"]))
    if kind == "TYPE":
        return f"# TYPE {name} " + draw(st.sampled_from(_TYPES))
    return draw(st.sampled_from(["# EOF", "#", "# a comment", "#HELP x y", "# HELP", "# TYPE x"]))


_expositions = st.lists(
    st.one_of(_sample_line(), _sample_line(), _comment_line(), st.sampled_from(["", " ", 'x{a="b"}'])), max_size=25
).map(lambda lines: "\n".join(lines) + "\n")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_expositions)
@example("# TYPE c counter\nc 1\n# TYPE c_total counter\nc_total -0\n")  # renamed counter; "-0" is int 0
@example("# TYPE _total counter\n_total 1\n")  # a family named "" is the reference's error
@example('# HELP h x\nh_bucket{le="+Inf"} 1\n# TYPE h histogram\nh_count 1\n')  # TYPE after samples
@example("a 1" + "0" * 400 + "\nb 1e400\n")  # literals past float range: left to the reference
def test_fast_path_answers_like_the_reference_or_declines(text: str) -> None:
    fast = fast_samples(text)
    if fast is None:
        return  # the reference parser handles it, errors included
    ref = _reference(text)
    assert ref is not None, "the fast path accepted a body the reference rejects"
    assert _key(fast) == _key(ref)


def test_literals_past_float_range_are_left_to_the_reference() -> None:
    assert fast_samples("a 1" + "0" * 400 + "\n") is None
    assert fast_samples("b 1e400\n") is None
    fast = fast_samples("c +Inf\nd -Inf\n")
    assert fast is not None and [s[4] for s in fast] == [math.inf, -math.inf]


@st.composite
def _strict_exposition(draw) -> str:  # type: ignore[no-untyped-def]
    """The form real servers emit: the fast path must accept it (else it is no fast path)."""
    lines = []
    for i in range(draw(st.integers(1, 6))):
        name, typ = f"m{i}", draw(st.sampled_from(["counter", "gauge", "histogram"]))
        lines += [f"# HELP {name} help text", f"# TYPE {name} {typ}"]
        values = st.sampled_from(["0.0", "1", "2.5", "1e3", "+Inf", "NaN"])
        for j in range(draw(st.integers(1, 3))):
            lbl = f'engine="{j}",model_name="{draw(st.sampled_from(["m", "a b", "x,y"]))}"'
            if typ == "histogram":
                for le in ("0.1", "+Inf"):
                    lines.append(f'{name}_bucket{{{lbl},le="{le}"}} {draw(values)}')
                lines += [f"{name}_count{{{lbl}}} {draw(values)}", f"{name}_sum{{{lbl}}} {draw(values)}"]
            else:
                lines.append(f"{name}{'_total' if typ == 'counter' else ''}{{{lbl}}} {draw(values)}")
    return "\n".join(lines) + "\n"


@settings(max_examples=100, deadline=None)
@given(_strict_exposition())
def test_fast_path_accepts_the_common_form(text: str) -> None:
    fast = fast_samples(text)
    assert fast is not None
    ref = _reference(text)
    assert ref is not None and _key(fast) == _key(ref)


def test_nan_and_negative_zero_are_kept_bit_for_bit() -> None:
    fast = fast_samples("a -0\nb -0.0\nc NaN\n")
    assert fast is not None
    assert [repr(s[4]) for s in fast] == ["0.0", "-0.0", "nan"]
    assert math.isnan(fast[2][4])
