"""What a route may ask of the apply flow, and what the flow asks of a route: the narrow interfaces between them.

The flow (flow.py) drives an apply through a ``Route`` (routes.py, kube.py) and hands itself in as ``Steps``: the
few operations a route needs to switch a server (journal a step, the managed server's process, start it through
the health gate, drain it, count what it serves). ``tuner tune`` holds its trial servers through the same port.
Routes never see the rest of the flow, and neither module imports the other's internals: flow.py imports routes,
routes import this module only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tuner.apply import managed as mg
from tuner.config import Config, Target
from tuner.errors import ApplyError, ServerStartError
from tuner.store.journal import ApplyState

__all__ = ["Steps", "Route", "Canaried", "Plan"]


class Steps(Protocol):
    """The apply flow as a route sees it."""

    @property
    def cfg(self) -> Config: ...

    @property
    def config_dir(self) -> Path: ...

    @property
    def clock(self) -> Callable[[], float]: ...  # wall time (tests inject it)

    @property
    def sleep(self) -> Callable[[float], None]: ...  # waits on ``clock``

    @property
    def room(self) -> Callable[[Target, dict[str, Any]], tuple[bool, str]] | None:
        """Whether a second server of the target with those flags fits beside the running one, and why."""
        ...

    @property
    def engine(self) -> Any: ...

    @property
    def store(self) -> Any: ...  # tuner.store.Store: which targets served in a window (a Kubernetes group's pods)

    def step(self, aid: int, name: str, detail: str = "", state: ApplyState | None = None) -> None:
        """Journal step ``name`` of apply ``aid`` (its detail redacted) and say it."""
        ...

    def running(self, t: Target) -> mg.Running | None:
        """The managed server of ``t`` tuner started, if it is alive."""
        ...

    def launch(
        self,
        t: Target,
        flags: dict[str, Any],
        *,
        restarts: list[int] | None = None,
        spawned: Callable[[mg.Running], None] | None = None,
    ) -> mg.Running:
        """Start ``t``'s managed server with ``flags`` through the health gate; ServerStartError if it fails."""
        ...

    def drain(self, t: Target, r: mg.Running) -> str:
        """Stop ``r`` letting in-flight requests finish (the backend's way); what happened, in words."""
        ...

    def in_flight(self, t: Target) -> int | None:
        """Requests running or waiting on ``t`` now (one scrape); None without an answer."""
        ...


class Route(Protocol):
    name: str  # the plan's and the journal's word for it: managed | hook | manual
    restarts: bool  # tuner itself restarts the server: the restart budget applies
    outage: bool  # clients go unserved while it switches: the CLI says for how long, the journal measures it
    whole_group: bool  # it changes every replica of the target's group: the verdict reads the group

    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        """What runs (or what to run) for ``flags``: the journal's old and new argv."""
        ...

    def describe(self, p: Plan) -> list[str]:
        """The dry run's lines after the diff."""
        ...

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        """Take the server to ``flags`` and through the health gate; ServerStartError or ApplyError if not."""
        ...

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        """Back to ``p.old_flags`` after a switch that failed or did not pay; False when only a person can."""
        ...

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        """The one line a failed switch is recorded with: the server's own words where the route has them."""
        ...

    def in_flight(self, ap: Steps, t: Target) -> int | None:
        """Requests in the server just before a switch (None: not measured by this route)."""
        ...

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        """A tuner died during an apply on ``t``: leave no server out of rotation and no temporary one behind."""
        ...

    def replicas(self, ap: Steps, t: Target, start: float, end: float) -> list[str]:
        """The targets of ``t``'s group that served in [start, end] (the config's replicas; a Kubernetes group's
        pods come and go)."""
        ...


@runtime_checkable
class Canaried(Route, Protocol):
    """A route that can put new flags on part of a group first, beside an unchanged part serving the same traffic."""

    def canary(self, ap: Steps, aid: int, p: Plan) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """The canary part takes ``p.new_flags``: ((canary, its targets), (control, its targets)) to compare."""
        ...

    def promote(self, ap: Steps, aid: int, p: Plan) -> None:
        """After a kept canary: the rest of the group takes ``p.new_flags``."""
        ...


@dataclass(frozen=True)
class Plan:
    target: Target
    route: Route  # how the flags reach the server (routes.py)
    diff: dict[str, Any]
    old_flags: dict[str, Any]
    new_flags: dict[str, Any]
    old_argv: list[str]
    new_argv: list[str]

    @property
    def how(self) -> str:
        """The route's name: managed | hook | manual (what the journal and `--dry-run --json` say)."""
        return self.route.name

    @property
    def whole_group(self) -> bool:
        """The route changes every replica of the target's group (a rolling apply): the verdict reads the group."""
        return self.route.whole_group and self.target.group is not None
