"""Load from vLLM's own benchmark client (``vllm.benchmarks.serve``), one request rate per run, parsed from its JSON.

The client runs in the vLLM install's Python (the ``vllm`` console script of the CPU build fails on its package
metadata, so the module is called): one process per tuning session, which imports vLLM once (~12 s here) and then
runs ``vllm.benchmarks.serve.main`` for each rate it is sent, as ``vllm bench serve`` would with the same arguments.
What the client prints goes to a log; each run's result is its ``--save-result --save-detailed`` JSON file.

SLO attainment of a run = requests that met every budget / requests sent (failed requests are misses): TTFT and
E2E per request against their budgets, and the request's mean time per output token against the ITL budget
(vLLM's own ``--goodput`` uses the same three per-request figures; its ``request_goodput`` is reported beside).
Warm-up requests (``--num-warmups``) are not counted.

Its standard error is not the binomial one: requests that arrive together queue together, so misses come in
clumps (on a saved bursty run at its capacity, with a TTFT budget its P95 met, the spread of the attainment over
ten blocks of consecutive requests was 2.3x what independent requests would give). ``attainment_se`` is read by
batch means: the requests in arrival order cut into ``BLOCKS`` blocks, the standard deviation of the blocks'
attainments over sqrt(blocks) (the standard estimate for a share of correlated observations).

Each run also carries the server's decode step time at each concurrency it saw (``step_s``, tuner/tune/speed.py):
the speed the host gave it while it ran.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from tuner.apply.launch import group_sentinel, own_group_dying_with_parent
from tuner.config import Slo
from tuner.errors import TunerError
from tuner.signals.workload import Workload
from tuner.tune.cores import pin_threads
from tuner.tune.speed import step_times

__all__ = [
    "RateRun",
    "BenchClient",
    "BenchError",
    "attainment",
    "attainment_se",
    "bench_args",
    "outcomes",
    "read_result",
]

BLOCKS = 10  # batch means: blocks of consecutive requests (at least MIN_BLOCK requests each)
MIN_BLOCK = 10

# Runs vLLM's client in a loop: one JSON object per stdin line ({"args": the CLI arguments, "arrivals": an int}),
# one JSON answer per stdout line. The client's own output goes to stderr (the log). A constant: no data ever becomes
# code here.
#
# The client seeds two generators from its one --seed: its dataset's own (the prompts) and numpy's global one, from
# which it draws nothing but the gaps between arrivals (vllm/benchmarks/serve.py, get_request). The runner gives
# the global one the run's arrival seed instead, so runs can share an arrival pattern (scaled to each run's rate)
# while each sends prompts of its own (the same prompts twice would be served from the prefix cache).
_RUNNER = r"""
import json, os, sys
import numpy
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
answer = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
seed_global = numpy.random.seed
answer.write(json.dumps({"ready": True}) + "\n")
for line in sys.stdin:
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    try:
        job = json.loads(line)
        arrivals = int(job["arrivals"])
        numpy.random.seed = lambda seed=None: seed_global(arrivals)
        main(parser.parse_args(job["args"]))
        answer.write(json.dumps({"ok": True}) + "\n")
    except BaseException as exc:
        answer.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
    finally:
        numpy.random.seed = seed_global
"""


class BenchError(TunerError, RuntimeError):
    """vLLM's benchmark client could not start or could not run."""

    exit_code = 6


@dataclass(frozen=True)
class RateRun:
    """One run of the client at one request rate."""

    rate_rps: float
    sent: int
    completed: int
    good: int  # completed within every budget
    attainment: float  # good / sent
    duration_s: float
    throughput_rps: float
    goodput_rps: float | None  # vLLM's own request_goodput (with --goodput)
    ttft_p99: float | None  # seconds
    e2e_p99: float | None
    itl_p99: float | None
    result_file: str = ""
    mean_e2e_s: float | None = None
    attainment_se: float | None = None  # batch means over blocks of consecutive requests; None: too few requests
    attainment_se_detrended: float | None = None  # the same about the blocks' trend (tuner/tune/compare.py reads it)
    # requests decoding at once -> the median gap between two tokens at it, seconds (tuner/tune/speed.py)
    step_s: dict[int, float] | None = None

    @property
    def in_flight(self) -> float | None:
        """Requests in flight on average over the run, by Little's law: throughput x mean end-to-end latency
        (queued ones included: with max-num-seqs 2 at its capacity rate, 11 in flight means 9 waited)."""
        return None if self.mean_e2e_s is None else self.throughput_rps * self.mean_e2e_s

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "in_flight": self.in_flight}


def _budgets(slo: Slo) -> dict[str, float]:
    return {
        k: getattr(slo, f"{k}_p99").total_seconds()
        for k in ("ttft", "itl", "e2e")
        if getattr(slo, f"{k}_p99") is not None
    }


