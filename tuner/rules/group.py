"""One evaluation of one rule group: the loop the daemon and the scenario runner share.

Prometheus has one ``Group.Eval`` behind both its server and ``promtool test rules``, so a unit test exercises
the code that alerts in production. ``eval_group`` is tuner's: for each rule of the group, its query result
(``vector``) and its new alerts (``evaluate``), then what is due to be sent (``to_send``). A rule that raises is
isolated as Prometheus isolates a failing rule: its alerts stay as they were, its error is reported under its key
(group/alert), and the other rules are evaluated as usual. Pure: what a rule reads comes in as ``Inputs`` (the
daemon's read the store, the scenario runner's read a scenario's series), and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from tuner.config import Target
from tuner.rules.evaluate import configured_max_num_seqs, evaluate, to_send, vector
from tuner.rules.model import RuleGroup
from tuner.rules.state import Alert
from tuner.signals.derive import TargetSignals
from tuner.store.window import GpuLatest

__all__ = ["Inputs", "GroupEval", "eval_group"]

State = Mapping[str, Mapping[str, Alert]]  # rule key (group/alert) -> fingerprint -> alert


@dataclass(frozen=True)
class Inputs:
    """What the rules of a group read at one evaluation.

    ``signals(name, window)``: a target's (or, for a rule over groups, a replica group's) signals over the window
    before now, None without data; ``gpus``: the GPUs' latest readings; ``target_signal(target, signal, window)``:
    tuner's own signals (SELF_SIGNALS; target "" for the whole tuner); ``max_num_seqs(target)``: the limit the server
    runs with."""

    targets: Sequence[Target]
    signals: Callable[[str, timedelta], TargetSignals | None]
    gpus: Sequence[GpuLatest] = ()
    target_signal: Callable[[str, str, timedelta], float | None] | None = None
    max_num_seqs: Callable[[Target], float | None] = configured_max_num_seqs


@dataclass(frozen=True)
class GroupEval:
    """The outcome: ``state`` holds the new alerts of every rule that evaluated (a failed rule's key is absent: its
    previous alerts stand), ``events`` the state changes in rule order, ``due`` the alerts to (re)send now with
    their rule's key, ``failed`` each failed rule's error by key."""

    state: dict[str, dict[str, Alert]]
    events: list[dict] = field(default_factory=list)
    due: list[tuple[str, Alert]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def eval_group(
    group: RuleGroup, state: State, now_ms: int, inputs: Inputs, *, resend_delay: timedelta = timedelta(minutes=1)
) -> GroupEval:
    """Evaluate every rule of ``group`` at ``now_ms`` from the alerts in ``state`` (not modified)."""
    out = GroupEval(state={})
    for rule in group.rules:
        key = group.key(rule)
        try:
            result = vector(
                rule,
                inputs.targets,
                inputs.signals,
                inputs.gpus,
                target_signal=inputs.target_signal,
                max_num_seqs=inputs.max_num_seqs,
            )
            alerts, events = evaluate(rule, result, state.get(key, {}), now_ms, key=key)
        except Exception as exc:  # noqa: BLE001  isolated: its alerts stay as they were, the group goes on
            out.failed[key] = f"rule {key} ({rule.source}) failed to evaluate: {type(exc).__name__}: {exc}"
            continue
        out.state[key] = alerts
        out.events.extend(events)
        # to_send marks the alerts it returns as sent: these are evaluate's copies, never the caller's
        out.due.extend(
            (key, a) for a in to_send(alerts.values(), now_ms, resend_delay=resend_delay, interval=group.interval)
        )
    return out
