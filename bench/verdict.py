"""The verdict on every recorded real before/after series (tests/fixtures/verdict/), beside what the client saw.

Usage: .venv/bin/python bench/verdict.py [--append]
(prints a Markdown table; --append also writes it to bench/results/YYYY-MM-DD-HHMM-verdict.md and refreshes the
summary in bench/README.md)
The series come from scripts/record_verdict_fixtures.py; each case.json holds the flags, the clients, the
client's own counts and the outcome the case must get.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from bench import summary  # noqa: E402
from tuner.app.judge import judge_dirs  # noqa: E402
from tuner.config import Slo, parse_duration  # noqa: E402

CASES = ROOT / "tests" / "fixtures" / "verdict"


def _flags(f: dict) -> str:
    return " ".join(f"{k.lstrip('-')}={v}" for k, v in f.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--append", action="store_true", help="also write the table to bench/results/YYYY-MM-DD-HHMM-verdict.md"
    )
    args = ap.parse_args()
    slo = Slo(ttft_p99=parse_duration("2s"), e2e_p99=parse_duration("10s"))
    rows = [
        "| case | before -> after | clients | client tokens/s before -> after | must be | verdict | confidence | "
        "deciding numbers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    right = 0
    cases = sorted(p for p in CASES.iterdir() if (p / "case.json").exists())
    for case in cases:
        meta = json.loads((case / "case.json").read_text())
        v = judge_dirs(case / "before", case / "after", backend=meta["backend"], slo=slo, min_requests=20)
        tput = [meta[s]["client"]["completion_tokens"] / meta[s]["client"]["wall_s"] for s in ("before", "after")]
        ok = v.outcome != "rolled_back" if meta["expected"] == "not rolled_back" else v.outcome == meta["expected"]
        right += ok
        reason = v.reason.split(": ", 1)[-1][:140].replace("|", "/")
        rows.append(
            f"| {case.name} ({meta['backend']}) | {_flags(meta['before']['flags'])} -> "
            f"{_flags(meta['after']['flags'])} | {meta['before']['clients']} -> {meta['after']['clients']} | "
            f"{tput[0]:.0f} -> {tput[1]:.0f} | {meta['expected']} | **{v.outcome}**{'' if ok else ' (WRONG)'} "
            f"| {v.confidence:.2f} | {reason} |"
        )
    load = os.getloadavg()
    text = (
        f"## Verdict on recorded real series ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
        f"`python bench/verdict.py` (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}); series recorded by "
        "`scripts/record_verdict_fixtures.py` on this 2-core machine (vLLM 0.32 CPU, tiny model, "
        "--enforce-eager; llama-server, tiny GGUF, -t 1), 20 s a side, /metrics every second, the load from "
        "tuner.lab.load in a niced process of its own (closed loop, 100-token prompts, 64 generated tokens on "
        "vLLM, 128 on llama-server).\n\n" + "\n".join(rows) + f"\n\n{right} of {len(cases)} right.\n"
    )
    print(text)
    if args.append:
        results_file = summary.results_path("verdict", datetime.now(timezone.utc))
        results_file.parent.mkdir(parents=True, exist_ok=True)
        with open(results_file, "a") as f:
            f.write(text)
        summary.update_readme()
        print(f"written to {results_file}")
    return 0 if right == len(cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