def bench_args(
    workload: Workload,
    *,
    url: str,
    model: str,
    tokenizer: str,
    rate: float,
    prompts: int,
    slo: Slo,
    result_dir: Path,
    result_file: str,
    warmups: int = 2,
    seed: int = 0,
    close_connections: bool = False,
) -> list[str]:
    """The client's arguments for one run (what ``vllm bench serve`` takes); ``close_connections``: a new connection
    per request (tuner/backends.py ``bench_closes_connections``)."""
    budgets = _budgets(slo)
    goodput = [f"{'e2el' if k == 'e2e' else 'tpot' if k == 'itl' else k}:{v * 1000:g}" for k, v in budgets.items()]
    args = [
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(workload.input_len - workload.prefix_len),
        "--random-output-len",
        str(workload.output_len),
        "--random-range-ratio",
        f"{workload.range_ratio:g}",
        "--random-prefix-len",
        str(workload.prefix_len),
        "--num-prompts",
        str(prompts),
        "--request-rate",
        f"{rate:.6g}",
        "--burstiness",
        f"{workload.burstiness:g}",
        "--ignore-eos",
        "--seed",
        str(seed),
        "--num-warmups",
        str(warmups),
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_file,
        "--ready-check-timeout-sec",
        "0",
    ]
    if goodput:
        args += ["--goodput", *goodput]
    if close_connections:
        args += ["--header", "Connection=close"]
    return args


def outcomes(result: Mapping[str, Any], slo: Slo) -> list[bool]:
    """Whether each request sent met every budget, in the order they were sent (the client's lists are in that
    order); requests the result holds no timings for are misses, at the end."""
    budgets = _budgets(slo)
    sent = int(result.get("num_prompts") or 0)
    ttfts, e2es = result.get("ttfts") or [], result.get("latencies") or []
    outs, errors = result.get("output_lens") or [], result.get("errors") or []
    met: list[bool] = []
    for i, e2e in enumerate(e2es):
        ttft = ttfts[i] if i < len(ttfts) else None
        out = outs[i] if i < len(outs) else 0
        met.append(
            not (i < len(errors) and errors[i])
            and bool(out)  # a request that produced nothing failed
            and ttft is not None
            and bool(e2e)
            and not ("ttft" in budgets and ttft > budgets["ttft"])
            and not ("e2e" in budgets and e2e > budgets["e2e"])
            and not ("itl" in budgets and out > 1 and (e2e - ttft) / (out - 1) > budgets["itl"])
        )
    return met + [False] * max(0, sent - len(met))


def attainment(result: Mapping[str, Any], slo: Slo) -> tuple[int, int]:
    """(good, sent) from a detailed result: a request is good when it finished and met every budget."""
    return sum(outcomes(result, slo)), int(result.get("num_prompts") or 0)


def attainment_se(
    met: Sequence[bool], blocks: int = BLOCKS, min_block: int = MIN_BLOCK, *, detrend: bool = False
) -> float | None:
    """Standard error of the share of ``met`` by batch means: ``blocks`` blocks of consecutive requests (fewer
    where a block would hold under ``min_block``; None under 4 blocks), the standard deviation of their shares over
    sqrt(blocks). Requests past the last whole block are left out of the estimate.

    ``detrend``: about the least-squares line through the blocks' shares instead of their mean (k - 2 degrees of
    freedom). A queue that grows through a run above its capacity misses more in each block: a trend the run's
    length decides, the same in every run of that length, not clumps that fall where bursts happen to."""
    k = min(blocks, len(met) // max(1, min_block))
    if k < 4:
        return None
    size = len(met) // k
    shares = [sum(met[i * size : (i + 1) * size]) / size for i in range(k)]
    mean = sum(shares) / k
    if not detrend:
        return math.sqrt(sum((x - mean) ** 2 for x in shares) / (k - 1) / k)
    mid = (k - 1) / 2
    slope = sum((i - mid) * (x - mean) for i, x in enumerate(shares)) / sum((i - mid) ** 2 for i in range(k))
    return math.sqrt(sum((x - mean - slope * (i - mid)) ** 2 for i, x in enumerate(shares)) / (k - 2) / k)


def read_result(path: Path, slo: Slo, rate: float) -> RateRun:
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"vLLM's benchmark client left no readable result at {path}: {exc}") from None
    met = outcomes(result, slo)
    good, sent = attainment(result, slo)
    sent = sent or int(result.get("completed") or 0)

    def ms(key: str) -> float | None:
        v = result.get(key)
        return v / 1000 if isinstance(v, (int, float)) and math.isfinite(v) else None

    return RateRun(
        rate_rps=rate,
        sent=sent,
        completed=int(result.get("completed") or 0),
        good=good,
        attainment=good / sent if sent else 0.0,
        duration_s=float(result.get("duration") or 0.0),
        throughput_rps=float(result.get("request_throughput") or 0.0),
        goodput_rps=result.get("request_goodput"),
        ttft_p99=ms("p99_ttft_ms"),
        e2e_p99=ms("p99_e2el_ms"),
        itl_p99=ms("p99_itl_ms"),
        result_file=str(path),
        mean_e2e_s=ms("mean_e2el_ms"),
        attainment_se=attainment_se(met),
        attainment_se_detrended=attainment_se(met, detrend=True),
        step_s=step_times(result) or None,
    )


