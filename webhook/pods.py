"""The admission decision for pods: gate every pod that asks for a managed resource, and let nobody but
raygate's reconciler lift the gate; record, once, whose booking the pod may use (raygate.core.identity), and
let nobody rewrite what that record and the gate rest on; put every pod of a gang scheduled through a group
(native mode: Kubernetes' PodGroup) into it. Pure, like the decision for Ray objects (raygate.core.podgate
says why the gate is at the pod; the mode's GroupRules which group a pod joins, from the webhook's caches).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raygate.core import identity, keys, podgate
from raygate.core.modes import all_groups_at_the_pod, for_object
from raygate.core.objects import get, labels, metadata
from raygate.core.patch import PatchBuilder
from raygate.core.policy import RaygateConfig
from raygate.webhook.review import Review
from raygate.webhook.verdict import Decision, allow, refuse

POD_KIND = "Pod"


def _subject(review: Review) -> tuple[dict[str, object], str] | str:
    """The pod and its namespace, or the outcome that says why raygate leaves it alone."""
    pod = review.obj
    if pod is None:
        return "skipped-operation"
    namespace = review.namespace_of(pod)
    if not review.opted_in(namespace):
        return "skipped-namespace"
    return pod, namespace


def _in_group(pod: Mapping[str, object]) -> bool:
    """A pod of a gang that some mode schedules through a group (its template says which, whatever the
    namespace's mode is now: a job keeps the mode it was admitted under)."""
    return any(r.names_group(pod) is not None for r in all_groups_at_the_pod())


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    found = metadata(pod).get("annotations")
    return found if isinstance(found, Mapping) else {}


def mutate(review: Review) -> Decision:
    if review.operation != "CREATE":
        return allow("skipped-operation")
    subject = _subject(review)
    if isinstance(subject, str):
        return allow(subject)
    pod, namespace = subject
    config, claims = review.config, review.claims
    policy = config.policy_for(namespace)
    books = for_object(policy).gates_pods
    gated = books and podgate.needs_gate(pod, policy, claims, namespace)
    b = PatchBuilder(pod)
    if books:
        for key in podgate.BOOKING_ANNOTATIONS:
            b.remove(("metadata", "annotations", key))
    if not gated and not _in_group(pod):
        # kueue mode (Kueue is the gate), a namespace that books nothing, or a pod that asks for no GPU
        if b.ops:
            return Decision(allowed=True, outcome="booking-claim-removed", patch=b.ops, mode=policy.mode)
        return allow("pod-without-managed-resources" if books else "pod-not-gated-here")
    if gated and get(pod, ("spec", "nodeName")):
        return refuse(f"raygate gates pods that ask for {policy.managed_names()} in namespace {namespace} until a "
                      "booking covers them, and this pod names a node (spec.nodeName), which skips the scheduler "
                      "and its gates: remove nodeName from the pod template and choose nodes with a nodeSelector "
                      "or affinity", mode=policy.mode)
    who = identity.at_pod_create(pod, review.user, config.ray_operator_users)
    if gated and who.refusal is not None:
        return refuse(who.refusal, code=403, mode=policy.mode)
    if who.record is not None:
        b.set(("metadata", "annotations", keys.RAY_OWNER_ANNOTATION), who.record)
    if gated:
        podgate.gate(b, pod)
    for rules in all_groups_at_the_pod():
        rules.pod_patch(b, pod, namespace, gated, review.members)
    outcome = ("gated" if gated else "grouped") if b.ops else "unchanged"
    return Decision(allowed=True, outcome=outcome, patch=b.ops, mode=policy.mode)


def validate(review: Review) -> Decision:
    subject = _subject(review)
    if isinstance(subject, str):
        return allow(subject)
    pod, namespace = subject
    config, claims = review.config, review.claims
    policy = config.policy_for(namespace)
    gates = for_object(policy).gates_pods
    if review.operation == "CREATE":
        # Validation runs after every mutating webhook (and after the API server dropped the fields it does not
        # serve): the pod must be stored gated, with raygate's record of whose it is, and in its group.
        for rules in all_groups_at_the_pod():
            if (problem := rules.pod_problem(pod)) is not None:
                return refuse(problem, mode=policy.mode)
        if not gates:
            return allow("pod-not-gated-here")
        if podgate.needs_gate(pod, policy, claims, namespace) and not podgate.gated(pod):
            return refuse(f"pod {get(pod, ('metadata', 'name')) or ''} asks for {policy.managed_names()} and would "
                          f"be stored without raygate's scheduling gate {keys.CAPACITY_GATE}: another mutating "
                          "webhook removed it, or raygate's did not run (cluster admins: check `kubectl get "
                          "mutatingwebhookconfiguration raygate-mutating`)", mode=policy.mode)
        if problem := _stored_claims(pod, review.user, config):
            return refuse(problem, mode=policy.mode)
        return allow("valid")
    if not gates:
        return allow("pod-not-gated-here")
    old = review.old
    if review.operation != "UPDATE" or old is None:
        return allow("skipped-operation")
    user = review.user
    if user in config.trusted_users:
        return allow("trusted")
    if podgate.gated(old) and not podgate.gated(pod):
        return refuse(f"only raygate lifts its scheduling gate {keys.CAPACITY_GATE}, once a Provisioned "
                      "ProvisioningRequest covers this pod: see why it waits with `kubectl raygate status -n "
                      f"{namespace}` and the Events of its Ray object", code=403, mode=policy.mode)
    if changed := identity_changes(old, pod, user, config):
        return refuse(f"you may not {', '.join(changed)} of pod {get(old, ('metadata', 'name')) or ''}: raygate "
                      "decided when it was created whose booking it may use, and what the cluster-autoscaler "
                      "and KubeRay read from these fields must stay as it was. To move work, delete the pod and "
                      "let KubeRay create it again, or change the RayCluster or RayJob that owns it",
                      code=403, mode=policy.mode)
    return allow("valid")


def _stored_claims(pod: Mapping[str, Any], user: str, config: RaygateConfig) -> str | None:
    """What another mutating webhook (after raygate's) may have written in raygate's name."""
    found = _annotations(pod)
    if any(k in found for k in podgate.BOOKING_ANNOTATIONS):
        return ("this pod would be stored naming a ProvisioningRequest it consumes: raygate writes that when it lifts "
                "the pod's gate, and only then (remove annotation " + keys.CONSUME_ANNOTATION + ")")
    record = found.get(keys.RAY_OWNER_ANNOTATION)
    if podgate.gated(pod) and record != identity.at_pod_create(pod, user, config.ray_operator_users).record:
        return (f"this pod's annotation {keys.RAY_OWNER_ANNOTATION} would be stored other than raygate recorded it: "
                "another mutating webhook changed it after raygate's (cluster admins: check the order of mutating "
                "webhooks)")
    return None


def identity_changes(old: Mapping[str, Any], new: Mapping[str, Any], user: str, config: RaygateConfig) -> list[str]:
    """What this update of a pod would change of what raygate reads as its identity or booking, phrased after
    "you may not". KubeRay's operator may change its own pods; the garbage collector and the Job controller
    strip or release owner references (raygate does not read them once the pod has its record)."""
    out: list[str] = []
    before, after = _annotations(old), _annotations(new)
    for key in podgate.BOOKING_ANNOTATIONS:
        if before.get(key) != after.get(key):
            out.append(f"change annotation {key}")
    own = labels(old).get(keys.POD_GATE_LABEL) is not None or keys.RAY_OWNER_ANNOTATION in before
    if not own or user in config.ray_operator_users:
        return out
    if labels(old).get(keys.POD_GATE_LABEL) != labels(new).get(keys.POD_GATE_LABEL):
        out.append(f"change label {keys.POD_GATE_LABEL}, raygate's record of its gate")
    for key in (*identity.RAY_POD_LABELS, *(k for k in {**labels(old), **labels(new)} if k.startswith(keys.DOMAIN))):
        if key != keys.POD_GATE_LABEL and labels(old).get(key) != labels(new).get(key):
            out.append(f"change label {key}")
    for key in sorted({*before, *after}):
        if key.startswith(keys.DOMAIN + "/") and before.get(key) != after.get(key):
            out.append(f"change annotation {key}")
    if metadata(old).get("ownerReferences") != metadata(new).get("ownerReferences") and not \
            identity.system_controller(user):
        out.append("change its ownerReferences")
    return out
