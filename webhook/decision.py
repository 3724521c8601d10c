"""The admission decision: a pure function of (request, namespace labels, config).

No I/O here: the namespace labels and the config come from caches the server keeps current, so
a review is answered in microseconds and `dryRun` behaves exactly like a real request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from raygate.core import booking, dra, identity, keys, limits, podgate, queueing
from raygate.core.modes import NO_MEMBERS, Members, ObjectRules, for_object
from raygate.core.objects import get
from raygate.core.patch import PatchBuilder, PatchOp
from raygate.core.policy import NamespacePolicy, RaygateConfig
from raygate.core.workload import ManifestError, Workload
from raygate.webhook import guard, jobs, pods
from raygate.webhook.review import AdmissionRequest, Review, kind_of
from raygate.webhook.verdict import Decision, allow, refuse

RAY_KINDS = frozenset({keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND})


def _kuberay_child(w: Workload, user: str, config: RaygateConfig, policy: NamespacePolicy) -> bool:
    """KubeRay's own cluster for a RayJob that raygate admitted (or that another system admits): leave it alone.

    Decided by who asks, not by what the object claims: anyone may write an ownerReference or a
    label. Only the KubeRay operator creates a RayJob's cluster, and it copies the job's labels and
    annotations onto it; users cannot write raygate's keys on a job (the guard), so a state of
    Admitted, or the mode recorded here, is the job's own (so its rules are read from them).
    """
    if w.rayjob_parent() is None or user not in config.ray_operator_users:
        return False
    return w.labels.get(keys.STATE_LABEL) == keys.State.ADMITTED or not for_object(policy, w.annotations).holds


def _skip_reason(w: Workload, user: str, config: RaygateConfig, policy: NamespacePolicy) -> str | None:
    if _kuberay_child(w, user, config, policy):
        return "skipped-owned-by-rayjob"  # its RayJob was gang-admitted already
    if w.uses_cluster_selector:
        return "skipped-cluster-selector"  # runs on an existing cluster: there is no gang to admit
    # No skip on raygate's own annotation: a user could set it to walk past the hold. An object
    # raygate already mutated needs no patch anyway, because every operation is a no-op then.
    return None


def _gpu_submitter(w: Workload, rules: ObjectRules) -> str | None:
    """A RayJob on an existing cluster (clusterSelector) whose submitter pod asks for GPUs, where pods are gated.
    raygate cannot hold such a job (KubeRay refuses to suspend a clusterSelector RayJob, for good), so its
    submitter's GPUs could never be booked: it would stay gated for ever."""
    template = get(w.obj, ("spec", "submitterPodTemplate"))
    if w.submission_mode != "K8sJobMode" or not isinstance(template, dict) or not rules.gates_pods:
        return None
    managed, uncounted = podgate.managed_request(template, rules.policy, w.claim_templates, w.namespace)
    if not managed and not uncounted:
        return None
    return (f"its submitter pod asks for {', '.join(sorted(managed) or uncounted)}, and it runs on an existing cluster "
            "(spec.clusterSelector): raygate books GPUs by holding a job suspended until its capacity is provisioned, "
            "and KubeRay never runs a suspended RayJob with clusterSelector, so this submitter could never get a "
            "booking. The submitter only submits the job to the cluster: remove the GPUs from "
            "spec.submitterPodTemplate, or give the job its own cluster (spec.rayClusterSpec instead of "
            "clusterSelector)")


def _parent_record(w: Workload) -> Decision:
    """KubeRay's cluster of a RayJob is left as the operator made it, but for raygate's record of its parent: the
    reconciler reads whose cluster it is from that record (written here, when the operator creates it), never
    from an ownerReference or a label, which a user creating a RayCluster may write too."""
    b = PatchBuilder(w.obj)
    parent = w.rayjob_parent()
    if parent is not None:
        b.set(("metadata", "annotations", keys.PARENT_ANNOTATION),
              identity.RayOwner(keys.RAYJOB_KIND, *parent).render())
    return Decision(allowed=True, outcome="skipped-owned-by-rayjob", patch=b.ops)


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


def _unreadable(request: AdmissionRequest, err: ManifestError) -> Decision:
    obj = request.get("object") or request.get("oldObject")
    kind = obj.get("kind") if isinstance(obj, dict) else None
    return refuse(f"raygate cannot read this {kind if isinstance(kind, str) else 'object'}: {err}")


