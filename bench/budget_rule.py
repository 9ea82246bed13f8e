"""The gallop's token budget against every vLLM grid measured: which max-num-batched-tokens `step_budget` carries to
the top of the max-num-seqs axis, and which one the grid measured higher there. Reads stored results; runs nothing.

tune's search, from a poor config (1 sequence, 256 tokens), gallops up max-num-seqs and takes the token budget along
only where the sequences' average tokens a step outgrow it (`step_budget`, tuner/tune/space.py). With a budget of three
trials it never measures the other budget at the top, so the rule's pick there is the search's answer. This script
applies the rule as tuner has it (the function itself, on the workload file `tuner workload` wrote) to each shape of
issue 40's corpus, and sets its pick beside each grid's two readings at 16 and 32 sequences (256 and 2,048 tokens, the
bench grid's budget values), next to the two fixed answers (always 256, always 2,048).

A grid reading is a capacity with its interval (the highest rate met, up to the lowest missed); the two budgets are
*separated* where one's capacity is at or above the other's upper end, and a pick counts right or wrong only there.
Every grid here has been seen by the rules' authors: this is a check of the rule on the evidence that exists, not a
held-back score.

    python bench/budget_rule.py            # the table, from bench/results/*-tune-corpus.md and bench/corpus*/
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.summary import corpus_runs, results, tables  # noqa: E402
from tuner.signals.workload import Workload, parse_workload  # noqa: E402
from tuner.tune.space import Axis, step_budget  # noqa: E402

SEQS = "max_num_seqs"
TOKENS = "max_num_batched_tokens"
BUDGETS = (256, 2048)
_CELL = re.compile(r"^([\d.]+)(?:\s*req/s)?(?:\s*\(([\d.]+)-([\d.]+)\))?")


@dataclass(frozen=True)
class Reading:
    capacity: float
    upper: float  # the lowest rate missed (the capacity itself where the file gives no interval)

    @classmethod
    def parse(cls, cell: str) -> Reading | None:
        m = _CELL.match(cell.strip())
        if not m:
            return None
        cap = float(m.group(1))
        return cls(cap, float(m.group(3)) if m.group(3) else cap)


def grids(text: str, shapes: list[str]) -> dict[str, dict[int, dict[int, Reading]]]:
    """Each grid table of a results file: shape -> seqs -> budget -> reading. A header names its shape
    ("drawn-8593-1, tokens 256") or, where it does not, the file scored one shape only (``shapes``)."""
    out: dict[str, dict[int, dict[int, Reading]]] = {}
    for header, rows in tables(text):
        if not header or header[0] != SEQS or len(header) < 3:
            continue
        columns: list[tuple[str, int]] = []
        shape = None
        for h in header[1:]:
            named = re.match(r"^([\w-]+), tokens (\d+)$", h)
            plain = re.match(r"^(?:max_num_batched_tokens |tokens )?(\d+)$", h)
            if named:
                shape = named.group(1)
                columns.append((shape, int(named.group(2))))
            elif plain and shape is not None:
                columns.append((shape, int(plain.group(1))))
            elif plain and len(shapes) == 1:
                shape = shapes[0]
                columns.append((shape, int(plain.group(1))))
            else:
                columns = []
                break
        for row in rows:
            if not row[0].isdigit():
                continue
            for (name, budget), cell in zip(columns, row[1:], strict=False):
                got = Reading.parse(cell)
                if got is not None:
                    out.setdefault(name, {}).setdefault(int(row[0]), {})[budget] = got
    return out


def workload_of(shape: str) -> Workload | None:
    for path in sorted((ROOT / "bench").glob(f"corpus*/{shape}.yaml")):
        return parse_workload(path.read_text(encoding="utf-8"), str(path))
    return None


def rule_pick(workload: Workload, seqs: int) -> int:
    """The token budget tune's gallop carries from 1 sequence and 256 tokens to ``seqs`` sequences."""
    axes = (Axis(SEQS, (1, 2, 4, 8, 16, 32)), Axis(TOKENS, BUDGETS))
    along = step_budget("vllm", axes, workload)
    assert along is not None
    return int(along({SEQS: 1, TOKENS: 256}, {SEQS: seqs, TOKENS: 256}).get(TOKENS, 256))


def better(at: dict[int, Reading]) -> int | None:
    """The budget the grid separated above the other (None: not separated)."""
    a, b = at.get(BUDGETS[0]), at.get(BUDGETS[1])
    if a is None or b is None:
        return None
    if a.capacity >= b.upper and a.capacity > b.capacity:
        return BUDGETS[0]
    if b.capacity >= a.upper and b.capacity > a.capacity:
        return BUDGETS[1]
    return None


def main() -> int:
    found = results()
    scored: dict[str, list[str]] = {}
    for run in corpus_runs(found):
        if run.backend == "vLLM":
            scored.setdefault(run.source.path.name, []).append(run.shape)
    seen: dict[str, tuple[str, dict[int, dict[int, Reading]]]] = {}
    for r in sorted(found, key=lambda r: r.order):
        if r.kind != "tune-corpus":
            continue
        shapes = sorted(set(scored.get(r.path.name, [])))
        for shape, grid in grids(r.text, shapes).items():
            seen.setdefault(shape, (r.path.name, grid))  # a shape's first grid
    print(
        "| shape | in / out, prefix, burstiness | seqs | grid: 256 tokens | 2048 | separated: better | "
        "step_budget's pick | right? | grid file |"
    )
    print("|---|---|---:|---|---|---|---:|---|---|")
    tally = {"rule": [0, 0], "always 256": [0, 0], "always 2048": [0, 0]}
    for shape, (name, grid) in seen.items():
        w = workload_of(shape)
        if w is None:
            continue
        for seqs in (16, 32):
            at = grid.get(seqs, {})
            if len(at) < 2:
                continue
            pick, best = rule_pick(w, seqs), better(at)
            verdict = "-" if best is None else ("yes" if pick == best else "no")
            if best is not None:
                for who, chosen in (("rule", pick), ("always 256", 256), ("always 2048", 2048)):
                    tally[who][0 if chosen == best else 1] += 1
            cells = " | ".join(
                f"{at[b].capacity:g}"
                + (f" ({at[b].capacity:g}-{at[b].upper:g})" if at[b].upper > at[b].capacity else "")
                for b in BUDGETS
            )
            print(
                f"| {shape} | {w.input_len} / {w.output_len}, {w.prefix_len}, {w.burstiness:g} | {seqs} | {cells} | "
                f"{best or '-'} | {pick} | {verdict} | {name} |"
            )
    print()
    print(
        "Where the grid separated the budgets: "
        + "; ".join(f"{who} right in {ok} of {ok + bad}" for who, (ok, bad) in tally.items())
        + "."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
