"""The Kubernetes route (tuner/apply/kube.py) through the official client: patch a Deployment's container args,
follow the rollout, judge the group's pods, patch the previous args back.

Every test here that takes ``cluster`` runs against the stand-in API server (tests/k8s_standin.py: a real local
HTTP server answering with the official client's object shapes and rolling Deployments as the controller does; no
kube-apiserver can run on these machines) and, when $KUBECONFIG is set, against that real cluster too (skipped
otherwise). What the pods served is recorded real vLLM CPU data (tests/fixtures/verdict), stored under the pods'
target names as the daemon's scrapes would store it: the old pods the ``before`` recordings, the new pods the
``after`` ones. The route's pure parts (args, the disruption budget, a rollout's state) are tested on the client's
models alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import (
    V1Container,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStatus,
    V1DeploymentStrategy,
    V1LabelSelector,
    V1LabelSelectorRequirement,
    V1ObjectMeta,
    V1Pod,
    V1PodDisruptionBudget,
    V1PodDisruptionBudgetSpec,
    V1PodSpec,
    V1PodStatus,
    V1PodTemplateSpec,
    V1RollingUpdateDeployment,
    V1RollingUpdateStatefulSetStrategy,
    V1StatefulSet,
    V1StatefulSetSpec,
    V1StatefulSetStatus,
    V1StatefulSetUpdateStrategy,
)

from tests.k8s_clusters import CLUSTERS, open_cluster
from tuner.app.judge import read_series
from tuner.apply.flow import Applier
from tuner.apply.kube import budget_refusal, rollout_state, unavailable_during_roll
from tuner.apply.routes import ROUTES, route_for
from tuner.collect import vllm
from tuner.config import parse_config
from tuner.errors import ApplyError, FlagError, KubernetesError
from tuner.kube.api import KubeApi
from tuner.kube.args import parse_flags, rewrite_args
from tuner.kube.pods import PodWatch, expand, templates
from tuner.store import journal as jr
from tuner.store import recommendations as recs

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "verdict"
ARGS = [
    "serve",
    "/models/qwen",
    "--port",
    "8000",
    "--max-num-seqs",
    "4",
    "--enable-prefix-caching",
    "--served-model-name",
    "chat",
    "--max-model-len=2048",
]


@pytest.fixture(params=CLUSTERS)
def cluster(request, tmp_path):
    c = open_cluster(request.param, tmp_path)
    yield c
    c.close()


def _config(c: Any, tmp_path: Path, *, name: str = "chat", canary: str | None = None, apply: str = "") -> str:
    extra = f", canary: {canary}" if canary else ""
    return (
        f"kubernetes: {{kubeconfig: '{c.kubeconfig}'}}\n"
        f"targets:\n  - name: chat\n    backend: vllm\n    url: http://chat.{c.namespace}.svc:8000\n"
        f"    slo: {{ttft_p99: 2s, e2e_p99: 10s}}\n"
        f"    kubernetes: {{namespace: {c.namespace}, name: {name}, container: vllm, pods: {{selector: "
        f"'app=chat'}}, poll: 2s{extra}}}\n"
        f"    apply: {{baseline: 25s, observe: 25s, observe_max: 25s{apply}}}\n"
    )


def _discovered(c: Any, tmp_path: Path, **kw: Any):
    """The config with the template replaced by its pods, as the daemon and the CLI see it."""
    cfg = parse_config(_config(c, tmp_path, **kw))
    api = KubeApi.connect(cfg.kubernetes, tmp_path)
    return expand(cfg, PodWatch(api, templates(cfg)).list_now())


def _store_served(store: Any, name: str, case: str, part: str, *, start: float) -> None:
    """A pod's scrapes: the recorded series of ``case``/``part``, moved to start at ``start``."""
    series = read_series(CASES / case / part)
    shift = start - series[0][0]
    store.ensure_target(name, "vllm", "http://127.0.0.1:9", {"group": "chat"})
    for ts, text, _ in series:
        store.ingest(vllm.snapshot_from_text(text, target=name, ts=ts + shift))


def _recommend(store: Any, target: str, diff: dict[str, Any], current: dict[str, Any], now: float) -> int:
    return recs.add_recommendation(
        store.engine,
        target=target,
        now=now,
        rules=["r"],
        diff_key=json.dumps(diff),
        diff=diff,
        current=current,
        evidence=[],
        expected_effect="",
        risk="",
        confidence=0.9,
        rank=1,
        memory_check={"ok": True},
    )


