"""The daemon's view of a config whose Kubernetes templates are replaced by their pods, kept current as pods come and
go: a watch per template through the API, and a read of Prometheus's ``up`` series each interval for the templates
whose source is prometheus (kubernetes_sd)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from tuner.config import Config
from tuner.errors import KubernetesError
from tuner.kube import connect
from tuner.kube.pods import Pod, PodWatch, expand, from_prometheus, templates

__all__ = ["Discovery"]


class Discovery:
    """``changed()`` is called whenever the pods that count changed (read ``current()`` then); ``failed(template,
    error)`` on every failure, and with ``""`` once its pods are read again."""

    def __init__(
        self,
        declared: Config,
        config_dir: Path | None,
        *,
        changed: Callable[[], None] = lambda: None,
        failed: Callable[[str, str], None] = lambda name, error: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.declared, self.changed, self.failed, self.clock = declared, changed, failed, clock
        tpls = templates(declared)
        self.api_side = [t for t in tpls if t.source != "prometheus"]
        self.prom_side = [t for t in tpls if t.source == "prometheus"]
        self.watch: PodWatch | None = None
        self._prom: dict[str, list[Pod]] = {}
        self._lock = threading.Lock()
        if self.api_side:
            try:
                self.watch = PodWatch(
                    connect(declared.kubernetes, config_dir), self.api_side, changed=changed, failed=failed
                )
            except KubernetesError as exc:  # no client or no config: said for each template, the rest runs on
                for t in self.api_side:
                    failed(t.name, str(exc))

    def first(self) -> Config:
        """List every template's pods once: the config the daemon starts with."""
        if self.watch is not None:
            self.watch.list_now()
        self.poll_prometheus(notify=False)
        return self.current()

    def current(self) -> Config:
        with self._lock:
            found = {**(self.watch.found() if self.watch is not None else {}), **self._prom}
        return expand(self.declared, found)

    def poll_prometheus(self, *, notify: bool = True) -> None:
        """Read the pods of the templates whose source is prometheus (one query of ``up`` each)."""
        assert not self.prom_side or self.declared.prometheus is not None
        moved = False
        for t in self.prom_side:
            try:
                pods = from_prometheus(
                    self.declared.prometheus.url,  # type: ignore[union-attr]
                    t,
                    timeout_s=self.declared.timeout(t).total_seconds(),
                    now=self.clock(),
                )
            except KubernetesError as exc:
                self.failed(t.name, str(exc))
                continue
            self.failed(t.name, "")
            with self._lock:
                if sorted(pods, key=lambda p: p.name) != sorted(self._prom.get(t.name, []), key=lambda p: p.name):
                    self._prom[t.name] = pods
                    moved = True
        if moved and notify:
            self.changed()

    def start(self) -> None:
        if self.watch is not None:
            self.watch.start()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop(wait=False)
