"""The Kubernetes route: a workload's container args patched, Kubernetes rolls the pods, tuner follows and judges.

Kubernetes does the rolling (its strategy, readiness probes as the health gate, the PodDisruptionBudget); tuner
never deletes or restarts a pod itself. An apply reads the Deployment (or StatefulSet), refuses when the rollout
could leave fewer pods available than a PodDisruptionBudget asks (maxUnavailable, Recreate) or when the group is
short already, then patches the container's args with a strategic-merge patch built as data (JSON): the
allow-listed flags of the change are set in place, every other arg stays as it is and where it is; the patch carries
the resourceVersion tuner read, so a change made meanwhile by someone else is refused (409), not overwritten. It
follows the rollout (observedGeneration, updated / available replicas) until it is done, or fails on
``ProgressDeadlineExceeded`` or a new pod that cannot run (CrashLoopBackOff, ImagePullBackOff, ...). Each patch is
journaled (the workload, the args before and after) before it is sent; restoring patches the args from before back
and follows that rollout the same way. The group's pods before and after a rollout are different pods: the
verdict reads the ones that served in each window (``replicas``: what the store kept of the group's pods).

A canary is a second Deployment beside the first (``kubernetes.canary``, the same pod labels behind the Service):
it takes the flags first, its pods are judged against the first's over the same window, and only a kept canary
rolls the first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.apply.launch import render_flags
from tuner.apply.port import Plan, Steps
from tuner.backends import backend as backend_of
from tuner.config import Kubernetes, Target
from tuner.errors import ApplyError, FlagError, KubernetesError, ServerStartError
from tuner.flags import render
from tuner.kube import connect
from tuner.kube.args import parse_flags, rewrite_args, tunable_in
from tuner.kube.pods import Pod, selector_of
from tuner.store import journal as jr
from tuner.store.journal import ApplyState, ApplyStep

if TYPE_CHECKING:  # the API client type only (kube.api is loaded when a Kubernetes target is used)
    from tuner.kube.api import KubeApi

__all__ = ["Kube", "budget_refusal", "rollout_state", "unavailable_during_roll", "selects"]

ANNOTATION = "tuner.dev/apply"  # on the workload: the apply that patched it last
# a pod of the new template waiting for one of these will not become ready by waiting longer
_STUCK = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "InvalidImageName",
)


def _flag_argv(backend: str, name: str, value: Any) -> list[str]:
    """One allow-listed flag as argv elements, by the argv builders' rules (routes.flags_argv of one flag)."""
    return render_flags(render(backend, {name: value}), dashed=backend_of(backend).dashed_flags, reserved=frozenset())


