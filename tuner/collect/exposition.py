"""Prometheus text exposition → the catalogue's series, with every problem named by line.

Parsing is prometheus_client's (the reference parser in Python). This module adds what a scraper
needs on top: the line number of a bad line, duplicate-series detection (Prometheus rejects such a
scrape), non-finite values dropped and reported, and the catalogue lookup that keeps only the series
tuner uses.

``fast_samples`` is a fast path for the strict, common form servers actually emit (``# HELP``/``# TYPE``
lines, ``name{label="value",...} value``, no escapes, no timestamps); it answers None for anything
else and the reference parser takes over. tests/collect/test_fastparse.py proves it gives the
reference's samples on every fixture and on generated inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from tuner.collect.catalogue import MetricSpec, Part, lookup
from tuner.errors import ExpositionError

__all__ = [
    "CatalogueSample",
    "ParsedExposition",
    "parse_exposition",
    "decode_body",
    "fast_samples",
    "reference_samples",
    "RawSample",
]

# (family name, family type, sample name, labels, value, line number): a sample as the reference parser
# hands it over, after its family grouping and counter renaming. ``labels`` is shared: do not mutate it.
RawSample = tuple[str, str, str, dict[str, str], float, int]


@dataclass(frozen=True)
class CatalogueSample:
    spec: MetricSpec
    part: Part
    labels: dict[str, str]
    value: float
    line_no: int


@dataclass
class ParsedExposition:
    samples: list[CatalogueSample] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # non-fatal, recorded with the scrape
    sample_count: int = 0  # every sample in the body, kept or not


def decode_body(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_no = body.count(b"\n", 0, exc.start) + 1
        raise ExpositionError(
            f"not UTF-8 (byte {exc.start})", line_no, body.split(b"\n")[line_no - 1].decode("utf-8", "replace")
        ) from None


def _as_float(value: float | int) -> float:
    """prometheus_client keeps integer text as int; one too large for a float is +/-Inf, as Prometheus reads it."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _spelled(value: float) -> str:
    """A non-finite value as the exposition format writes it."""
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _sample_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each sample line: the parser yields exactly one sample per such line."""
    return [
        (i, line)
        for i, line in enumerate(text.split("\n"), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _locate_error(text: str) -> ExpositionError:
    """Re-parse line by line (error path only) to name the first line the library rejects."""
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            for _ in text_string_to_metric_families(line + "\n"):
                pass
        except (ValueError, IndexError, TypeError, OverflowError) as exc:  # the same errors parse_exposition catches
            return ExpositionError(f"not a valid exposition line ({exc})", line_no, line)
    return ExpositionError("not a valid Prometheus text exposition")


def reference_samples(text: str) -> Iterator[RawSample]:
    """Every sample as prometheus_client's parser reads it; its ValueError etc. propagate."""
    lines: list[tuple[int, str]] | None = None
    index = -1
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            index += 1
            lines = lines or _sample_lines(text)
            yield family.name, family.type, s.name, s.labels, _as_float(s.value), lines[index][0]


# The strict form the fast path accepts; anything else falls back to the reference parser.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'(?!__)[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
_HEAD = re.compile(rf"({_NAME})(?:\{{((?:{_LABEL}(?:,{_LABEL})*,?)?)\}})?")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_VALUE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?Inf|NaN")
_COMMENT = re.compile(rf"# (?:HELP ({_NAME})(?: .*)?|TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped))")
_INFINITIES = (math.inf, -math.inf)
_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
_HEADS: dict[str, tuple[str, dict[str, str]] | None] = {}  # series text -> (name, labels); None = not strict
_HEADS_MAX = 200_000  # bounds the cache when series churn (cleared, not evicted: cheap and rare)
_LOOKUPS: dict[str, tuple[MetricSpec, Part] | None] = {}  # sample name -> catalogue answer (the catalogue is fixed)


class _Labels(dict):
    """A fast-path label set that carries its sorted items, the duplicate check's key, computed once."""

    __slots__ = ("sorted_items",)
    sorted_items: tuple[tuple[str, str], ...]


def _lookup(name: str) -> tuple[MetricSpec, Part] | None:
    try:
        return _LOOKUPS[name]
    except KeyError:
        if len(_LOOKUPS) >= _HEADS_MAX:
            _LOOKUPS.clear()
        hit = _LOOKUPS[name] = lookup(name)
        return hit


