"""Progress on long waits: whenever a command has said nothing for a few seconds, say what it is waiting for.

On a terminal the line is rewritten in place and cleared before the next real line; piped, it is a plain line
(never more than one per ``every`` seconds); ``--json`` commands use none.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Heartbeat"]


class Heartbeat:
    """``with Heartbeat(what) as hb:`` run the long call, passing ``hb.say`` as its progress callback."""

    def __init__(
        self,
        what: Callable[[], str | None] | None = None,
        *,
        every: float = 5.0,
        out: TextIO | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        poll: float = 0.5,
    ) -> None:
        self.what = what
        self.every, self.poll, self.clock = every, poll, clock
        self.out = out if out is not None else sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self._lock = threading.Lock()
        self._last = clock()
        self._shown = False  # a progress line is on screen (tty)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, line: str) -> None:
        """A real line: clears the progress line first, and restarts the quiet timer."""
        with self._lock:
            self._clear()
            print(line, file=self.out, flush=True)
            self._last = self.clock()

    def tick(self) -> bool:
        """Say what is waited for if nothing was said for ``every`` seconds; whether it did."""
        with self._lock:
            if self.what is None or self.clock() - self._last < self.every:
                return False
            text = self.what()
            if not text:
                return False
            if self.tty:
                self.out.write(f"\r\033[K… {text}")
                self._shown = True
            else:
                print(f"… {text}", file=self.out)
            self.out.flush()
            self._last = self.clock()
            return True

    def _clear(self) -> None:
        if self._shown:
            self.out.write("\r\033[K")
            self._shown = False

    def __enter__(self) -> Heartbeat:
        self._last = self.clock()
        self._stop.clear()  # one Heartbeat may serve several waits in turn
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.tick()
            except Exception:  # noqa: BLE001  (a progress line must never break the command)
                pass

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            self._clear()
            self.out.flush()
