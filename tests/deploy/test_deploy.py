"""What deploy/ ships: the Kubernetes manifests validate against the Kubernetes OpenAPI schema (kubernetes-validate,
strict: an unknown field fails), name what the config and the RBAC need of each other, are sized from bench/; the
Role is enough for tuner's client and no more (the stand-in API server enforces it: no kube-apiserver can run
here); `tuner alerts export --format prometheus-operator` writes a PrometheusRule whose rules promtool accepts; and
the systemd unit passes `systemd-analyze verify`.

The ServiceMonitor and the PrometheusRule are the Prometheus Operator's custom resources: kubernetes-validate has no
schema for them (and the operator's CRDs are not vendored here), so their metadata and label selectors are checked
against the Kubernetes schema's own ObjectMeta and LabelSelector, their references against the objects they name,
and the rules by promtool.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import importlib_resources
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from referencing import Registry, Resource

from tests.conftest import require_tool
from tests.k8s_clusters import StandIn
from tuner.apply.flow import Applier
from tuner.config import parse_config
from tuner.kube import connect, list_pods
from tuner.kube.pods import expand
from tuner.store import recommendations as recs

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SYSTEMD = ROOT / "deploy" / "systemd"
CRDS = {"ServiceMonitor", "PrometheusRule"}


def _docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (p.name, d)
        for p in sorted(K8S.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def _one(kind: str) -> dict[str, Any]:
    return next(d for _, d in _docs() if d["kind"] == kind)


def _schema_validate(data: Any, type_file: str) -> None:
    """``data`` against one type of the Kubernetes schema kubernetes-validate ships (strict), e.g. ObjectMeta."""
    base = (
        importlib_resources.files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{latest_version()}-local-strict"
    )
    schema = json.loads((base / type_file).read_text())
    defs = json.loads((base / "_definitions.json").read_text())
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(data)


def _validate(doc: dict[str, Any]) -> None:
    if doc["kind"] in CRDS:
        _schema_validate(doc["metadata"], "objectmeta-meta-v1.json")
        if doc["kind"] == "ServiceMonitor":
            _schema_validate(doc["spec"]["selector"], "labelselector-meta-v1.json")
        return
    kubernetes_validate.validate(doc, latest_version(), strict=True)


def test_every_manifest_validates_against_the_kubernetes_openapi_schema():
    docs = _docs()
    assert {d["kind"] for _, d in docs} == {
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "ServiceMonitor",
    }
    for _name, doc in docs:
        _validate(doc)
    # and the check can fail: a misspelt field, a wrong type, a bad label are refused
    bad = copy.deepcopy(_one("Deployment"))
    bad["spec"]["replica"] = bad["spec"].pop("replicas")
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        _validate(bad)
    bad = copy.deepcopy(_one("Service"))
    bad["spec"]["ports"][0]["port"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad)
    bad = copy.deepcopy(_one("ServiceMonitor"))
    bad["metadata"]["labelz"] = {}
    with pytest.raises(jsonschema.ValidationError, match="labelz"):
        _validate(bad)


def test_the_manifests_agree_with_each_other_and_with_the_kustomization():
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    ns = yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    assert {d["metadata"]["namespace"] for _, d in _docs()} == {ns}
    dep, svc, sm = _one("Deployment"), _one("Service"), _one("ServiceMonitor")
    pod = dep["spec"]["template"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"  # one SQLite writer
    assert pod["spec"]["serviceAccountName"] == _one("ServiceAccount")["metadata"]["name"]
    assert _one("RoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": "tuner", "namespace": ns}]
    assert _one("RoleBinding")["roleRef"]["name"] == _one("Role")["metadata"]["name"]
    claim = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
    assert claim["persistentVolumeClaim"]["claimName"] == _one("PersistentVolumeClaim")["metadata"]["name"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
    assert all(svc["metadata"]["labels"].get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["spec"]["endpoints"][0]["port"] in [p["name"] for p in svc["spec"]["ports"]]
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [ns]
    # the config it mounts is valid, listens where the Service sends, keeps its store on the volume
    cfg = parse_config(_one("ConfigMap")["data"]["tuner.yaml"], "configmap.yaml")
    c = pod["spec"]["containers"][0]
    assert cfg.listen_host_port[1] == c["ports"][0]["containerPort"]
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == claim["name"])
    assert cfg.store.url.startswith(f"sqlite:///{mount}/")
    assert c["args"][-1] == "run" and pod["spec"]["initContainers"][0]["args"][-2:] == ["db", "upgrade"]
    # every Deployment the config may patch is one the Role lets tuner patch, in the same namespace
    role = _one("Role")
    granted = next(r for r in role["rules"] if "deployments" in r["resources"])
    for t in cfg.targets:
        assert t.kubernetes is not None and t.kubernetes.namespace == role["metadata"]["namespace"]
        assert {t.kubernetes.name, t.kubernetes.canary} <= set(granted["resourceNames"]), t.name


def test_the_deployment_is_sized_from_the_bench():
    """The requests cover tuner's CPU and peak RSS at 1,000 targets in the newest bench run, with at most 2x room."""
    runs = sorted((ROOT / "bench" / "results").glob("*-whole-run.md"))
    text = "\n".join(p.read_text() for p in runs)  # oldest first: the last row is the newest run's
    rows = re.findall(r"^\| 1000 \| tuner \| [\d.]+ \| (\d+)% \| [\d,]+ \| (\d+) MiB \|", text, re.M)
    cpu_pct, rss_mib = map(int, rows[-1])
    res = _one("Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
    cpu_m = int(res["requests"]["cpu"].rstrip("m"))
    mem_mib = int(res["requests"]["memory"].rstrip("Mi"))
    assert cpu_pct * 10 <= cpu_m <= 2 * cpu_pct * 10, (cpu_pct, res)
    assert rss_mib <= mem_mib <= 2 * rss_mib, (rss_mib, res)
    assert int(res["limits"]["memory"].rstrip("Mi")) >= 2 * rss_mib and "cpu" not in res["limits"]


def test_the_shipped_role_is_enough_for_tuner_and_no_more(tmp_path, store):
    """Stand-in API server enforcing deploy/kubernetes/rbac.yaml's Role: discovery and an apply go through; a
    Deployment the Role does not name is refused (403)."""
    c = StandIn(tmp_path)
    try:
        c.cluster.rules = _one("Role")["rules"]
        args = ["--model", "m", "--max-num-seqs", "4"]
        c.deployment("vllm-chat", replicas=2, args=args, labels={"app": "vllm-chat"})
        c.deployment("other", replicas=1, args=args, labels={"app": "other"})
        cm = parse_config(_one("ConfigMap")["data"]["tuner.yaml"])
        text = _one("ConfigMap")["data"]["tuner.yaml"].replace(
            "'sqlite:////var/lib/tuner/tuner.db'", f"'sqlite:///{tmp_path}/t.db'"
        )
        cfg = parse_config(f"kubernetes: {{kubeconfig: '{c.kubeconfig}'}}\n" + text)
        assert cfg.targets[0].kubernetes == cm.targets[0].kubernetes
        cfg = expand(cfg, list_pods(cfg, None, now=c.clock()))
        assert len(cfg.targets) == 2
        t = cfg.targets[0]
        rid = recs.add_recommendation(
            store.engine,
            target=t.name,
            now=c.clock(),
            rules=["r"],
            diff_key="{}",
            diff={"max_num_seqs": 8},
            current={"max_num_seqs": 4},
            evidence=[],
            expected_effect="",
            risk="",
            confidence=0.9,
            rank=1,
            memory_check={"ok": True},
        )
        a = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).apply(rid)
        assert "forbidden" not in a.note and [s for s in a.steps if s["step"] == "patch"], a.note
        api = connect(cfg.kubernetes)
        with pytest.raises(Exception, match=r"403 .*cannot patch resource \"deployments\".*lacks a permission"):
            api.patch("Deployment", "llm", "other", {"metadata": {"annotations": {"x": "y"}}})
        with pytest.raises(Exception, match="403"):
            api.workload("Deployment", "llm", "other")
        with pytest.raises(Exception, match=r"(?s)403.*cannot list resource .*deployments"):
            api.apps.list_namespaced_deployment("llm")
    finally:
        c.close()


