"""The clusters the Kubernetes tests run against: the stand-in API server (tests/k8s_standin.py; always) and a real
cluster when $KUBECONFIG is set (skipped otherwise: no kube-apiserver can run on these machines).

Both offer what the tests need and nothing more: a Deployment of the test workload (its container's behaviour is
``behaviour_by_flags``: ``--max-num-seqs 999`` crashes, ``777`` never gets ready), a PodDisruptionBudget, a pod's
deletion, the Deployment's args and its pods, a kubeconfig, and the clock the Applier runs on. On the stand-in the
clock is simulated (a rollout moves one step per read, an observation takes no time); on a real cluster it is the
wall clock and the test waits for Kubernetes. The real cluster's namespace is $TUNER_K8S_TEST_NAMESPACE (default
``tuner-test``; it must exist and the kubeconfig's user may create Deployments and PodDisruptionBudgets there), its
image $TUNER_K8S_TEST_IMAGE (default python:3.12-alpine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.k8s_standin import Cluster, behaviour_by_flags, serve_cluster

__all__ = ["FakeClock", "StandIn", "RealCluster", "open_cluster", "CLUSTERS", "behaviour_by_flags"]

CLUSTERS = ["standin", "real"]

# The test workload's container on a real cluster: it does what behaviour_by_flags says the stand-in's pods do.
WORKLOAD = r"""
import http.server, sys
args = sys.argv[1:]
v = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--max-num-seqs"), None)
if v == "999":
    msg = "ValueError: max_num_seqs 999 does not fit the KV cache"
    print(msg, file=sys.stderr)
    open("/dev/termination-log", "w").write(msg)
    sys.exit(1)
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(503 if self.path == "/health" and v == "777" else 200)
        self.end_headers()
http.server.HTTPServer(("", 8000), H).serve_forever()
"""


class FakeClock:
    """Wall time that moves only when slept on: a rollout or an observation takes no real time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


class StandIn:
    """The stand-in API server (a real local HTTP server, no kube-apiserver) with a simulated clock."""

    real = False

    def __init__(self, tmp_path: Path, namespace: str = "llm") -> None:
        self.namespace = namespace
        self.cluster = Cluster()
        self.running = serve_cluster(self.cluster, tmp_path, namespace)
        self.kubeconfig = self.running.kubeconfig
        self.clock = FakeClock(time.time())
        self.sleep: Callable[[float], None] = self.clock.sleep

    def deployment(self, name: str, *, replicas: int, args: list[str], **kw: Any) -> None:
        self.cluster.deployment(self.namespace, name, replicas=replicas, args=args, **kw)

    def pdb(self, name: str, labels: dict[str, str], **kw: Any) -> None:
        self.cluster.pdb(self.namespace, name, labels, **kw)

    def args_of(self, name: str) -> list[str]:
        return self.cluster.args_of(self.namespace, name)

    def pods(self, owner: str) -> list[str]:
        """The Deployment's pods that are ready, by name."""
        return self.cluster.pod_names(self.namespace, owner, ready=True)

    def delete_pod(self, name: str) -> None:
        self.cluster.delete_pod(self.namespace, name)

    def settle(self, owner: str) -> None:
        """Let the controller replace what is missing (the stand-in moves when asked)."""
        for _ in range(4):
            self.cluster.tick()

    def close(self) -> None:
        self.running.close()


class RealCluster:
    """A real cluster from $KUBECONFIG, on the wall clock."""

    real = True

    def __init__(self, tmp_path: Path) -> None:
        from kubernetes import client, config

        self.namespace = os.environ.get("TUNER_K8S_TEST_NAMESPACE", "tuner-test")
        self.image = os.environ.get("TUNER_K8S_TEST_IMAGE", "python:3.12-alpine")
        self.kubeconfig = Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.apps, self.core, self.policy = (
            client.AppsV1Api(self.api),
            client.CoreV1Api(self.api),
            client.PolicyV1Api(self.api),
        )
        self.clock: Callable[[], float] = time.time
        self.sleep: Callable[[float], None] = time.sleep
        self.made: list[tuple[str, str]] = []
        self.suffix = f"{int(time.time()) % 100000}"

    def deployment(
        self,
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
        from kubernetes import client

        labels = labels or {"app": name}
        probe = client.V1Probe(
            http_get=client.V1HTTPGetAction(path="/health", port=port), period_seconds=1, failure_threshold=1
        )
        c = client.V1Container(
            name=container,
            image=self.image,
            command=["python", "-c", WORKLOAD],
            args=args,
            ports=[client.V1ContainerPort(name="http", container_port=port)],
            readiness_probe=probe,
        )
        ru = (
            client.V1RollingUpdateDeployment(max_unavailable=max_unavailable, max_surge=max_surge)
            if strategy == "RollingUpdate"
            else None
        )
        d = client.V1Deployment(
            api_version="apps/v1",
            kind="Deployment",
            metadata=client.V1ObjectMeta(name=name, labels=labels),
            spec=client.V1DeploymentSpec(
                replicas=replicas,
                progress_deadline_seconds=progress_deadline_s,
                selector=client.V1LabelSelector(match_labels=labels),
                strategy=client.V1DeploymentStrategy(type=strategy, rolling_update=ru),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels), spec=client.V1PodSpec(containers=[c])
                ),
            ),
        )
        self.apps.create_namespaced_deployment(self.namespace, d)
        self.made.append(("Deployment", name))
        self.settle(name)

    def pdb(self, name: str, labels: dict[str, str], **kw: Any) -> None:
        from kubernetes import client

        p = client.V1PodDisruptionBudget(
            api_version="policy/v1",
            kind="PodDisruptionBudget",
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodDisruptionBudgetSpec(selector=client.V1LabelSelector(match_labels=labels), **kw),
        )
        self.policy.create_namespaced_pod_disruption_budget(self.namespace, p)
        self.made.append(("PodDisruptionBudget", name))

    def args_of(self, name: str) -> list[str]:
        d = self.apps.read_namespaced_deployment(name, self.namespace)
        return list(d.spec.template.spec.containers[0].args or [])

    def pods(self, owner: str) -> list[str]:
        from tuner.kube.pods import Pod

        items = self.core.list_namespaced_pod(self.namespace).items
        return sorted(p.name for p in (Pod.of(i, "vllm") for i in items) if p.owner == owner and p.ready)

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace)

    def settle(self, owner: str, timeout_s: float = 300) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            d = self.apps.read_namespaced_deployment(owner, self.namespace)
            st = d.status
            if (
                (st.observed_generation or 0) >= d.metadata.generation
                and st.updated_replicas == d.spec.replicas == st.available_replicas == st.replicas
            ):
                return
            time.sleep(1)
        raise AssertionError(f"Deployment {owner} did not settle in {timeout_s:g}s")

    def close(self) -> None:
        for kind, name in reversed(self.made):
            if kind == "Deployment":
                self.apps.delete_namespaced_deployment(name, self.namespace)
            else:
                self.policy.delete_namespaced_pod_disruption_budget(name, self.namespace)


def open_cluster(kind: str, tmp_path: Path) -> StandIn | RealCluster:
    if kind == "real":
        if not os.environ.get("KUBECONFIG"):
            pytest.skip("a real cluster: set KUBECONFIG (and TUNER_K8S_TEST_NAMESPACE) to run these against it")
        return RealCluster(tmp_path)
    return StandIn(tmp_path)
