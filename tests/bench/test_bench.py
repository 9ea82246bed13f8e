"""The bench's own parts: the endpoint farm serves advancing counters; the helpers read /proc and profiles."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import VLLM_DIR
from tuner.collect.vllm import snapshot_from_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scale import cpu_seconds, peak_rss_bytes, profile_summary  # noqa: E402


def test_farm_serves_every_endpoint_with_counters_and_histograms_advancing(tmp_path: Path) -> None:
    ports_file = tmp_path / "ports.txt"
    farm = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "farm.py"),
            "--targets",
            "3",
            "--fixture",
            str(VLLM_DIR / "metrics_kv_pressure.txt"),
            "--ports-file",
            str(ports_file),
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not ports_file.exists():  # bounded by the deadline
            assert time.monotonic() < deadline and farm.poll() is None, "farm did not start"
            time.sleep(0.05)
        ports = [int(p) for p in ports_file.read_text().split()]
        assert len(set(ports)) == 3
        conn = http.client.HTTPConnection("127.0.0.1", ports[1], timeout=5)  # keep-alive, as Prometheus scrapes
        snaps = []
        for _ in range(2):
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            assert resp.status == 200
            snaps.append(snapshot_from_text(resp.read().decode(), target="t", ts=0.0).engines[0])
        conn.request("GET", "/health")
        health = conn.getresponse()
        assert (health.status, health.read()) == (200, b"")
        conn.close()
        first, second = snaps
        assert second.field("prompt_tokens_total") > first.field("prompt_tokens_total")
        e2e = "vllm:e2e_request_latency_seconds"
        assert second.histogram(e2e).count > first.histogram(e2e).count
        assert second.kv_cache_usage == first.kv_cache_usage  # gauges as recorded
    finally:
        farm.terminate()
        farm.wait(10)


def test_proc_readers_see_this_process() -> None:
    assert cpu_seconds(os.getpid()) > 0
    assert peak_rss_bytes(os.getpid()) > 10 * 2**20


def test_profile_summary_attributes_each_stack_to_its_first_stage(tmp_path: Path) -> None:
    raw = tmp_path / "spy.txt"
    raw.write_text(
        "run (apscheduler/executors/base.py:1);scrape_once (tuner/daemon/scraping.py:2);"
        "read (tuner/collect/layout.py:3) 30\n"
        "run (threading.py:1);_write (tuner/daemon/writer.py:2);flush (tuner/daemon/writer.py:3);"
        "write (tuner/store/store.py:4) 20\n"
        "run (apscheduler/executors/base.py:1);signals_once (tuner/daemon/jobs.py:4);"
        "window (tuner/store/store.py:5) 10\n"
        "run (apscheduler/executors/base.py:1);scrape_once (tuner/daemon/scraping.py:2) 10\n"
        "main (x.py:1) 30\n"
    )
    assert dict(profile_summary(raw)) == {
        "scrape: read by the learned layout": 0.3,
        "store: write (one transaction per batch)": 0.2,
        "signals: store.window": 0.1,
        "scrape job (the rest)": 0.1,
        "other": 0.3,
    }


def test_the_apply_bench_counts_requests_not_attempts() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench.apply import Req, requests_summary

    attempts = [
        Req(0, 1, "ok", request=(1, 0)),
        Req(1, 2, "refused", request=(1, 1)),
        Req(2, 3, "refused", request=(1, 1)),
        Req(3, 4, "ok", request=(1, 1)),  # one request, three attempts, answered
        Req(0, 5, "ok", request=(2, 0)),
        Req(5, 6, "http 500", request=(2, 1)),
    ]  # still failing when the load stopped
    assert requests_summary(attempts) == {"requests": 4, "retried": 1, "lost": 1, "attempts_failed": 3}


def test_lateness_is_read_around_the_interval_so_a_phase_at_its_edge_is_not_a_whole_interval_late() -> None:
    from bench.scale import lateness_ms

    interval = 5000
    # a target scraped at 4.99 s past each 5 s mark, with +-15 ms of jitter: some scrapes land just past the mark
    stamps = [k * interval + 4990 + j for k, j in enumerate([0, 15, -10, 12, 14, 3, -15, 11, 0, 13])]
    late = lateness_ms(stamps, interval)
    assert max(late) == 30 and min(late) == 0  # 4990 - 15 is the least late; 4990 + 15 (past the mark) 30 ms later
    # a scrape really 3 s late shows as 3 s (lateness is one-sided: no scheduler runs early), the others as before
    stamps[4] += 3000
    late = lateness_ms(stamps, interval)
    assert late[4] == 3000 + 14 + 15 and max(late[:4] + late[5:]) == 30
    assert lateness_ms([], interval) == []


def test_alert_latency_medians_take_the_onset_from_either_scraper_as_well() -> None:
    """Prometheus's onset alone gives tuner no credit for seeing the condition first; the other onset does, and a
    trial where one side never notified counts for neither."""
    from bench.alert_latency import medians

    # (trial, Prometheus's onset, tuner's webhook, Prometheus's webhook); tuner's first scrape above, per trial
    rows = [(1, 100.0, 102.0, 101.0), (2, 200.0, 201.0, 201.5), (3, 300.0, None, 303.0)]
    seen = [100.9, 199.5, None]  # trial 1: tuner saw it 0.9 s after Prometheus; trial 2: 0.5 s before
    m = medians(rows, seen)
    assert m is not None
    assert m["prometheus"] == (1.5, 1.25, 2.0, 2)  # tuner 2.0 and 1.0; Prometheus 1.0 and 1.5
    t, p, worst, n = m["either"]  # trial 2 now starts at 199.5: tuner 1.5, Prometheus 2.0
    assert (t, p, n) == (1.75, 1.5, 2) and abs(worst - 2.0) < 1e-9
    assert medians([(1, 100.0, None, 101.0)], [None]) is None


def test_alert_latency_goal_is_met_only_by_a_median_no_later_and_no_trial_past_twice_theirs_with_both_onsets() -> None:
    """Issue 15's goal 3 as the bench judges it: tuner's median onset -> webhook at most Prometheus + Alertmanager's
    and no trial above 2x theirs, from Prometheus's onset and from either scraper's."""
    from bench.alert_latency import verdict

    def run(rows, seen):
        return {"rows": rows, "steps": [(s, 0.01, None) for s in seen], "load_end": 0.0}

    # tuner faster in every trial (its scrape saw the condition with Prometheus's)
    fast = run([(1, 100.0, 101.1, 101.6), (2, 200.0, 201.2, 201.9), (3, 300.0, 301.0, 301.3)], [100.0, 200.0, 300.0])
    assert verdict(fast)[0] is True
    # the same medians, but one trial 2.5x theirs: not met
    spike = run([(1, 100.0, 101.1, 101.6), (2, 200.0, 201.2, 201.9), (3, 300.0, 302.5, 301.0)], [100.0, 200.0, 300.0])
    ok, how = verdict(spike)
    assert ok is False and "2.50×" in how
    # slower median from Prometheus's onset: not met
    slow = run([(1, 100.0, 102.0, 101.5), (2, 200.0, 202.0, 201.5), (3, 300.0, 301.0, 301.5)], [100.9, 200.9, 300.0])
    assert verdict(slow)[0] is False
    assert verdict(run([(1, 100.0, None, 101.0)], [None]))[0] is False


def test_scrapers_disagree_only_when_one_scraped_the_condition_below_after_the_other_saw_it_above() -> None:
    """A trial where one side's scrape came between the other's first sample above and its own, and so read the
    condition below, is a crossing shorter than the interval (sampling); consecutive first samples are not."""
    from bench.alert_latency import disagreed, verdict

    prom, tuner = [100.0, 101.0, 102.0, 103.0], [99.8, 100.8, 101.8, 102.8]
    assert disagreed(101.0, 101.8, prom, tuner) is False  # tuner's next scrape after Prometheus's onset saw it
    assert disagreed(101.0, 102.8, prom, tuner) is True  # tuner scraped at 101.8 in between, below
    assert disagreed(102.0, 100.8, prom, tuner) is True  # the other way: Prometheus scraped 101.0 below
    assert disagreed(101.0, 100.8, prom, tuner) is False
    assert disagreed(None, 100.8, prom, tuner) is False
    # the verdict leaves the disagreeing trials out (here the one that was 6x theirs), whichever side was first
    m = {
        "rows": [(1, 100.0, 101.0, 101.5), (2, 200.0, 206.8, 201.1), (3, 300.0, 301.2, 301.6)],
        "steps": [(100.0, 0.01, None), (205.8, 0.01, None), (300.0, 0.01, None)],
        "split": [False, True, False],
    }
    ok, how = verdict(m)
    assert ok is True and "(2 trials)" in how and "1 where one sampled" in how
    assert verdict({**m, "split": [False, False, False]})[0] is False
    # ...but not where tuner missed it for a stall of its own: its scrape loop an interval late, or a stall caught
    assert verdict({**m, "late": [0.0, 0.4, 0.0]})[0] is True
    assert verdict({**m, "late": [0.0, 5.6, 0.0]})[0] is False
    assert verdict({**m, "stalls": [[], [(8.0, "threads by state {'S': 16}")], []]})[0] is False


def test_a_trial_where_only_prometheus_notified_fails_goal_3() -> None:
    from bench.alert_latency import verdict

    m = {
        "rows": [(1, 100.0, 101.0, 101.5), (2, 200.0, None, 204.6), (3, 300.0, 301.2, 301.6)],
        "steps": [(100.0, 0.01, None), (200.2, 0.01, None), (300.0, 0.01, None)],
        "split": [False, False, False],
    }
    ok, how = verdict(m)
    assert ok is False and "1 trial(s) where Prometheus notified and tuner did not" in how
    assert verdict({**m, "rows": [m["rows"][0], (2, 200.0, 201.1, None), m["rows"][2]]})[0] is True


_STALLER = """
import re, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(404); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a):
        pass

srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
threading.Thread(target=srv.serve_forever, daemon=True).start()
sys.stdin.readline()
# Holds the GIL for seconds: the regex engine never lets go while it backtracks.
re.match(r"(a+)+$", "a" * int(sys.argv[1]) + "b")
print("done", flush=True)
sys.stdin.readline()
"""


def test_the_stall_watch_catches_a_process_that_stops_answering_and_names_the_gil_holder(tmp_path: Path) -> None:
    """A real process whose one thread holds the GIL in a long C call (a backtracking regex) while its HTTP server
    thread waits: the watch records one stall, as long as the call, with that thread running and holding the GIL.
    Before the call the same process answers, and no stall is recorded."""
    from bench.stallwatch import StallWatch

    n = 26  # ~2**26 backtracking steps: a second or more here
    proc = subprocess.Popen(
        [sys.executable, "-c", _STALLER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        port = int(proc.stdout.readline())
        watch = StallWatch(proc.pid, port, out=tmp_path / "stalls.txt", every_s=0.05, after_s=0.3)
        watch.start()
        time.sleep(0.5)  # answered promptly all along: nothing recorded
        assert watch.stalls == []
        t0 = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        held = time.monotonic() - t0
        deadline = time.monotonic() + 10
        while not watch.stalls and time.monotonic() < deadline:  # the stall's answer came; its record follows
            time.sleep(0.05)
        watch.stop()
    finally:
        proc.kill()
        proc.wait(10)
    assert held > 0.8, f"the regex held the GIL only {held:.2f} s: too short to be a stall here"
    assert len(watch.stalls) == 1, watch.stalls
    stall = watch.stalls[0]
    assert held - 0.3 - 0.2 <= stall.seconds <= held + 0.2, (stall.seconds, held)
    assert "R" in stall.summary and "CPU in the next 0.5 s: python" in stall.summary, stall.summary
    if watch.py_spy is not None:  # py-spy is the bench's; the test suite may run without it
        assert "re.py" in stall.summary or "match" in stall.summary, stall.summary
    # schedstat over the whole stall: the regex thread was on a CPU most of it (2 cores, nothing else busy here)
    import re

    ran = float(re.search(r"its threads ran ([0-9.]+) s", stall.summary)[1])  # type: ignore[index]
    assert 0.5 * stall.seconds <= ran <= stall.seconds + 0.3, stall.summary
    record = (tmp_path / "stalls.txt").read_text()
    assert record.count("=== stall probe") == 1 and record.count("=== stall ended") == 1


def test_the_workload_rate_bench_takes_the_truth_from_the_client_and_judges_each_interval_against_it() -> None:
    from bench.workload_rate import reading, realized_rate

    # 5 requests sent over 2 s: 4 gaps, 2/s (a count over the span would say 2.5)
    assert realized_rate([10.5, 10.0, 11.0, 12.0, 11.5]) == 2.0
    with pytest.raises(ValueError, match="two requests"):
        realized_rate([3.0])
    w = {"rate_rps": 1.8, "inferred": {"rate_rps": {"low": 1.7, "high": 1.9}}}
    low = reading(w, 2.0)
    assert not low["holds"] and abs(low["error"] - (-0.1)) < 1e-12
    assert reading(w, 1.85)["holds"] and reading(w, 1.7)["holds"]  # the bounds themselves hold it
    assert not reading({"rate_rps": 1.8}, 1.8)["holds"]  # no interval: nothing to hold it


def test_the_client_s_start_times_are_binned_as_scrape_intervals_for_the_burstiness_estimator() -> None:
    from bench.workload_rate import _bins
    from tuner.signals.workload import _burstiness

    # 12 s of sends in 5-s bins from the first: [0, 5) holds 3, [5, 12] 3 (the last partial bin joins the one before)
    got = _bins([0.0, 1.0, 4.9, 5.0, 9.0, 12.0])
    assert [(iv.seconds, iv.finished) for iv in got] == [(5.0, 3.0), (7.0, 3.0)]
    # one burst of 20 every 30 s, nothing between: far burstier than Poisson, and the estimator says so
    bursts = [30.0 * k + 0.01 * i for k in range(12) for i in range(20)]
    shape = _burstiness(_bins(bursts))[1]
    assert shape is not None and shape[0] < 0.2
    even = [0.5 * i for i in range(400)]  # one every half second: as regular as the scale allows
    assert _burstiness(_bins(even))[1][0] == 10.0


def test_the_drawn_truths_spread_only_the_part_of_the_prompt_past_the_shared_prefix(tmp_path: Path) -> None:
    from bench.workload_rate import drawn_truths

    d = tmp_path / "corpus-drawn9"
    d.mkdir()
    sent = {
        "input_len": 400,
        "output_len": 3,
        "range_ratio": 0.3,
        "burstiness": 1.0,
        "rate_rps": 2.0,
        "prefix_len": 200,
    }
    (d / "drawn.json").write_text(json.dumps({"seed": 1, "shapes": {"drawn-1-1": sent}}))
    (d / "drawn-1-1.yaml").write_text(
        "input_len: 400\noutput_len: 3\nrange_ratio: 0.2\nprefix_len: 128\nburstiness: 0.9\n"
        "inferred:\n  range_ratio: {low: 0.0, high: 0.14}\n  prefix_len: {low: 128, high: 255}\n"
        "  burstiness: {low: 0.5, high: 1.5}\n"
    )
    got = {t["field"]: t for t in drawn_truths(tmp_path)}
    # the client spreads the 200 tokens past the prefix by 0.3: +-60 of 400, a whole-prompt ratio of 0.15
    assert got["range_ratio"]["sent"] == 0.3 * 200 / 400 and not got["range_ratio"]["holds"]
    assert got["prefix_len"]["holds"] and got["burstiness"]["holds"]
