"""The Kubernetes API as tuner uses it, through the official client: list and watch pods, read and patch a
Deployment or StatefulSet, read PodDisruptionBudgets. Nothing more (deploy/kubernetes/rbac.yaml grants exactly this).

Connect: a kubeconfig when the config names one (``kubernetes.kubeconfig``); in a pod, its ServiceAccount (in-cluster
config); else $KUBECONFIG or ~/.kube/config, with ``kubernetes.context`` or the current one. Every failure is a
KubernetesError that names the object and what the API answered, never a client traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from tuner.config import KubeAccess
from tuner.errors import KubernetesError

__all__ = ["KubeApi", "STRATEGIC_MERGE"]

STRATEGIC_MERGE = "application/strategic-merge-patch+json"
Kind = Literal["Deployment", "StatefulSet"]


class KubeApi:
    """One connection to one cluster; ``timeout_s`` bounds every request (a watch: its own ``timeout_s`` more)."""

    def __init__(self, api_client: client.ApiClient, *, timeout_s: float = 10.0, where: str = "") -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s
        self.where = where or api_client.configuration.host
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)

    @classmethod
    def connect(cls, access: KubeAccess, config_dir: Path | None = None) -> KubeApi:
        conf = client.Configuration()
        try:
            if access.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=conf)
                where = "in-cluster (ServiceAccount)"
            else:
                path = os.path.expanduser(access.kubeconfig) if access.kubeconfig else None
                if path is not None and config_dir is not None and not Path(path).is_absolute():
                    path = str(config_dir / path)
                config.load_kube_config(
                    config_file=path, context=access.context, client_configuration=conf, persist_config=False
                )
                where = f"kubeconfig {path or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
        except (config.ConfigException, OSError, ValueError, KeyError) as exc:
            raise KubernetesError(
                "config",
                f"{exc} (set kubernetes.kubeconfig and kubernetes.context in the "
                "config, or run tuner in the cluster with its ServiceAccount)",
            ) from None
        conf.retries = 1  # a watch or a poll asks again soon: no client-side burst of retries
        return cls(client.ApiClient(conf), timeout_s=access.timeout.total_seconds(), where=where)

    # ---- pods ---------------------------------------------------------------------------------------

    def pods(self, namespace: str, selector: str) -> tuple[list[client.V1Pod], str]:
        """The pods that match ``selector`` in ``namespace``, and the list's resourceVersion (to watch from)."""
        got = self._call(
            f"list pods in {namespace} ({selector})", self.core.list_namespaced_pod, namespace, label_selector=selector
        )
        return list(got.items or []), got.metadata.resource_version or ""

    def watch_pods(
        self, namespace: str, selector: str, resource_version: str, *, timeout_s: float
    ) -> Iterator[tuple[str, client.V1Pod]]:
        """(ADDED | MODIFIED | DELETED, pod) from ``resource_version`` on, for at most ``timeout_s``; a history the
        API no longer has (410 Gone) is a KubernetesError whose reason starts with "410": list again."""
        w = watch.Watch()
        what = f"watch pods in {namespace} ({selector})"
        try:
            for event in w.stream(
                self.core.list_namespaced_pod,
                namespace,
                label_selector=selector,
                resource_version=resource_version,
                timeout_seconds=max(1, int(timeout_s)),
                allow_watch_bookmarks=False,
                _request_timeout=(self.timeout_s, timeout_s + self.timeout_s),
            ):
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    yield event["type"], event["object"]
        except ApiException as exc:
            raise self._error(what, exc) from None
        except (HTTPError, OSError) as exc:
            raise KubernetesError(what, f"API at {self.where} unreachable: {type(exc).__name__}") from None
        finally:
            w.stop()

    # ---- workloads ------------------------------------------------------------------------------------

    def workload(self, kind: Kind, namespace: str, name: str) -> Any:
        """The Deployment or StatefulSet (V1Deployment / V1StatefulSet)."""
        read = self.apps.read_namespaced_deployment if kind == "Deployment" else self.apps.read_namespaced_stateful_set
        return self._call(f"get {kind} {namespace}/{name}", read, name, namespace)

    def patch(self, kind: Kind, namespace: str, name: str, body: dict[str, Any]) -> Any:
        """A strategic-merge patch of the workload (``body`` is data, sent as JSON); the patched object."""
        fn = self.apps.patch_namespaced_deployment if kind == "Deployment" else self.apps.patch_namespaced_stateful_set
        return self._call(
            f"patch {kind} {namespace}/{name}",
            fn,
            name,
            namespace,
            body,
            field_manager="tuner",
            _content_type=STRATEGIC_MERGE,
        )

    def disruption_budgets(self, namespace: str) -> list[client.V1PodDisruptionBudget]:
        got = self._call(
            f"list PodDisruptionBudgets in {namespace}", self.policy.list_namespaced_pod_disruption_budget, namespace
        )
        return list(got.items or [])

    # ---- errors -------------------------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            raise self._error(what, exc) from None
        except (HTTPError, OSError) as exc:
            raise KubernetesError(what, f"API at {self.where} unreachable: {type(exc).__name__}") from None

    def _error(self, what: str, exc: ApiException) -> KubernetesError:
        message = exc.reason or ""
        try:
            message = json.loads(exc.body or "{}").get("message") or message
        except (ValueError, AttributeError):
            pass
        hint = {
            401: "; the credentials were refused (kubeconfig user, or the ServiceAccount token)",
            403: "; the ServiceAccount lacks a permission (see deploy/kubernetes/rbac.yaml)",
            409: "; it changed since tuner read it (someone else edited it): read the recommendation again",
        }.get(exc.status or 0, "")
        return KubernetesError(what, f"{exc.status} {message}{hint}")
