"""The scrape loop's schedule on a fake clock: spread first runs, one interval apart, a late loop back in phase
(not a burst), a busy target refused instead of run twice."""

from __future__ import annotations

import threading

from tests.helpers import wait_until
from tuner.daemon.scrapeloop import ScrapeLoop


class _Clock:
    """Moves only when the loop sleeps, and only once every run handed out so far has finished."""

    def __init__(self, until: float) -> None:
        self.now, self.until = 0.0, until
        self.loop: ScrapeLoop[str] | None = None
        self.jumps: dict[float, float] = {}  # at this time the clock leaps on by that much (a stalled machine)

    def __call__(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        assert self.loop is not None
        assert wait_until(lambda: not self.loop._running, 10)  # noqa: SLF001 (the test's view of in-flight runs)
        for at, leap in list(self.jumps.items()):
            if self.now < at <= self.now + dt:
                del self.jumps[at]
                self.now = at + leap
                return
        self.now += dt
        if self.now > self.until:
            self.loop._stopping = True  # noqa: SLF001


def _run(items: dict[str, float], clock: _Clock, run=None) -> tuple[ScrapeLoop[str], list[tuple[str, float]]]:
    runs: list[tuple[str, float]] = []
    loop = ScrapeLoop(list(items), items.__getitem__, run or (lambda item: runs.append((item, clock()))),
                      workers=2, clock=clock, sleep=clock.sleep)
    clock.loop = loop
    loop.start()
    assert loop._thread is not None  # noqa: SLF001
    loop._thread.join(30)  # noqa: SLF001
    loop.stop()
    return loop, runs


def test_each_target_runs_once_an_interval_with_first_runs_spread() -> None:
    clock = _Clock(until=6.0)
    loop, runs = _run({"a": 1.0, "b": 2.0}, clock)
    assert [t for i, t in runs if i == "a"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert [t for i, t in runs if i == "b"] == [1.0, 3.0, 5.0]  # second of two: half an interval in
    assert loop.refused == loop.skipped == 0


def test_a_late_loop_runs_once_and_comes_back_in_phase() -> None:
    clock = _Clock(until=9.0)
    clock.jumps[3.0] = 3.5  # due at 3.0, the loop next looks at 6.5: three runs missed (3, 4, 5; 6 is due)
    loop, runs = _run({"a": 1.0}, clock)
    assert [t for _, t in runs] == [0.0, 1.0, 2.0, 6.5, 7.0, 8.0, 9.0]  # one late run, then 7, 8, 9 in phase
    assert loop.skipped == 3


def test_a_target_still_being_scraped_is_refused_not_run_twice() -> None:
    release, started = threading.Event(), threading.Event()
    calls: list[float] = []

    def slow(item: str) -> None:
        calls.append(clock())
        if len(calls) == 1:
            started.set()
            release.wait(30)

    class _Busy(_Clock):
        def sleep(self, dt: float) -> None:  # time passes while the first run hangs; released at 3.5
            if started.is_set() and not release.is_set():
                if self.now + dt < 3.5:
                    self.now += dt
                    return
                release.set()
            super().sleep(dt)

    clock = _Busy(until=6.0)
    loop, _ = _run({"a": 1.0}, clock, run=slow)
    assert loop.refused == 3  # due at 1, 2, 3 while the first run was in flight
    assert calls == [0.0, 4.0, 5.0, 6.0]