def _tuner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_alerts_export_writes_a_prometheus_rule_object_promtool_accepts(tmp_path):
    promtool = require_tool("promtool")
    out = _tuner(
        "alerts",
        "export",
        "--format",
        "prometheus-operator",
        "--namespace",
        "monitoring",
        "--label",
        "release=prometheus",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    obj = yaml.safe_load(out.stdout)
    assert (obj["apiVersion"], obj["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert obj["metadata"]["name"] == "tuner" and obj["metadata"]["namespace"] == "monitoring"
    assert obj["metadata"]["labels"]["release"] == "prometheus"
    _validate(obj)
    plain = yaml.safe_load(_tuner("alerts", "export", cwd=tmp_path).stdout)
    assert obj["spec"]["groups"] == plain["groups"]  # the same rules as the rule file
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}))
    check = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    # the configured pack, and a bad name said in one line
    cfg = tmp_path / "tuner.yaml"
    (tmp_path / "mine.yaml").write_text(
        "groups:\n  - name: mine\n    rules:\n      - {alert: Busy, signal: requests_waiting, op: '>', threshold: 3, "
        "for: 1m, backend: vllm}\n"
    )
    cfg.write_text("alerting: {rule_files: [mine.yaml]}\n")
    mine = yaml.safe_load(
        _tuner("--config", str(cfg), "alerts", "export", "--format", "prometheus-operator", cwd=tmp_path).stdout
    )
    assert [g["name"] for g in mine["spec"]["groups"]] == ["mine"]
    bad = _tuner("alerts", "export", "--format", "prometheus-operator", "--name", "Tuner_Rules", cwd=tmp_path)
    assert bad.returncode == 2 and "--name" in bad.stderr and "DNS-1123" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def _verify(unit_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit_dir / "tuner.service"), str(unit_dir / "tuner.slice")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    unit = (SYSTEMD / "tuner.service").read_text()
    tuner = Path(sys.executable).parent / "tuner"
    assert tuner.exists()
    # verify checks that ExecStart's binary exists: the unit as installed where tuner's entry point is
    (tmp_path / "tuner.service").write_text(unit.replace("/usr/local/bin/tuner", str(tuner)))
    shutil.copy(SYSTEMD / "tuner.slice", tmp_path / "tuner.slice")
    got = _verify(tmp_path)
    assert got.returncode == 0 and not (got.stdout + got.stderr).strip(), got.stdout + got.stderr
    keys = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    assert keys["Slice"] == "tuner.slice" and int(keys["CPUWeight"]) > 100
    assert keys["Restart"] == "on-failure" and keys["StateDirectory"] == "tuner"
    assert "[Slice]" in (SYSTEMD / "tuner.slice").read_text()
    # loopback by default: the unit sets no listen address, and a config without one listens on 127.0.0.1
    assert "0.0.0.0" not in unit and parse_config("targets: []").listen_host_port[0] == "127.0.0.1"
    # and verify can fail: a misspelt key, a missing binary
    (tmp_path / "tuner.service").write_text(
        unit.replace("/usr/local/bin/tuner", str(tuner)).replace("Restart=", "Restrat=")
    )
    got = _verify(tmp_path)
    assert "Unknown key" in got.stdout + got.stderr
    (tmp_path / "tuner.service").write_text(unit)
    if not Path("/usr/local/bin/tuner").exists():
        assert _verify(tmp_path).returncode != 0
