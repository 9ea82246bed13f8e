"""The shape of a target's last exposition, so the next scrape of the same shape skips parsing and assembly.

A server serves the same series scrape after scrape; only the numbers move. After a full parse
(``parse_exposition`` + ``assemble_engines``) a Layout remembers which number on which line feeds which
engine value, histogram bucket, count or sum. The next body is split at its line-final numbers in one regex
pass; when everything between those numbers is what the layout saw (compared by a hash of the pieces), the
body differs from the parsed one only in its numbers, so the engines are filled straight from them.
Anything else (a new series, a NaN, a timestamp, a number that overflows) misses and the full parse runs
and learns the new shape. tests/collect/test_layout.py holds the two paths equal on every recorded
exposition and on perturbed ones.

The split is compiled where tuner was built with a C compiler (``_numbers.c``: one pass that hashes the pieces
and reads the numbers, 31 µs against the regex path's 186 µs on a 52 KB vLLM body; a whole read 62 µs against
237 µs), else, or with TUNER_PURE_PYTHON=1, the regex below. tests/collect/test_numbers.py holds the two splits
equal.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Literal

from tuner.collect.assemble import assemble_engines
from tuner.collect.compiled import compiled
from tuner.collect.exposition import CatalogueSample, parse_exposition
from tuner.collect.snapshots import EngineSnapshot, Histogram, SeriesKey
from tuner.errors import ScrapeError
from tuner.names import LLAMACPP_PREFIX, VLLM_PREFIX

__all__ = ["Layouts", "engines_from_text"]

# A line-final number in the strict form (no NaN/Inf: those miss, and the full parse reports them). The
# alphabet is chosen so that whatever float() accepts from it is a value the exposition format accepts too.
_NUMBER_AT_EOL = re.compile(r" ([-+0-9.eE]+)(?:\n|$)")
_DECREASING = "bucket counts decrease with le"  # the one value-dependent problem assembly reports: never learned


def _scan_regex(text: str) -> tuple[int, int, list[float] | None]:
    """The body's shape (a hash of the pieces between its line-final numbers), how many pieces, and the numbers
    (None when one is not a float literal or overflows)."""
    parts = _NUMBER_AT_EOL.split(text)
    pieces = parts[0::2]
    try:  # C loops only: float, then + 0.0 ("-0" reads as 0, as the reference has it)
        numbers: list[float] | None = list(map(operator.add, map(float, parts[1::2]), repeat(0.0)))
    except ValueError:  # "1e" or "+-1": the full parse names the line
        numbers = None
    if numbers is not None and not all(map(math.isfinite, numbers)):  # overflowed to Inf: the full parse reports it
        numbers = None
    return hash(tuple(pieces)), len(pieces), numbers


COMPILED: Callable[[str], tuple[int, int, list[float] | None]] | None = compiled("scan")


@dataclass(frozen=True)
class _EnginePlan:
    engine: EngineSnapshot  # engine, model_name, config as learned; values and histograms refilled
    value_keys: tuple[SeriesKey, ...]
    value_numbers: Callable[[list[float]], tuple[float, ...]]  # the numbers of value_keys, in their order
    # key, bounds, where the buckets' numbers are (a slice: a histogram's buckets are consecutive lines, as
    # servers write them; else their indices), sum's index and count's (-1: absent)
    hists: tuple[tuple[SeriesKey, tuple[float, ...], slice | tuple[int, ...], int, int], ...]


def _picker(indices: Sequence[int]) -> Callable[[list[float]], tuple[float, ...]]:
    """``numbers`` -> the numbers at ``indices``, as a tuple (itemgetter gives a bare number for one index)."""
    if len(indices) == 1:
        i = indices[0]
        return lambda numbers: (numbers[i],)
    return operator.itemgetter(*indices) if indices else (lambda numbers: ())


def _where(indices: tuple[int, ...]) -> slice | tuple[int, ...]:
    """Consecutive indices as a slice (a slice of the numbers is one C copy), others as they are."""
    if indices and indices == tuple(range(indices[0], indices[0] + len(indices))):
        return slice(indices[0], indices[0] + len(indices))
    return indices


@dataclass(frozen=True)
class _Layout:
    shape: int  # hash of the pieces between the numbers
    pieces: int  # how many there are
    engines: tuple[_EnginePlan, ...]
    problems: tuple[str, ...]  # the shape's own problems (untyped series, dropped buckets), repeated each scrape


class Layouts:
    """One learned layout per key (a target, its backend and default model). Safe to share between
    threads as long as one key is read and learned by one thread at a time (the daemon's scrape loop never runs
    two scrapes of one target at once)."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self._scan = COMPILED or _scan_regex
        self._by_key: dict[tuple[str, str, str], _Layout] = {}
        self._max_keys = max_keys
        self.hits = 0
        self.misses = 0

    def read(self, key: tuple[str, str, str], text: str) -> tuple[tuple[EngineSnapshot, ...], list[str]] | None:
        """The engines and problems the full path would give for ``text``, or None (parse it)."""
        layout = self._by_key.get(key)
        if layout is None:
            self.misses += 1
            return None
        try:
            shape, pieces, numbers = self._scan(text)
        except UnicodeEncodeError:  # a lone surrogate: the full parse says what is wrong
            self.misses += 1
            return None
        if pieces != layout.pieces or shape != layout.shape or numbers is None:
            self.misses += 1
            return None
        engines = []
        for plan in layout.engines:
            values = dict(zip(plan.value_keys, plan.value_numbers(numbers)))
            hists = {}
            for hkey, bounds, buckets, s, c in plan.hists:
                counts = numbers[buckets] if type(buckets) is slice else [numbers[i] for i in buckets]
                if counts != sorted(counts):  # decreasing: a server bug the full path reports in its place
                    self.misses += 1
                    return None
                hists[hkey] = Histogram(bounds, tuple(counts), numbers[s] if s >= 0 else 0.0, numbers[c])
            e = plan.engine
            engines.append(EngineSnapshot(e.backend, e.engine, e.model_name, values, hists, e.config))
        self.hits += 1
        return tuple(engines), list(layout.problems)

    def learn(
        self,
        key: tuple[str, str, str],
        text: str,
        samples: Sequence[CatalogueSample],
        backend: Literal["vllm", "llamacpp"],
        problems: Sequence[str],
    ) -> None:
        """Remember the shape of ``text``, fully parsed into ``samples`` (those assembly kept) with ``problems``.
        A body with a value-dependent problem (a non-finite sample dropped) is not learned: the next one is
        parsed in full as well."""
        self._by_key.pop(key, None)
        if any(" sample dropped" in p or _DECREASING in p for p in problems):
            return
        parts = _NUMBER_AT_EOL.split(text)
        pieces = parts[0::2]
        index_of_line: dict[int, int] = {}
        line = 1
        for i, piece in enumerate(pieces[:-1]):
            line += piece.count("\n")
            index_of_line[line] = i
            line += 1  # the newline the number ended with
        # Assemble once with each sample's value replaced by (its number's index + 1): the engines that come
        # out say where every value, bucket, sum and count comes from (0 = absent).
        stand_ins = []
        for s in samples:
            at = index_of_line.get(s.line_no)
            if at is None:
                return  # a kept sample whose value is not a plain number (an info series' NaN): not learnable
            stand_ins.append(CatalogueSample(s.spec, s.part, s.labels, float(at + 1), s.line_no))
        scratch: list[str] = []
        plans = []
        for e in assemble_engines(stand_ins, backend, key[2], scratch):
            hists = tuple(
                (hkey, h.bounds, _where(tuple(int(x) - 1 for x in h.counts)), int(h.sum) - 1, int(h.count) - 1)
                for hkey, h in e.histograms.items()
            )
            plans.append(
                _EnginePlan(
                    replace(e, values={}, histograms={}),
                    tuple(e.values),
                    _picker([int(v) - 1 for v in e.values.values()]),
                    hists,
                )
            )
        try:
            shape, count, _ = self._scan(text)
        except UnicodeEncodeError:
            return
        if len(self._by_key) >= self._max_keys:
            self._by_key.clear()
        self._by_key[key] = _Layout(shape, count, tuple(plans), tuple(problems))


