"""What every use case starts from: a config, the directory its relative paths are read from, and its store.

The CLI builds one from ``--config``, the daemon from the file it was started with; use cases take a Session and
never parse a command line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tuner.app.room import second_server
from tuner.apply.flow import Applier
from tuner.config import Config, load_config
from tuner.errors import ConfigError
from tuner.kube import expand, list_pods, templates
from tuner.store.db import check_schema, open_engine
from tuner.store.store import Store

__all__ = ["DEFAULT_CONFIG", "Session", "config_path", "open_store"]

DEFAULT_CONFIG = "tuner.yaml"


def config_path(given: str | None) -> tuple[str, bool]:
    """The config file to read and whether the user named it (``--config`` or $TUNER_CONFIG) rather than the
    default ./tuner.yaml: commands that can work without a config use one only when it was named or exists."""
    named = given or os.environ.get("TUNER_CONFIG")
    return (named, True) if named else (DEFAULT_CONFIG, False)


@dataclass
class Session:
    cfg: Config
    config_dir: Path
    _store: Store | None = field(default=None, repr=False)

    @classmethod
    def load(cls, given: str | None, *, pods: bool = False) -> Session:
        """The named config (else ./tuner.yaml); ConfigError naming the file when there is none. ``pods``: with
        Kubernetes pods in place of their templates (``with_pods``)."""
        path, _ = config_path(given)
        if not Path(path).exists():
            raise ConfigError(
                path,
                "",
                "no such file; pass --config PATH or set TUNER_CONFIG (see docs/configuration.md for an example)",
            )
        s = cls(load_config(path), Path(path).resolve().parent)
        return s.with_pods() if pods else s

    def with_pods(self) -> Session:
        """This session with each target whose ``kubernetes.pods`` is set replaced by its pods, listed now: a
        command sees the targets the daemon scrapes (``chat.POD``). KubernetesError when they cannot be listed."""
        if not templates(self.cfg):
            return self
        return Session(
            expand(self.cfg, list_pods(self.cfg, self.config_dir, now=time.time())), self.config_dir, self._store
        )

    @classmethod
    def optional(cls, given: str | None) -> Session | None:
        """For commands whose help says "else the defaults": None when no config was named and ./tuner.yaml is
        absent; a named file that is missing is still an error."""
        path, named = config_path(given)
        if not named and not Path(path).exists():
            return None
        return cls.load(given)

    @property
    def store(self) -> Store:
        """The config's store, opened once; SchemaOutdatedError (run `tuner db upgrade`) when behind."""
        if self._store is None:
            self._store = open_store(self.cfg)
        return self._store

    def applier(self, say: Callable[[str], None] = print, clock: Callable[[], float] = time.time) -> Applier:
        """The apply flow for this config and store; blue/green asks it whether a second server fits."""
        return Applier(
            self.cfg,
            self.store,
            self.config_dir,
            say=say,
            clock=clock,
            room=lambda t, flags: second_server(self.store, t, flags, clock()),
        )


def open_store(cfg: Config, *, check: bool = True) -> Store:
    engine = open_engine(cfg.store.url)
    if check:
        check_schema(engine)
    return Store(engine, retention=cfg.store.retention)