def _on_observing(then: Callable[[], None]) -> Callable[[str], None]:
    """A ``say`` that runs ``then`` once, when the apply starts observing (the new pods serve from there on)."""
    done = []

    def say(msg: str) -> None:
        if "] observing:" in msg and not done:
            done.append(msg)
            then()

    return say


def test_an_apply_on_a_two_pod_deployment_rolls_is_judged_on_its_pods_and_rolls_back(cluster, store, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): the whole route, done when this passes."""
    c = cluster
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"}, max_unavailable=0, max_surge=1)
    c.pdb("chat", {"app": "chat"}, min_available=1)
    cfg = _discovered(c, tmp_path)
    old = c.pods("chat")
    assert [t.name for t in cfg.targets] == [f"chat.{p}" for p in old] and len(old) == 2
    first = cfg.target(f"chat.{old[0]}")
    assert first.group == "chat" and first.replica == old[0] and first.url.endswith(":8000")
    assert first.flags == {"max_num_seqs": 4, "enable_prefix_caching": True, "max_model_len": 2048}
    assert route_for(first) is ROUTES["kubernetes"]
    # the old pods served before (the recorded runs of one group: r1 ``same_restart``, r2 ``fewer_seqs``)
    now = c.clock()
    _store_served(store, f"chat.{old[0]}", "same_restart", "before", start=now - 21)
    _store_served(store, f"chat.{old[1]}", "fewer_seqs", "before", start=now - 20.6)
    new_pods: list[str] = []

    def new_pods_serve() -> None:  # what the daemon's scrapes of the new pods store while tuner observes
        new_pods.extend(p for p in c.pods("chat") if p not in old)
        _store_served(store, f"chat.{new_pods[0]}", "same_restart", "after", start=c.clock() + 0.5)
        _store_served(store, f"chat.{new_pods[1]}", "fewer_seqs", "after", start=c.clock() + 0.9)

    rid = _recommend(store, first.name, {"max_num_seqs": 8}, {"max_num_seqs": 4}, now)
    ap = Applier(cfg, store, tmp_path, say=_on_observing(new_pods_serve), clock=c.clock, sleep=c.sleep)
    a = ap.apply(rid)

    steps = [s["step"] for s in a.steps]
    patches = [json.loads(s["detail"]) for s in a.steps if s["step"] == "patch"]
    # rolled: one patch of the container's args, the changed flag only, every other arg in its place
    assert patches[0]["from"] == ARGS and patches[0]["kind"] == "Deployment" and patches[0]["name"] == "chat"
    assert patches[0]["to"] == [a if i != 5 else "8" for i, a in enumerate(ARGS)]
    rollout = [s["detail"] for s in a.steps if s["step"] == "rollout"]
    assert any("2 of 2 pods updated, 2 available, 0 old" in r for r in rollout), rollout
    assert steps.index("healthy") < steps.index("observing") and len(new_pods) == 2 and not set(new_pods) & set(old)
    if not c.real:
        assert any("waiting for the controller to see generation 2" in r for r in rollout), rollout
        assert (
            "PATCH",
            "/apis/apps/v1/namespaces/llm/deployments/chat",
            "application/strategic-merge-patch+json",
        ) in c.cluster.requests
        # the patch is data: the container's args and tuner's annotation, on the resourceVersion tuner read
        body = c.cluster.patches[0]
        assert body["spec"] == {"template": {"spec": {"containers": [{"name": "vllm", "args": patches[0]["to"]}]}}}
        assert set(body["metadata"]) == {"resourceVersion", "annotations"} and body["metadata"]["resourceVersion"]
        assert body["metadata"]["annotations"] == {"tuner.dev/apply": str(a.id)}
        # never below the budget: maxUnavailable 0 and a surge of 1, so at least 2 pods available at every read
        assert all("2 available" in r or "3 available" in r for r in rollout if "available" in r), rollout
    # judged on the group's pods: the old ones before, the new ones after (the group fell by half: undone)
    assert a.outcome == "rolled_back", (a.note, a.steps)
    assert a.baseline["replicas"] == [f"chat.{p}" for p in old]
    assert a.after["replicas"] == sorted(f"chat.{p}" for p in new_pods)
    assert a.after["served_rps"] / a.baseline["served_rps"] < 0.6, (a.baseline, a.after)
    # rolled back: the previous args patched back, exactly, and rolled out again to pods that are ready
    assert patches[-1]["to"] == ARGS and steps[-2:] == ["restored", "done: rolled_back"], steps
    assert c.args_of("chat") == ARGS
    back = c.pods("chat")
    assert len(back) == 2 and not set(back) & set(new_pods)
    assert recs.get_recommendation(store.engine, rid).status == "rolled_back"
    assert jr.open_applies(store.engine) == []


def test_a_rollout_that_stalls_past_its_deadline_is_restored(cluster, store, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): ``--max-num-seqs 777`` starts pods that never get ready."""
    c = cluster
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"}, progress_deadline_s=30)
    cfg = _discovered(c, tmp_path)
    old = c.pods("chat")
    t = cfg.target(f"chat.{old[0]}")
    rid = _recommend(store, t.name, {"max_num_seqs": 777}, {"max_num_seqs": 4}, c.clock())
    a = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).apply(rid)
    assert a.outcome == "failed" and "ProgressDeadlineExceeded" in a.note, a.note
    assert "did not roll out" in a.note and "previous flags restored" in a.note, a.note
    assert c.args_of("chat") == ARGS and len(c.pods("chat")) == 2
    # the stalled rollout never took an old pod out: both still serve (maxUnavailable 0)
    assert set(c.pods("chat")) == set(old)
    assert recs.get_recommendation(store.engine, rid).status == "failed"


