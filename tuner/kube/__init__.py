"""Kubernetes as tuner sees it: the API (official client; in-cluster config or a kubeconfig), a workload's pods as
targets (listed and watched, or read from Prometheus's kubernetes_sd labels), and a container's args as flags.

The official client is the optional extra ``tuner[kubernetes]``: ``tuner.kube.api`` imports it, and only ``connect``
imports ``tuner.kube.api`` (a config without Kubernetes never loads it). Nothing here decides an apply: the route
that patches and follows a rollout is tuner/apply/kube.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuner.config import Config, KubeAccess
from tuner.errors import KubernetesError
from tuner.kube.args import parse_flags, rewrite_args, tunable_in
from tuner.kube.pods import Pod, PodWatch, expand, from_prometheus, is_template, members, templates

if TYPE_CHECKING:
    from tuner.kube.api import KubeApi

__all__ = [
    "Pod",
    "PodWatch",
    "connect",
    "expand",
    "from_prometheus",
    "is_template",
    "list_pods",
    "members",
    "parse_flags",
    "rewrite_args",
    "templates",
    "tunable_in",
]


def connect(access: KubeAccess, config_dir: Path | None = None) -> KubeApi:
    """The API client for ``access``; KubernetesError when the client is missing or its config cannot be read."""
    try:
        from tuner.kube.api import KubeApi
    except ImportError as exc:
        raise KubernetesError(
            "client", f"the kubernetes Python client is not installed ({exc.name}): pip install 'tuner[kubernetes]'"
        ) from None
    return KubeApi.connect(access, config_dir)


def list_pods(cfg: Config, config_dir: Path | None, *, now: float) -> dict[str, list[Pod]]:
    """Every template's pods, listed once (the API, or Prometheus for a template whose source is prometheus);
    KubernetesError naming the first template whose pods could not be listed."""
    found: dict[str, list[Pod]] = {}
    api_side = [t for t in templates(cfg) if t.source != "prometheus"]
    errors: list[str] = []
    if api_side:
        watch = PodWatch(
            connect(cfg.kubernetes, config_dir),
            api_side,
            failed=lambda name, error: errors.append(f"targets[{name}]: {error}") if error else None,
        )
        found.update(watch.list_now())
        if errors:
            raise KubernetesError("pods", errors[0])
    for t in templates(cfg):
        if t.source == "prometheus":
            assert cfg.prometheus is not None  # the config's cross-check guarantees it
            found[t.name] = from_prometheus(cfg.prometheus.url, t, timeout_s=cfg.timeout(t).total_seconds(), now=now)
    return found


from tuner.kube.discovery import Discovery  # noqa: E402  (it connects through ``connect`` above)

__all__ += ["Discovery"]
