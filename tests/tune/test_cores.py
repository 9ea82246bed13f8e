"""Where a vLLM CPU trial's worker and the benchmark client run: placement from what is pinned where (pure), and the
/proc reading and pinning on real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tuner.tune.cores import Pinned, parse_cpu_list, pin_threads, place, read_pinned, thread_cpus


def test_cpu_lists_parse_as_the_kernel_writes_them():
    assert parse_cpu_list("0-2,5") == (0, 1, 2, 5)
    assert parse_cpu_list("1\n") == (1,)


def test_a_trial_worker_goes_where_no_other_worker_is_pinned():
    # 2 cores, production's vLLM worker pinned to core 0 by vLLM's auto binding (as every vLLM's is here)
    # (the client, which takes the timings, is not put beside it either: it runs where the kernel puts it)
    p = place([0, 1], [Pinned(4242, "VLLM::Worker", (0,), 0.9)])
    assert p.worker_cpus == (1,) and p.client_cpus is None and p.bind == "1"
    assert "no other process pinned there" in p.note and p.pinned == {0: ["VLLM::Worker[4242] 90%"]}
    # 2 idle cores: the worker on one, the client on the other
    p = place([0, 1], [])
    assert p.worker_cpus == (1,) and p.client_cpus == (0,)
    # 4 cores, a worker on 0-1: the trial's worker on the free core but one, the client on the last free one
    p = place([0, 1, 2, 3], [Pinned(1, "VLLM::Worker", (0, 1), 1.5)])
    assert p.worker_cpus == (3,) and p.client_cpus == (2,)
    # 8 idle cores: the worker takes all but one, the client the one left
    p = place(range(8), [])
    assert p.worker_cpus == (1, 2, 3, 4, 5, 6, 7) and p.client_cpus == (0,)
    # every core has a pinned process: the least used one, and the note says so
    p = place([0, 1], [Pinned(1, "a", (0,), 0.9), Pinned(2, "b", (1,), 0.1)])
    assert p.worker_cpus == (1,) and "every core has a pinned process" in p.note
    assert place([0], []).client_cpus is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin one")
def test_pinned_processes_are_read_from_proc_and_threads_are_pinned():
    allowed = sorted(os.sched_getaffinity(0))
    one = allowed[-1]
    code = (
        "import threading, time; [threading.Thread(target=time.sleep, args=(60,)).start() for _ in range(3)]; "
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert all(cpus == tuple(allowed) for cpus in thread_cpus(proc.pid).values())
        assert not any(p.pid == proc.pid for p in read_pinned(allowed, sample_s=0.1))
        assert pin_threads(proc.pid, [one]) == 4  # the main thread and its three
        assert set(thread_cpus(proc.pid).values()) == {(one,)}
        found = [p for p in read_pinned(allowed, sample_s=0.1) if p.pid == proc.pid]
        assert len(found) == 1 and found[0].cpus == (one,) and 0 <= found[0].cpu_share < 0.5  # it sleeps
        assert not any(p.pid == proc.pid for p in read_pinned(allowed, sample_s=0.1, exclude=[proc.pid]))
    finally:
        proc.kill()
        proc.wait()
