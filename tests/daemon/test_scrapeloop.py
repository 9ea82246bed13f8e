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
    loop = ScrapeLoop(
        list(items),
        items.__getitem__,
        run or (lambda item: runs.append((item, clock()))),
        workers=2,
        clock=clock,
        sleep=clock.sleep,
    )
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
            assert started.wait(10)  # the first run (due at 0, handed out before this sleep) is in flight
            if not release.is_set():
                if self.now + dt < 3.5:
                    self.now += dt
                    return
                release.set()
            super().sleep(dt)

    clock = _Busy(until=6.0)
    loop, _ = _run({"a": 1.0}, clock, run=slow)
    assert loop.refused == 3  # due at 1, 2, 3 while the first run was in flight
    assert calls == [0.0, 4.0, 5.0, 6.0]


def _held_loop(
    items: dict[str, float], clock: list[float]
) -> tuple[ScrapeLoop[str], dict[str, threading.Event], threading.Event]:
    """A loop on a hand-moved clock whose runs each block until their item's event is set; its loop thread
    only looks at the clock when woken (so the test decides when runs are handed out)."""
    gates = {item: threading.Event() for item in items}
    wake = threading.Event()

    def sleep(dt: float) -> None:
        wake.wait(30)
        wake.clear()

    loop = ScrapeLoop(
        list(items),
        items.__getitem__,
        lambda item: gates[item].wait(30),
        workers=2,
        clock=lambda: clock[0],
        sleep=sleep,
        start=0.0,
    )
    return loop, gates, wake


def test_settle_waits_for_the_runs_due_by_then_to_finish_and_no_others() -> None:
    clock = [0.0]
    loop, gates, wake = _held_loop({"a": 1.0, "b": 1.0}, clock)  # a due at 0, 1, 2...; b at 0.5, 1.5...
    loop.start()
    try:
        assert wait_until(lambda: "a" in loop._running, 10)  # noqa: SLF001 (a's first run is in flight)
        assert loop.settle(before=0.2, timeout=0.05) is False  # a's run (due 0) still going
        assert loop.settle(before=-0.1, timeout=0.05) is True  # nothing was due before the origin
        gates["a"].set()  # a's run lands: whoever waits for 0.2 is let go at once
        assert loop.settle(before=0.2, timeout=10) is True
        # b is due at 0.5 but the loop has not handed it out (its clock is still at 0): a reader at 0.6 waits for it
        assert loop.settle(before=0.6, timeout=0.05) is False
        clock[0] = 0.6
        wake.set()
        assert wait_until(lambda: "b" in loop._running, 10)  # noqa: SLF001
        assert loop.settle(before=0.6, timeout=0.05) is False  # handed out, not finished
        gates["b"].set()
        assert loop.settle(before=0.6, timeout=10) is True
        assert loop.settle(before=1.0, timeout=0.05) is False  # a's second run is due at 1.0: not handed out yet
    finally:
        for gate in gates.values():
            gate.set()
        loop.stop(wait=False)
        wake.set()


def test_settle_returns_once_the_loop_stops() -> None:
    clock = [0.0]
    loop, gates, wake = _held_loop({"a": 1.0}, clock)
    loop.start()
    assert wait_until(lambda: "a" in loop._running, 10)  # noqa: SLF001
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(loop.settle(before=0.5, timeout=30)))
    waiter.start()
    loop.stop(wait=False)
    waiter.join(10)
    gates["a"].set()
    wake.set()
    assert done == [True]  # not held for its 30 s: a stopping loop has nothing more to wait for


def test_unspread_first_runs_all_start_at_the_origin() -> None:
    """The alert groups' loop: every group's first evaluation at the origin, then each on its own interval."""
    clock = _Clock(until=4.0)
    runs: list[tuple[str, float]] = []
    loop = ScrapeLoop(
        ["a", "b"],
        {"a": 1.0, "b": 2.0}.__getitem__,
        lambda item: runs.append((item, clock())),
        workers=2,
        clock=clock,
        sleep=clock.sleep,
        start=0.5,
        spread=False,
    )
    clock.loop = loop
    loop.start()
    assert loop._thread is not None  # noqa: SLF001
    loop._thread.join(30)  # noqa: SLF001
    loop.stop()
    assert [t for i, t in runs if i == "a"] == [0.5, 1.5, 2.5, 3.5]
    assert [t for i, t in runs if i == "b"] == [0.5, 2.5]


def test_items_added_and_removed_while_it_runs_keep_their_own_intervals() -> None:
    """Kubernetes pods come and go: an added item runs within one interval and then every interval; a removed one
    is not run again, the others are untouched."""
    clock = _Clock(until=8.0)
    runs: list[tuple[str, float]] = []
    holder: list[ScrapeLoop[str]] = []

    def run(item: str) -> None:
        runs.append((item, clock()))
        if (item, clock()) == ("a", 2.0):
            holder[0].add("b", 1.0)
            holder[0].add("a", 5.0)  # already scheduled: its own interval stands
        if (item, clock()) == ("a", 4.0):
            holder[0].remove("a")

    loop = ScrapeLoop(["a", "c"], {"a": 1.0, "c": 2.0}.__getitem__, run, workers=2, clock=clock, sleep=clock.sleep)
    holder.append(loop)
    clock.loop = loop
    loop.start()
    assert loop._thread is not None  # noqa: SLF001
    loop._thread.join(30)  # noqa: SLF001
    loop.stop()
    assert [t for i, t in runs if i == "a"] == [0.0, 1.0, 2.0, 3.0, 4.0]  # removed at 4: not run again
    assert [t for i, t in runs if i == "c"] == [1.0, 3.0, 5.0, 7.0]  # untouched
    b = [t for i, t in runs if i == "b"]
    # due within an interval of the add at 2.0 (this fake sleep is not woken by it: the first run is at 3.0 at the
    # latest), then every interval in its own phase
    assert 2.0 <= b[0] <= 3.0 and 2.0 <= b[1] - 1.0 < 3.0 and len(b) >= 5, b
    assert all(abs(y - x - 1.0) < 1e-9 for x, y in zip(b[1:], b[2:])), b
