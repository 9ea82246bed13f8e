"""The flags a target runs with, and the managed servers tuner starts, supervises, drains and stops itself.

``flags_in_force`` is what every apply, rollback, tune and recommendation starts from. ``Servers`` keeps the
journal's record of each managed server (tuner/store/journal.py ``ManagedState``) true to its process: a start
waits for the health gate, a crash is restarted a bounded number of times, a drain lets in-flight requests finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.apply import managed as mg
from tuner.backends import backend as backend_of
from tuner.collect.scrape import scrape_target
from tuner.config import Config, Target
from tuner.errors import ApplyError, FlagError, ServerStartError, TunerError
from tuner.flags import spec, validate
from tuner.store import journal as jr
from tuner.store.journal import ApplyOutcome, ApplyState, ServerState

__all__ = ["Servers", "canonical", "busy", "flags_in_force"]

_IN_FLIGHT_TIMEOUT_S = 15.0


def canonical(backend: str, flags: dict[str, Any]) -> dict[str, Any]:
    """Flags by tuner's names, validated; names not on the allow-list are not tuner's business and are left out."""
    out = {}
    for name, value in flags.items():
        for candidate in (name, "--" + name):
            try:
                s = spec(backend, candidate)
            except FlagError:
                continue
            out[s.name] = validate(backend, s.name, value)
            break
    return out


def flags_in_force(engine: Any, t: Target, *, journaled: bool = True) -> dict[str, Any]:
    """The tunable flags the target runs with, as tuner knows them (tuner's names). ``journaled=False``: the
    caller knows the journal holds no apply of the target (a fleet asks for every target at once).

    Managed: what tuner last started it with, unless the config's flags changed since (then the config's).
    Otherwise: the flags of the last apply whose new flags stand (kept, or inconclusive under on_inconclusive: keep) or of the
    last rollback, else the config's ``flags``.
    """
    if t.managed is not None:
        st = jr.get_managed(engine, t.name)
        base = canonical(t.backend, dict(t.managed.flags))
        return dict(st.flags) if st is not None and st.config_flags == base else base
    if not journaled:
        return canonical(t.backend, dict(t.flags))
    for a in jr.list_applies(engine, target=t.name):
        if jr.new_flags_stand(a) or (
            a.state == ApplyState.DONE and (a.kind, a.outcome) == ("rollback", ApplyOutcome.ROLLED_BACK)
        ):
            return dict(a.new_flags)
    return canonical(t.backend, dict(t.flags))


def busy(engine: Any, cfg: Config, t: Target, *, shadow: bool = True) -> list[int]:
    """Open applies on ``t`` or on any replica of its group (a rolling apply holds them all); ``shadow=False``
    leaves out tuning runs beside production (they do not touch it)."""
    return [a for m in cfg.group(t) for a in jr.open_applies_for(engine, m.name, shadow=shadow)]


@dataclass
class Servers:
    """The managed servers of one config and store. ``say`` prints progress (already redacted by the caller's
    wrapper); ``clock`` is wall time (tests inject it)."""

    cfg: Config
    store: Any  # tuner.store.Store
    config_dir: Path
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.time

    @property
    def engine(self) -> Any:
        return self.store.engine

    def config_flags(self, t: Target) -> dict[str, Any]:
        assert t.managed is not None
        return canonical(t.backend, dict(t.managed.flags))

    def running(self, t: Target) -> mg.Running | None:
        st = jr.get_managed(self.engine, t.name)
        if st is None or not mg.is_alive(st.pid, st.proc_start):
            return None
        assert st.pid is not None and st.proc_start is not None
        return mg.Running(st.pid, st.proc_start, st.argv, mg.log_path(t, self.config_dir))

    def save(
        self,
        t: Target,
        r: mg.Running | None,
        flags: dict[str, Any],
        state: str,
        note: str = "",
        restarts: list[int] | None = None,
    ) -> None:
        old = jr.get_managed(self.engine, t.name)
        now_ms = int(self.clock() * 1000)
        jr.save_managed(
            self.engine,
            jr.ManagedState(
                target=t.name,
                pid=r.pid if r else None,
                proc_start=r.start if r else None,
                argv=r.argv if r else (old.argv if old else []),
                flags=flags,
                config_flags=self.config_flags(t),
                started_ms=now_ms if r else (old.started_ms if old else now_ms),
                restarts=restarts if restarts is not None else (old.restarts if old else []),
                state=state,
                updated_ms=now_ms,
                note=note,
            ),
        )

    def launch(
        self,
        t: Target,
        flags: dict[str, Any],
        *,
        restarts: list[int] | None = None,
        spawned: Callable[[mg.Running], None] | None = None,
    ) -> mg.Running:
        """Start the managed server with ``flags``, record it, wait for the health gate. ServerStartError if not.

        ``spawned`` is told as soon as the process exists (the journal's health_check step starts there).
        """
        assert t.managed is not None
        argv = mg.build_argv(t, flags)
        r = mg.start_server(argv, mg.server_env(t), mg.log_path(t, self.config_dir), nice=t.managed.nice)
        self.save(t, r, flags, ServerState.RUNNING, restarts=restarts)
        if spawned is not None:
            spawned(r)
        try:
            took = mg.wait_healthy(r, t.url, t.managed.start_timeout.total_seconds())
            mg.yield_engine_core(r, t.managed.engine_core_nice)
            gate = mg.health_gate(t)
        except ServerStartError:
            # Up but not serving (or never up): stop it, or it would hold the port against the next start.
            mg.stop_server(r, grace_s=5.0)
            self.save(t, None, flags, ServerState.CRASHED, restarts=restarts)
            raise
        self.say(f"{t.name}: healthy after {took:.1f}s ({gate}); pid {r.pid}{mg.yield_note(r, why=True)}")
        return r

    def start(self, t: Target) -> mg.Running:
        if t.managed is None:
            raise ApplyError(f"target {t.name!r} is not managed (no managed: section); tuner cannot start it")
        r = self.running(t)
        if r is not None:
            self.say(f"{t.name}: already running, pid {r.pid}")
            return r
        flags = flags_in_force(self.engine, t)
        try:
            return self.launch(t, flags)
        except ServerStartError as exc:
            self.save(t, None, flags, ServerState.CRASHED, note=str(exc).splitlines()[0])
            raise

    def stop(self, t: Target, *, state: str = ServerState.STOPPED) -> str:
        r = self.running(t)
        how = "was not running" if r is None else self.drain(t, r)
        self.save(t, None, flags_in_force(self.engine, t) if t.managed else {}, state)
        return how

    def drain(self, t: Target, r: mg.Running) -> str:
        assert t.managed is not None
        grace = t.managed.drain_timeout.total_seconds()
        if backend_of(t.backend).drain == "slots_idle":
            # llama-server stops decoding at the first signal but exits only at the second (bench/results/
            # 2026-11-21-1037-apply.md): waiting longer in between only keeps connections hanging.
            idle = mg.drain_llama(t.url, grace)
            return f"{idle}; " + mg.stop_server(r, grace_s=0.5)
        # vLLM got --shutdown-timeout: on SIGTERM it finishes in-flight requests for up to that long.
        return mg.stop_server(r, grace_s=grace + 15.0)

    def supervise(self, t: Target) -> str | None:
        """Start a managed server that should run and does not; restarts after a crash are bounded."""
        if t.managed is None or busy(self.engine, self.cfg, t, shadow=False):  # a tune beside production: keep it up
            return None
        st = jr.get_managed(self.engine, t.name)
        if st is not None and st.state in (ServerState.STOPPED, ServerState.GIVEN_UP):
            return None
        if st is not None and mg.is_alive(st.pid, st.proc_start):
            return None
        now = self.clock()
        window_ms = t.managed.restart_window.total_seconds() * 1000
        restarts = [ms for ms in (st.restarts if st else []) if ms >= now * 1000 - window_ms]
        if st is not None and st.state in (ServerState.RUNNING, ServerState.CRASHED):
            why = mg.error_line(mg.log_path(t, self.config_dir))
            if len(restarts) >= t.managed.max_restarts:
                self.save(
                    t,
                    None,
                    st.flags,
                    ServerState.GIVEN_UP,
                    note=f"{len(restarts)} restarts in "
                    f"{t.managed.restart_window.total_seconds():.0f}s; last error: {why}",
                    restarts=restarts,
                )
                return f"{t.name}: gave up after {len(restarts)} restarts (last error: {why})"
            restarts.append(int(now * 1000))
            self.say(f"{t.name}: server died ({why}); restart {len(restarts)} of {t.managed.max_restarts}")
        flags = flags_in_force(self.engine, t)
        try:
            self.launch(t, flags, restarts=restarts)
        except ServerStartError as exc:
            self.save(t, None, flags, ServerState.CRASHED, note=str(exc).splitlines()[0], restarts=restarts)
            return f"{t.name}: start failed: {str(exc).splitlines()[0]}"
        return f"{t.name}: started"

    def in_flight(self, t: Target) -> int | None:
        """Requests running or waiting on the server now, from one scrape of its /metrics (None: no answer).

        A loaded vLLM CPU answers /metrics in 4-10 s (its HTTP server shares cores with the engine), so this one
        read waits longer than a scrape does; the server keeps serving meanwhile."""
        try:
            snap = scrape_target(
                t, self.cfg, now=self.clock(), timeout_s=max(_IN_FLIGHT_TIMEOUT_S, self.cfg.timeout(t).total_seconds())
            )
        except TunerError:
            return None
        return round(sum((e.requests_running or 0.0) + (e.requests_waiting or 0.0) for e in snap.engines))