def test_a_pod_that_crash_loops_fails_the_apply_with_its_own_words_and_is_restored(cluster, store, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): ``--max-num-seqs 999`` makes the container exit 1."""
    c = cluster
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"})
    cfg = _discovered(c, tmp_path)
    old = c.pods("chat")
    rid = _recommend(store, f"chat.{old[0]}", {"max_num_seqs": 999}, {"max_num_seqs": 4}, c.clock())
    a = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).apply(rid)
    assert a.outcome == "failed", a.note
    assert "CrashLoopBackOff" in a.note and "exited 1" in a.note, a.note
    assert "max_num_seqs 999 does not fit the KV cache" in a.note, a.note
    assert c.args_of("chat") == ARGS and set(c.pods("chat")) == set(old)


@pytest.mark.parametrize("shape", ["max_unavailable", "recreate"])
def test_an_apply_that_could_go_below_the_pdb_is_refused_before_anything_is_patched(cluster, store, tmp_path, shape):
    """Stand-in API server (or $KUBECONFIG's cluster): maxUnavailable 1 (or Recreate) against minAvailable 2."""
    c = cluster
    kw: dict[str, Any] = (
        {"max_unavailable": 1, "max_surge": 0} if shape == "max_unavailable" else {"strategy": "Recreate"}
    )
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"}, **kw)
    c.pdb("chat", {"app": "chat"}, min_available=2)
    cfg = _discovered(c, tmp_path)
    t = cfg.targets[0]
    rid = _recommend(store, t.name, {"max_num_seqs": 8}, {"max_num_seqs": 4}, c.clock())
    a = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).apply(rid)
    assert a.outcome == "failed"
    assert "PodDisruptionBudget chat keeps 2 of 2 pods available" in a.note and "may leave" in a.note, a.note
    assert "tuner does not go below it" in a.note
    assert not [s for s in a.steps if s["step"] == "patch"]  # nothing was patched
    assert c.args_of("chat") == ARGS
    if not c.real:
        assert not [r for r in c.cluster.requests if r[0] == "PATCH"]


