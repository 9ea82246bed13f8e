"""The layout fast path (collect/layout.py) against the full parse, on the same inputs.

Every recorded real exposition is read once (learning its shape), then later bodies of the same shape (counters
advanced by ReplayExposition, or numbers rewritten at random) must give exactly what parse_exposition +
assemble_engines give on that body, through the fast path (counted as a hit). Bodies that differ in anything
but their numbers must miss and be parsed in full. Every test runs twice: with the compiled split (where tuner
was built with it) and with the regex.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tests.helpers import both_ways
from tuner.collect import layout, llamacpp, vllm
from tuner.collect.layout import Layouts
from tuner.collect.llamacpp import parse_slots
from tuner.lab.replay import ReplayExposition

FIXTURES = Path(__file__).parent.parent / "fixtures"
VLLM = sorted((FIXTURES / "vllm-0.32-cpu").glob("metrics_*.txt"))
LLAMA = sorted(p for p in (FIXTURES / "llama-server").glob("metrics_*.txt"))
_NUMBER = re.compile(r"(?<= )(-?[0-9][0-9.eE+-]*)$", re.M)

_split = both_ways(layout)  # each test with the compiled split and with the regex


def _read(path: Path, text: str, layouts: Layouts | None):
    if "llama-server" in path.parts:
        slots = parse_slots((FIXTURES / "llama-server" / "slots_mid_load.json").read_bytes())
        return llamacpp.snapshot_from_text(text, target="t", ts=1.0, slots=slots, layouts=layouts)
    return vllm.snapshot_from_text(text, target="t", ts=1.0, layouts=layouts)


def _renumber(text: str, rng: random.Random, *, buckets: bool) -> str:
    """Line-final numbers replaced by other spellings of numbers; bucket lines too when ``buckets`` (then
    histograms mostly stop being cumulative: such bodies must miss and still come out equal)."""
    spellings = [
        lambda: str(rng.randint(0, 10**6)),
        lambda: repr(rng.random() * 1e3),
        lambda: "-0",
        lambda: f"{rng.random():.3e}",
        lambda: "." + str(rng.randint(0, 99)),
        lambda: "+7",
        lambda: "5.",
    ]
    return "\n".join(
        line if "_bucket{" in line and not buckets else _NUMBER.sub(lambda m: rng.choice(spellings)(), line)
        for line in text.split("\n")
    )


@pytest.mark.parametrize("path", VLLM + LLAMA, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_advancing_counters_take_the_fast_path_and_equal_the_full_parse(path: Path) -> None:
    replay = ReplayExposition(path.read_text())
    layouts = Layouts()
    _read(path, replay.render().decode(), layouts)  # learns the shape
    for _ in range(5):
        text = replay.render().decode()
        hits = layouts.hits
        fast = _read(path, text, layouts)
        assert layouts.hits == hits + 1, "a body that differs only in its numbers must take the fast path"
        assert fast == _read(path, text, None)


@pytest.mark.parametrize("path", VLLM + LLAMA, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_any_numbers_give_what_the_full_parse_gives(path: Path) -> None:
    text = path.read_text()
    rng = random.Random(path.name)
    layouts = Layouts()
    for i in range(30):
        _read(path, text, layouts)
        body = _renumber(text, rng, buckets=i % 2 == 1)
        before = layouts.hits
        assert _read(path, body, layouts) == _read(path, body, None)
        if i % 2 == 0:  # buckets as recorded: still cumulative, so the fast path must have read it
            assert layouts.hits == before + 1


def _lines(text: str) -> list[str]:
    return text.split("\n")


@pytest.mark.parametrize(
    "change", ["nan", "inf_literal", "new_series", "timestamp", "label_value", "decreasing_buckets", "bad_number"]
)
def test_a_body_that_changed_more_than_its_numbers_is_parsed_in_full(change: str) -> None:
    path = FIXTURES / "vllm-0.32-cpu" / "metrics_under_load.txt"
    text = path.read_text()
    lines = _lines(text)
    running = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    bucket = next(i for i, line in enumerate(lines) if line.startswith("vllm:e2e_request_latency_seconds_bucket{"))
    head, _, _ = lines[running].rpartition(" ")
    bhead, _, bvalue = lines[bucket].rpartition(" ")
    edits = {
        "nan": lambda: lines.__setitem__(running, head + " NaN"),
        "inf_literal": lambda: lines.__setitem__(running, head + " 1e999"),
        "new_series": lambda: lines.insert(running + 1, head.replace('engine="0"', 'engine="1"') + " 3"),
        "timestamp": lambda: lines.__setitem__(running, head + " 2 1700000000000"),
        "label_value": lambda: lines.__setitem__(running, head.replace('engine="0"', 'engine="9"') + " 2"),
        "decreasing_buckets": lambda: lines.__setitem__(bucket, bhead + " " + str(float(bvalue) + 1e6)),
        "bad_number": lambda: lines.__setitem__(running, head + " 1e"),
    }
    layouts = Layouts()
    _read(path, text, layouts)
    edits[change]()
    body = "\n".join(lines)
    hits = layouts.hits
    try:
        full = _read(path, body, None)
    except Exception as exc:  # the full parse rejects it: the layout path must reject it the same way
        with pytest.raises(type(exc)):
            _read(path, body, layouts)
    else:
        assert _read(path, body, layouts) == full
    assert layouts.hits == hits


def test_a_new_shape_is_learned_and_the_old_one_forgotten() -> None:
    path = FIXTURES / "vllm-0.32-cpu" / "metrics_under_load.txt"
    other = FIXTURES / "vllm-0.32-cpu" / "metrics_idle.txt"
    layouts = Layouts()
    _read(path, path.read_text(), layouts)
    _read(other, other.read_text(), layouts)  # a restart: a different shape, learned in its place
    assert _read(other, other.read_text(), layouts) == _read(other, other.read_text(), None)
    assert layouts.hits == 1
    _read(path, path.read_text(), layouts)
    assert layouts.hits == 1  # the first shape was replaced, not kept beside it


def test_targets_do_not_share_a_layout() -> None:
    path = FIXTURES / "vllm-0.32-cpu" / "metrics_under_load.txt"
    layouts = Layouts()
    vllm.snapshot_from_text(path.read_text(), target="a", ts=1.0, layouts=layouts)
    snap = vllm.snapshot_from_text(path.read_text(), target="b", ts=1.0, layouts=layouts)
    assert layouts.hits == 0 and snap.target == "b"


def test_buckets_not_on_consecutive_lines_are_read_from_where_they_are() -> None:
    """A server may write a histogram's buckets in any order, or between other lines: the layout then keeps
    each bucket's own place (not the one slice it keeps for consecutive buckets), and still equals the full parse."""
    path = FIXTURES / "vllm-0.32-cpu" / "metrics_under_load.txt"
    lines = _lines(path.read_text())
    at = [i for i, line in enumerate(lines) if line.startswith("vllm:e2e_request_latency_seconds_bucket{")]
    assert len(at) > 3
    shuffled = [lines[i] for i in at]
    random.Random(7).shuffle(shuffled)  # le out of order
    for i, line in zip(at, shuffled):
        lines[i] = line
    running = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    lines.insert(at[2], lines.pop(running))  # and another series' line between two buckets
    text = "\n".join(lines)
    replay = ReplayExposition(text)
    layouts = Layouts()
    _read(path, replay.render().decode(), layouts)
    plan = next(iter(layouts._by_key.values())).engines[0]
    assert any(type(where) is tuple for _, _, where, _, _ in plan.hists)  # the other form was taken
    for _ in range(3):
        body = replay.render().decode()
        hits = layouts.hits
        assert _read(path, body, layouts) == _read(path, body, None)
        assert layouts.hits == hits + 1


def test_every_target_histogram_of_a_metric_shares_one_bounds_tuple() -> None:
    """Held once for all targets (the layouts and the head keep one per target's histogram: at 1,000 targets
    the copies were 10 MiB of floats)."""
    text = (FIXTURES / "vllm-0.32-cpu" / "metrics_under_load.txt").read_text()
    layouts = Layouts()
    a = vllm.snapshot_from_text(text, target="a", ts=1.0, layouts=layouts)
    b = vllm.snapshot_from_text(text, target="b", ts=1.0, layouts=layouts)
    c = vllm.snapshot_from_text(text, target="b", ts=2.0, layouts=layouts)  # b's layout
    assert layouts.hits == 1
    for key, h in a.engines[0].histograms.items():
        assert h.bounds is b.engines[0].histograms[key].bounds is c.engines[0].histograms[key].bounds