def mutate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig,
           claims: dra.ClaimTemplates = dra.no_templates, members: Members = NO_MEMBERS) -> Decision:
    """The mutating webhook: hold the job and add what its mode needs, or refuse with a reason.

    `ns_labels`, `claims` (DRA claim templates) and `members` (pods in groups) come from the server's caches."""
    review = Review(request, config, ns_labels, claims, members)
    try:
        if kind_of(request) == pods.POD_KIND:
            return pods.mutate(review)
        if kind_of(request) == jobs.JOB_KIND:
            return jobs.mutate(review)
        return _mutate(review)
    except ManifestError as err:  # a malformed field anywhere (labels that are a list, ...) is the user's to fix
        return _unreadable(request, err)


def _subject(review: Review) -> tuple[Workload, str] | Decision:
    """The Ray object under review and its namespace, or why raygate has nothing to say about it."""
    obj = review.obj
    if obj is None:
        return allow("skipped-operation")
    w = Workload(obj, review.claims)
    if w.kind not in RAY_KINDS:
        return allow("skipped-kind")
    namespace = review.namespace_of(obj)
    if not review.opted_in(namespace):
        return allow("skipped-namespace")
    return w, namespace


def _mutate(review: Review) -> Decision:
    if review.operation == "UPDATE":
        return _operator_update(review)
    if review.operation != "CREATE":
        return allow("skipped-operation")
    subject = _subject(review)
    if isinstance(subject, Decision):
        return subject
    w, namespace = subject
    return _admit(w, namespace, for_object(review.config.policy_for(namespace)), review.config, review.user)


def _operator_update(review: Review) -> Decision:
    """The KubeRay operator replaces a RayService's cluster wholesale: keep raygate's hold and record on it."""
    old = review.old
    if review.user not in review.config.ray_operator_users or old is None:
        return allow("skipped-operation")
    subject = _subject(review)
    if isinstance(subject, Decision):
        return subject
    w, _ = subject
    previous = Workload(old, review.claims)
    if previous.labels.get(keys.STATE_LABEL) is None:
        return allow("skipped-not-held")
    b = PatchBuilder(w.obj)
    guard.carry_over(b, previous, w)
    return Decision(allowed=True, outcome="kept-raygates" if b.ops else "unchanged", patch=b.ops)


def _strip_user_claims(b: PatchBuilder, w: Workload) -> None:
    """Remove what a user wrote in raygate's name: its own keys (a state, a request, a reason), and
    annotations on pod templates that would consume a booking made for someone else's job."""
    for kind in ("labels", "annotations"):
        for key in getattr(w, kind):
            path = ("metadata", kind, key)
            if guard.raygate_owned(key) and not b.written(path):
                b.remove(path)
    for _, template in w.template_paths():
        # The booking a pod consumes, and the gang group the pod webhook puts it in, are raygate's to write.
        for key in (keys.CONSUME_ANNOTATION, keys.CLASS_ANNOTATION, keys.GANG_GROUP_ANNOTATION):
            b.remove((*template, "metadata", "annotations", key))


def _admit(w: Workload, namespace: str, rules: ObjectRules, config: RaygateConfig, user: str) -> Decision:
    """Refuse, or hold and patch, an opted-in Ray object being created (`rules`: its namespace's, for_object)."""
    policy = rules.policy
    skip = _skip_reason(w, user, config, policy)
    if skip == "skipped-owned-by-rayjob":
        return _parent_record(w)
    if skip == "skipped-cluster-selector" and (problem := _gpu_submitter(w, rules)) is not None:
        return refuse(f"raygate refused {w.kind} {w.name}: {problem}", mode=rules.mode)
    if skip:
        return allow(skip)
    b = PatchBuilder(w.obj)
    warnings: list[str] = []
    try:
        problems = _rayjob_refusals(w, policy, b, warnings)
        gang = w.gang()
        if rules.books:
            problems += booking.refusals(policy, gang)
        problems += rules.mode_rules.refusals(w, policy, gang)
        problems += limits.problems(namespace, policy, gang, books=rules.books)
        if (priority := queueing.priority_problem(namespace, policy, w)) is not None:
            problems.append(priority)
    except ManifestError as err:
        return refuse(f"raygate cannot read this {w.kind}: {err}", mode=rules.mode)
    if problems:
        return refuse(f"raygate refused {w.kind} {w.name}: " + "; ".join(problems), mode=rules.mode)
    rules.mode_rules.apply(b, w, policy, gang)
    b.set(("metadata", "annotations", keys.MODE_ANNOTATION), rules.mode.value)
    _strip_user_claims(b, w)
    return Decision(
        allowed=True, outcome="mutated" if b.ops else "unchanged", patch=b.ops, warnings=warnings, gang=gang,
        mode=rules.mode,
    )


