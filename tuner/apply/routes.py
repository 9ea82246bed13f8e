"""How a change of flags reaches a server: one class per way, each with the same five answers.

  * ``Managed``: tuner started the server; drain the old process, start the new argv, health gate;
  * ``Hook``: an argv template from ``apply.hook.command``, run by tuner, then the health gate;
  * ``Systemd``: a drop-in with ``TUNER_FLAGS`` for ``apply.hook.systemd_unit``, daemon-reload, restart, gate;
  * ``ByHand``: tuner says what to change and waits for ``tuner apply-recommendation ID --applied``;
  * ``Rolling``: a replica group behind HAProxy; one replica at a time is drained in the balancer until idle,
    restarted like ``Managed``, health-gated, put back and waited on until HAProxy's own check says UP;
  * ``BlueGreen``: one managed server behind HAProxy with room beside it for a second: the new flags start on a
    spare port and join the backend before the server is drained and restarted with them, then the spare leaves;
  * ``Kube`` (kube.py): a Deployment's or StatefulSet's container args patched; Kubernetes rolls the pods, tuner
    follows the rollout and patches the previous args back to restore.

The apply flow (flow.py) asks a route for the argv before and after, the lines of a dry run, whether tuner itself
restarts the server (the restart budget, the outage), how to switch the server to some flags, what the server
said when it failed, and (``settle``, after a tuner died mid-apply) to leave nothing half-switched in a balancer;
it never asks which route it has. ``tests/apply/test_routes.py`` runs the same checks over
every route. ``outage``: whether clients go unserved while it switches (no for a rolling apply: the other
replicas serve).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tuner.apply import managed as mg
from tuner.apply.balancer import HAProxy
from tuner.apply.kube import Kube
from tuner.apply.launch import free_port, render_flags
from tuner.apply.port import Canaried, Plan, Route, Steps
from tuner.backends import backend as backend_of
from tuner.config import Target
from tuner.errors import ApplyError, ConfigError, ServerStartError
from tuner.flags import render
from tuner.store import journal as jr
from tuner.store.journal import ApplyState, ApplyStep, ServerState

__all__ = [
    "Route",
    "Canaried",
    "Managed",
    "Hook",
    "Systemd",
    "ByHand",
    "Rolling",
    "BlueGreen",
    "Kube",
    "ROUTES",
    "route_for",
    "flags_argv",
    "hook_argv",
]

_HOOK_HEALTH_TIMEOUT_S = 600.0


def flags_argv(backend: str, flags: dict[str, Any]) -> list[str]:
    """Allow-listed flags (tuner's names) as argv elements, e.g. ["--max-num-seqs", "8"]."""
    return render_flags(render(backend, flags), dashed=backend_of(backend).dashed_flags, reserved=frozenset())


def hook_argv(target: Target, flags: dict[str, Any], diff: dict[str, Any], rec_id: int | None) -> list[str]:
    """The hook's argv template filled in: {flags} / {diff} elements expand to several, others are substituted."""
    hook = target.apply.hook
    assert hook is not None and hook.command is not None
    values = {"target": target.name, "url": target.url, "recommendation": "" if rec_id is None else str(rec_id)}
    out: list[str] = []
    for element in hook.command:
        if element == "{flags}":
            out += flags_argv(target.backend, flags)
        elif element == "{diff}":
            out += flags_argv(target.backend, diff)
        else:
            try:
                out.append(element.format(**values))
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(
                    "config",
                    f"targets[{target.name}].apply.hook.command",
                    f"{element!r}: unknown placeholder {exc} (use {{target}}, {{url}}, "
                    "{recommendation}, or a whole {flags} / {diff} element)",
                ) from None
    return out


def _config_replicas(self: Any, ap: Steps, t: Target, start: float, end: float) -> list[str]:
    return [m.name for m in ap.cfg.group(t)]


class Managed:
    name, restarts, outage, whole_group = "managed", True, True, False
    replicas = _config_replicas

    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        return mg.build_argv(t, flags)

    def describe(self, p: Plan) -> list[str]:
        return ["new argv: " + json.dumps(p.new_argv)]

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        t = p.target
        r = ap.running(t)
        ap.step(aid, ApplyStep.DRAINING, f"pid {r.pid}" if r else "no server running", state=ApplyState.DRAINING)
        if r is not None:
            ap.step(aid, ApplyStep.STOPPED, ap.drain(t, r))
        ap.step(aid, ApplyStep.STARTING, json.dumps(mg.build_argv(t, flags)), state=ApplyState.STARTING)
        r = ap.launch(
            t,
            flags,
            spawned=lambda r: ap.step(
                aid, ApplyStep.HEALTH_CHECK, f"pid {r.pid} started", state=ApplyState.HEALTH_CHECK
            ),
        )
        ap.step(aid, ApplyStep.HEALTHY, f"/health 200 and one real request; pid {r.pid}{mg.yield_note(r)}")

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        r = ap.running(p.target)
        if r is not None:
            ap.step(aid, ApplyStep.STOPPED, ap.drain(p.target, r))
        ap.launch(p.target, p.old_flags)
        return True

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        if isinstance(exc, ServerStartError) and exc.exited:  # the process ended: its log says why
            return mg.error_line(mg.log_path(t, ap.config_dir))
        return str(exc).splitlines()[0]

    def in_flight(self, ap: Steps, t: Target) -> int | None:
        return ap.in_flight(t)

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        return None


class _Gated:
    """Routes that restart a server tuner does not own, then wait for its health gate."""

    name, restarts, outage, whole_group = "hook", True, True, False
    replicas = _config_replicas

    def commands(self, ap: Steps, aid: int, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[list[str]]:
        raise NotImplementedError

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        t = p.target
        ap.step(aid, ApplyStep.STARTING, "", state=ApplyState.STARTING)
        self._run(ap, aid, t, flags, diff)
        ap.step(aid, ApplyStep.HEALTH_CHECK, "", state=ApplyState.HEALTH_CHECK)
        ap.step(aid, ApplyStep.HEALTHY, self._gate(ap, t))

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        self._run(ap, aid, p.target, p.old_flags, p.old_flags)
        self._gate(ap, p.target)
        return True

    @staticmethod
    def _gate(ap: Steps, t: Target) -> str:
        """The health gate, tried until it passes: the hook may return before the server listens again."""
        deadline = ap.clock() + _HOOK_HEALTH_TIMEOUT_S
        last = ""
        while ap.clock() < deadline:
            try:
                return mg.health_gate(t, timeout_s=30)
            except ServerStartError as exc:
                last = str(exc)
                ap.sleep(1.0)
        raise ServerStartError(f"not healthy {_HOOK_HEALTH_TIMEOUT_S:.0f}s after the hook: {last}", None, [])

    def _run(self, ap: Steps, aid: int, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        hook = t.apply.hook
        assert hook is not None
        for argv in self.commands(ap, aid, t, flags, diff):
            ap.step(aid, ApplyStep.HOOK, json.dumps(argv))
            try:
                proc = subprocess.run(
                    argv, capture_output=True, text=True, timeout=hook.timeout.total_seconds(), stdin=subprocess.DEVNULL
                )
            except FileNotFoundError:
                raise ApplyError(
                    f"hook {argv[0]!r} not found; apply by hand: restart {t.name} with "
                    f"{' '.join(flags_argv(t.backend, flags))}"
                ) from None
            except subprocess.TimeoutExpired:
                raise ApplyError(
                    f"hook {json.dumps(argv)} did not finish in {hook.timeout.total_seconds():.0f}s"
                ) from None
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                raise ApplyError(f"hook {json.dumps(argv)} exited {proc.returncode}: {tail[0]}")

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        return str(exc).splitlines()[0]

    def in_flight(self, ap: Steps, t: Target) -> int | None:
        return None

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        return None


class Hook(_Gated):
    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        return hook_argv(t, flags, diff, None)

    def describe(self, p: Plan) -> list[str]:
        return ["hook argv: " + json.dumps(p.new_argv)]

    def commands(self, ap: Steps, aid: int, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[list[str]]:
        return [hook_argv(t, flags, diff, None)]


class Systemd(_Gated):
    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        return ["systemctl", "restart", self._unit(t)]

    def describe(self, p: Plan) -> list[str]:
        t = p.target
        flags = " ".join(flags_argv(t.backend, p.new_flags))
        return [
            f"systemd: drop-in {self.dropin_path(t)} with TUNER_FLAGS={flags}, then systemctl daemon-reload "
            f"and systemctl restart {self._unit(t)}"
        ]

    def commands(self, ap: Steps, aid: int, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[list[str]]:
        path = self.dropin_path(t)
        text = (
            "# written by tuner: the flags it applied; the unit's ExecStart must use $TUNER_FLAGS\n"
            f'[Service]\nEnvironment="TUNER_FLAGS={" ".join(flags_argv(t.backend, flags))}"\n'
        )
        ap.step(aid, ApplyStep.DROPIN, f"{path}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as exc:
            raise ApplyError(
                f"cannot write the systemd drop-in {path}: {exc.strerror}; write it by hand:\n"
                f"{text}then run: systemctl daemon-reload && systemctl restart "
                f"{self._unit(t)}"
            ) from None
        return [["systemctl", "daemon-reload"], ["systemctl", "restart", self._unit(t)]]

    @staticmethod
    def _unit(t: Target) -> str:
        return (t.apply.hook.systemd_unit if t.apply.hook else None) or ""

    @staticmethod
    def dropin_path(t: Target) -> Path:
        hook = t.apply.hook
        assert hook is not None
        return Path(hook.systemd_dropin or f"/etc/systemd/system/{hook.systemd_unit}.d/tuner-flags.conf")


class ByHand:
    name, restarts, outage, whole_group = "manual", False, False, False
    replicas = _config_replicas

    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        return flags_argv(t.backend, flags)

    def describe(self, p: Plan) -> list[str]:
        return ["flags after: " + " ".join(p.new_argv)]

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        raise ApplyError(
            f"tuner does not restart {p.target.name}: restart it by hand with "
            f"{' '.join(flags_argv(p.target.backend, flags))}"
        )

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        return False

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        return str(exc).splitlines()[0]

    def in_flight(self, ap: Steps, t: Target) -> int | None:
        return None

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        return None


class _Balanced:
    """Routes of managed servers behind HAProxy: the argv is the managed one, tuner reads the in-flight count."""

    replicas = _config_replicas

    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        return mg.build_argv(t, flags)

    def in_flight(self, ap: Steps, t: Target) -> int | None:
        return ap.in_flight(t)

    @staticmethod
    def _lb(ap: Steps, t: Target) -> HAProxy:
        assert t.balancer is not None
        return HAProxy(t.balancer.socket, t.balancer.backend, clock=ap.clock, sleep=ap.sleep)


class Rolling(_Balanced):
    """A replica group behind HAProxy, tuner managing each replica: one at a time, the others serving."""

    name, restarts, outage, whole_group = "rolling", True, False, True

    def describe(self, p: Plan) -> list[str]:
        b = p.target.balancer
        assert b is not None
        return [
            f"rolling over the replicas of {p.target.group} one at a time, behind HAProxy backend {b.backend} "
            f"(drain until idle, restart, health gate, ready until UP); the others serve meanwhile",
            "new argv (per replica, its own port): " + json.dumps(p.new_argv),
        ]

    @staticmethod
    def _runs(ap: Steps, m: Target, flags: dict[str, Any]) -> bool:
        r = ap.running(m)
        return r is not None and mg.proc_argv(r.pid) == mg.build_argv(m, flags)

    def _one(self, ap: Steps, aid: int, m: Target, flags: dict[str, Any], lb: HAProxy) -> None:
        """Take replica ``m`` to ``flags`` while the others serve."""
        assert m.balancer is not None and m.replica is not None
        b, server = m.balancer, m.replica
        up, waited = lb.wait_others_up(server, b.up_timeout.total_seconds())
        if not up:
            raise ApplyError(
                f"no other replica of {m.group} is UP in HAProxy backend {b.backend} (waited {waited:.0f}s, "
                f"balancer.up_timeout): taking {server} out would leave no server for the clients"
            )
        if waited >= 0.2:
            ap.step(aid, ApplyStep.PEER_WAIT, f"{m.name}: waited {waited:.1f}s for {', '.join(up)} to be UP in HAProxy")
        ap.step(
            aid,
            ApplyStep.DRAINING,
            f"{m.name}: HAProxy {b.backend}/{server} drain; {', '.join(up)} serve",
            state=ApplyState.DRAINING,
        )
        drained, st = lb.drain(server, b.drain_timeout.total_seconds())
        ap.step(
            aid,
            "drained" if drained else "drain_timeout",
            f"{m.name}: {st.current} sessions, {st.queued} "
            f"queued in HAProxy" + ("" if drained else f" after {b.drain_timeout.total_seconds():g}s"),
        )
        r = ap.running(m)
        if r is not None:
            ap.step(aid, ApplyStep.STOPPED, f"{m.name}: {ap.drain(m, r)}")
        ap.step(aid, ApplyStep.STARTING, f"{m.name}: {json.dumps(mg.build_argv(m, flags))}", state=ApplyState.STARTING)
        r = ap.launch(
            m,
            flags,
            spawned=lambda r: ap.step(
                aid, ApplyStep.HEALTH_CHECK, f"{m.name}: pid {r.pid} started", state=ApplyState.HEALTH_CHECK
            ),
        )
        st = lb.ready(server, b.up_timeout.total_seconds())
        ap.step(aid, ApplyStep.IN_ROTATION, f"{m.name}: HAProxy {b.backend}/{server} {st.status}; pid {r.pid}")

    def canary(self, ap: Steps, aid: int, p: Plan) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """The recommendation's replica takes the flags; a peer keeps the old ones as the control."""
        t = p.target
        control = next(m for m in ap.cfg.group(t) if m.name != t.name)
        ap.step(
            aid, ApplyStep.CANARY, f"{t.name} takes the new flags; {control.name} keeps the old ones as the control"
        )
        self._one(ap, aid, t, p.new_flags, self._lb(ap, t))
        return (t.name, [t.name]), (control.name, [control.name])

    def promote(self, ap: Steps, aid: int, p: Plan) -> None:
        lb = self._lb(ap, p.target)
        for m in ap.cfg.group(p.target):
            if m.name != p.target.name:
                self._one(ap, aid, m, p.new_flags, lb)
        ap.step(aid, ApplyStep.HEALTHY, f"rolled out to all {len(ap.cfg.group(p.target))} replicas of {p.target.group}")

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        lb = self._lb(ap, p.target)
        members = ap.cfg.group(p.target)
        for m in members:
            self._one(ap, aid, m, flags, lb)
        ap.step(
            aid,
            ApplyStep.HEALTHY,
            f"all {len(members)} replicas of {p.target.group} run the flags and are UP in HAProxy",
        )

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        """Every replica not running the old flags goes back to them, one at a time; one that does is put back in
        rotation if a failed switch left it drained."""
        lb = self._lb(ap, p.target)
        # the replicas not running first: while one is down, another must be UP before it can be drained
        for m in sorted(ap.cfg.group(p.target), key=lambda m: ap.running(m) is not None):
            assert m.replica is not None
            if self._runs(ap, m, p.old_flags):
                if lb.stat(m.replica).status != "UP":
                    lb.ready(m.replica, m.balancer.up_timeout.total_seconds() if m.balancer else 30.0)
                continue
            self._one(ap, aid, m, p.old_flags, lb)
        return True

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        if isinstance(exc, ServerStartError) and exc.exited:
            for m in ap.cfg.group(t):  # the replica that failed is the one not running
                if ap.running(m) is None:
                    return f"{m.name}: {mg.error_line(mg.log_path(m, ap.config_dir))}"
        return str(exc).splitlines()[0]

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        """Replicas that run and were left drained go back in rotation."""
        lb = self._lb(ap, t)
        for m in ap.cfg.group(t):  # `ready` is idempotent; a drained replica whose check fails reads DOWN, not DRAIN
            assert m.replica is not None and m.balancer is not None
            if ap.running(m) is not None:
                st = lb.ready(m.replica, m.balancer.up_timeout.total_seconds())
                ap.step(aid, ApplyStep.IN_ROTATION, f"{m.name}: HAProxy {st.status}")


class BlueGreen(_Balanced):
    """One managed server (blue) behind HAProxy, with room on the host for a second one beside it.

    To take it to some flags: a spare server (green) starts with them on a free port and joins the backend; once
    HAProxy's check says green is UP, blue is drained until idle and restarted with the same flags on its own port
    while green serves; blue back UP, green is drained and removed from the backend. Clients always have a server
    that is UP, and a config that does not start fails on the spare, before blue is touched. Blue keeps its address
    (the one tuner scrapes, the config names and the verdict watches), at the cost of a second start.
    The room (memory for both at once) is the app's answer, ``Steps.room``; without room it refuses."""

    name, restarts, outage, whole_group = "blue_green", True, False, False

    def describe(self, p: Plan) -> list[str]:
        b = p.target.balancer
        assert b is not None
        return [
            f"blue/green behind HAProxy backend {b.backend}: the new flags start on a spare port and join it; "
            f"{b.server} is drained until idle, restarted with them on its own port and put back; the spare is "
            "drained and removed (clients always have a server UP)",
            "new argv: " + json.dumps(p.new_argv),
        ]

    @staticmethod
    def spare(t: Target, port: int | None = None) -> Target:
        """The spare server of ``t``: the same target on another port, its own name (its log and run state), the
        same served model name (clients ask for it by that name)."""
        assert t.managed is not None and t.balancer is not None and t.balancer.server is not None
        host, own = t.host_port
        return t.model_copy(
            update={
                "name": f"{t.name}~spare",
                "url": f"http://{host}:{port if port is not None else own}",
                "replica": f"{t.balancer.server[:56]}-spare",
                "managed": t.managed.model_copy(update={"served_model_name": t.served_name}),
            }
        )

    def _spare_now(self, ap: Steps, t: Target) -> Target | None:
        """The spare as it runs (its port from the argv it was started with), if a spare was recorded."""
        st = jr.get_managed(ap.engine, self.spare(t).name)
        if st is None or "--port" not in st.argv:
            return None
        return self.spare(t, int(st.argv[st.argv.index("--port") + 1]))

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        t = p.target
        fits, why = ap.room(t, flags) if ap.room is not None else (False, "no memory reading was given to tuner")
        if not fits:
            raise ApplyError(
                f"blue/green needs room for a second server beside {t.name}: {why}; free memory, or "
                f"apply with an outage by removing targets[{t.name}].balancer"
            )
        ap.step(aid, ApplyStep.ROOM, f"a second server fits: {why}")
        self._converge(ap, aid, t, flags, spare_ok=True)
        ap.step(aid, ApplyStep.HEALTHY, f"{t.name} runs the flags and is UP in HAProxy; the spare is gone")

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        fits, why = ap.room(p.target, p.old_flags) if ap.room is not None else (False, "no memory reading")
        if not fits:
            ap.step(aid, ApplyStep.ROOM, f"no room for a spare ({why}): {p.target.name} restarts in place, an outage")
        self._converge(ap, aid, p.target, p.old_flags, spare_ok=fits)
        return True

    def _converge(self, ap: Steps, aid: int, t: Target, flags: dict[str, Any], *, spare_ok: bool) -> None:
        """Blue running ``flags`` and UP, no spare left; a spare with ``flags`` serves while blue restarts."""
        b, lb = t.balancer, self._lb(ap, t)
        assert b is not None and b.server is not None
        up_s = b.up_timeout.total_seconds()
        blue = ap.running(t)
        if blue is not None and mg.proc_argv(blue.pid) == mg.build_argv(t, flags):
            lb.ready(b.server, up_s)  # idempotent; a server left drained reads DOWN if its check failed meanwhile
            self._remove_spare(ap, aid, t, lb)
            return
        if blue is not None:
            spare = self._spare_now(ap, t)
            r = ap.running(spare) if spare is not None else None
            if spare is None or r is None or mg.proc_argv(r.pid) != mg.build_argv(spare, flags):
                self._remove_spare(ap, aid, t, lb)
                spare = self._start_spare(ap, aid, t, flags, lb) if spare_ok else None
            if spare is not None:
                ap.step(
                    aid,
                    ApplyStep.DRAINING,
                    f"{t.name}: HAProxy {b.backend}/{b.server} drain; {spare.replica} serves",
                    state=ApplyState.DRAINING,
                )
                drained, st = lb.drain(b.server, b.drain_timeout.total_seconds())
                ap.step(
                    aid,
                    "drained" if drained else "drain_timeout",
                    f"{t.name}: {st.current} sessions, {st.queued} queued in HAProxy",
                )
            ap.step(aid, ApplyStep.STOPPED, f"{t.name}: {ap.drain(t, blue)}")
        ap.step(aid, ApplyStep.STARTING, f"{t.name}: {json.dumps(mg.build_argv(t, flags))}", state=ApplyState.STARTING)
        r = ap.launch(
            t,
            flags,
            spawned=lambda r: ap.step(
                aid, ApplyStep.HEALTH_CHECK, f"{t.name}: pid {r.pid} started", state=ApplyState.HEALTH_CHECK
            ),
        )
        st = lb.ready(b.server, up_s)
        ap.step(aid, ApplyStep.IN_ROTATION, f"{t.name}: HAProxy {b.backend}/{b.server} {st.status}; pid {r.pid}")
        self._remove_spare(ap, aid, t, lb)

    def _start_spare(self, ap: Steps, aid: int, t: Target, flags: dict[str, Any], lb: HAProxy) -> Target:
        assert t.balancer is not None
        spare = self.spare(t, free_port())
        assert spare.replica is not None
        ap.step(
            aid,
            ApplyStep.STARTING,
            f"{spare.name} on {spare.url}: {json.dumps(mg.build_argv(spare, flags))}",
            state=ApplyState.STARTING,
        )
        r = ap.launch(
            spare,
            flags,
            spawned=lambda r: ap.step(
                aid, ApplyStep.HEALTH_CHECK, f"{spare.name}: pid {r.pid} started", state=ApplyState.HEALTH_CHECK
            ),
        )
        host, port = spare.host_port
        lb.add(spare.replica, host, port)
        st = lb.ready(spare.replica, t.balancer.up_timeout.total_seconds())
        ap.step(
            aid, ApplyStep.IN_ROTATION, f"{spare.name}: HAProxy {lb.backend}/{spare.replica} {st.status}; pid {r.pid}"
        )
        return spare

    def _remove_spare(self, ap: Steps, aid: int, t: Target, lb: HAProxy) -> None:
        assert t.balancer is not None
        spare = self._spare_now(ap, t) or self.spare(t)
        assert spare.replica is not None
        if spare.replica in lb.stats():
            drained, st = lb.drain(spare.replica, t.balancer.drain_timeout.total_seconds())
            ap.step(
                aid,
                "drained" if drained else "drain_timeout",
                f"{spare.name}: {st.current} sessions, {st.queued} queued in HAProxy",
            )
        r = ap.running(spare)
        if r is not None:
            ap.step(aid, ApplyStep.STOPPED, f"{spare.name}: {ap.drain(spare, r)}")
        if spare.replica in lb.stats():
            lb.remove(spare.replica)
            ap.step(aid, ApplyStep.REMOVED, f"{spare.name}: HAProxy {lb.backend}/{spare.replica} deleted")
        jr.forget_managed(ap.engine, spare.name)

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        if isinstance(exc, ServerStartError) and exc.exited:
            spare = self.spare(t)
            st = jr.get_managed(ap.engine, spare.name)
            who = spare if st is not None and st.state == ServerState.CRASHED else t
            return f"{who.name}: {mg.error_line(mg.log_path(who, ap.config_dir))}"
        return str(exc).splitlines()[0]

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        """Blue, if it runs, back in rotation; the spare drained and removed."""
        assert t.balancer is not None and t.balancer.server is not None
        lb = self._lb(ap, t)
        if ap.running(t) is not None:
            st = lb.ready(t.balancer.server, t.balancer.up_timeout.total_seconds())
            ap.step(aid, ApplyStep.IN_ROTATION, f"{t.name}: HAProxy {lb.backend}/{t.balancer.server} {st.status}")
            self._remove_spare(ap, aid, t, lb)


ROUTES: dict[str, Route] = {
    "managed": Managed(),
    "hook": Hook(),
    "systemd": Systemd(),
    "manual": ByHand(),
    "rolling": Rolling(),
    "blue_green": BlueGreen(),
    "kubernetes": Kube(),
}


def route_for(t: Target) -> Route:
    """The one place that decides how a target's flags change."""
    if t.kubernetes is not None:
        return ROUTES["kubernetes"]
    if t.managed is not None and t.balancer is not None and t.group is not None:
        return ROUTES["rolling"]
    if t.managed is not None and t.balancer is not None:
        return ROUTES["blue_green"]
    if t.managed is not None:
        return ROUTES["managed"]
    if t.apply.hook is not None:
        return ROUTES["hook"] if t.apply.hook.command is not None else ROUTES["systemd"]
    return ROUTES["manual"]
