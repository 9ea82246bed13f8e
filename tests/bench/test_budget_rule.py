"""bench/budget_rule.py: the gallop's token budget (tuner/tune/space.py's step_budget, the function itself) against the
grids stored in bench/results/. Checked: the three grid-table layouts the files use are read, a pick is scored only
where the grid separated the two budgets, and the rule's picks on shapes whose need is plain."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.budget_rule import Reading, better, grids, rule_pick, workload_of  # noqa: E402
from tuner.signals.workload import Workload  # noqa: E402

NAMED = """| max_num_seqs | drawn-1-1, tokens 256 | 2048 | drawn-1-2, tokens 256 | 2048 |
|---:|---:|---:|---:|---:|
| 16 | 16 (16-18.4) | 13.9 (13.9-16) | 147 (147-169) | 194 (194-268) |
| 32 | 16 (16-24.1) | 18.4 (18.4-21.1) | 223 (223-256) | 194 (194-223) |
"""
PLAIN = """| max_num_seqs | max_num_batched_tokens 256 | 2048 |
|---:|---:|---:|
| 32 | 187 | 314 |
"""


def test_grid_tables_are_read_in_each_layout() -> None:
    named = grids(NAMED, [])
    assert named["drawn-1-1"][32][2048] == Reading(18.4, 21.1) and named["drawn-1-2"][16][256] == Reading(147, 169)
    assert grids(PLAIN, ["tiny"]) == {"tiny": {32: {256: Reading(187, 187), 2048: Reading(314, 314)}}}
    assert grids(PLAIN, ["a", "b"]) == {}, "a table that names no shape in a file of two shapes is nobody's"
    assert grids(PLAIN.replace("max_num_batched_tokens 256", "tokens 256"), ["x"])["x"][32][2048].capacity == 314


def test_a_pick_counts_only_where_the_grid_separated_the_budgets() -> None:
    g = grids(NAMED, [])
    assert better(g["drawn-1-1"][32]) is None  # 16 (16-24.1) against 18.4: the first interval reaches past it
    assert better(g["drawn-1-1"][16]) == 256  # 16 against 13.9 (13.9-16): at the other's upper end
    assert better(g["drawn-1-2"][32]) == 256 and better(g["drawn-1-2"][16]) == 2048


def test_the_rule_carries_the_budget_up_only_for_a_prefill_bound_shape() -> None:
    """256-token prompts with 4-token answers ask 65 tokens a step a sequence: 32 of them outgrow 256 tokens; 64-token
    answers to 64-token prompts ask 2."""
    prefill = Workload(input_len=256, output_len=4, rate_rps=5.0)
    decode = Workload(input_len=64, output_len=64, rate_rps=5.0)
    assert rule_pick(prefill, 32) == 2048 and rule_pick(prefill, 2) == 256
    assert rule_pick(decode, 32) == 256


def test_the_corpus_shapes_have_their_workload_files() -> None:
    w = workload_of("rag")
    assert w is not None and w.prefix_len > 0 and rule_pick(w, 32) == 256
    assert workload_of("no-such-shape") is None