def _head(head: str) -> tuple[str, dict[str, str]] | None:
    hit = _HEADS.get(head, False)
    if hit is not False:
        return hit  # type: ignore[return-value]
    m = _HEAD.fullmatch(head)
    parsed: tuple[str, dict[str, str]] | None = None
    if m is not None:
        pairs = _PAIR.findall(m.group(2) or "")
        labels = _Labels(pairs)
        if len(labels) == len(pairs):  # a repeated label name is the reference's error
            labels.sorted_items = tuple(sorted(pairs))
            parsed = (m.group(1), labels)
    if len(_HEADS) >= _HEADS_MAX:
        _HEADS.clear()
    _HEADS[head] = parsed
    return parsed


def fast_samples(text: str) -> list[RawSample] | None:
    """What ``reference_samples`` yields, for text in the strict form; None for anything else."""
    out: list[RawSample] = []
    name, typ = "", "untyped"
    allowed: tuple[str, ...] = ()
    family: list[tuple[str, dict[str, str], float, int]] = []

    def flush() -> bool:
        fname, ftyp = name, ("unknown" if typ == "untyped" else typ)
        rename = ftyp == "counter" and not fname.endswith("_total")
        if ftyp == "counter" and not rename:
            fname = fname[:-6]
        for sname, labels, value, line_no in family:
            out.append((fname, ftyp, sname + "_total" if rename else sname, labels, value, line_no))
        return bool(fname)  # the reference rejects a family named "" (a counter called "_total")

    value_match = _VALUE.fullmatch
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        if line[0] == "#":
            m = _COMMENT.fullmatch(line)
            if m is None:
                return None
            help_name, type_name, new_type = m.groups()
            cand = help_name or type_name
            if cand != name:
                if name and not flush():
                    return None
                name, family = cand, []
                typ, allowed = "untyped", (cand,)
            if new_type is not None:
                typ = new_type
                allowed = tuple(name + sfx for sfx in _SUFFIXES.get(typ, ("",)))
            continue
        head, sep, raw = line.rpartition(" ")
        if not sep or value_match(raw) is None:
            return None
        parsed = _head(head)
        if parsed is None:
            return None
        sname, labels = parsed
        value = float(raw)
        if not value and raw[0] == "-" and not any(c in raw for c in ".eE"):
            value = 0.0  # the reference reads "-0" as the integer 0
        elif value in _INFINITIES and "I" not in raw:
            return None  # an overflowing literal: the reference's own reading (an integer) decides
        if sname in allowed:
            family.append((sname, labels, value, line_no))
            continue
        if name and not flush():
            return None
        name, typ, allowed, family = "", "untyped", (), []
        out.append((sname, "unknown", sname, labels, value, line_no))
    if name and not flush():
        return None
    return out


def parse_exposition(text: str) -> ParsedExposition:
    """Parse ``text``; raise ExpositionError (with the line) when the body as a whole is invalid."""
    out = ParsedExposition()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    untyped: set[str] = set()
    index = -1
    lines: list[str] = []
    fast = fast_samples(text)
    try:
        for family_name, family_type, name, labels, value, line_no in (
            fast if fast is not None else reference_samples(text)
        ):
            index += 1
            items = getattr(labels, "sorted_items", None)
            key = (name, items if items is not None else tuple(sorted(labels.items())))
            if key in seen:
                lines = lines or text.split("\n")
                raise ExpositionError("duplicate series", line_no, lines[line_no - 1])
            seen.add(key)
            hit = _lookup(name)
            if hit is None and family_type == "counter" and name == family_name + "_total":
                # The parser appends _total to a counter served without it (llamacpp:n_tokens_max).
                lines = lines or text.split("\n")
                if not lines[line_no - 1].lstrip().startswith(name):
                    hit = _lookup(family_name)
            if hit is None:
                continue
            spec, part = hit
            if not math.isfinite(value) and not (part == "value" and spec.kind == "info"):
                out.problems.append(f"line {line_no}: {name} is {_spelled(value)}; sample dropped")
                continue
            if family_type == "unknown" and spec.kind != "info" and spec.name not in untyped:
                untyped.add(spec.name)
                out.problems.append(f"line {line_no}: {name} has no TYPE; read as {spec.kind} (catalogue)")
            out.samples.append(CatalogueSample(spec, part, dict(labels), value, line_no))
    except ExpositionError:
        raise
    except (ValueError, IndexError, TypeError, OverflowError):
        raise _locate_error(text) from None
    out.sample_count = index + 1
    return out
