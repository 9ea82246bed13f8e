"""Prometheus text exposition → the catalogue's series, with every problem named by line.

Parsing is prometheus_client's (the reference parser in Python). This module adds what a scraper
needs on top: the line number of a bad line, duplicate-series detection (Prometheus rejects such a
scrape), non-finite values dropped and reported, and the catalogue lookup that keeps only the series
tuner uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from tuner.collect.catalogue import MetricSpec, Part, lookup
from tuner.errors import ExpositionError

__all__ = ["CatalogueSample", "ParsedExposition", "parse_exposition", "decode_body"]


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
        raise ExpositionError(f"not UTF-8 (byte {exc.start})", line_no,
                              body.split(b"\n")[line_no - 1].decode("utf-8", "replace")) from None


def _spelled(value: float) -> str:
    """A non-finite value as the exposition format writes it."""
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _sample_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each sample line: the parser yields exactly one sample per such line."""
    return [(i, line) for i, line in enumerate(text.split("\n"), start=1)
            if line.strip() and not line.lstrip().startswith("#")]


def _locate_error(text: str) -> ExpositionError:
    """Re-parse line by line (error path only) to name the first line the library rejects."""
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            for _ in text_string_to_metric_families(line + "\n"):
                pass
        except (ValueError, IndexError, TypeError) as exc:  # the same errors parse_exposition catches
            return ExpositionError(f"not a valid exposition line ({exc})", line_no, line)
    return ExpositionError("not a valid Prometheus text exposition")


def parse_exposition(text: str) -> ParsedExposition:
    """Parse ``text``; raise ExpositionError (with the line) when the body as a whole is invalid."""
    out = ParsedExposition()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    untyped: set[str] = set()
    lines: list[tuple[int, str]] | None = None
    index = -1
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                index += 1
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in seen:
                    lines = lines or _sample_lines(text)
                    line_no, line = lines[index]
                    raise ExpositionError("duplicate series", line_no, line)
                seen.add(key)
                hit = lookup(s.name)
                if hit is None and family.type == "counter" and s.name == family.name + "_total":
                    # The parser appends _total to a counter served without it (llamacpp:n_tokens_max).
                    lines = lines or _sample_lines(text)
                    if not lines[index][1].lstrip().startswith(s.name):
                        hit = lookup(family.name)
                if hit is None:
                    continue
                spec, part = hit
                lines = lines or _sample_lines(text)
                line_no = lines[index][0]
                value = float(s.value)
                if not math.isfinite(value) and not (part == "value" and spec.kind == "info"):
                    out.problems.append(f"line {line_no}: {s.name} is {_spelled(value)}; sample dropped")
                    continue
                if family.type == "unknown" and spec.kind != "info" and spec.name not in untyped:
                    untyped.add(spec.name)
                    out.problems.append(f"line {line_no}: {s.name} has no TYPE; read as {spec.kind} "
                                        "(catalogue)")
                out.samples.append(CatalogueSample(spec, part, dict(s.labels), value, line_no))
    except ExpositionError:
        raise
    except (ValueError, IndexError, TypeError):
        raise _locate_error(text) from None
    out.sample_count = index + 1
    return out
