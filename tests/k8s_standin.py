"""A stand-in Kubernetes API server for the tests: no kube-apiserver can run on these machines (none in the package
registries they reach), so the Kubernetes route and pod discovery are tested against this real local HTTP server.

It answers as the API does, with the object shapes of the official client's models (every answer is built as
the model, then serialized with ``ApiClient().sanitize_for_serialization``): list and watch pods (label selectors,
resourceVersion, a 410 Gone ERROR event for a history it no longer has), get and patch Deployments (strategic
merge patch and JSON merge patch, ``metadata.resourceVersion`` as a precondition: 409 Conflict), list
PodDisruptionBudgets, bearer-token auth (401), RBAC when given a Role's rules (403, as the API refuses a
ServiceAccount) and Status objects for errors. Clients reach it through a real
kubeconfig file (``Cluster.kubeconfig``), as they would reach a cluster.

Its Deployment controller rolls the pods as the real one does, one step per ``tick`` (each read of the Deployment is
followed by one, so a client that follows a rollout drives it; ``tick_s`` is how many seconds a tick stands for): it honours
``maxSurge`` / ``maxUnavailable`` (or Recreate), names ReplicaSets and pods ``NAME-HASH`` / ``NAME-HASH-XXXXX``
with the ``pod-template-hash`` label and owner references, reports observedGeneration, replicas, updatedReplicas,
readyReplicas, availableReplicas and the Progressing condition, which turns to ProgressDeadlineExceeded when no pod
became available for ``progressDeadlineSeconds``. What a pod's container does is ``behaviour(args)``: "ok" (ready),
"unready" (runs, its readiness probe fails: a rollout that stalls) or "crash" (exits 1: CrashLoopBackOff, with its
last termination message). Each new pod gets its own loopback address (127.0.0.2, 127.0.0.3, ...) as its IP, so a
test can serve /metrics for it there.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client
from kubernetes.client import (
    V1Container,
    V1ContainerPort,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStrategy,
    V1LabelSelector,
    V1ObjectMeta,
    V1Pod,
    V1PodDisruptionBudget,
    V1PodDisruptionBudgetSpec,
    V1PodSpec,
    V1PodTemplateSpec,
    V1RollingUpdateDeployment,
)

__all__ = ["Cluster", "behaviour_by_flags", "serve_cluster"]

_API = client.ApiClient()
TOKEN = "standin-token"


def behaviour_by_flags(args: list[str]) -> str:
    """What the test workload's container does with these args (the real-cluster variant's image does the same):
    ``--max-num-seqs 999`` exits at once, ``--max-num-seqs 777`` never gets ready, anything else serves."""
    value = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--max-num-seqs"), None)
    value = next((a.split("=", 1)[1] for a in args if a.startswith("--max-num-seqs=")), value)
    return {"999": "crash", "777": "unready"}.get(value or "", "ok")


def _shape(model: Any, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` read as the client's model and serialized back: what the API would send."""
    return _API.sanitize_for_serialization(model.from_dict(data))


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """A label selector string (equality and set-based) against a pod's labels."""
    if not selector:
        return True
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    for part in (p.strip() for p in parts):
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s*\((.*)\)", part)
        if m:
            values = {v.strip() for v in m[3].split(",")}
            have = labels.get(m[1])
            if (m[2] == "in") != (have is not None and have in values):
                return False
        elif part.startswith("!"):
            if part[1:].strip() in labels:
                return False
        elif "!=" in part:
            k, v = part.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in part:
            k, v = part.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif part not in labels:
            return False
    return True


