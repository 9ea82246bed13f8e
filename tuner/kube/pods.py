"""A workload's pods as targets: one per pod, the replicas of the target's group, added and removed as pods come and go.

A target whose ``kubernetes.pods`` is set is a template: it is never scraped itself (its url is the Service clients
use); ``expand`` puts in its place one target per pod of its workload (and of its canary Deployment), named
``TARGET.POD``, scraped at the pod's IP and port, grouped under the template's name. Pods come from the API (a list,
then a watch: ``PodWatch``) or, for a template whose source is prometheus, from the labels Prometheus's
kubernetes_sd relabeling put on the series it scrapes (``pods_from_prometheus``). A pod that is gone leaves the
targets; the store keeps what was scraped of it (the verdict of a rollout reads the pods before and after).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.config import Config, Target, parse_selector
from tuner.errors import FlagError, KubernetesError
from tuner.kube.args import parse_flags

if TYPE_CHECKING:  # the client is an optional extra: imported where a connection is made (tuner.kube.connect)
    from tuner.kube.api import KubeApi

__all__ = [
    "Pod",
    "PodWatch",
    "expand",
    "from_prometheus",
    "is_template",
    "members",
    "owner_pattern",
    "pods_from_prometheus",
    "prometheus_up_query",
    "selector_of",
    "templates",
]

log = logging.getLogger("tuner.kube")
_RETRY_S = 5.0  # after a failed list or watch, before the next try


@dataclass(frozen=True)
class Pod:
    """What discovery keeps of a pod: where to scrape it, which workload owns it, what its container runs."""

    namespace: str
    name: str
    ip: str | None  # the pod's IP; for pods read from Prometheus, the series' instance (HOST:PORT)
    owner_kind: str | None  # Deployment (through its ReplicaSet) or StatefulSet
    owner: str | None
    ready: bool = False
    args: tuple[str, ...] = ()  # the configured container's args
    ports: tuple[tuple[str, int], ...] = ()  # the container's ports: (name, number), in order
    gone: bool = False  # its phase is Succeeded or Failed (a terminating pod still serves: it counts until deleted)

    @classmethod
    def of(cls, pod: Any, container: str) -> Pod:
        """From a V1Pod (the official client's model)."""
        meta, spec, status = pod.metadata, pod.spec, pod.status
        c = next((c for c in (spec.containers if spec else None) or [] if c.name == container), None)
        kind, owner = _owner(meta)
        ready = (
            any(cond.type == "Ready" and cond.status == "True" for cond in (status.conditions or []))
            if status
            else False
        )
        phase = status.phase if status else None
        return cls(
            namespace=meta.namespace,
            name=meta.name,
            ip=status.pod_ip if status else None,
            owner_kind=kind,
            owner=owner,
            ready=ready,
            args=tuple(c.args or []) if c else (),
            ports=tuple((p.name or "", p.container_port) for p in (c.ports or [])) if c else (),
            gone=phase in ("Succeeded", "Failed"),
        )


def _owner(meta: Any) -> tuple[str | None, str | None]:
    """The workload that controls the pod: a Deployment is its ReplicaSet's name less the pod-template-hash."""
    for ref in meta.owner_references or []:
        if not ref.controller:
            continue
        if ref.kind == "ReplicaSet":
            h = (meta.labels or {}).get("pod-template-hash")
            return "Deployment", ref.name[: -len(h) - 1] if h and ref.name.endswith("-" + h) else ref.name
        return ref.kind, ref.name
    return None, None


def is_template(t: Target) -> bool:
    """A target whose pods are its replicas (never scraped itself)."""
    return t.kubernetes is not None and t.kubernetes.pods is not None and t.group is None


def templates(cfg: Config) -> list[Target]:
    return [t for t in cfg.targets if is_template(t)]


def selector_of(workload: Any) -> str:
    """A workload's spec.selector as a label selector string (matchLabels and matchExpressions)."""
    sel = workload.spec.selector
    parts = [f"{k}={v}" for k, v in sorted((sel.match_labels or {}).items())]
    for e in sel.match_expressions or []:
        op = e.operator
        if op in ("In", "NotIn"):
            parts.append(f"{e.key} {op.lower()} ({','.join(e.values or [])})")
        else:
            parts.append(e.key if op == "Exists" else f"!{e.key}")
    return ",".join(parts)


def owner_pattern(kind: str, name: str) -> re.Pattern[str]:
    """The names of the pods a workload creates: a Deployment's NAME-RSHASH-XXXXX, a StatefulSet's NAME-ORDINAL
    (pods read from Prometheus carry no owner: their name says it)."""
    if kind == "StatefulSet":
        return re.compile(re.escape(name) + r"-\d+")
    return re.compile(re.escape(name) + r"-[a-z0-9]{1,10}-[a-z0-9]{5}")


def _port(template: Target, pod: Pod) -> int | None:
    k = template.kubernetes
    assert k is not None and k.pods is not None
    want = k.pods.port
    if isinstance(want, int):
        return want
    if isinstance(want, str):
        return next((n for name, n in pod.ports if name == want), None)
    return pod.ports[0][1] if pod.ports else template.host_port[1]


def _member(template: Target, pod: Pod) -> Target | None:
    k = template.kubernetes
    assert k is not None and k.pods is not None
    labels = {
        **template.labels,
        "group": template.name,
        "replica": pod.name,
        "namespace": pod.namespace,
        "pod": pod.name,
        "workload": pod.owner or "",
    }
    update: dict[str, Any] = {
        "name": f"{template.name}.{pod.name}",
        "group": template.name,
        "replica": pod.name,
        "group_url": template.url,
        "labels": labels,
    }
    if template.source == "prometheus":
        own = template.prometheus_selector.strip().strip("{}") + "," if template.prometheus_selector else ""
        update["prometheus_selector"] = (
            f'{own}{k.pods.namespace_label}="{pod.namespace}",{k.pods.pod_label}="{pod.name}"'
        )
        update["url"] = f"{k.pods.scheme}://{pod.ip}" if pod.ip else template.url
    else:
        port = _port(template, pod)
        if port is None or not pod.ip:
            return None
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
        update["url"] = f"{k.pods.scheme}://{host}:{port}"
    if pod.args:
        try:
            update["flags"] = {**template.flags, **parse_flags(template.backend, pod.args)}
        except FlagError as exc:
            log.warning("pod %s/%s: %s; its flags are taken from the config", pod.namespace, pod.name, exc)
    return template.model_copy(update=update)


def members(template: Target, pods: Iterable[Pod]) -> list[Target]:
    """The template's replicas: a target per pod of its workload or its canary, by pod name."""
    k = template.kubernetes
    assert k is not None
    owners = {(k.kind, k.name)} | ({("Deployment", k.canary)} if k.canary else set())
    out = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.namespace == k.namespace and (pod.owner_kind, pod.owner) in owners and not pod.gone:
            m = _member(template, pod)
            if m is not None:
                out.append(m)
    return out


def expand(cfg: Config, found: dict[str, list[Pod]]) -> Config:
    """``cfg`` with each template replaced by its pods' targets (none while none is known)."""
    targets: list[Target] = []
    for t in cfg.targets:
        targets += members(t, found.get(t.name, ())) if is_template(t) else [t]
    out = cfg.model_copy(update={"targets": targets})
    out.__dict__.pop("_by_name", None)  # the name index is of the copied list: built again on first use
    return out


# ---- from Prometheus's kubernetes_sd labels -------------------------------------------------------------


def pods_from_prometheus(series: Sequence[dict[str, str]], template: Target) -> list[Pod]:
    """The template's pods among the label sets of ``up`` series: their namespace and pod labels (as the scrape
    config's kubernetes_sd relabeling named them), their owner read from the pod's name; a pod whose ``up`` is 0
    is still one (it is down, and tuner says so)."""
    k = template.kubernetes
    assert k is not None and k.pods is not None
    owners = [(k.kind, k.name, owner_pattern(k.kind, k.name))]
    if k.canary:
        owners.append(("Deployment", k.canary, owner_pattern("Deployment", k.canary)))
    seen: dict[str, Pod] = {}
    for labels in series:
        ns, name = labels.get(k.pods.namespace_label), labels.get(k.pods.pod_label)
        if ns != k.namespace or not name:
            continue
        # the longest owner name first: a canary "chat-canary" also reads as a pod name of "chat"
        hit = next(
            ((kind, owner) for kind, owner, pat in sorted(owners, key=lambda o: -len(o[1])) if pat.fullmatch(name)),
            None,
        )
        if hit is not None:
            seen[name] = Pod(ns, name, labels.get("instance"), hit[0], hit[1], ready=True)
    return list(seen.values())


def prometheus_up_query(template: Target) -> str:
    """The ``up`` series that name the template's pods: the target's prometheus_selector, else its namespace."""
    k = template.kubernetes
    assert k is not None and k.pods is not None
    if template.prometheus_selector:
        parse_selector(template.prometheus_selector)
        return "up{" + template.prometheus_selector.strip().strip("{}") + "}"
    return f'up{{{k.pods.namespace_label}="{k.namespace}"}}'


def from_prometheus(prom_url: str, template: Target, *, timeout_s: float, now: float) -> list[Pod]:
    """The template's pods as Prometheus scrapes them at ``now`` (one query of ``up``); KubernetesError naming
    Prometheus when it cannot answer."""
    from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
    from requests import RequestException

    query = prometheus_up_query(template)
    try:
        got = PrometheusConnect(url=prom_url, disable_ssl=True, timeout=max(1, math.ceil(timeout_s))).custom_query(
            query=query, params={"time": f"{now:.3f}"}
        )
    except (RequestException, PrometheusApiClientException) as exc:
        raise KubernetesError(
            f"pods of {template.name} from Prometheus",
            f"{prom_url} answered {query!r} with {type(exc).__name__}: {exc}",
        ) from None
    return pods_from_prometheus([r["metric"] for r in got], template)


# ---- from the API: a list, then a watch --------------------------------------------------------------------


class PodWatch:
    """Each template's live pods, kept by a thread per template: list, then watch from the list's resourceVersion
    (a 410 Gone or a failure lists again after a pause). ``changed()`` is called after every change of the pods
    that count (ready once, not gone); ``failed(template, error)`` after every failure (and ``""`` when it works
    again). A pod counts from its first Ready on (a vLLM still loading its model is not down) until it is gone."""

    def __init__(
        self,
        api: KubeApi,
        targets: Sequence[Target],
        *,
        changed: Callable[[], None] = lambda: None,
        failed: Callable[[str, str], None] = lambda name, error: None,
        watch_s: float = 300.0,
    ) -> None:
        self.api, self.targets = api, list(targets)
        self.changed, self.failed, self.watch_s = changed, failed, watch_s
        self._pods: dict[str, dict[str, Pod]] = {t.name: {} for t in self.targets}
        self._ready_once: set[tuple[str, str]] = set()  # (namespace, pod) seen Ready
        self._selectors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def found(self) -> dict[str, list[Pod]]:
        with self._lock:
            return {name: list(pods.values()) for name, pods in self._pods.items()}

    def selector(self, t: Target) -> str:
        """The template's label selector: its own, else its workload's (read once)."""
        k = t.kubernetes
        assert k is not None and k.pods is not None
        if k.pods.selector:
            return k.pods.selector
        if t.name not in self._selectors:
            self._selectors[t.name] = selector_of(self.api.workload(k.kind, k.namespace, k.name))
        return self._selectors[t.name]

    def list_now(self) -> dict[str, list[Pod]]:
        """List every template's pods once (no watch); a template whose list failed keeps what it had."""
        for t in self.targets:
            try:
                self._relist(t)
            except KubernetesError as exc:
                self.failed(t.name, str(exc))
        return self.found()

    def start(self) -> None:
        for t in self.targets:
            th = threading.Thread(target=self._run, args=(t,), name=f"pods:{t.name}", daemon=True)
            self._threads.append(th)
            th.start()

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if wait:
            for th in self._threads:
                th.join(timeout=self.api.timeout_s + 5)

    def _relist(self, t: Target) -> str:
        k = t.kubernetes
        assert k is not None
        items, rv = self.api.pods(k.namespace, self.selector(t))
        pods = {}
        for raw in items:
            p = Pod.of(raw, k.container)
            if self._counts(p):
                pods[p.name] = p
        with self._lock:
            before = self._pods[t.name]
            self._pods[t.name] = pods
        if before.keys() != pods.keys() or before != pods:
            self.changed()
        return rv

    def _counts(self, p: Pod) -> bool:
        if p.ready:
            self._ready_once.add((p.namespace, p.name))
        return not p.gone and p.ip is not None and (p.namespace, p.name) in self._ready_once

    def _event(self, t: Target, kind: str, raw: Any) -> None:
        k = t.kubernetes
        assert k is not None
        p = Pod.of(raw, k.container)
        with self._lock:
            pods = self._pods[t.name]
            had = pods.get(p.name)
            if kind == "DELETED":
                self._ready_once.discard((p.namespace, p.name))
            if kind == "DELETED" or not self._counts(p):
                pods.pop(p.name, None)
                now = None
            else:
                pods[p.name] = p
                now = p
        if had != now:
            self.changed()

    def _run(self, t: Target) -> None:
        k = t.kubernetes
        assert k is not None
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist(t)
                    self.failed(t.name, "")
                started = time.monotonic()
                for kind, raw in self.api.watch_pods(k.namespace, self.selector(t), rv, timeout_s=self.watch_s):
                    self._event(t, kind, raw)
                    rv = (raw.metadata.resource_version if raw.metadata is not None else None) or rv
                    if self._stop.is_set():
                        return
                if time.monotonic() - started < 0.05 and not math.isinf(self.watch_s):
                    self._stop.wait(0.05)  # a server that closes watches at once is not asked in a tight loop
            except KubernetesError as exc:
                if not exc.reason.startswith("410"):
                    self.failed(t.name, str(exc))
                    self._stop.wait(_RETRY_S)
                rv = None  # list again: the history the watch needed is gone, or the connection was
