"""Every error tuner raises on purpose, in one place.

Each says what happened and what to do about it. The CLI maps each class to an exit code and prints
the message alone: a user error never shows a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tuner.names import LLAMACPP_PREFIX

__all__ = [
    "TunerError",
    "ConfigError",
    "ExpositionError",
    "ScrapeError",
    "MetricsDisabledError",
    "SchemaOutdatedError",
    "StoreError",
    "StoreBusyError",
    "UnknownTargetError",
    "ServerStartError",
    "RuleFileError",
]


class TunerError(Exception):
    """Base class: an error whose message is meant for the operator."""

    exit_code = 1


class ConfigError(TunerError, ValueError):
    """Raised when the config file is missing, unreadable or invalid; names the file and the key."""

    exit_code = 2

    def __init__(self, path: str, key: str, reason: str) -> None:
        self.path, self.key, self.reason = path, key, reason
        where = f"{path}: {key}" if key else path
        super().__init__(f"{where}: {reason}")


class ExpositionError(TunerError, ValueError):
    """Raised when a body is not a valid Prometheus text exposition; names the line."""

    exit_code = 3

    def __init__(self, reason: str, line_no: int | None = None, line: str | None = None) -> None:
        self.reason, self.line_no, self.line = reason, line_no, line
        if line_no is None:
            super().__init__(reason)
        else:
            shown = line if line is not None and len(line) <= 120 else (line or "")[:117] + "..."
            super().__init__(f"line {line_no}: {reason}: {shown!r}")


class ScrapeError(TunerError):
    """Raised when a target cannot be scraped (refused, timed out, HTTP error, body too large); tuner's one HTTP
    client (collect/http.py) raises it for any peer it cannot reach in time (a server's /health, Alertmanager).
    ``healthy``: what the server's /health answered in the same scrape, when it was asked and answered."""

    exit_code = 4
    healthy: bool | None = None


class MetricsDisabledError(ScrapeError):
    """Raised when llama-server answers 501 on /metrics: it was started without --metrics."""

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{url} answered 501: llama-server was started without --metrics; "
            f"restart it with --metrics to expose {LLAMACPP_PREFIX}* series"
        )


class SchemaOutdatedError(TunerError):
    """Raised when the database schema is older (or newer) than this tuner; says which command fixes it."""

    exit_code = 5

    def __init__(self, url: str, current: str | None, head: str) -> None:
        self.current, self.head = current, head
        have = current or "no schema"
        super().__init__(
            f"database {url} is at {have}, this tuner needs {head}: run `tuner db upgrade` "
            "(with the same --config) and start again"
        )


class StoreError(TunerError):
    """Raised when the store cannot be opened or written (locked, disk full, not a database)."""

    exit_code = 6


class StoreBusyError(StoreError):
    """Raised when a second `tuner run` is started on a store another one holds: one daemon per store (two would
    both alert, supervise and auto-apply). Names the process holding it and the lock file."""

    def __init__(self, url: str, lock: Path, holder: str) -> None:
        self.lock, self.holder = lock, holder
        who = f"pid {holder}" if holder.isdigit() else "a process whose pid it has not written yet"
        super().__init__(
            f"store {url} is held by another `tuner run` ({who}; lock {lock}): one daemon per store; "
            "stop that one first, or give this one its own store.url"
        )


class UnknownTargetError(TunerError, KeyError):
    """Raised when a command names a target the config (or the store) does not have."""

    exit_code = 2

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown target {name!r}; known targets: {', '.join(known) or 'none'}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ServerStartError(TunerError, RuntimeError):
    """Raised when a server process exits or stays unhealthy while starting; carries the log's last lines.

    ``exited``: the process itself ended (its log says why), as opposed to one that runs but never got healthy."""

    exit_code = 7

    def __init__(self, what: str, log_path: Path | None, log_tail: Sequence[str], *, exited: bool = False) -> None:
        self.log_tail = list(log_tail)
        self.exited = exited
        where = f" (log: {log_path})" if log_path else ""
        if log_path is None and not self.log_tail:
            super().__init__(what)
            return
        tail = "\n".join("    " + line for line in self.log_tail) or "    <log is empty>"
        super().__init__(f"{what}{where}; last log lines:\n{tail}")


