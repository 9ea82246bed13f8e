"""The cost of an exposition with many engines (distinct ``engine``/``model_name`` pairs): issue 39, item 9.

A hostile or broken server can label each sample with a model_name of its own. Assembly (collect/assemble.py)
used to match every sample against every engine: O(N^2), 87 s of one core for 32k engines in a 1.9 MB body. Run

    PYTHONPATH=$PWD python bench/many_engines.py [N ...]

It times the parse of one body per N (one ``vllm:num_requests_running`` line per model, plus the lines without
a model_name that every engine shares), through tuner's cap on engines per target (assemble.MAX_ENGINES; the
scrape is refused) and with the cap lifted (the assembly itself).
"""

from __future__ import annotations

import sys
import time

from tuner.collect import assemble
from tuner.collect.vllm import snapshot_from_text
from tuner.errors import ExpositionError


def body(n: int) -> str:
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="0",model_name="m{i:05d}"}} 1' for i in range(n)]
    lines += [
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",engine="0"} 1',
        "# TYPE process_start_time_seconds gauge",
        "process_start_time_seconds 1.7e9",
    ]
    return "\n".join(lines) + "\n"


def timed(text: str) -> tuple[float, str]:
    start = time.perf_counter()
    try:
        snap = snapshot_from_text(text, target="t", ts=0.0)
        what = f"{len(snap.engines)} engines"
    except ExpositionError as exc:
        what = f"refused: {str(exc)[:80]}"
    return time.perf_counter() - start, what


def main(sizes: list[int]) -> None:
    cap = getattr(assemble, "MAX_ENGINES", None)
    for n in sizes:
        text = body(n)
        took, what = timed(text)
        print(f"N={n:>6} body {len(text) / 1e6:5.2f} MB  cap {cap}: {took:7.3f} s  {what}")
        if cap is not None:
            assemble.MAX_ENGINES = 10**9
            took, what = timed(text)
            assemble.MAX_ENGINES = cap
            print(f"N={n:>6} body {len(text) / 1e6:5.2f} MB  no cap: {took:7.3f} s  {what}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [2000, 32000])
