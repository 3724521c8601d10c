"""The admission decision for pods: gate every pod that asks for a managed resource, and let nobody but
raygate's reconciler lift the gate; put every pod of a gang scheduled through a group (native mode:
Kubernetes' PodGroup) into it. Pure, like the decision for Ray objects (raygate.core.podgate says why
the gate is at the pod; the mode's GroupRules which group a pod joins, from the webhook's caches).
"""

from __future__ import annotations

from collections.abc import Mapping

from raygate.core import dra, keys, podgate
from raygate.core.modes import NO_MEMBERS, Members, all_groups_at_the_pod, for_object
from raygate.core.objects import get, labels
from raygate.core.patch import PatchBuilder
from raygate.core.policy import RaygateConfig
from raygate.webhook.review import AdmissionRequest, username
from raygate.webhook.verdict import Decision, allow, refuse

POD_KIND = "Pod"


def _subject(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig
             ) -> tuple[dict[str, object], str] | str:
    """The pod and its namespace, or the outcome that says why raygate leaves it alone."""
    pod = request.get("object")
    if not isinstance(pod, dict):
        return "skipped-operation"
    namespace = request.get("namespace") or get(pod, ("metadata", "namespace"))
    namespace = namespace if isinstance(namespace, str) else ""
    if not config.opted_in(namespace, dict(ns_labels) if ns_labels is not None else None):
        return "skipped-namespace"
    return pod, namespace


def _in_group(pod: Mapping[str, object]) -> bool:
    """A pod of a gang that some mode schedules through a group (its template says which, whatever the
    namespace's mode is now: a job keeps the mode it was admitted under)."""
    return any(r.names_group(pod) is not None for r in all_groups_at_the_pod())


def mutate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig,
           claims: dra.ClaimTemplates, members: Members = NO_MEMBERS) -> Decision:
    if request.get("operation") != "CREATE":
        return allow("skipped-operation")
    subject = _subject(request, ns_labels, config)
    if isinstance(subject, str):
        return allow(subject)
    pod, namespace = subject
    policy = config.policy_for(namespace)
    gates = for_object(policy).gates_pods
    gated = gates and podgate.needs_gate(pod, policy, claims, namespace)
    if not gated and not _in_group(pod):
        # kueue mode (Kueue is the gate), a namespace that books nothing, or a pod that asks for no GPU
        return allow("pod-without-managed-resources" if gates else "pod-not-gated-here")
    if gated and get(pod, ("spec", "nodeName")):
        return refuse(f"raygate gates pods that ask for {policy.managed_names()} in namespace {namespace} until a "
                      "booking covers them, and this pod names a node (spec.nodeName), which skips the scheduler "
                      "and its gates: remove nodeName from the pod template and choose nodes with a nodeSelector "
                      "or affinity", mode=policy.mode)
    b = PatchBuilder(pod)
    if gated:
        podgate.gate(b, pod)
    for rules in all_groups_at_the_pod():
        rules.pod_patch(b, pod, namespace, gated, members)
    outcome = ("gated" if gated else "grouped") if b.ops else "unchanged"
    return Decision(allowed=True, outcome=outcome, patch=b.ops, mode=policy.mode)


def validate(request: AdmissionRequest, ns_labels: Mapping[str, str] | None, config: RaygateConfig,
             claims: dra.ClaimTemplates, members: Members = NO_MEMBERS) -> Decision:
    subject = _subject(request, ns_labels, config)
    if isinstance(subject, str):
        return allow(subject)
    pod, namespace = subject
    policy = config.policy_for(namespace)
    gates = for_object(policy).gates_pods
    if request.get("operation") == "CREATE":
        # Validation runs after every mutating webhook (and after the API server dropped the fields it does not
        # serve): the pod must be stored gated, and in its group.
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
        return allow("valid")
    if not gates:
        return allow("pod-not-gated-here")
    old = request.get("oldObject")
    if request.get("operation") != "UPDATE" or not isinstance(old, dict):
        return allow("skipped-operation")
    if username(request) in config.trusted_users:
        return allow("trusted")
    if podgate.gated(old) and not podgate.gated(pod):
        return refuse(f"only raygate lifts its scheduling gate {keys.CAPACITY_GATE}, once a Provisioned "
                      "ProvisioningRequest covers this pod: see why it waits with `kubectl raygate status -n "
                      f"{namespace}` and the Events of its Ray object", code=403, mode=policy.mode)
    if labels(old).get(keys.POD_GATE_LABEL) != labels(pod).get(keys.POD_GATE_LABEL):
        return refuse(f"label {keys.POD_GATE_LABEL} is raygate's record of its gate on this pod: leave it as it is",
                      code=403, mode=policy.mode)
    return allow("valid")
