"""The admission decision: a pure function of (request, namespace labels, config).

No I/O here: the namespace labels and the config come from caches the server keeps current, so
a review is answered in microseconds and `dryRun` behaves exactly like a real request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from raygate.core import keys
from raygate.core import quantity as q
from raygate.core.modes import Mode, recorded_mode, rules_for
from raygate.core.objects import get
from raygate.core.patch import PatchBuilder, PatchOp
from raygate.core.policy import NamespacePolicy, RaygateConfig
from raygate.core.workload import Gang, ManifestError, Workload
from raygate.webhook import guard
from raygate.webhook.review import AdmissionRequest, username

RAY_KINDS = frozenset({keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    outcome: str  # for metrics and logs: mutated, unchanged, skipped-*, refused, denied
    patch: list[PatchOp] = field(default_factory=list)
    message: str | None = None
    code: int | None = None
    warnings: list[str] = field(default_factory=list)
    gang: Gang | None = None
    mode: Mode | None = None


def allow(outcome: str, message: str | None = None) -> Decision:
    return Decision(allowed=True, outcome=outcome, message=message)


def refuse(message: str, *, code: int = 422, mode: Mode | None = None) -> Decision:
    return Decision(allowed=False, outcome="refused", message=message, code=code, mode=mode)


def _kuberay_child(w: Workload, user: str, config: RaygateConfig) -> bool:
    """KubeRay's own cluster for a RayJob that raygate admitted (or that another system admits): leave it alone.

    Decided by who asks, not by what the object claims: anyone may write an ownerReference or a
    label. Only the KubeRay operator creates a RayJob's cluster, and it copies the job's labels and
    annotations onto it; users cannot write raygate's keys on a job (the guard), so a state of
    Admitted here is the admitted job's own.
    """
    if w.rayjob_parent() is None or user not in config.ray_operator_users:
        return False
    mode = recorded_mode(w.annotations)
    return w.labels.get(keys.STATE_LABEL) == keys.State.ADMITTED or (mode is not None and not rules_for(mode).holds)


def _skip_reason(w: Workload, user: str, config: RaygateConfig) -> str | None:
    if _kuberay_child(w, user, config):
        return "skipped-owned-by-rayjob"  # its RayJob was gang-admitted already
    if w.uses_cluster_selector:
        return "skipped-cluster-selector"  # runs on an existing cluster: there is no gang to admit
    # No skip on raygate's own annotation: a user could set it to walk past the hold. An object
    # raygate already mutated needs no patch anyway, because every operation is a no-op then.
    return None


def _rayjob_refusals(w: Workload, policy: NamespacePolicy, b: PatchBuilder, warnings: list[str]) -> list[str]:
    if not w.is_job:
        return []
    out = []
    deletion = get(w.obj, ("spec", "deletionStrategy"))
    if isinstance(deletion, dict) and deletion.get("deletionRules"):
        return [
            "spec.deletionStrategy.deletionRules cannot be used with raygate: KubeRay requires "
            "shutdownAfterJobFinishes: false with deletionRules, and refuses to suspend a RayJob unless "
            "shutdownAfterJobFinishes is true, so this job could never be held until its capacity is booked. "
            "Remove deletionRules and set `shutdownAfterJobFinishes: true`; keep the cluster after the job with "
            "ttlSecondsAfterFinished, or choose what is deleted with deletionStrategy.onSuccess/onFailure"
        ]
    if isinstance(deletion, dict) and any(
            get(deletion, (when, "policy")) == "DeleteNone" for when in ("onSuccess", "onFailure")):
        out.append(
            "deletionStrategy policy DeleteNone needs shutdownAfterJobFinishes: false, and KubeRay refuses to "
            "suspend such a RayJob: use DeleteCluster, DeleteWorkers or DeleteSelf (with ttlSecondsAfterFinished "
            "to keep the cluster a while)"
        )
    if get(w.obj, ("spec", "clusterSelector")):
        out.append(
            "spec.clusterSelector and spec.rayClusterSpec cannot be used together: remove clusterSelector "
            "to run on a new gang-admitted cluster, or rayClusterSpec to use an existing cluster"
        )
    if get(w.obj, ("spec", "shutdownAfterJobFinishes")) is not True:
        if policy.fix_shutdown_after_job_finishes:
            b.set(("spec", "shutdownAfterJobFinishes"), True)
            # The API server may cut warnings longer than 120 characters: keep it short.
            warnings.append(
                "raygate set spec.shutdownAfterJobFinishes=true: KubeRay fails a suspended RayJob without it"
            )
        else:
            out.append(
                "spec.shutdownAfterJobFinishes must be true: the job is created suspended until its capacity "
                "is available, and KubeRay fails a suspended RayJob without it. "
                "Add `shutdownAfterJobFinishes: true` to spec"
            )
    return out


def _max_gang_refusals(namespace: str, policy: NamespacePolicy, gang: Gang) -> list[str]:
    out: list[str] = []
    if not policy.max_gang:
        return out  # no limit: skip summing the gang's resources (about a tenth of a review's time)
    need = gang.start_resources
    for name, limit in sorted(policy.max_gang_quantities().items()):
        if need.get(name, Decimal(0)) > limit:
            out.append(
                f"the gang needs {q.format_quantity(need.get(name, Decimal(0)), binary=q.is_binary(name))} "
                f"{name} but "
                f"namespace {namespace} allows at most {q.format_quantity(limit, binary=q.is_binary(name))} "
                "(maxGang in raygate-config): reduce replicas or per-pod requests"
            )
    return out


def _namespace(request: AdmissionRequest, w: Workload) -> str:
    ns = request.get("namespace")
    return ns if isinstance(ns, str) and ns else w.namespace


def _unreadable(request: AdmissionRequest, err: ManifestError) -> Decision:
    obj = request.get("object") or request.get("oldObject")
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return refuse(f"raygate cannot read this {kind if isinstance(kind, str) else 'object'}: {err}")


def mutate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig) -> Decision:
    """The mutating webhook: hold the job and add what its mode needs, or refuse with a reason."""
    try:
        return _mutate(request, ns_labels, config)
    except ManifestError as err:  # a malformed field anywhere (labels that are a list, ...) is the user's to fix
        return _unreadable(request, err)


def _subject(
    request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig
) -> tuple[Workload, str] | Decision:
    """The Ray object under review and its namespace, or why raygate has nothing to say about it."""
    obj = request.get("object")
    if not isinstance(obj, dict):
        return allow("skipped-operation")
    w = Workload(obj)
    if w.kind not in RAY_KINDS:
        return allow("skipped-kind")
    namespace = _namespace(request, w)
    if not config.opted_in(namespace, dict(ns_labels) if ns_labels is not None else None):
        return allow("skipped-namespace")
    return w, namespace


def _mutate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig) -> Decision:
    if request.get("operation") != "CREATE":
        return allow("skipped-operation")
    subject = _subject(request, ns_labels, config)
    if isinstance(subject, Decision):
        return subject
    return _admit(*subject, config, username(request))


def _strip_user_claims(b: PatchBuilder, w: Workload) -> None:
    """Remove what a user wrote in raygate's name: its own keys (a state, a request, a reason), and
    annotations on pod templates that would consume a booking made for someone else's job."""
    for kind in ("labels", "annotations"):
        for key in getattr(w, kind):
            path = ("metadata", kind, key)
            if guard.raygate_owned(key) and not b.written(path):
                b.remove(path)
    for _, template in w.template_paths():
        for key in (keys.CONSUME_ANNOTATION, keys.CLASS_ANNOTATION):
            b.remove((*template, "metadata", "annotations", key))


