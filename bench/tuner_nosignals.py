"""``tuner run`` with the signals job switched off: a diagnostic that isolates scrape + parse + store.

Not a mode of tuner. The bench runs it beside the real ``tuner run`` at the largest target count to
show how much of tuner's CPU the per-interval signals recomputation (Daemon.signals_once) takes.
"""

from __future__ import annotations

import sys

from tuner.daemon import jobs as daemon
from tuner.cli import main

daemon.Daemon.signals_once = lambda self: None  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