class BenchClient:
    """vLLM's benchmark client, kept running between runs. Use as a context manager."""

    def __init__(
        self,
        python: str,
        workdir: Path,
        *,
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 180.0,
        close_connections: bool = False,
    ) -> None:
        self.python, self.workdir = python, workdir
        self.close_connections = close_connections  # every run's requests each on a new connection
        self.results = workdir / "bench-results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "bench-client.log"
        self._env = {
            **os.environ,
            "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[str] | None = None
        self._sentinel: int | None = None
        self._runs = 0
        self._cpus: tuple[int, ...] | None = None  # where the client runs (None: where the kernel puts it)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def pin(self, cpus: Sequence[int] | None) -> None:
        """Run the client on ``cpus`` from its next run on (None: on every CPU this process may use): off the cores
        of the trial server's worker (tuner/tune/cores.py), whose timings it takes."""
        self._cpus = tuple(cpus) if cpus else None
        if self.pid is not None:
            self._apply_pin()

    def _apply_pin(self) -> None:
        assert self._proc is not None
        pin_threads(self._proc.pid, self._cpus or sorted(os.sched_getaffinity(0)))

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self.close()  # a client that died between runs: its pipes and its group's watcher go before a new one
        log: IO[bytes] = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen(
                [self.python, "-c", _RUNNER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=self._env,
                preexec_fn=own_group_dying_with_parent,  # in tuner's session, as the trial server
            )
        except OSError as exc:
            raise BenchError(f"cannot start vLLM's benchmark client with {self.python}: {exc}") from None
        finally:
            log.close()
        self._sentinel = group_sentinel(self._proc.pid)  # its children (a resource tracker) go with us too
        line = self._read_answer(self._start_timeout_s)
        if not line.get("ready"):
            raise BenchError(f"vLLM's benchmark client did not start: {line}; see {self.log_path}")
        return self._proc

    def _read_answer(self, timeout_s: float) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self._proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if sel.select(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                    line = self._proc.stdout.readline()
                    if not line:
                        break
                    return dict(json.loads(line))
                if self._proc.poll() is not None:
                    break
        finally:
            sel.close()
        code = self._proc.poll()
        self.close()
        raise BenchError(
            f"vLLM's benchmark client {'exited ' + str(code) if code is not None else 'timed out'}; see {self.log_path}"
        )

    def run(
        self,
        workload: Workload,
        *,
        url: str,
        model: str,
        tokenizer: str,
        rate: float,
        prompts: int,
        slo: Slo,
        warmups: int = 2,
        timeout_s: float = 600.0,
        arrivals: int = 0,
    ) -> RateRun:
        """One run at ``rate`` requests/s of ``prompts`` requests (plus warm-ups, not counted).

        ``arrivals`` seeds the gaps between arrivals: runs with the same seed meet the same pattern of bursts and
        lulls, scaled to their rates (common random numbers: the rates of a capacity search, and the trials of a
        session, then differ by what they serve, not by the luck of their arrivals). Each run sends prompts of its
        own whatever the seed."""
        proc = self._start()
        if self._cpus is not None:
            self._apply_pin()  # threads it started since are placed too
        self._runs += 1
        name = f"run-{os.getpid()}-{self._runs}-{time.time_ns()}.json"
        args = bench_args(
            workload,
            url=url,
            model=model,
            tokenizer=tokenizer,
            rate=rate,
            prompts=prompts,
            slo=slo,
            result_dir=self.results,
            result_file=name,
            warmups=warmups,
            seed=self._runs,
            close_connections=self.close_connections,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"args": args, "arrivals": int(arrivals)}) + "\n")
        proc.stdin.flush()
        answer = self._read_answer(timeout_s)
        if not answer.get("ok"):
            raise BenchError(
                f"vLLM's benchmark client failed at {rate:g} req/s: {answer.get('error')}; see {self.log_path}"
            )
        return read_result(self.results / name, slo, rate)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if self._sentinel is not None:  # what the client left in its group (its resource tracker) goes now
            os.close(self._sentinel)
            self._sentinel = None
