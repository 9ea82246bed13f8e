"""vLLM's benchmark client as tune runs it (tuner/tune/bench.py), against a real llama-server: runs given the same
arrival seed meet the same arrivals, each with prompts of its own.

Why it matters: a capacity search compares rates, and a comparison in turns compares servers, by one 30-s run each.
Near capacity, whether a run meets the SLO depends on its bursts as much as on the server; a search whose every run
meets the same arrival pattern (scaled to its rate) compares what the servers serve, not their luck. The prompts must
differ all the same: the same prompts twice would be served from the prefix cache.
"""

from __future__ import annotations

import json

import realservers
from conftest import require

from tuner.config import Slo
from tuner.signals.workload import Workload
from tuner.tune.bench import BenchClient


def _sent_at(result_file: str) -> tuple[list[float], list[int]]:
    """When each request was sent, in seconds after the first, and each prompt's length, from the detailed result."""
    data = json.loads(open(result_file).read())
    starts = data["start_times"]
    return [t - starts[0] for t in starts], data["input_lens"]


def test_runs_with_one_arrival_seed_meet_the_same_arrivals_and_send_prompts_of_their_own(llama_server, tmp_path):
    require(realservers.VLLM_PYTHON, realservers.TINY_MODEL)
    workload = Workload(input_len=48, output_len=4, range_ratio=0.5)
    slo = Slo(ttft_p99=30.0, e2e_p99=60.0, objective=0.5)
    rate, prompts = 4.0, 16  # 4 s of arrivals, a gap of 0.25 s on average: far above the client's own jitter
    with BenchClient(str(realservers.VLLM_PYTHON.path()), tmp_path) as client:

        def run(arrivals: int) -> tuple[list[float], list[int]]:
            got = client.run(
                workload,
                url=llama_server.url,
                model=str(llama_server.model_name),
                tokenizer=str(realservers.TINY_MODEL.path()),
                rate=rate,
                prompts=prompts,
                slo=slo,
                warmups=0,
                arrivals=arrivals,
            )
            # every request was sent (one may fail on a connection llama-server closed between runs: it was sent
            # all the same, at its time, which is what this test reads)
            assert got.sent == prompts and got.completed >= prompts - 2, got
            return _sent_at(got.result_file)

        first, again, other = run(7), run(7), run(8)

    (t1, lens1), (t2, lens2), (t3, lens3) = first, again, other
    jitter = max(abs(a - b) for a, b in zip(t1, t2))
    apart = max(abs(a - b) for a, b in zip(t1, t3))
    # the same seed: the same schedule, to within the client's own timing (an asyncio sleep on a busy 2-core host)
    assert jitter < 0.1, (t1, t2)
    # another seed: another schedule, by far more than that jitter (both are scaled to the same 4 s, so they differ
    # in between)
    assert apart > 3 * max(jitter, 0.05), (t1, t3)
    # and every run its own prompts (the client's --seed is each run's own): lengths drawn afresh each time
    assert lens1 != lens2 and lens2 != lens3, (lens1, lens2, lens3)
