"""Where a vLLM CPU trial server computes and where the benchmark client runs: disjoint cores, away from the cores
other vLLM workers are pinned to.

vLLM's CPU worker binds its OpenMP threads by ``VLLM_CPU_OMP_THREADS_BIND`` (default ``auto``,
vllm/utils/ompmultiprocessing.py): auto takes the CPUs of the worker's NUMA node, keeps the last
``reserve_cpu_num`` (1) for the other processes and binds the worker to the rest. On a 2-core host that is core 0
for every vLLM started there: production's worker, each trial's, any other's (measured: all 46 threads of a
running worker had ``Cpus_allowed_list: 0``, with ``GOMP_CPU_AFFINITY=0 OMP_NUM_THREADS=1``), while its engine core,
its API server and the benchmark client float over both. A pinned thread cannot be moved off a busy core, so a
trial's capacity depended on what else was pinned to core 0 at the time.

``place`` picks the trial worker's cores from those no other process is pinned to (fewest pinned processes first,
then the least CPU they used, then the highest index), leaving at least one core for the rest of the trial server and
the client, and gives the client the cores the worker does not have and nothing else is pinned to (the client takes
the timings: beside a pinned busy thread it would wait; with no such core it runs where the kernel puts it). ``read_pinned`` reads the pinned processes from
/proc; ``place`` is pure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner import procfs

__all__ = ["Pinned", "Placement", "read_pinned", "place", "parse_cpu_list", "thread_cpus", "pin_threads"]


@dataclass(frozen=True)
class Pinned:
    """A process whose threads may run on only some of the host's CPUs."""

    pid: int
    name: str
    cpus: tuple[int, ...]
    cpu_share: float  # of one core, over the sampling interval (0-n)


@dataclass(frozen=True)
class Placement:
    worker_cpus: tuple[int, ...]  # VLLM_CPU_OMP_THREADS_BIND of the trial server
    client_cpus: tuple[int, ...] | None  # the benchmark client's affinity; None: left to the kernel
    pinned: dict[int, list[str]] = field(default_factory=dict)  # cpu -> what was pinned there when placed
    note: str = ""

    @property
    def bind(self) -> str:
        return ",".join(str(c) for c in self.worker_cpus)

    def as_json(self) -> dict[str, object]:
        return {
            "worker_cpus": list(self.worker_cpus),
            "client_cpus": list(self.client_cpus or []) or None,
            "pinned": {str(k): v for k, v in self.pinned.items()},
            "note": self.note,
        }


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` -> (0, 1, 2, 5) (the kernel's Cpus_allowed_list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _status(pid: int | str, task: str = "") -> dict[str, str]:
    path = Path(f"/proc/{pid}") / (f"task/{task}" if task else "") / "status"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


_PF_KTHREAD = 0x00200000  # a kernel thread (per-CPU ones are pinned by design, and compete with nothing here)


def _is_kernel_thread(pid: int | str) -> bool:
    st = procfs.stat(pid)
    return st is None or bool(st.flags & _PF_KTHREAD)


def _cpu_ticks(pid: int) -> int | None:
    st = procfs.stat(pid)
    return st.cpu_ticks if st is not None else None


def thread_cpus(pid: int) -> dict[int, tuple[int, ...]]:
    """Each thread of ``pid`` -> the CPUs it may run on (from /proc/<pid>/task/<tid>/status)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        st = _status(pid, tid)
        if "Cpus_allowed_list" in st:
            out[int(tid)] = parse_cpu_list(st["Cpus_allowed_list"])
    return out


def pin_threads(pid: int, cpus: Sequence[int]) -> int:
    """Set the affinity of every thread of ``pid`` (threads started later inherit it); how many were set."""
    n = 0
    for tid in thread_cpus(pid):
        try:
            os.sched_setaffinity(tid, set(cpus))
            n += 1
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def read_pinned(allowed: Sequence[int], *, sample_s: float = 0.5, exclude: Sequence[int] = ()) -> list[Pinned]:
    """Processes whose affinity is a strict subset of ``allowed`` (a vLLM worker bound to its cores, a process under
    taskset), with the CPU they used over ``sample_s``. Kernel threads are left out (each CPU has its own)."""
    every = set(allowed)
    found: dict[int, tuple[str, tuple[int, ...]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        st = _status(entry)
        cpus = parse_cpu_list(st.get("Cpus_allowed_list", "")) if st.get("Cpus_allowed_list") else ()
        if cpus and set(cpus) < every and st.get("State", "")[:1] != "Z" and not _is_kernel_thread(entry):
            found[int(entry)] = (st.get("Name", "?"), cpus)
    before = {pid: _cpu_ticks(pid) for pid in found}
    t0 = time.monotonic()
    time.sleep(sample_s)
    secs = time.monotonic() - t0
    hz = procfs.CLK_TCK
    out = []
    for pid, (name, cpus) in found.items():
        a, b = before.get(pid), _cpu_ticks(pid)
        share = (b - a) / hz / secs if a is not None and b is not None and secs > 0 else 0.0
        out.append(Pinned(pid, name, cpus, round(max(0.0, share), 3)))
    return out


def place(allowed: Sequence[int], pinned: Sequence[Pinned]) -> Placement:
    """The trial worker's cores and the client's, from the CPUs this process may use and what is pinned where."""
    cpus = sorted(set(allowed))
    count = {c: 0 for c in cpus}
    share = {c: 0.0 for c in cpus}
    names: dict[int, list[str]] = {}
    for p in pinned:
        for c in p.cpus:
            if c in count:
                count[c] += 1
                share[c] += p.cpu_share / len(p.cpus)
                names.setdefault(c, []).append(f"{p.name}[{p.pid}] {p.cpu_share:.0%}")
    if len(cpus) < 2:
        return Placement(tuple(cpus), None, names, "one CPU: nothing to place")
    order = sorted(cpus, key=lambda c: (count[c], share[c], -c))
    free = [c for c in order if count[c] == 0]
    # the worker takes the unpinned cores but one (left to its engine core, API server and the client); at least one
    n = max(1, len(free) - 1)
    worker = tuple(sorted(order[:n]))
    # the client takes timings: never beside threads pinned where they cannot make way for it; with no such core
    # left it runs where the kernel puts it
    client = tuple(c for c in cpus if c not in worker and count[c] == 0)
    why = (
        f"worker on {','.join(map(str, worker))}: "
        + (
            "no other process pinned there"
            if all(count[c] == 0 for c in worker)
            else "the least pinned cores (every core has a pinned process)"
        )
        + (
            f"; client on {','.join(map(str, client))}"
            if client
            else "; client where the kernel puts it (the other cores have pinned processes)"
        )
    )
    return Placement(worker, client or None, names, why)
