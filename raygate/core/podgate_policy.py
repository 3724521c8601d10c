"""The pod gate inside the API server: KubeRay's GPU pods gated by a MutatingAdmissionPolicy.

A webhook call costs the API server more than raygate's decision does (TLS, JSON both ways, a thread
woken on each side; docs/benchmarks.md measures a no-op webhook in Go at most of raygate's cost), and
KubeRay creates a gang's pods one at a time. Kubernetes 1.36 runs MutatingAdmissionPolicy (GA, on by
default): CEL the API server evaluates itself, before it calls any mutating webhook. The policy here
does for the common pod exactly what the webhook would (raygate/webhook/pods.py): a pod KubeRay's
operator creates for a RayCluster or RayJob, asking a managed resource in a namespace whose mode gates
pods, gets raygate's scheduling gate, the gated label and its ray-owner record, and the booking its
template names taken off. Every other pod (DRA claims, native-mode gangs, one that names a node,
anyone else's) is left to the webhook, which stays the whole rule.

The webhook is then not called for a pod that arrives exactly as it would leave it
(`skip_already_gated`): the API server skips the call only where the webhook's answer would be
"allowed, unchanged", so the skip is safe with the policy or without it (a cluster before 1.36, or one
whose admin left the policy out, simply calls the webhook for every pod, as before).

What the policy reads of raygate's config (the operator's usernames; which namespaces gate pods, and
on which resources) is written into it as CEL literals, by the reconciler each time the config loads
(`policy(config)`). The install ships it with no operator (`policy(None)`), which matches no pod: until
the reconciler writes it, the webhook gates every pod. Not a paramKind ConfigMap: kube-apiserver 1.36
can lose or freeze a built-in paramKind's informer for good once no binding names that kind
(kubernetes/kubernetes#130887), and a policy reading a frozen copy of the config would gate pods the
config no longer gates.

Pure: config in, the policy's objects and CEL out.
"""

from __future__ import annotations

from typing import Any

from raygate.core import keys
from raygate.core.identity import RAY_KINDS
from raygate.core.modes import for_object
from raygate.core.podgate import BOOKING_ANNOTATIONS
from raygate.core.policy import NamespacePolicy, RaygateConfig

POLICY_NAME = "raygate-pod-gate"
POLICY_API_VERSION = "admissionregistration.k8s.io/v1"

_ANNOTATIONS = "object.metadata.annotations"
_LABELS = "object.metadata.labels"
_CONTROLLER = "object.metadata.ownerReferences.filter(r, has(r.controller) && r.controller)"


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _in_map(map_: str, key: str) -> str:
    return f"(has({map_}) && {_quoted(key)} in {map_})"


# --- who made the pod, and for which Ray object (raygate.core.identity.at_pod_create) ---------------------

RAY_OWNED = (f"has(object.metadata.ownerReferences) && {_CONTROLLER}.size() == 1 && "
             f"{_CONTROLLER}[0].kind in [{', '.join(map(_quoted, RAY_KINDS))}] && "
             f"{_CONTROLLER}[0].apiVersion.startsWith({_quoted(keys.RAY_GROUP + '/')}) && "
             f"{_CONTROLLER}[0].name != '' && {_CONTROLLER}[0].uid != ''")

_GROUP = f"{_LABELS}[{_quoted(keys.RAY_GROUP_LABEL)}]"
# identity.pod_set_of: the Ray group (headgroup by its task name), else the submitter's.
_POD_SET = (f"({_in_map(_LABELS, keys.RAY_GROUP_LABEL)} && {_GROUP} != '' ? "
            f"({_GROUP} == 'headgroup' ? {_quoted(keys.HEAD_GROUP_TASK)} : {_GROUP}) : "
            f"{_quoted(keys.SUBMITTER_TASK)})")
# identity.RayOwner.render(): kind/name/uid/pod set. Valid only where RAY_OWNED holds.
RECORD = (f"{_CONTROLLER}[0].kind + '/' + {_CONTROLLER}[0].name + '/' + {_CONTROLLER}[0].uid + '/' + "
          f"{_POD_SET}")