def strategic_merge(target: Any, patch: Any, path: str = "") -> Any:
    """Kubernetes' strategic merge patch, for the fields tuner patches: maps merge, ``containers`` merge by name,
    other lists and scalars are replaced, null deletes."""
    if isinstance(patch, dict) and isinstance(target, dict):
        out = dict(target)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in ("containers", "initContainers") and isinstance(v, list):
                merged = [dict(c) for c in out.get(k, [])]
                for pc in v:
                    i = next((i for i, c in enumerate(merged) if c.get("name") == pc.get("name")), None)
                    if i is None:
                        merged.append(pc)
                    else:
                        merged[i] = strategic_merge(merged[i], pc, f"{path}.{k}")
                out[k] = merged
            else:
                out[k] = strategic_merge(out.get(k), v, f"{path}.{k}")
        return out
    return copy.deepcopy(patch)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (application/merge-patch+json): lists are replaced whole."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _scaled(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = total * int(value[:-1]) / 100
        return int(-(-share // 1)) if round_up else int(share // 1)
    return int(value)


@dataclass
class _Deploy:
    obj: dict[str, Any]  # the Deployment as the API holds it (spec, metadata; status is computed)
    stuck_ticks: int = 0  # ticks since a pod last became available while the rollout is not complete
    seen_generation: int = 0  # what the controller has observed (one tick behind a patch)


@dataclass
class Cluster:
    """The objects of one cluster and its Deployment controller. ``behaviour(args)`` says what a pod's container
    does; ``tick_s``: the seconds one tick stands for (progressDeadlineSeconds is counted in them)."""

    behaviour: Callable[[list[str]], str] = behaviour_by_flags
    tick_s: float = 10.0
    token: str = TOKEN
    lock: threading.RLock = field(default_factory=threading.RLock)
    changed: threading.Condition = field(init=False)
    rv: int = 100
    deployments: dict[tuple[str, str], _Deploy] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pdbs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # (rv, type, pod) for watches
    compacted: int = 0  # watches from a resourceVersion below this get 410 Gone
    # (method, path, the PATCH's content type or "watch" for a watch) and the PATCH bodies, as received
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    rules: list[dict[str, Any]] | None = None  # a Role's rules: when set, every request must be allowed by one
    next_ip: int = 2
    _serial: int = 0

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    # ---- what a test sets up ---------------------------------------------------------------------------

    def deployment(
        self,
        namespace: str,
        name: str,
        *,
        replicas: int,
        args: list[str],
        container: str = "vllm",
        labels: dict[str, str] | None = None,
        max_unavailable: int | str | None = 0,
        max_surge: int | str | None = 1,
        strategy: str = "RollingUpdate",
        progress_deadline_s: int = 600,
        port: int = 8000,
        command: list[str] | None = None,
    ) -> None:
        """A Deployment whose pods are already rolled out and ready."""
        labels = labels or {"app": name}
        ru = (
            V1RollingUpdateDeployment(max_unavailable=max_unavailable, max_surge=max_surge)
            if strategy == "RollingUpdate"
            else None
        )
        d = V1Deployment(
            api_version="apps/v1",
            kind="Deployment",
            metadata=V1ObjectMeta(
                name=name,
                namespace=namespace,
                generation=1,
                uid=f"uid-{name}",
                creation_timestamp=datetime.now(timezone.utc),
                labels=dict(labels),
            ),
            spec=V1DeploymentSpec(
                replicas=replicas,
                progress_deadline_seconds=progress_deadline_s,
                selector=V1LabelSelector(match_labels=dict(labels)),
                strategy=V1DeploymentStrategy(type=strategy, rolling_update=ru),
                template=V1PodTemplateSpec(
                    metadata=V1ObjectMeta(labels=dict(labels)),
                    spec=V1PodSpec(
                        containers=[
                            V1Container(
                                name=container,
                                image="vllm/vllm-openai:v0.11.0",
                                command=command,
                                args=list(args),
                                ports=[V1ContainerPort(name="http", container_port=port)],
                            )
                        ]
                    ),
                ),
            ),
        )
        with self.lock:
            obj = _API.sanitize_for_serialization(d)
            self._bump(obj)
            dep = _Deploy(obj, seen_generation=1)
            self.deployments[(namespace, name)] = dep
            for _ in range(replicas):
                self._new_pod(dep, ready=True)
            self.changed.notify_all()

    def pdb(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str],
        *,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> None:
        p = V1PodDisruptionBudget(
            api_version="policy/v1",
            kind="PodDisruptionBudget",
            metadata=V1ObjectMeta(name=name, namespace=namespace),
            spec=V1PodDisruptionBudgetSpec(
                min_available=min_available,
                max_unavailable=max_unavailable,
                selector=V1LabelSelector(match_labels=labels),
            ),
        )
        with self.lock:
            obj = _API.sanitize_for_serialization(p)
            self._bump(obj)
            self.pdbs[(namespace, name)] = obj

    def delete_pod(self, namespace: str, name: str) -> None:
        """The pod goes (a node drain, kubectl delete); its Deployment replaces it at the next tick."""
        with self.lock:
            self._delete((namespace, name))

    def edit_args(self, namespace: str, name: str, args: list[str]) -> None:
        """Someone else changes the Deployment's container args (kubectl edit)."""
        with self.lock:
            dep = self.deployments[(namespace, name)]
            dep.obj["spec"]["template"]["spec"]["containers"][0]["args"] = list(args)
            dep.obj["metadata"]["generation"] += 1
            self._bump(dep.obj)

    def compact(self) -> None:
        """Forget the watch history so far: a watch from an older resourceVersion gets 410 Gone."""
        with self.lock:
            self.compacted = self.rv
            self.events.clear()

    def args_of(self, namespace: str, name: str) -> list[str]:
        with self.lock:
            return list(self.deployments[(namespace, name)].obj["spec"]["template"]["spec"]["containers"][0]["args"])

    def pod_names(self, namespace: str, owner: str | None = None, *, ready: bool | None = None) -> list[str]:
        with self.lock:
            return sorted(
                p["metadata"]["name"]
                for (ns, _), p in self.pods.items()
                if ns == namespace
                and (owner is None or self._owner(p) == owner)
                and (ready is None or self._ready(p) == ready)
            )

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[(namespace, name)])

    # ---- the controller ------------------------------------------------------------------------------------

    def tick(self, namespace: str | None = None, name: str | None = None) -> None:
        """One step of every Deployment's controller (or of one)."""
        with self.lock:
            for key, dep in list(self.deployments.items()):
                if namespace is None or key == (namespace, name):
                    self._step(dep)
            self.changed.notify_all()

    def _bump(self, obj: dict[str, Any]) -> int:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return self.rv

    @staticmethod
    def _hash(template: dict[str, Any]) -> str:
        digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
        return "".join(c for c in digest if c in "bcdfghjklmnpqrstvwxz2456789")[:10]

    @staticmethod
    def _owner(pod: dict[str, Any]) -> str:
        rs = pod["metadata"]["ownerReferences"][0]["name"]
        return rs[: -len(pod["metadata"]["labels"]["pod-template-hash"]) - 1]

    @staticmethod
    def _ready(pod: dict[str, Any]) -> bool:
        return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))

    def _pods_of(self, dep: _Deploy) -> list[dict[str, Any]]:
        ns, name = dep.obj["metadata"]["namespace"], dep.obj["metadata"]["name"]
        return [p for (pns, _), p in sorted(self.pods.items()) if pns == ns and self._owner(p) == name]

    def _event(self, kind: str, pod: dict[str, Any]) -> None:
        rv = self._bump(pod)
        self.events.append((rv, kind, _shape(V1Pod, pod)))

    def _new_pod(self, dep: _Deploy, *, ready: bool = False) -> None:
        meta, template = dep.obj["metadata"], dep.obj["spec"]["template"]
        h = self._hash(template)
        self._serial += 1
        suffix = hashlib.sha256(f"{meta['name']}{self._serial}".encode()).hexdigest()
        suffix = "".join(c for c in suffix if c in "bcdfghjklmnpqrstvwxz2456789")[:5]
        name = f"{meta['name']}-{h}-{suffix}"
        ip = f"127.0.0.{self.next_ip}"
        self.next_ip += 1
        spec = copy.deepcopy(template["spec"])
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "uid": f"uid-{name}",
                "creationTimestamp": _now(),
                "labels": {**template["metadata"]["labels"], "pod-template-hash": h},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": f"{meta['name']}-{h}",
                        "uid": f"uid-rs-{h}",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {
                "phase": "Pending",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                    for c in spec["containers"]
                ],
            },
        }
        if ready:
            self._run_pod(pod)
        self.pods[(meta["namespace"], name)] = pod
        self._event("ADDED", pod)

    def _run_pod(self, pod: dict[str, Any]) -> None:
        """The pod's containers start and do what ``behaviour`` says."""
        c = pod["spec"]["containers"][0]
        what = self.behaviour(list(c.get("args") or []))
        cs = pod["status"]["containerStatuses"][0]
        if what == "crash":
            cs["restartCount"] += 1
            cs["state"] = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container {c['name']}",
                }
            }
            cs["lastState"] = {
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": "ValueError: max_num_seqs 999 does not fit the KV cache",
                }
            }
            pod["status"]["phase"] = "Running"
            ready = False
        else:
            cs["state"] = {"running": {"startedAt": _now()}}
            pod["status"]["phase"] = "Running"
            ready = what == "ok"
        cs["ready"] = ready
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    def _delete(self, key: tuple[str, str]) -> None:
        pod = self.pods.pop(key)
        self._event("DELETED", pod)

    def _step(self, dep: _Deploy) -> None:
        spec, meta = dep.obj["spec"], dep.obj["metadata"]
        if dep.seen_generation < meta["generation"]:  # the controller sees a change one tick after it was made
            dep.seen_generation = meta["generation"]
            dep.stuck_ticks = 0
            return
        new_hash = self._hash(spec["template"])
        replicas = spec.get("replicas", 1)
        for p in self._pods_of(dep):  # pending pods start; crash-looping ones crash again
            cs = p["status"]["containerStatuses"][0]
            if p["status"]["phase"] == "Pending" or "waiting" in cs["state"] and cs["restartCount"]:
                self._run_pod(p)
                self._event("MODIFIED", p)
        pods = self._pods_of(dep)
        new = [p for p in pods if p["metadata"]["labels"]["pod-template-hash"] == new_hash]
        old = [p for p in pods if p not in new]
        available = sum(self._ready(p) for p in pods)
        if spec["strategy"].get("type") == "Recreate":
            if old:
                for p in old:
                    self._delete((p["metadata"]["namespace"], p["metadata"]["name"]))
            elif len(new) < replicas:
                self._new_pod(dep)
        else:
            ru = spec["strategy"].get("rollingUpdate") or {}
            max_unavailable = _scaled(ru.get("maxUnavailable", "25%"), replicas, round_up=False)
            surge = _scaled(ru.get("maxSurge", "25%"), replicas, round_up=True)
            if max_unavailable == 0 and surge == 0:
                max_unavailable = 1
            # scale the old ReplicaSet down while enough pods stay available (not-ready ones first)
            victim = sorted(old, key=lambda p: self._ready(p))[:1]
            if victim and (not self._ready(victim[0]) or available - 1 >= replicas - max_unavailable):
                self._delete((victim[0]["metadata"]["namespace"], victim[0]["metadata"]["name"]))
                pods = self._pods_of(dep)
            # and the new one up, within the surge
            now_new = [p for p in pods if p["metadata"]["labels"]["pod-template-hash"] == new_hash]
            if len(now_new) < replicas and len(pods) < replicas + surge:
                self._new_pod(dep)
        pods = self._pods_of(dep)
        new = [p for p in pods if p["metadata"]["labels"]["pod-template-hash"] == new_hash]
        complete = len(new) == replicas == len(pods) and all(self._ready(p) for p in new)
        ready_new = sum(self._ready(p) for p in new)
        if complete or ready_new > dep.obj.get("_ready_new", 0):
            dep.stuck_ticks = 0
        else:
            dep.stuck_ticks += 1
        dep.obj["_ready_new"] = ready_new

    def deployment_view(self, dep: _Deploy) -> dict[str, Any]:
        """The Deployment with its status, as the API shows it."""
        spec, meta = dep.obj["spec"], dep.obj["metadata"]
        pods = self._pods_of(dep)
        new_hash = self._hash(spec["template"])
        new = [p for p in pods if p["metadata"]["labels"]["pod-template-hash"] == new_hash]
        ready = sum(self._ready(p) for p in pods)
        replicas = spec.get("replicas", 1)
        complete = len(new) == replicas == len(pods) and all(self._ready(p) for p in new)
        deadline = spec.get("progressDeadlineSeconds", 600)
        if complete:
            progressing = {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable",
                "message": f'ReplicaSet "{meta["name"]}-{new_hash}" has successfully progressed.',
            }
        elif dep.stuck_ticks * self.tick_s > deadline:
            progressing = {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": f'ReplicaSet "{meta["name"]}-{new_hash}" has timed out progressing.',
            }
        else:
            progressing = {
                "type": "Progressing",
                "status": "True",
                "reason": "ReplicaSetUpdated",
                "message": f'ReplicaSet "{meta["name"]}-{new_hash}" is progressing.',
            }
        status = {
            "observedGeneration": dep.seen_generation,
            "replicas": len(pods),
            "updatedReplicas": len(new),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, replicas - ready),
            "conditions": [
                {
                    "type": "Available",
                    "status": "True" if ready >= replicas - 1 else "False",
                    "reason": "MinimumReplicasAvailable",
                },
                progressing,
            ],
        }
        return _shape(V1Deployment, {k: v for k, v in dep.obj.items() if not k.startswith("_")} | {"status": status})


