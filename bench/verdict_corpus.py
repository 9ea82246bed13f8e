"""The verdict on the recorded corpus (tests/fixtures/verdict_corpus/), the held-back third scored apart.

Usage: .venv/bin/python bench/verdict_corpus.py [--append]
(prints a Markdown table per part; --append also writes them to bench/results/YYYY-MM-DD-HHMM-verdict-corpus.md and
refreshes the summary in bench/README.md)

Each pair is judged as the corpus test judges it (tests/apply/test_verdict_corpus.py: tuner's own ingest, the
verdict of tuner/apply/verdict.py) and held to the truth read from the clients alone (tests/apply/verdict_corpus.py,
whose docstring gives the rules). A pair is right when its outcome is one the truth allows and no clause of its
reason contradicts the numbers it cites.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner, tests and bench/, from whichever directory the script runs

from bench import summary  # noqa: E402
from tests.apply import verdict_corpus as corpus  # noqa: E402
from tests.apply.test_verdict_corpus import judge_pair  # noqa: E402


def _flags(f: dict) -> str:
    return " ".join(f"{k.lstrip('-')}={v}" for k, v in f.items())


def _table(pairs: list[corpus.Pair]) -> tuple[list[str], int]:
    rows = [
        "| pair | change | truth (from the clients) | allowed | verdict | confidence | why |",
        "|---|---|---|---|---|---|---|",
    ]
    right = 0
    for p in pairs:
        meta = corpus.meta(p.recording)
        allowed, why = corpus.truth(p)
        v = judge_pair(p)
        bad = corpus.clauses_contradicting_their_numbers(v)
        ok = v.outcome in allowed and not bad
        right += ok
        change = (
            f"{_flags(meta['before']['flags'])} @ {meta['before']['rate']:g}/s -> "
            f"{_flags(meta['after']['flags'])} @ {meta['after']['rate']:g}/s"
        )
        rows.append(
            f"| {p.id} | {change} | {why.replace('|', '/')} | {', '.join(sorted(allowed))} | "
            f"**{v.outcome}**{'' if ok else ' (WRONG)'} | {v.confidence:.2f} | "
            f"{v.reason[:220].replace('|', '/')}{' CONTRADICTS: ' + '; '.join(bad) if bad else ''} |"
        )
    return rows, right


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--append", action="store_true", help="also write the tables to bench/results/YYYY-MM-DD-HHMM-verdict-corpus.md"
    )
    args = ap.parse_args()
    started = time.gmtime()
    pairs = corpus.pairs()
    parts = {"built on": [p for p in pairs if not p.held_back], "held back": [p for p in pairs if p.held_back]}
    load = os.getloadavg()
    out = [
        f"## The verdict on the recorded corpus ({time.strftime('%Y-%m-%d %H:%M UTC', started)})",
        "",
        f"`python bench/verdict_corpus.py` (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}): "
        f"{len(corpus.recordings())} recordings from `scripts/record_verdict_corpus.py`, {len(pairs)} judged "
        "pairs (each vLLM recording without an SLO and under three). The held-back recordings "
        f"({', '.join(sorted(corpus.held_back()))}) were chosen at random before any was recorded "
        "(tests/fixtures/verdict_corpus/held_back.json) and nothing was tuned to them.",
        "",
    ]
    scores = {}
    for name, part in parts.items():
        rows, right = _table(part)
        scores[name] = (right, len(part))
        out += [f"### {name.capitalize()}: {right} of {len(part)} judged right", "", *rows, ""]
    out.insert(4, "Score: " + "; ".join(f"{name} {r} of {n}" for name, (r, n) in scores.items()) + ".\n")
    text = "\n".join(out)
    print(text)
    if args.append:
        path = summary.results_path("verdict-corpus", datetime.fromtimestamp(time.mktime(started), timezone.utc))
        path.write_text(text + "\n")
        summary.update_readme()
        print(f"written to {path}", file=sys.stderr)
    return 0 if all(r == n for r, n in scores.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