# What only the webhook handles: a pod that names a node (refused), claims DRA devices (counted from
# ResourceClaimTemplates it caches) or names a native-mode gang (its PodGroup chosen from the webhook's cache).
WEBHOOK_ONLY = (f"(has(object.spec.nodeName) && object.spec.nodeName != '') || "
                f"(has(object.spec.resourceClaims) && object.spec.resourceClaims.size() > 0) || "
                f"{_in_map(_ANNOTATIONS, keys.GANG_GROUP_ANNOTATION)}")
# The booking a pod consumes is raygate's to write when it lifts the gate: taken off at create. An admitted RayJob's
# pod templates name it, so every pod KubeRay makes for one does.
NAMES_A_BOOKING = " || ".join(_in_map(_ANNOTATIONS, k) for k in BOOKING_ANNOTATIONS)

IS_POD_CREATE = ("request.operation == 'CREATE' && request.resource.group == '' && "
                 "request.resource.resource == 'pods'")
GATED = (f"has(object.spec.schedulingGates) && "
         f"object.spec.schedulingGates.exists(g, g.name == {_quoted(keys.CAPACITY_GATE)})")
# A pod that names a native-mode gang but not its PodGroup (webhook/pods.py validate() refuses it).
GANG_NOT_NAMED = (f"{_in_map(_ANNOTATIONS, keys.GANG_GROUP_ANNOTATION)} && "
                  "!(has(object.spec.schedulingGroup) && has(object.spec.schedulingGroup.podGroupName))")

# A pod of a Ray object that arrives with raygate's gate, its gated label and the ray-owner record raygate would
# write, naming no booking, node or native-mode gang: an admitted RayCluster's templates say all that
# (podgate.born_gated). Its creator checked apart, neither the policy nor the webhook would change it
# (webhook/pods.py mutate(): the gate and label are there, the record is the one at_pod_create gives KubeRay's
# pods, and nothing is left to take off or add), so neither is called for it.
ARRIVES_GATED = (f"{GATED} && {_in_map(_LABELS, keys.POD_GATE_LABEL)} && "
                 f"{_LABELS}[{_quoted(keys.POD_GATE_LABEL)}] == {_quoted(keys.POD_GATED)} && {RAY_OWNED} && "
                 f"{_in_map(_ANNOTATIONS, keys.RAY_OWNER_ANNOTATION)} && "
                 f"{_ANNOTATIONS}[{_quoted(keys.RAY_OWNER_ANNOTATION)}] == {RECORD} && !({WEBHOOK_ONLY}) && "
                 f"!({NAMES_A_BOOKING})")
NOT_GATED_ALREADY = "not-gated-already"


# --- which resources the namespace gates pods on (raygate.core.podgate.needs_gate) -------------------------

def _list(items: list[str]) -> str:
    return "[" + ", ".join(map(_quoted, items)) + "]"


def _managed_list(gated: dict[str, list[str]], default: list[str]) -> str:
    """CEL: the managed resources of the request's namespace ([]: its mode does not gate pods)."""
    if not gated:
        return _list(default)
    table = "{" + ", ".join(f"{_quoted(ns)}: {_list(v)}" for ns, v in sorted(gated.items())) + "}"
    return f"(request.namespace in {table} ? {table}[request.namespace] : {_list(default)})"


def _asks(resources: str, managed: str, skip_if_requested: str | None = None) -> str:
    """CEL: the quantities map `resources` asks more than zero of a resource in `managed` (names, or prefixes
    ending in `*`; `skip_if_requested`: the container's requests, for its limits, which count only where no
    request is given)."""
    unless = f"!(has({skip_if_requested}) && r in {skip_if_requested}) && " if skip_if_requested else ""
    is_managed = f"{managed}.exists(m, m.endsWith('*') ? r.startsWith(m.substring(0, m.size() - 1)) : r == m)"
    return (f"has({resources}) && {resources}.exists(r, {unless}{is_managed} && "
            f"quantity({resources}[r]).isGreaterThan(quantity('0')))")