# ---- the HTTP face --------------------------------------------------------------------------------------------


def _request(method: str, path: str, query: dict[str, str]) -> tuple[str, str, str, str | None] | None:
    """(verb, API group, resource, name) of a request, as RBAC reads it."""
    m = re.fullmatch(r"/api/v1/namespaces/[^/]+/(pods)(?:/([^/]+))?", path) or re.fullmatch(
        r"/apis/(?:apps|policy)/v1/namespaces/[^/]+/(deployments|statefulsets|poddisruptionbudgets)(?:/([^/]+))?", path
    )
    if m is None:
        return None
    group = {"pods": "", "deployments": "apps", "statefulsets": "apps", "poddisruptionbudgets": "policy"}[m[1]]
    if method == "PATCH":
        verb = "patch"
    elif m[2]:
        verb = "get"
    else:
        verb = "watch" if query.get("watch") in ("true", "1") else "list"
    return verb, group, m[1], m[2]


def _allowed(rules: list[dict[str, Any]], verb: str, group: str, resource: str, name: str | None) -> bool:
    for r in rules:
        if group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", []):
            names = r.get("resourceNames")
            if not names or (name is not None and name in names):
                return True
    return False


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return _API.sanitize_for_serialization(
        client.V1Status(api_version="v1", kind="Status", status="Failure", code=code, reason=reason, message=message)
    )


