"""The gate at the pod: what makes a pod one raygate gates, and what a booking covers.

The promise is about pods: no GPU pod of a Ray object binds a GPU unless a Provisioned booking covers
it. The Ray spec is an open-ended way to make pods (in-tree autoscaling, edits, KubeRay's own batch
Jobs), so the webhook gates the pods themselves: in a namespace where raygate books capacity, every
pod that asks for a managed resource is created with the scheduling gate `raygate.io/capacity`. A
gated pod is never scheduled, and the cluster-autoscaler (which scales up only for pods the
scheduler marked Unschedulable) never adds a node for it, so it holds no GPU. Only the reconciler
lifts the gate, one pod per booked slot (reconciler/release.py).

One rule, no exception by identity: who creates the pod (KubeRay, the Job controller, a user) does
not matter at the gate. Whose booking a pod may use is the reconciler's question, asked of the
pod's owners as the API server records them.

Pure: pods in, patch operations or verdicts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raygate.core import dra, keys
from raygate.core import quantity as q
from raygate.core.identity import pod_set_of as pod_set_of
from raygate.core.names import digest
from raygate.core.objects import JSON, Path, get
from raygate.core.patch import PatchBuilder, PatchOp, pointer
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import DEFAULT_SCHEDULER as DEFAULT_SCHEDULER
from raygate.core.workload import ManifestError, pod_request

# Pod spec fields that decide which nodes a pod fits on, besides its resource requests.
PLACEMENT_FIELDS = ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints", "priorityClassName",
                    "runtimeClassName", "schedulerName", "nodeName", "resourceClaims")
# What a booking for a pod set must agree on with a pod to cover it: the fields that choose its nodes
# and what it asks of the managed resources. Not nodeName (a gated pod has none) and not
# priorityClassName (the Priority admission plugin fills in a cluster's global default; it orders pods,
# it does not choose nodes).
MATCHED_FIELDS = tuple(f for f in PLACEMENT_FIELDS if f not in ("nodeName", "priorityClassName"))
# Tolerations the API server's admission plugins add to every pod (DefaultTolerationSeconds) and to
# pods asking for an extended resource (ExtendedResourceToleration): never in a template, always on
# the pod, so they are left out on both sides.
_ADMISSION_TOLERATED = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def pruned(value: Any) -> Any:
    """Without nulls and empty objects or lists: a typed client's round trip adds them (KubeRay's updates
    write `creationTimestamp: null` and `resources: {}` into every template) without changing a pod."""
    if isinstance(value, Mapping):
        out = {k: pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def fields_view(spec: Any, fields: tuple[str, ...]) -> JSON:
    if not isinstance(spec, Mapping):
        return {}
    return {k: v for k in fields if (v := pruned(spec.get(k))) not in (None, {}, [])}


def _by_admission(toleration: Any, requested: Mapping[str, Any]) -> bool:
    if not isinstance(toleration, Mapping) or toleration.get("operator") != "Exists":
        return False
    key, effect = toleration.get("key"), toleration.get("effect")
    return (key in _ADMISSION_TOLERATED and effect == "NoExecute") or (key in requested and effect == "NoSchedule")


def _without_merged_keys(term: Any, merged: tuple[tuple[str, str], ...]) -> Any:
    """A topology spread constraint or pod (anti-)affinity term without the selector requirements the API server
    merges into a pod at creation: for each key of matchLabelKeys (operator In) and mismatchLabelKeys (NotIn),
    `key <op> [the pod's value of that label]` (kubernetes pkg/registry/core/pod/strategy.go, PrepareForCreate:
    mutateTopologySpreadConstraints and mutatePodAffinity, v1.36). The template has the keys, not the values."""
    if not isinstance(term, Mapping):
        return term
    drop = {(key, op) for field, op in merged for key in (term.get(field) or []) if isinstance(key, str)}
    expressions = get(term, ("labelSelector", "matchExpressions"))
    if not drop or not isinstance(expressions, list):
        return term
    kept = [e for e in expressions if not (isinstance(e, Mapping) and (e.get("key"), e.get("operator")) in drop
                                           and isinstance(e.get("values"), list) and len(e["values"]) == 1)]
    return {**term, "labelSelector": {**term["labelSelector"], "matchExpressions": kept}}


_SPREAD_KEYS = (("matchLabelKeys", "In"),)
_AFFINITY_KEYS = (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn"))


def _as_created(view: JSON) -> JSON:
    """The placement fields with what the API server derives at pod creation taken out again."""
    if isinstance(spread := view.get("topologySpreadConstraints"), list):
        view["topologySpreadConstraints"] = [pruned(_without_merged_keys(c, _SPREAD_KEYS)) for c in spread]
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = get(view, ("affinity", kind))
        if not isinstance(terms, Mapping):
            continue
        out = dict(terms)
        if isinstance(required := terms.get("requiredDuringSchedulingIgnoredDuringExecution"), list):
            out["requiredDuringSchedulingIgnoredDuringExecution"] = [
                pruned(_without_merged_keys(t, _AFFINITY_KEYS)) for t in required]
        if isinstance(preferred := terms.get("preferredDuringSchedulingIgnoredDuringExecution"), list):
            out["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {**w, "podAffinityTerm": pruned(_without_merged_keys(w.get("podAffinityTerm"), _AFFINITY_KEYS))}
                if isinstance(w, Mapping) else w for w in preferred]
        view["affinity"] = {**view["affinity"], kind: out}
    return view


def match_digest(spec: Any, managed: Mapping[str, Any]) -> str:
    """Pods and the PodTemplate of a pod set agree here exactly when a booking for the one covers the
    other: same managed request per pod, same node selection. (KubeRay adds containers of its own, its
    autoscaler sidecar and an init container, that ask for no managed resource; the API server fills in
    a default scheduler and tolerations of its own, and merges matchLabelKeys into label selectors.)"""
    return digest({"managed": q.render(managed), **_placement(spec, managed)}, 16)


def placement_digest(spec: Any, managed: Mapping[str, Any]) -> str:
    """The node selection alone of a pod asking `managed` (ANYWHERE: none of its own)."""
    return digest(_placement(spec, managed), 16)


def _placement(spec: Any, managed: Mapping[str, Any]) -> dict[str, Any]:
    view = _as_created(fields_view(spec, MATCHED_FIELDS))
    if view.get("schedulerName") == DEFAULT_SCHEDULER:
        del view["schedulerName"]
    if "tolerations" in view:
        kept = [t for t in view["tolerations"] if not _by_admission(t, managed)]
        view["tolerations"] = kept
        if not kept:
            del view["tolerations"]
    return view


ANYWHERE = digest({}, 16)

# The booking a pod consumes, as the cluster-autoscaler reads it: raygate writes it when it lifts the gate, and
# only then (a pod created with it, or given it later, would use capacity booked for someone else's job).
BOOKING_ANNOTATIONS = (keys.CONSUME_ANNOTATION, keys.CLASS_ANNOTATION)


# --- at the webhook ---------------------------------------------------------------------------------

def gated(pod: Mapping[str, Any]) -> bool:
    gates = get(pod, ("spec", "schedulingGates"))
    return isinstance(gates, list) and any(isinstance(g, Mapping) and g.get("name") == keys.CAPACITY_GATE
                                           for g in gates)


def managed_request(pod: Mapping[str, Any], policy: NamespacePolicy, claims: dra.ClaimTemplates,
                    namespace: str) -> tuple[q.Resources, list[str]]:
    """What one pod asks of the managed resources (containers, init and sidecar containers, overhead;
    requests, or limits alone; DRA devices), and the DRA claims that could not be counted.
    Raises ManifestError for a spec the scheduler could not read either."""
    per_pod = pod_request(pod, ())
    devices, uncounted = dra.pod_devices(pod, "pod", namespace, claims)
    per_pod = q.add(per_pod, devices)
    return {r: v for r, v in per_pod.items() if v > 0 and policy.manages(r)}, uncounted


def needs_gate(pod: Mapping[str, Any], policy: NamespacePolicy, claims: dra.ClaimTemplates,
               namespace: str) -> bool:
    """A pod that asks for a managed resource, or claims devices raygate cannot count (never a silent pass)."""
    try:
        managed, uncounted = managed_request(pod, policy, claims, namespace)
    except ManifestError:
        return True  # unreadable requests: gate it, the scheduler will refuse it anyway
    return bool(managed or uncounted)


def gate(b: PatchBuilder, pod: Mapping[str, Any], at: Path = ()) -> None:
    """Add raygate's scheduling gate and label to a pod being created, or to the pod template at `at` of the
    object `b` patches (both idempotent)."""
    if not gated(pod):
        gates = get(pod, ("spec", "schedulingGates"))
        if isinstance(gates, list):
            b.ops.append({"op": "add", "path": pointer((*at, "spec", "schedulingGates", "-")),
                          "value": {"name": keys.CAPACITY_GATE}})
        else:
            b.set((*at, "spec", "schedulingGates"), [{"name": keys.CAPACITY_GATE}])
    b.set((*at, "metadata", "labels", keys.POD_GATE_LABEL), keys.POD_GATED)


def born_gated(b: PatchBuilder, template: Mapping[str, Any], at: Path, record: str) -> None:
    """Write into the pod template at `at` what the pod gate writes on each pod made from it: the gate, the
    gated label and `record` (identity.at_pod_create's for KubeRay's pods of that template). KubeRay then
    creates them as the gate would leave them, and the API server calls neither the gate's policy nor its
    webhook for them (podgate_policy.ARRIVES_GATED, which checks every pod: a stamp that does not match the
    pod's real owner only costs the fast path)."""
    gate(b, template, at)
    b.set((*at, "metadata", "annotations", keys.RAY_OWNER_ANNOTATION), record)


def unstamp(b: PatchBuilder, template: Mapping[str, Any], at: Path) -> None:
    """Take out of the pod template at `at` what born_gated wrote (its namespace no longer gates pods)."""
    if gated(template):
        if others := _other_gates(template):
            b.set((*at, "spec", "schedulingGates"), others)
        else:
            b.remove((*at, "spec", "schedulingGates"))
    b.remove((*at, "metadata", "labels", keys.POD_GATE_LABEL))
    b.remove((*at, "metadata", "annotations", keys.RAY_OWNER_ANNOTATION))


def without_stamp(template: JSON) -> JSON:
    """`template` (a copy) without what born_gated writes: a copy for capacity checking simulates pods, not gates."""
    meta = template.get("metadata")
    for kind, key in (("labels", keys.POD_GATE_LABEL), ("annotations", keys.RAY_OWNER_ANNOTATION)):
        if isinstance(meta, dict) and isinstance(meta.get(kind), dict):
            meta[kind].pop(key, None)
    spec = template.get("spec")
    if isinstance(spec, dict) and gated(template):
        if others := _other_gates(template):
            spec["schedulingGates"] = others
        else:
            del spec["schedulingGates"]
    return template


def _other_gates(pod: Mapping[str, Any]) -> list[Any]:
    gates = get(pod, ("spec", "schedulingGates"))
    return [g for g in gates if not (isinstance(g, Mapping) and g.get("name") == keys.CAPACITY_GATE)] if isinstance(
        gates, list) else []


def release_ops(pod: Mapping[str, Any], request: str | None, class_name: str | None) -> list[PatchOp]:
    """The patch that lifts raygate's gate from one pod and names the booking it consumes (None: a pod of
    no Ray object, not raygate's to hold). It tests that the gate is still where it was, so a pod is never
    released twice, whoever else acts."""
    gates = get(pod, ("spec", "schedulingGates")) or []
    index = next(i for i, g in enumerate(gates) if isinstance(g, Mapping) and g.get("name") == keys.CAPACITY_GATE)
    gate_path = pointer(("spec", "schedulingGates", index))
    ops: list[PatchOp] = [{"op": "test", "path": f"{gate_path}/name", "value": keys.CAPACITY_GATE},
                          {"op": "remove", "path": gate_path}]
    b = PatchBuilder(pod)
    if request is not None and class_name is not None:
        b.set(("metadata", "annotations", keys.CONSUME_ANNOTATION), request)
        b.set(("metadata", "annotations", keys.CLASS_ANNOTATION), class_name)
    b.set(("metadata", "labels", keys.POD_GATE_LABEL), keys.POD_RELEASED)
    return [*ops, *b.ops]


def template_of_pod(pod: Mapping[str, Any]) -> JSON:
    """A PodTemplate's template made from a gated pod, for the autoscaler to simulate the pods like it:
    the pod as created, without what only the API server and the scheduler set."""
    spec = {k: v for k, v in (pod.get("spec") or {}).items()
            if k not in ("nodeName", "schedulingGates", "serviceAccount")}
    meta = pod.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != keys.POD_GATE_LABEL}
    return {"metadata": {"labels": labels}, "spec": spec}