def asks_managed(managed: str) -> str:
    """CEL: the pod asks a resource in `managed`, as workload.pod_request counts: containers, init and sidecar
    containers (requests, or limits alone), pod overhead."""
    container = (f"has(c.resources) && (({_asks('c.resources.requests', managed)}) || "
                 f"({_asks('c.resources.limits', managed, 'c.resources.requests')}))")
    return (f"object.spec.containers.exists(c, {container}) || (has(object.spec.initContainers) && "
            f"object.spec.initContainers.exists(c, {container})) || ({_asks('object.spec.overhead', managed)})")


def _gated_resources(policy: NamespacePolicy) -> list[str]:
    """A namespace's managed resources where its mode gates pods, else none (nothing is gated there)."""
    return list(policy.managed_resources) if for_object(policy).gates_pods else []


# --- the objects ---------------------------------------------------------------------------------------------

def policy(config: RaygateConfig | None) -> dict[str, Any]:
    """The MutatingAdmissionPolicy for `config`: gate a pod KubeRay's operator creates for a Ray object, where the
    pod asks a managed resource and its namespace's mode gates pods; record whose it is. None: as installed,
    before the reconciler has written the config in (no operator, so no pod matches)."""
    operators = config.ray_operator_users if config is not None else []
    default = _gated_resources(config.defaults) if config is not None else []
    own = {ns: _gated_resources(config.policy_for(ns)) for ns in config.namespaces} if config is not None else {}
    gated = {ns: v for ns, v in own.items() if v != default}
    managed = _managed_list(gated, default)
    return {
        "apiVersion": POLICY_API_VERSION, "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            # Evaluated in order; the first false one skips the policy, and the webhook does the work.
            "matchConditions": [
                {"name": "by-kuberay-operator", "expression": f"request.userInfo.username in {_list(operators)}"},
                {"name": "of-a-ray-object", "expression": RAY_OWNED},
                {"name": NOT_GATED_ALREADY, "expression": f"!({ARRIVES_GATED})"},
                {"name": "not-webhook-only", "expression": f"!({WEBHOOK_ONLY})"},
                {"name": "asks-a-gated-resource", "expression": asks_managed(managed)},
            ],
            "variables": [{"name": "record", "expression": RECORD}],
            "mutations": [
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": (
                    "Object{metadata: Object.metadata{"
                    f"labels: {{{_quoted(keys.POD_GATE_LABEL)}: {_quoted(keys.POD_GATED)}}}, "
                    f"annotations: {{{_quoted(keys.RAY_OWNER_ANNOTATION)}: variables.record}}}}, "
                    "spec: Object.spec{schedulingGates: "
                    f"[Object.spec.schedulingGates{{name: {_quoted(keys.CAPACITY_GATE)}}}]}}}}")}},
                {"patchType": "JSONPatch", "jsonPatch": {"expression": " + ".join(
                    f"({_in_map(_ANNOTATIONS, k)} ? [JSONPatch{{op: 'remove', path: "
                    f"{_quoted('/metadata/annotations/' + k.replace('~', '~0').replace('/', '~1'))}}}] : [])"
                    for k in BOOKING_ANNOTATIONS)}},
            ],
            # A CEL error (an unreadable quantity) leaves the pod to the webhook, which gates what it cannot read.
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
        },
    }


def binding(namespace_selector: dict[str, Any]) -> dict[str, Any]:
    """The binding: the namespaces the webhooks see."""
    return {
        "apiVersion": POLICY_API_VERSION, "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "policyName": POLICY_NAME,
            "matchResources": {"namespaceSelector": namespace_selector},
        },
    }


def skip_already_gated(operators: list[str]) -> dict[str, str]:
    """The mutating webhook's matchCondition: not called for a pod create by KubeRay's operator that arrives as
    the gate would leave it (ARRIVES_GATED)."""
    return {
        "name": NOT_GATED_ALREADY,
        "expression": f"!({IS_POD_CREATE} && request.userInfo.username in {_list(operators)} && {ARRIVES_GATED})",
    }
