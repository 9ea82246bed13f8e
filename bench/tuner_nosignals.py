"""``tuner run`` with the signals job and the alert rules switched off: a diagnostic that isolates the
ingest path (scrape, parse, store), the part Prometheus's own scraping does.

Not a mode of tuner. The bench runs it beside the real ``tuner run`` at the largest target count to
show how much of tuner's CPU goes to ingest and how much to deriving signals (Daemon.signals_once, and the
rule evaluations that derive each target's signals every group interval, RuleJobs.evaluate_once).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's tuner and bench/, from whichever directory the script runs

from tuner.cli import main  # noqa: E402
from tuner.daemon import jobs as daemon  # noqa: E402
from tuner.daemon.evaluating import RuleJobs  # noqa: E402

daemon.Daemon.signals_once = lambda self: None  # type: ignore[method-assign]
RuleJobs.evaluate_once = lambda self, group_name: None  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