def _scaled(value: int | str | None, total: int, *, round_up: bool, default: int | str) -> int:
    """An IntOrString of the Kubernetes API (``1``, ``"25%"``) against ``total`` pods."""
    v = default if value is None else value
    if isinstance(v, str) and v.endswith("%"):
        share = total * float(v[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(v)


def unavailable_during_roll(kind: str, w: Any) -> tuple[int, str]:
    """How many of the workload's pods a rollout may take out of service at once, and why; ApplyError when a patch
    would not roll at all (a StatefulSet's OnDelete or partition, a paused Deployment)."""
    spec = w.spec
    replicas = 1 if spec.replicas is None else spec.replicas
    if kind == "Deployment":
        if spec.paused:
            raise ApplyError("the Deployment is paused: a patch would not roll (kubectl rollout resume it first)")
        strategy = spec.strategy
        if strategy is not None and strategy.type == "Recreate":
            return replicas, "strategy Recreate stops every pod before the new ones start"
        ru = strategy.rolling_update if strategy is not None else None
        raw_mu = ru.max_unavailable if ru is not None else None
        mu = _scaled(raw_mu, replicas, round_up=False, default="25%")
        surge = _scaled(ru.max_surge if ru is not None else None, replicas, round_up=True, default="25%")
        if mu == 0 and surge == 0:
            mu = 1  # what the Deployment controller does with both at 0
        return min(mu, replicas), f"maxUnavailable {raw_mu if raw_mu is not None else '25%'}"
    us = spec.update_strategy
    if us is not None and us.type == "OnDelete":
        raise ApplyError("the StatefulSet's updateStrategy is OnDelete: a patch would not roll its pods")
    ru = us.rolling_update if us is not None else None
    if ru is not None and ru.partition:
        raise ApplyError(
            f"the StatefulSet's rollingUpdate.partition is {ru.partition}: pods below it would keep the old args"
        )
    raw = ru.max_unavailable if ru is not None else None
    return min(
        max(1, _scaled(raw, replicas, round_up=False, default=1)), replicas
    ), f"maxUnavailable {raw if raw is not None else 1}"


def selects(selector: Any, labels: dict[str, str]) -> bool:
    """Whether a V1LabelSelector selects pods with ``labels`` (a null selector selects none, an empty one all)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.match_labels or {}).items()):
        return False
    for e in selector.match_expressions or []:
        have = e.key in labels
        ok = {
            "In": have and labels[e.key] in (e.values or []),
            "NotIn": not have or labels[e.key] not in (e.values or []),
            "Exists": have,
            "DoesNotExist": not have,
        }.get(e.operator, False)
        if not ok:
            return False
    return True


def budget_refusal(kind: str, w: Any, budgets: Sequence[Any]) -> str | None:
    """Why patching the workload now could take more pods out of service than allowed (None: it may roll): a
    PodDisruptionBudget over its pods against what the rollout may take out at once, or pods short already."""
    replicas = 1 if w.spec.replicas is None else w.spec.replicas
    out, how = unavailable_during_roll(kind, w)
    labels = (w.spec.template.metadata.labels if w.spec.template.metadata else None) or {}
    for pdb in budgets:
        if not selects(pdb.spec.selector, labels):
            continue
        name = pdb.metadata.name
        if pdb.spec.min_available is not None:
            need = _scaled(pdb.spec.min_available, replicas, round_up=True, default=0)
            if replicas - out < need:
                return (
                    f"PodDisruptionBudget {name} keeps {pdb.spec.min_available} of {replicas} pods available and "
                    f"the rollout ({how}) may leave {replicas - out}"
                )
        if pdb.spec.max_unavailable is not None:
            allow = _scaled(pdb.spec.max_unavailable, replicas, round_up=True, default=0)
            if out > allow:
                return (
                    f"PodDisruptionBudget {name} allows {pdb.spec.max_unavailable} unavailable and the rollout "
                    f"({how}) may take {out} out at once"
                )
    st = w.status
    available = (st.available_replicas if st is not None else None) or 0
    if kind == "StatefulSet" and st is not None and st.available_replicas is None:
        available = st.ready_replicas or 0
    if replicas and available < replicas:
        return f"only {available} of its {replicas} pods are available now; a rollout would take more out"
    return None


def _container(w: Any, name: str) -> Any:
    spec = w.spec.template.spec
    c = next((c for c in spec.containers or [] if c.name == name), None)
    if c is None:
        raise ApplyError(
            f"it has no container {name!r} (containers: "
            f"{', '.join(c.name for c in spec.containers or [])}); set kubernetes.container"
        )
    return c


def rollout_state(kind: str, w: Any, pods: Sequence[Any], container: str, args: Sequence[str]) -> tuple[str, str]:
    """("done" | "progressing" | "failed", what the rollout to ``args`` is at) from the workload's status and its
    pods (V1Pod): failed on ProgressDeadlineExceeded or a pod with the new args that cannot run."""
    for p in pods:
        c = next((c for c in p.spec.containers or [] if c.name == container), None)
        if c is None or list(c.args or []) != list(args):
            continue
        cs = next((s for s in (p.status.container_statuses or [] if p.status else []) if s.name == container), None)
        waiting = cs.state.waiting if cs is not None and cs.state is not None else None
        if cs is not None and waiting is not None and waiting.reason in _STUCK:
            last = cs.last_state.terminated if cs.last_state is not None else None
            said = ""
            if last is not None:
                said = f"; it exited {last.exit_code}" + (f" ({last.reason})" if last.reason else "")
                if last.message and last.message.strip():
                    said += ": " + last.message.strip().splitlines()[-1][:200]
            return "failed", f"pod {p.metadata.name}: {waiting.reason} after {cs.restart_count} restarts{said}"
    meta, spec, st = w.metadata, w.spec, w.status
    replicas = 1 if spec.replicas is None else spec.replicas
    if st is None or (st.observed_generation or 0) < (meta.generation or 0):
        return "progressing", f"waiting for the controller to see generation {meta.generation}"
    if kind == "Deployment":
        for cond in st.conditions or []:
            if cond.type == "Progressing" and cond.reason == "ProgressDeadlineExceeded":
                return "failed", f"ProgressDeadlineExceeded ({cond.message})"
        updated, available, total = st.updated_replicas or 0, st.available_replicas or 0, st.replicas or 0
        text = f"{updated} of {replicas} pods updated, {available} available, {max(0, total - updated)} old"
        done = updated >= replicas and available >= replicas and total <= replicas
        return ("done" if done else "progressing"), text
    updated, ready = st.updated_replicas or 0, st.ready_replicas or 0
    text = f"{updated} of {replicas} pods updated, {ready} ready"
    done = updated >= replicas and ready >= replicas and st.current_revision == st.update_revision
    return ("done" if done else "progressing"), text


class Kube:
    """A target whose server Kubernetes runs (``kubernetes:``): its workload's container args carry the flags."""

    name, restarts, outage, whole_group = "kubernetes", True, False, True

    def argv(self, t: Target, flags: dict[str, Any], diff: dict[str, Any]) -> list[str]:
        """The tunable flags as container args (the journal's old and new argv; the other args are the pod's)."""
        return [a for n, v in flags.items() if n != "backend" for a in _flag_argv(t.backend, n, v)]

    def describe(self, p: Plan) -> list[str]:
        k = self._k(p.target)
        also = f" and of its canary Deployment {k.canary}" if k.canary else ""
        return [
            f"kubernetes: patch the args of container {k.container} in {k.kind} {k.namespace}/{k.name}{also} "
            "(the changed flags only; every other arg kept, in order); Kubernetes rolls the pods, tuner follows "
            "the rollout, never below the PodDisruptionBudget, and judges the group's pods",
            "flags after: " + " ".join(p.new_argv),
        ]

    @staticmethod
    def _k(t: Target) -> Kubernetes:
        assert t.kubernetes is not None
        return t.kubernetes

    @staticmethod
    def _api(ap: Steps) -> KubeApi:
        try:
            return connect(ap.cfg.kubernetes, ap.config_dir)
        except KubernetesError as exc:
            raise ApplyError(str(exc)) from None

    def switch(self, ap: Steps, aid: int, p: Plan, flags: dict[str, Any], diff: dict[str, Any]) -> None:
        t, k = p.target, self._k(p.target)
        api = self._api(ap)
        done = [self._roll(ap, aid, api, t, k.kind, k.name, diff, p.old_flags)]
        if k.canary is not None:  # the whole group runs the flags: the canary Deployment's pods too
            done.append(self._roll(ap, aid, api, t, "Deployment", k.canary, diff, p.old_flags, missing_ok=True))
        ap.step(aid, ApplyStep.HEALTHY, "; ".join(d for d in done if d))

    def canary(self, ap: Steps, aid: int, p: Plan) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """The canary Deployment takes the flags; ((canary, its pods' targets), (control, its pods' targets))."""
        t, k = p.target, self._k(p.target)
        if k.canary is None or t.group is None:
            raise ApplyError(
                f"{t.name}: a canary on Kubernetes needs a second Deployment beside the first "
                "(kubernetes.canary) and its pods as targets (kubernetes.pods)"
            )
        api = self._api(ap)
        ap.step(
            aid,
            ApplyStep.CANARY,
            f"Deployment {k.canary} takes the new flags; {k.kind} {k.name} keeps the old ones as the control",
        )
        self._roll(ap, aid, api, t, "Deployment", k.canary, p.diff, p.old_flags)
        sides = []
        for owner in (k.canary, k.name):
            w = api.workload("Deployment" if owner == k.canary else k.kind, k.namespace, owner)
            items, _ = api.pods(k.namespace, selector_of(w))
            pods = sorted(q.name for q in (Pod.of(i, k.container) for i in items) if q.owner == owner and q.ready)
            sides.append((owner, [f"{t.group}.{name}" for name in pods]))
        # as many control pods as the canary has: the verdict compares what each side served, like for like
        (canary, canary_in), (control, control_in) = sides
        return (canary, canary_in), (control, control_in[: len(canary_in)])

    def promote(self, ap: Steps, aid: int, p: Plan) -> None:
        """After a kept canary: the first Deployment takes the flags too."""
        k = self._k(p.target)
        ap.step(
            aid, ApplyStep.HEALTHY, self._roll(ap, aid, self._api(ap), p.target, k.kind, k.name, p.diff, p.old_flags)
        )

    def _roll(
        self,
        ap: Steps,
        aid: int,
        api: KubeApi,
        t: Target,
        kind: Any,
        name: str,
        diff: dict[str, Any],
        old: dict[str, Any],
        *,
        missing_ok: bool = False,
    ) -> str:
        """Patch one workload's container args to ``diff`` and follow its rollout; what it reached."""
        k = self._k(t)
        where = f"{kind} {k.namespace}/{name}"
        try:
            w = api.workload(kind, k.namespace, name)
        except KubernetesError as exc:
            if missing_ok and exc.reason.startswith("404"):
                ap.step(aid, ApplyStep.ROLLOUT, f"{where} does not exist: nothing to patch")
                return ""
            raise ApplyError(str(exc)) from None
        try:
            c = _container(w, k.container)
            if tunable_in(t.backend, c.command or []):
                raise ApplyError(
                    f"container {k.container} sets {', '.join(tunable_in(t.backend, c.command))} in "
                    "its command; tuner patches args only: move the server's flags to args"
                )
            args = list(c.args or [])
            have = parse_flags(t.backend, args)
        except FlagError as exc:
            raise ApplyError(f"{where}: container {k.container}: {exc}") from None
        except ApplyError as exc:
            raise ApplyError(f"{where}: {exc}") from None
        moved = [n for n in diff if n in old and have.get(n) != old[n]]
        if moved:
            raise ApplyError(
                f"{where} runs "
                + ", ".join(f"{n}={have.get(n, '(default)')}" for n in moved)
                + " where tuner expected "
                + ", ".join(f"{n}={old[n]}" for n in moved)
                + ": it was changed outside tuner; `tuner recommend` again against what runs"
            )
        try:
            refusal = budget_refusal(kind, w, api.disruption_budgets(k.namespace))
        except KubernetesError as exc:
            raise ApplyError(str(exc)) from None
        except ApplyError as exc:
            raise ApplyError(f"{where}: {exc}") from None
        if refusal is not None:
            raise ApplyError(
                f"{where}: {refusal}; tuner does not go below it (change the budget or the strategy, or apply by hand)"
            )
        new = rewrite_args(t.backend, args, {n: _flag_argv(t.backend, n, v) for n, v in diff.items() if n != "backend"})
        return self._patch(ap, aid, api, t, kind, name, w, args, new)

    def _patch(
        self,
        ap: Steps,
        aid: int,
        api: KubeApi,
        t: Target,
        kind: Any,
        name: str,
        w: Any,
        args: list[str],
        new: list[str],
    ) -> str:
        k = self._k(t)
        ap.step(
            aid,
            ApplyStep.PATCH,
            json.dumps(
                {
                    "kind": kind,
                    "namespace": k.namespace,
                    "name": name,
                    "container": k.container,
                    "from": args,
                    "to": new,
                }
            ),
            state=ApplyState.STARTING,
        )
        if new != args:  # the same args: nothing to send, but a rollout still going (to them) is followed
            body = {
                "metadata": {"resourceVersion": w.metadata.resource_version, "annotations": {ANNOTATION: str(aid)}},
                "spec": {"template": {"spec": {"containers": [{"name": k.container, "args": new}]}}},
            }
            try:
                api.patch(kind, k.namespace, name, body)
            except KubernetesError as exc:
                raise ApplyError(str(exc)) from None
        return self._follow(ap, aid, api, t, kind, name, new)

    def _follow(self, ap: Steps, aid: int, api: KubeApi, t: Target, kind: Any, name: str, args: list[str]) -> str:
        """Read the rollout every ``kubernetes.poll`` until done; ApplyError when it failed or outlasted
        ``kubernetes.rollout_timeout``."""
        k = self._k(t)
        where = f"{kind} {k.namespace}/{name}"
        deadline = ap.clock() + k.rollout_timeout.total_seconds()
        last = ""
        while True:
            try:
                w = api.workload(kind, k.namespace, name)
                items, _ = api.pods(k.namespace, selector_of(w))
            except KubernetesError as exc:
                raise ApplyError(str(exc)) from None
            own = [i for i in items if Pod.of(i, k.container).owner == name]
            state, detail = rollout_state(kind, w, own, k.container, args)
            if detail != last:
                ap.step(aid, ApplyStep.ROLLOUT, f"{where}: {detail}", state=ApplyState.HEALTH_CHECK)
                last = detail
            if state == "done":
                return f"{where}: rolled out, {detail}"
            if state == "failed":
                raise ApplyError(f"{where} did not roll out: {detail}")
            if ap.clock() >= deadline:
                raise ApplyError(
                    f"{where} still rolling after kubernetes.rollout_timeout "
                    f"{k.rollout_timeout.total_seconds():g}s: {detail}"
                )
            ap.sleep(k.poll.total_seconds())

    def restore(self, ap: Steps, aid: int, p: Plan) -> bool:
        """Every workload this apply patched gets the args it had before the apply back (journaled as patched),
        the last patched first; ApplyError when one was changed since by someone else."""
        patches = [json.loads(s["detail"]) for s in jr.get_apply(ap.engine, aid).steps if s["step"] == ApplyStep.PATCH]
        if not patches:
            return True  # nothing was patched: nothing changed
        before: dict[tuple[str, str], list[str]] = {}
        ours: dict[tuple[str, str], list[list[str]]] = {}
        for pt in patches:
            key = (pt["kind"], pt["name"])
            before.setdefault(key, pt["from"])
            ours.setdefault(key, []).extend([pt["from"], pt["to"]])
        api = self._api(ap)
        t, k = p.target, self._k(p.target)
        for (kind, name), args in reversed(list(before.items())):
            where = f"{kind} {k.namespace}/{name}"
            try:
                w = api.workload(kind, k.namespace, name)  # type: ignore[arg-type]
            except KubernetesError as exc:
                raise ApplyError(str(exc)) from None
            now = list(_container(w, k.container).args or [])
            if now not in ours[(kind, name)]:
                raise ApplyError(
                    f"{where} was changed since tuner patched it (its args are now {json.dumps(now)}); "
                    f"restore by hand: args {json.dumps(args)}"
                )
            self._patch(ap, aid, api, t, kind, name, w, now, args)
        return True

    def why_failed(self, ap: Steps, t: Target, exc: ServerStartError | ApplyError) -> str:
        return str(exc).splitlines()[0]

    def in_flight(self, ap: Steps, t: Target) -> int | None:
        return None

    def settle(self, ap: Steps, aid: int, t: Target) -> None:
        return None  # Kubernetes goes on rolling by itself; reconcile restores the args (restore)

    def replicas(self, ap: Steps, t: Target, start: float, end: float) -> list[str]:
        """The group's pods that served in [start, end]: the targets the store kept of them (a rollout replaces
        every pod: the window before reads the old ones, the window after the new)."""
        if t.group is None:
            return [t.name]
        prefix = t.group + "."
        return [
            n for n in ap.store.target_names() if n.startswith(prefix) and ap.store.data_span(n, start, end) is not None
        ]