_SERVERS = {"vllm": (VLLM_PREFIX, "a vLLM server"), "llamacpp": (LLAMACPP_PREFIX, "a llama-server")}


def engines_from_text(
    text: str, backend: Literal["vllm", "llamacpp"], *, target: str, default_model: str, layouts: Layouts | None = None
) -> tuple[tuple[EngineSnapshot, ...], list[str]]:
    """One exposition's engines and problems: read by ``layouts`` when the body has the target's last shape,
    else parsed in full (and its shape learned). ExpositionError if the body is invalid; ScrapeError if it has
    none of the backend's series."""
    key = (target, backend, default_model)
    known = layouts.read(key, text) if layouts is not None else None
    if known is not None:
        return known
    parsed = parse_exposition(text)
    samples = [s for s in parsed.samples if s.spec.backend == backend]
    prefix, server = _SERVERS[backend]
    if not any(s.spec.name.startswith(prefix) for s in samples):
        raise ScrapeError(
            f"{target}: /metrics has no {prefix}* series; is this {server} (or is the target's backend wrong)?"
        )
    problems = list(dict.fromkeys(parsed.problems))
    engines = assemble_engines(samples, backend, default_model, problems)
    if layouts is not None:
        layouts.learn(key, text, samples, backend, problems)
    return engines, problems