def test_a_deployment_changed_outside_tuner_is_not_overwritten(cluster, store, tmp_path):
    """Stand-in API server: someone edits the args after the recommendation, and again while tuner observes."""
    c = cluster
    if c.real:
        pytest.skip("edits the Deployment behind the client's back: the stand-in's own hook")
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"})
    cfg = _discovered(c, tmp_path)
    t = cfg.targets[0]
    edited = [a if a != "4" else "6" for a in ARGS]
    c.cluster.edit_args("llm", "chat", edited)
    for _ in range(5):
        c.cluster.tick()
    rid = _recommend(store, t.name, {"max_num_seqs": 8}, {"max_num_seqs": 4}, c.clock())
    a = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).apply(rid)
    assert a.outcome == "failed" and "runs max_num_seqs=6 where tuner expected max_num_seqs=4" in a.note, a.note
    assert c.args_of("chat") == edited

    # and an edit made after tuner's patch is not clobbered by the restore
    c.cluster.edit_args("llm", "chat", ARGS)
    for _ in range(5):
        c.cluster.tick()
    cfg = _discovered(c, tmp_path)
    t = cfg.targets[0]
    later = ARGS + ["--seed", "1"]
    rid = _recommend(store, t.name, {"max_num_seqs": 8}, {"max_num_seqs": 4}, c.clock())
    ap = Applier(
        cfg,
        store,
        tmp_path,
        say=_on_observing(lambda: c.cluster.edit_args("llm", "chat", later)),
        clock=c.clock,
        sleep=c.sleep,
    )
    a = ap.apply(rid)  # nothing served: inconclusive, and keep_previous restores...
    assert a.outcome == "inconclusive" and "restoring the previous flags FAILED" in a.note, a.note
    assert "was changed since tuner patched it" in a.note and c.args_of("chat") == later


def test_a_stale_resource_version_is_a_conflict_not_an_overwrite(cluster, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): the patch carries the resourceVersion tuner read."""
    c = cluster
    c.deployment("chat", replicas=1, args=ARGS, labels={"app": "chat"})
    api = KubeApi.connect(parse_config(_config(c, tmp_path)).kubernetes)
    w = api.workload("Deployment", c.namespace, "chat")
    api.patch("Deployment", c.namespace, "chat", {"metadata": {"annotations": {"x": "1"}}})  # someone else
    with pytest.raises(KubernetesError, match="409 .*changed since tuner read it"):
        api.patch(
            "Deployment",
            c.namespace,
            "chat",
            {
                "metadata": {"resourceVersion": w.metadata.resource_version},
                "spec": {"template": {"spec": {"containers": [{"name": "vllm", "args": ["--max-num-seqs", "8"]}]}}},
            },
        )
    assert c.args_of("chat") == ARGS


def test_a_canary_deployment_is_judged_against_as_many_control_pods_then_the_first_rolls(cluster, store, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): a second Deployment beside the first, the same app label."""
    c = cluster
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat", "track": "stable"})
    c.deployment("chat-canary", replicas=1, args=ARGS, labels={"app": "chat", "track": "canary"})
    cfg = _discovered(c, tmp_path, canary="chat-canary")
    control_pods, canary_old = c.pods("chat"), c.pods("chat-canary")
    assert sorted(t.name for t in cfg.targets) == sorted(f"chat.{p}" for p in control_pods + canary_old)
    assert {t.labels["workload"] for t in cfg.targets} == {"chat", "chat-canary"}
    t = cfg.target(f"chat.{control_pods[1]}")  # the recommendation's pod need not be the one compared

    def serve() -> None:  # over the same window: the control as before, the canary as after (more seqs: better)
        canary = [p for p in c.pods("chat-canary") if p not in canary_old]
        start = c.clock() + 0.5
        _store_served(store, f"chat.{control_pods[0]}", "queue_more_seqs", "before", start=start)
        _store_served(store, f"chat.{control_pods[1]}", "same_restart", "before", start=start + 0.3)
        _store_served(store, f"chat.{canary[0]}", "queue_more_seqs", "after", start=start + 0.1)

    rid = _recommend(store, t.name, {"max_num_seqs": 8}, {"max_num_seqs": 4}, c.clock())
    ap = Applier(cfg, store, tmp_path, say=_on_observing(serve), clock=c.clock, sleep=c.sleep)
    a = ap.canary(rid)
    assert a.kind == "canary" and a.outcome == "kept", (a.note, a.steps)
    assert (a.baseline["replica"], a.after["replica"]) == ("chat", "chat-canary")
    assert a.baseline["replicas"] == [f"chat.{control_pods[0]}"] and len(a.after["replicas"]) == 1  # 1 against 1
    patched = [json.loads(s["detail"])["name"] for s in a.steps if s["step"] == "patch"]
    assert patched == ["chat-canary", "chat"]  # the canary first; kept, then the first Deployment
    assert c.args_of("chat") == c.args_of("chat-canary") == [x if x != "4" else "8" for x in ARGS]
    assert recs.get_recommendation(store.engine, rid).status == "applied"