# --- the validating guard -------------------------------------------------------------------------

def validate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig,
             claims: dra.ClaimTemplates = dra.no_templates, members: Members = NO_MEMBERS) -> Decision:
    """The validating webhook: refuse what cannot be admitted; guard jobs raygate holds."""
    review = Review(request, config, ns_labels, claims, members)
    try:
        if kind_of(request) == pods.POD_KIND:
            return pods.validate(review)
        if kind_of(request) == jobs.JOB_KIND:
            return jobs.validate(review)
        return _validate(review)
    except ManifestError as err:
        return _unreadable(request, err)


def _validate(review: Review) -> Decision:
    subject = _subject(review)
    if isinstance(subject, Decision):
        return subject
    w, namespace = subject
    user, config = review.user, review.config
    if review.operation == "CREATE":
        # The mutating webhook refuses first; this catches an object that bypassed it.
        rules = for_object(config.policy_for(namespace))
        decision = _admit(w, namespace, rules, config, user)
        if not decision.allowed:
            return decision
        if decision.outcome == "skipped-owned-by-rayjob" and decision.patch:
            return refuse(f"{w.kind} {w.name} would be stored without raygate's record of its RayJob "
                          f"({keys.PARENT_ANNOTATION}): another mutating webhook removed it after raygate's, or "
                          "raygate's did not run (cluster admins: check `kubectl get mutatingwebhookconfiguration "
                          "raygate-mutating`)")
        if decision.mode is None:
            return allow("valid")
        if (problem := rules.mode_rules.stored_problem(w, namespace)) is not None:
            return refuse(problem, mode=rules.mode)
        if rules.holds and decision.patch:
            return refuse(_not_held(w, namespace, decision.patch), mode=rules.mode)
        return allow("valid")
    if review.operation != "UPDATE" or review.old is None:
        return allow("skipped-operation")
    if user in config.trusted_users:
        return allow("trusted")
    old = Workload(review.old, review.claims)
    rules = for_object(config.policy_for(namespace), old.annotations)
    if (over := _over_limits(old, w, namespace, rules)) is not None:
        return over
    if w.uses_cluster_selector and (problem := _gpu_submitter(w, rules)) is not None:
        return refuse(f"raygate refused this change of {w.kind} {w.name}: {problem}", mode=rules.mode)
    if not rules.holds:
        return allow("admitted-elsewhere")  # the system that admits here (Kueue) guards its own jobs
    changes = guard.forbidden_changes(old, w, rules.mode_rules, rules.policy.manages, pods_gated=rules.gates_pods)
    if not changes:
        return allow("valid")
    return refuse(guard.refusal(w, old, namespace, changes), code=403)


def _over_limits(old: Workload, new: Workload, namespace: str, rules: ObjectRules) -> Decision | None:
    """An update that takes the object over a limit, in any state and any mode, is refused with the numbers
    (one that stays over a limit it was already over without growing is left to the other checks); so is one
    that names another PriorityClass the namespace does not allow."""
    priority = queueing.priority_problem(namespace, rules.policy, new)
    if priority is not None and queueing.priority_class_names(new) != queueing.priority_class_names(old):
        return refuse(f"raygate refused this change of {new.kind} {new.name}: {priority}", code=403)
    if new.uses_cluster_selector:
        return None
    gang = new.gang()
    problems = limits.problems(namespace, rules.policy, gang, books=rules.books)
    if not problems or not limits.grows(old.gang(), gang):
        return None
    return refuse(f"raygate refused this change of {new.kind} {new.name}: " + "; ".join(problems), mode=rules.mode)


def _not_held(w: Workload, namespace: str, patch: list[PatchOp]) -> str:
    """Validation runs after every mutating webhook: the object must be stored exactly as raygate held it."""
    paths = ", ".join(sorted({str(op["path"]) for op in patch})[:5])
    return (f"{w.kind} {w.name} would be stored without raygate's hold in namespace {namespace} ({paths} differ "
            "from what raygate's mutating webhook sets): its GPU pods could start before capacity is booked. "
            "Another mutating webhook changed it after raygate, or raygate's mutating webhook did not run: "
            "cluster admins, check `kubectl get mutatingwebhookconfiguration raygate-mutating`")


class Decide(Protocol):
    def __call__(self, request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig,
                 claims: dra.ClaimTemplates = ..., members: Members = ..., /) -> Decision: ...
