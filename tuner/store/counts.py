"""How a histogram row's bucket counts are kept: the column ``hist_samples.counts``.

A scrape's cumulative counts are whole numbers that mostly repeat ("[0.0, 0.0, 3.0, 11.0, 13.0, 13.0, …]"),
so they are stored as the increments from one bucket to the next, in decimal, with the trailing zeros
left out: "0,0,3,8,2". That is a quarter of the JSON list's bytes on vLLM's histograms (bench/results/)
and decodes as fast. Counts it cannot hold exactly (fractions, NaN, ±Inf, beyond 2**53) are written as
the JSON list of cumulative counts, which is also what every row written before this format holds: a
row starting with "[" is JSON, so old databases read the same without a migration.

Encoding runs once per histogram per scrape: compiled where tuner was built with a C compiler
(collect/_numbers.c, 0.9 µs against 5.8 µs for a 20-bucket histogram), else, or with TUNER_PURE_PYTHON=1, in
Python; tests/store/test_counts.py holds the two equal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import accumulate

from tuner.collect.compiled import compiled

__all__ = ["encode_counts", "decode_counts"]

_EXACT = 2.0**53  # integers up to here are exact as floats, so increments add back to the same counts


COMPILED: Callable[[tuple[float, ...]], str | None] | None = compiled("encode_counts")


def encode_counts(counts: tuple[float, ...]) -> str:
    if COMPILED is not None:
        text = COMPILED(counts)
        return json.dumps(counts) if text is None else text
    return encode_counts_python(counts)


def encode_counts_python(counts: tuple[float, ...]) -> str:
    try:
        ints = list(map(int, counts))  # ValueError for NaN, OverflowError for ±Inf
    except (ValueError, OverflowError):
        return json.dumps(counts)
    if list(map(float, ints)) != list(counts) or (ints and max(map(abs, ints)) >= _EXACT):
        return json.dumps(counts)  # a fraction, or too large to add back exactly
    steps = [b - a for a, b in zip([0, *ints], ints)]
    while steps and not steps[-1]:
        steps.pop()
    return ",".join(map(str, steps))


def decode_counts(text: str, n: int) -> tuple[float, ...]:
    """The ``n`` cumulative counts ``text`` holds (``n``: the series' number of bounds)."""
    if text.startswith("["):
        try:
            return tuple(map(float, text[1:-1].split(", ")))  # what every older row holds
        except ValueError:  # "[]", or json.dumps's NaN/Infinity beside another spacing
            return tuple(float(c) for c in json.loads(text))
    if not text:
        return (0.0,) * n
    cum = list(map(float, accumulate(map(int, text.split(",")))))
    if len(cum) < n:
        cum.extend([cum[-1]] * (n - len(cum)))
    return tuple(cum)