def test_a_tuner_that_died_mid_apply_leaves_the_previous_args_restored_by_reconcile(cluster, store, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): the apply's tuner stops while observing; the next one
    (``tuner reconcile``, or a restarted ``tuner run``) patches the args back."""
    c = cluster
    c.deployment("chat", replicas=2, args=ARGS, labels={"app": "chat"})
    cfg = _discovered(c, tmp_path)
    rid = _recommend(store, cfg.targets[0].name, {"max_num_seqs": 8}, {"max_num_seqs": 4}, c.clock())

    class Killed(BaseException):
        pass

    def die() -> None:
        raise Killed

    dead = Applier(
        cfg, store, tmp_path, say=_on_observing(die), clock=c.clock, sleep=c.sleep, owner=(2**22 + 7, 1)
    )  # no such process: its apply is orphaned
    with pytest.raises(Killed):
        dead.apply(rid)
    assert c.args_of("chat") != ARGS and len(jr.open_applies(store.engine)) == 1
    lines = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).reconcile()
    assert len(lines) == 1 and "rolled_back" in lines[0] and "previous flags restored" in lines[0], lines
    assert c.args_of("chat") == ARGS and len(c.pods("chat")) == 2


def test_flags_held_in_the_command_are_refused(cluster, store, tmp_path):
    """Stand-in API server (or $KUBECONFIG's cluster): tuner patches args only."""
    c = cluster
    if c.real:
        pytest.skip("the real cluster's test image has its own command")
    c.deployment(
        "chat",
        replicas=1,
        args=["/models/qwen"],
        labels={"app": "chat"},
        command=["vllm", "serve", "--max-num-seqs", "4"],
    )
    cfg = _discovered(c, tmp_path)
    rid = _recommend(store, cfg.targets[0].name, {"max_num_seqs": 8}, {}, c.clock())
    a = Applier(cfg, store, tmp_path, say=lambda m: None, clock=c.clock, sleep=c.sleep).apply(rid)
    assert a.outcome == "failed" and "sets --max-num-seqs in its command" in a.note, a.note


# ---- the pure parts, on the client's models -------------------------------------------------------------------


def test_args_are_set_in_place_and_every_other_arg_is_left_as_it_was():
    args = [
        "serve",
        "m",
        "--max-num-seqs",
        "4",
        "--seed",
        "3",
        "--max-model-len=2048",
        "--no-enable-prefix-caching",
        "--max-num-seqs",
        "5",
        "--trust-remote-code",
    ]
    assert parse_flags("vllm", args) == {"max_num_seqs": 5, "max_model_len": 2048, "enable_prefix_caching": False}
    out = rewrite_args(
        "vllm",
        args,
        {
            "max_num_seqs": ["--max-num-seqs", "8"],
            "max_model_len": ["--max-model-len", "4096"],
            "enable_prefix_caching": ["--enable-prefix-caching"],
            "gpu_memory_utilization": ["--gpu-memory-utilization", "0.85"],
        },
    )
    assert out == [
        "serve",
        "m",
        "--max-num-seqs",
        "8",
        "--seed",
        "3",
        "--max-model-len=4096",
        "--enable-prefix-caching",
        "--max-num-seqs",
        "8",
        "--trust-remote-code",
        "--gpu-memory-utilization",
        "0.85",
    ]
    assert rewrite_args("vllm", args, {}) == args
    assert parse_flags("llamacpp", ["-m", "x.gguf", "-c", "4096", "-fa", "on", "--port", "8080"]) == {
        "ctx_size": 4096,
        "flash_attn": "on",
    }
    with pytest.raises(FlagError, match="end with --max-num-seqs and no value"):
        parse_flags("vllm", ["--max-num-seqs"])
    with pytest.raises(FlagError, match="max_num_seqs"):
        parse_flags("vllm", ["--max-num-seqs", "-1"])


def _deployment(
    replicas: int = 2,
    *,
    strategy: str = "RollingUpdate",
    mu: Any = None,
    surge: Any = None,
    status: V1DeploymentStatus | None = None,
    generation: int = 1,
) -> V1Deployment:
    ru = V1RollingUpdateDeployment(max_unavailable=mu, max_surge=surge) if strategy == "RollingUpdate" else None
    return V1Deployment(
        metadata=V1ObjectMeta(name="chat", generation=generation),
        spec=V1DeploymentSpec(
            replicas=replicas,
            selector=V1LabelSelector(match_labels={"app": "chat"}),
            strategy=V1DeploymentStrategy(type=strategy, rolling_update=ru),
            template=V1PodTemplateSpec(
                metadata=V1ObjectMeta(labels={"app": "chat", "tier": "a"}),
                spec=V1PodSpec(containers=[V1Container(name="vllm")]),
            ),
        ),
        status=status
        or V1DeploymentStatus(
            replicas=replicas, available_replicas=replicas, observed_generation=1, updated_replicas=replicas
        ),
    )


def _pdb(**kw: Any) -> V1PodDisruptionBudget:
    sel = kw.pop("selector", V1LabelSelector(match_labels={"app": "chat"}))
    return V1PodDisruptionBudget(metadata=V1ObjectMeta(name="b"), spec=V1PodDisruptionBudgetSpec(selector=sel, **kw))


def test_what_a_rollout_may_take_out_is_read_as_the_controllers_read_it():
    assert unavailable_during_roll("Deployment", _deployment(4))[0] == 1  # the default 25%, rounded down
    assert unavailable_during_roll("Deployment", _deployment(3))[0] == 0
    assert unavailable_during_roll("Deployment", _deployment(4, mu=0, surge=0))[0] == 1  # both 0: the controller's 1
    assert unavailable_during_roll("Deployment", _deployment(10, mu="30%"))[0] == 3
    assert unavailable_during_roll("Deployment", _deployment(3, strategy="Recreate"))[0] == 3
    sts = V1StatefulSet(
        metadata=V1ObjectMeta(name="s"),
        spec=V1StatefulSetSpec(
            replicas=3,
            selector=V1LabelSelector(match_labels={"a": "b"}),
            service_name="s",
            template=V1PodTemplateSpec(spec=V1PodSpec(containers=[V1Container(name="vllm")])),
        ),
    )
    assert unavailable_during_roll("StatefulSet", sts)[0] == 1
    sts.spec.update_strategy = V1StatefulSetUpdateStrategy(type="OnDelete")
    with pytest.raises(ApplyError, match="OnDelete"):
        unavailable_during_roll("StatefulSet", sts)
    sts.spec.update_strategy = V1StatefulSetUpdateStrategy(
        type="RollingUpdate", rolling_update=V1RollingUpdateStatefulSetStrategy(partition=2)
    )
    with pytest.raises(ApplyError, match="partition is 2"):
        unavailable_during_roll("StatefulSet", sts)


def test_a_budget_refuses_what_its_selector_covers_and_nothing_else():
    d = _deployment(4, mu=1, surge=0)
    assert budget_refusal("Deployment", d, [_pdb(min_available=3)]) is None
    assert "keeps 4 of 4" in (budget_refusal("Deployment", d, [_pdb(min_available=4)]) or "")
    assert "keeps 100% of 4" in (budget_refusal("Deployment", d, [_pdb(min_available="100%")]) or "")
    assert "allows 0 unavailable" in (budget_refusal("Deployment", d, [_pdb(max_unavailable=0)]) or "")
    other = V1LabelSelector(match_labels={"app": "other"})
    assert budget_refusal("Deployment", d, [_pdb(min_available=4, selector=other)]) is None
    expr = V1LabelSelector(match_expressions=[V1LabelSelectorRequirement(key="tier", operator="In", values=["a"])])
    assert budget_refusal("Deployment", d, [_pdb(min_available=4, selector=expr)]) is not None
    assert budget_refusal("Deployment", d, [_pdb(min_available=4, selector=None)]) is None  # a null selector: none
    short = _deployment(4, mu=1, status=V1DeploymentStatus(replicas=4, available_replicas=3, observed_generation=1))
    assert "only 3 of its 4 pods are available" in (budget_refusal("Deployment", short, []) or "")


def _pod(name: str, args: list[str], waiting: str | None = None, restarts: int = 0) -> V1Pod:
    state = V1ContainerState(waiting=V1ContainerStateWaiting(reason=waiting)) if waiting else V1ContainerState()
    last = V1ContainerState(
        terminated=V1ContainerStateTerminated(exit_code=137, reason="OOMKilled", message="Killed\n")
    )
    return V1Pod(
        metadata=V1ObjectMeta(name=name),
        spec=V1PodSpec(containers=[V1Container(name="vllm", args=args)]),
        status=V1PodStatus(
            container_statuses=[
                V1ContainerStatus(
                    name="vllm",
                    image="i",
                    image_id="",
                    ready=False,
                    restart_count=restarts,
                    state=state,
                    last_state=last,
                )
            ]
        ),
    )


def test_a_rollout_is_done_failed_or_progressing_by_its_status_and_its_new_pods():
    new = ["--max-num-seqs", "8"]
    done = _deployment(
        2,
        generation=2,
        status=V1DeploymentStatus(observed_generation=2, replicas=2, updated_replicas=2, available_replicas=2),
    )
    assert rollout_state("Deployment", done, [], "vllm", new)[0] == "done"
    unseen = _deployment(2, generation=3, status=done.status)
    assert rollout_state("Deployment", unseen, [], "vllm", new) == (
        "progressing",
        "waiting for the controller to see generation 3",
    )
    old_left = _deployment(
        2,
        generation=2,
        status=V1DeploymentStatus(observed_generation=2, replicas=3, updated_replicas=2, available_replicas=2),
    )
    assert rollout_state("Deployment", old_left, [], "vllm", new) == (
        "progressing",
        "2 of 2 pods updated, 2 available, 1 old",
    )
    looping = [_pod("old", ["--max-num-seqs", "4"], "CrashLoopBackOff", 3), _pod("new", new, "CrashLoopBackOff", 2)]
    state, why = rollout_state("Deployment", old_left, looping, "vllm", new)
    assert state == "failed" and why.startswith("pod new: CrashLoopBackOff after 2 restarts; it exited 137 (OOMKilled)")
    assert (
        rollout_state("Deployment", old_left, [_pod("new", new, "ContainerCreating")], "vllm", new)[0] == "progressing"
    )
    sts = V1StatefulSet(
        metadata=V1ObjectMeta(name="s", generation=2),
        spec=V1StatefulSetSpec(replicas=2, selector=V1LabelSelector(), service_name="s", template=V1PodTemplateSpec()),
        status=V1StatefulSetStatus(
            replicas=2,
            observed_generation=2,
            updated_replicas=2,
            ready_replicas=2,
            current_revision="a",
            update_revision="b",
        ),
    )
    assert rollout_state("StatefulSet", sts, [], "vllm", new)[0] == "progressing"
    sts.status.current_revision = "b"
    assert rollout_state("StatefulSet", sts, [], "vllm", new) == ("done", "2 of 2 pods updated, 2 ready")


def test_the_config_names_the_workload_by_kubernetes_rules():
    base = "targets:\n  - {name: c, backend: vllm, url: 'http://x:1', kubernetes: {%s}}"
    ok = parse_config(base % "namespace: llm, name: vllm.chat-1, container: vllm, pods: {port: http}")
    assert ok.targets[0].kubernetes.kind == "Deployment"
    for bad, key in [
        ("namespace: Llm, name: c, container: v", "kubernetes.namespace"),
        ("namespace: llm, name: c_1, container: v", "kubernetes.name"),
        ("namespace: llm, name: c, container: v.1", "kubernetes.container"),
        ("namespace: llm, name: c, container: v, pods: {selector: 'a in b'}", "kubernetes.pods.selector"),
        ("namespace: llm, name: c, container: v, pods: {port: Http}", "kubernetes.pods.port"),
        ("namespace: " + "a" * 64 + ", name: c, container: v", "kubernetes.namespace"),
    ]:
        with pytest.raises(Exception, match=key.replace(".", r"\.")):
            parse_config(base % bad)
    with pytest.raises(Exception, match="auto mode's guardrails .* count per target"):
        parse_config(base % "namespace: llm, name: c, container: v, pods: {}}, apply: {mode: auto")
    with pytest.raises(Exception, match="Kubernetes starts this server"):
        parse_config(
            "targets:\n  - {name: c, backend: vllm, url: 'http://x:1', managed: {model: m}, "
            "kubernetes: {namespace: a, name: b, container: c}}"
        )