def _admit(w: Workload, namespace: str, config: RaygateConfig, user: str) -> Decision:
    """Refuse, or hold and patch, an opted-in Ray object being created."""
    skip = _skip_reason(w, user, config)
    if skip:
        return allow(skip)
    policy = config.policy_for(namespace)
    mode_rules = rules_for(policy.mode)
    b = PatchBuilder(w.obj)
    warnings: list[str] = []
    try:
        problems = _rayjob_refusals(w, policy, b, warnings)
        gang = w.gang()
        problems += mode_rules.refusals(w, policy, gang)
        problems += _max_gang_refusals(namespace, policy, gang)
    except ManifestError as err:
        return refuse(f"raygate cannot read this {w.kind}: {err}", mode=policy.mode)
    if problems:
        return refuse(f"raygate refused {w.kind} {w.name}: " + "; ".join(problems), mode=policy.mode)
    mode_rules.apply(b, w, policy, gang)
    b.set(("metadata", "annotations", keys.MODE_ANNOTATION), policy.mode.value)
    _strip_user_claims(b, w)
    return Decision(
        allowed=True, outcome="mutated" if b.ops else "unchanged", patch=b.ops, warnings=warnings, gang=gang,
        mode=policy.mode,
    )


# --- the validating guard -------------------------------------------------------------------------

def validate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig) -> Decision:
    """The validating webhook: refuse what cannot be admitted; guard jobs raygate holds."""
    try:
        return _validate(request, ns_labels, config)
    except ManifestError as err:
        return _unreadable(request, err)


def _validate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig) -> Decision:
    subject = _subject(request, ns_labels, config)
    if isinstance(subject, Decision):
        return subject
    w, namespace = subject
    user = username(request)
    if request.get("operation") == "CREATE":
        # The mutating webhook refuses first; this catches an object that bypassed it.
        decision = _admit(w, namespace, config, user)
        if not decision.allowed:
            return decision
        if decision.mode is None:
            return allow("valid")
        rules = rules_for(decision.mode)
        if (problem := rules.stored_problem(w, namespace)) is not None:
            return refuse(problem, mode=decision.mode)
        if rules.holds and decision.patch:
            return refuse(_not_held(w, namespace, decision.patch), mode=decision.mode)
        return allow("valid")
    if request.get("operation") != "UPDATE" or not isinstance(request.get("oldObject"), dict):
        return allow("skipped-operation")
    if user in config.trusted_users:
        return allow("trusted")
    old = Workload(request["oldObject"])  # type: ignore[arg-type]
    policy = config.policy_for(namespace)
    rules = rules_for(policy.recorded_mode(old.annotations))
    if not rules.holds:
        return allow("admitted-elsewhere")  # the system that admits here (Kueue) guards its own jobs
    changes = guard.forbidden_changes(old, w, rules, policy.managed_resources)
    if not changes:
        return allow("valid")
    return refuse(guard.refusal(w, old, namespace, changes), code=403)


def _not_held(w: Workload, namespace: str, patch: list[PatchOp]) -> str:
    """Validation runs after every mutating webhook: the object must be stored exactly as raygate held it."""
    paths = ", ".join(sorted({str(op["path"]) for op in patch})[:5])
    return (f"{w.kind} {w.name} would be stored without raygate's hold in namespace {namespace} ({paths} differ "
            "from what raygate's mutating webhook sets): its GPU pods could start before capacity is booked. "
            "Another mutating webhook changed it after raygate, or raygate's mutating webhook did not run: "
            "cluster admins, check `kubectl get mutatingwebhookconfiguration raygate-mutating`")


Decide = Callable[[AdmissionRequest, Mapping[str, str] | None, RaygateConfig], Decision]
