"""Kubernetes as tuner sees it: the API (official client; in-cluster config or a kubeconfig), a workload's pods as
targets (listed and watched, or read from Prometheus's kubernetes_sd labels), and a container's args as flags.

Nothing here decides an apply: the route that patches and follows a rollout is tuner/apply/kube.py.
"""

from tuner.kube.api import KubeApi
from tuner.kube.args import parse_flags, rewrite_args, tunable_in
from tuner.kube.pods import Pod, PodWatch, expand, members, pods_from_prometheus, templates

__all__ = ["KubeApi", "Pod", "PodWatch", "expand", "members", "parse_flags", "pods_from_prometheus", "rewrite_args",
           "templates", "tunable_in"]