def _handler(cluster: Cluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") != f"Bearer {cluster.token}":
                self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                return False
            url = urlsplit(self.path)
            req = _request(self.command, url.path, {k: v[0] for k, v in parse_qs(url.query).items()})
            if cluster.rules is None or req is None or _allowed(cluster.rules, *req):
                return True
            verb, group, resource, name = req
            ns = url.path.split("/namespaces/")[1].split("/")[0]
            self._send(
                403,
                _status(
                    403,
                    "Forbidden",
                    f"{resource}{'.' + group if group else ''}"
                    f"{' ' + repr(name) if name else ''} is forbidden: User "
                    f'"system:serviceaccount:{ns}:tuner" cannot {verb} resource "{resource}" in API '
                    f'group "{group}" in the namespace "{ns}"',
                ),
            )
            return False

        def do_GET(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            with cluster.lock:
                cluster.requests.append(("GET", url.path, "watch" if q.get("watch") in ("true", "1") else ""))
            if not self._authorized():
                return
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path):
                if q.get("watch") in ("true", "1"):
                    return self._watch(m[1], q)
                with cluster.lock:
                    items = [
                        p
                        for (ns, _), p in sorted(cluster.pods.items())
                        if ns == m[1] and _selector_matches(q.get("labelSelector", ""), p["metadata"]["labels"])
                    ]
                    body = {
                        "apiVersion": "v1",
                        "kind": "PodList",
                        "metadata": {"resourceVersion": str(cluster.rv)},
                        "items": items,
                    }
                return self._send(200, _shape(client.V1PodList, body))
            if m := re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)", url.path):
                with cluster.lock:
                    dep = cluster.deployments.get((m[1], m[2]))
                    if dep is None:
                        return self._send(404, _status(404, "NotFound", f'deployments.apps "{m[2]}" not found'))
                    view = cluster.deployment_view(dep)
                    cluster.tick(m[1], m[2])  # after the read: what a client sees next is one step on
                return self._send(200, view)
            if m := re.fullmatch(r"/apis/policy/v1/namespaces/([^/]+)/poddisruptionbudgets", url.path):
                with cluster.lock:
                    items = [p for (ns, _), p in sorted(cluster.pdbs.items()) if ns == m[1]]
                    body = {
                        "apiVersion": "policy/v1",
                        "kind": "PodDisruptionBudgetList",
                        "metadata": {"resourceVersion": str(cluster.rv)},
                        "items": items,
                    }
                return self._send(200, _shape(client.V1PodDisruptionBudgetList, body))
            self._send(404, _status(404, "NotFound", f"the server could not find the requested resource {url.path}"))

        def do_PATCH(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            ctype = self.headers.get("Content-Type", "")
            patch = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            with cluster.lock:
                cluster.requests.append(("PATCH", url.path, ctype))
                cluster.patches.append(patch)
            if not self._authorized():
                return
            m = re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)", url.path)
            if m is None:
                return self._send(404, _status(404, "NotFound", url.path))
            merge = {
                "application/strategic-merge-patch+json": strategic_merge,
                "application/merge-patch+json": lambda t, p: merge_patch(t, p),
            }.get(ctype)
            if merge is None or not isinstance(patch, dict):
                return self._send(
                    415,
                    _status(
                        415,
                        "UnsupportedMediaType",
                        f"the body of the request was in an unknown format - accepted "
                        f"media types include: application/strategic-merge-patch+json, "
                        f"application/merge-patch+json (got {ctype})",
                    ),
                )
            with cluster.lock:
                dep = cluster.deployments.get((m[1], m[2]))
                if dep is None:
                    return self._send(404, _status(404, "NotFound", f'deployments.apps "{m[2]}" not found'))
                want = (patch.get("metadata") or {}).get("resourceVersion")
                if want is not None and want != dep.obj["metadata"]["resourceVersion"]:
                    return self._send(
                        409,
                        _status(
                            409,
                            "Conflict",
                            f"Operation cannot be fulfilled on "
                            f'deployments.apps "{m[2]}": the object has been modified; '
                            "please apply your changes to the latest version and try again",
                        ),
                    )
                before = copy.deepcopy(dep.obj["spec"])
                obj = merge({k: v for k, v in dep.obj.items() if not k.startswith("_")}, patch)
                V1Deployment.from_dict(obj)  # what the API would refuse to store, it refuses here too
                dep.obj.update(obj)
                if obj["spec"] != before:
                    dep.obj["metadata"]["generation"] += 1
                cluster._bump(dep.obj)
                cluster.changed.notify_all()
                return self._send(200, cluster.deployment_view(dep))

        def _watch(self, namespace: str, q: dict[str, str]) -> None:
            since = int(q.get("resourceVersion") or 0)
            hold = min(float(q.get("timeoutSeconds") or 30), 2.0)  # this server ends watches early, as it may
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(obj: dict[str, Any]) -> None:
                data = (json.dumps(obj) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            sel = q.get("labelSelector", "")
            try:
                with cluster.lock:
                    if since and since < cluster.compacted:
                        chunk(
                            {
                                "type": "ERROR",
                                "object": _status(
                                    410, "Expired", f"too old resource version: {since} ({cluster.compacted})"
                                ),
                            }
                        )
                        self.wfile.write(b"0\r\n\r\n")
                        return
                    sent = since
                    end = threading.Event()
                    timer = threading.Timer(hold, lambda: (end.set(), self._wake()))
                    timer.start()
                    while not end.is_set():
                        for rv, kind, pod in list(cluster.events):
                            if rv > sent and pod["metadata"]["namespace"] == namespace:
                                if _selector_matches(sel, pod["metadata"].get("labels") or {}):
                                    cluster.lock.release()
                                    try:
                                        chunk({"type": kind, "object": pod})
                                    finally:
                                        cluster.lock.acquire()
                                sent = rv
                        cluster.changed.wait(0.2)
                    timer.cancel()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _wake(self) -> None:
            with cluster.lock:
                cluster.changed.notify_all()

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True


@dataclass
class Running:
    cluster: Cluster
    url: str
    kubeconfig: Path
    server: _Server

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_cluster(cluster: Cluster, tmp_path: Path, namespace: str = "llm") -> Running:
    """The stand-in on a free loopback port, and a kubeconfig for it (token auth, its context current)."""
    server = _Server(("127.0.0.1", 0), _handler(cluster))
    threading.Thread(target=server.serve_forever, name="k8s-standin", daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "standin",
                "clusters": [{"name": "standin", "cluster": {"server": url}}],
                "users": [{"name": "tuner", "user": {"token": cluster.token}}],
                "contexts": [
                    {"name": "standin", "context": {"cluster": "standin", "user": "tuner", "namespace": namespace}}
                ],
            }
        )
    )
    return Running(cluster, url, path, server)