class NothingToMeasureError(TunerError, ValueError):
    """Raised when every candidate of a tuning run is pruned before any server starts (the flags in force
    included): names the binding constraint and what to widen or lower."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(f"tuner tune: nothing to measure: {message}")


__all__ += ["NothingToMeasureError"]


class ApplyError(TunerError):
    """Raised when an apply cannot go ahead or did not hold (target busy, not proposed, refused, rolled back)."""

    exit_code = 8


class NotProposedError(ApplyError):
    """Raised when asked to apply a recommendation that is not (or no longer) proposed."""

    def __init__(self, rec_id: int, status: str) -> None:
        self.rec_id, self.status = rec_id, status
        super().__init__(
            f"recommendation #{rec_id} is {status}, not proposed; only proposed ones are applied "
            "(see `tuner recommendations list`)"
        )


class TargetBusyError(ApplyError):
    """Raised when a target, or the replica group it belongs to, already has an apply (or a tuning run) in progress:
    one at a time per target and per group. Names the apply that holds it."""

    def __init__(
        self,
        target: str,
        apply_id: int,
        *,
        held_target: str | None = None,
        kind: str = "apply",
        mode: str = "",
        group: str | None = None,
    ) -> None:
        self.target, self.apply_id, self.held_target, self.group = target, apply_id, held_target or target, group
        what = (
            f"apply #{apply_id}"
            if kind == "apply"
            else (f"apply #{apply_id} ({kind}" + (f", {mode}" if mode == "shadow" else "") + ")")
        )
        if self.held_target != target:
            what += f" on {self.held_target}"
        scope = (
            f"replica group {group} of target {target!r}"
            if group and self.held_target != target
            else f"target {target!r}"
        )
        super().__init__(
            f"{scope} has {what} in progress (one change at a time per target and per group); wait for "
            "it, or run `tuner reconcile` if the tuner doing it died"
        )


class FlagError(TunerError, ValueError):
    """Raised when a flag is not on tuner's allow-list, or its value has the wrong type or is out of bounds."""

    exit_code = 2

    def __init__(self, backend: str, name: str, reason: str) -> None:
        self.backend, self.name, self.reason = backend, name, reason
        super().__init__(f"{backend} flag {name}: {reason}")


class ModelFactsError(TunerError, ValueError):
    """Raised when a model directory or file cannot be read into facts (config.json, safetensors, GGUF); names it."""

    exit_code = 2

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


class RecommendationNotFoundError(TunerError, KeyError):
    """Raised when a command names a recommendation id the store does not have."""

    exit_code = 2

    def __init__(self, rec_id: int) -> None:
        super().__init__(f"no recommendation with id {rec_id}; list them with `tuner recommendations list`")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


__all__ += [
    "FlagError",
    "ModelFactsError",
    "RecommendationNotFoundError",
    "ApplyError",
    "NotProposedError",
    "TargetBusyError",
]


class RuleFileError(TunerError, ValueError):
    """Raised when an alert rule file is unreadable or invalid; names the file, the line and the reason."""

    exit_code = 2

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")


class GrafanaError(TunerError):
    """Raised when Grafana cannot be reached or refuses a request; names the URL and what it answered."""

    exit_code = 4

    def __init__(self, url: str, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(f"Grafana at {url}: {reason}")


__all__ += ["GrafanaError"]


class KubernetesError(TunerError):
    """Raised when the Kubernetes API cannot be reached or refuses a request tuner needs (list pods, read or patch a
    workload); names the object and what the API answered."""

    exit_code = 4

    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        super().__init__(f"Kubernetes {what}: {reason}")


__all__ += ["KubernetesError"]


class InputFileError(TunerError, ValueError):
    """Raised when a file handed to tuner (config, rules, workload, token, saved exposition) cannot be read as
    text: missing, not UTF-8, over its size cap, a truncated or corrupt gzip; names the file and why."""

    exit_code = 2

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


__all__ += ["InputFileError"]
