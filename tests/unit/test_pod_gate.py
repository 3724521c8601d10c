"""The pod webhook: every pod that asks for a managed resource is born gated, and only raygate lifts the gate."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from builders import config, container
from builders import request as review_request

from raygate.core import identity, keys, podgate
from raygate.core.patch import PatchBuilder
from raygate.core.policy import KUBERAY_OPERATOR_USER as OPERATOR
from raygate.webhook.decision import mutate, validate

OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}
TRUSTED = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
GPU = {"nvidia.com/gpu": "1"}
CLUSTER_REF = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "c", "uid": "u1", "controller": True}


def request(obj: dict[str, Any] | None, user: str = OPERATOR, **kwargs: Any) -> Any:
    """A pod review; by default from KubeRay's operator, which makes Ray pods."""
    return review_request(obj, user=user, **kwargs)


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    """A worker pod of RayCluster c as KubeRay's operator creates it."""
    body: dict[str, Any] = {"containers": list(containers) or [container("main", requests={"cpu": "1"})], **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ray-worker-x", "namespace": "team", "ownerReferences": [CLUSTER_REF],
                         "labels": {keys.RAY_GROUP_LABEL: "gpu", keys.RAY_NODE_TYPE_LABEL: "worker",
                                    keys.RAY_CLUSTER_LABEL: "c"}},
            "spec": body}


def bare(*containers: dict[str, Any]) -> dict[str, Any]:
    """A pod a user writes, with no Ray labels or owner."""
    obj = pod(*containers)
    obj["metadata"] = {"name": "mine", "namespace": "team"}
    return obj


def admit(obj: dict[str, Any], user: str = OPERATOR, **defaults: Any) -> dict[str, Any]:
    d = mutate(request(obj, user=user), OPTED_IN, config(**defaults))
    assert d.allowed, d.message
    return jsonpatch.apply_patch(obj, d.patch)  # type: ignore[no-any-return]


def sidecar(**resources: Any) -> dict[str, Any]:
    return {**container("proxy", **resources), "restartPolicy": "Always"}


@pytest.mark.parametrize("obj", [
    pod(container("w", limits=GPU)),
    pod(container("w", requests={"nvidia.com/gpu": "2"}, limits={"nvidia.com/gpu": "2"})),
    pod(container("w", requests={"cpu": "1"}), init=[container("warm", limits=GPU)]),
    pod(container("w", requests={"cpu": "1"}), init=[sidecar(limits=GPU)]),
    pod(container("w", limits={"nvidia.com/mig-2g.20gb": "1"})),
    pod(container("w", limits={"amd.com/gpu": "1"})),
    pod(container("w", requests={"cpu": "1"}), resourceClaims=[{"name": "g", "resourceClaimTemplateName": "gpus"}]),
], ids=["gpu-in-limits", "gpu-in-requests", "gpu-in-an-init-container", "gpu-in-a-sidecar", "mig-slice", "amd",
        "a-dra-claim-raygate-cannot-count"])
def test_a_pod_that_asks_for_a_managed_resource_is_created_gated(obj: dict[str, Any]) -> None:
    stored = admit(obj)
    assert podgate.gated(stored)
    assert stored["metadata"]["labels"][keys.POD_GATE_LABEL] == keys.POD_GATED
    assert admit(stored) == stored  # admitting it again changes nothing


def test_a_gate_of_someone_else_is_kept_beside_raygates() -> None:
    stored = admit(pod(container("w", limits=GPU), schedulingGates=[{"name": "example.com/quota"}]))
    assert [g["name"] for g in stored["spec"]["schedulingGates"]] == ["example.com/quota", keys.CAPACITY_GATE]


def test_a_cpu_pod_is_left_alone() -> None:
    d = mutate(request(pod()), OPTED_IN, config())
    assert (d.allowed, d.patch, d.outcome) == (True, [], "pod-without-managed-resources")


@pytest.mark.parametrize(("defaults", "outcome"), [
    ({"mode": "kueue", "queueName": "q"}, "pod-not-gated-here"),
    ({"mode": "volcano"}, "pod-not-gated-here"),
    ({"mode": "volcano", "provisioning": {"enabled": True}}, "gated"),
    ({"provisioning": {"enabled": False}}, "pod-not-gated-here"),
], ids=["kueue-is-the-gate", "volcano-podgroup-is-the-gate", "volcano-that-books", "provisioning-that-books-nothing"])
def test_pods_are_gated_where_raygate_books(defaults: dict[str, Any], outcome: str) -> None:
    assert mutate(request(pod(container("w", limits=GPU))), OPTED_IN, config(**defaults)).outcome == outcome


def test_a_pod_in_a_namespace_not_opted_in_is_left_alone() -> None:
    assert mutate(request(pod(container("w", limits=GPU))), {}, config()).outcome == "skipped-namespace"


def test_a_gpu_pod_that_names_its_node_is_refused() -> None:
    d = mutate(request(pod(container("w", limits=GPU), nodeName="gpu-1")), OPTED_IN, config())
    assert not d.allowed and d.message is not None and "spec.nodeName" in d.message and "nodeSelector" in d.message


def test_a_gpu_pod_stored_without_the_gate_is_refused() -> None:
    """Validation runs after every mutating webhook: one that dropped the gate is caught here."""
    d = validate(request(pod(container("w", limits=GPU))), OPTED_IN, config())
    assert not d.allowed and d.message is not None and keys.CAPACITY_GATE in d.message
    assert validate(request(admit(pod(container("w", limits=GPU)))), OPTED_IN, config()).allowed


def update(old: dict[str, Any], new: dict[str, Any], user: str = "alice") -> Any:  # a user with `edit` on pods
    return validate(request(new, operation="UPDATE", old=old, user=user), OPTED_IN, config())


def test_only_raygate_lifts_the_gate() -> None:
    old = admit(pod(container("w", limits=GPU)))
    lifted = jsonpatch.apply_patch(old, podgate.release_ops(old, "train-a1", keys.CHECK_CAPACITY_CLASS))
    assert not podgate.gated(lifted)
    assert lifted["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == "train-a1"
    d = update(old, lifted)
    assert not d.allowed and d.code == 403 and "only raygate lifts" in d.message  # type: ignore[operator]
    assert update(old, lifted, user=TRUSTED).allowed
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"][keys.POD_GATE_LABEL] = keys.POD_RELEASED
    assert not update(old, relabelled).allowed
    annotated = copy.deepcopy(old)
    annotated["metadata"]["annotations"]["team"] = "vision"
    assert update(old, annotated).allowed


def test_a_release_is_applied_once() -> None:
    """The release patch tests the gate it removes: replayed on a released pod, it fails."""
    old = admit(pod(container("w", limits=GPU)))
    ops = podgate.release_ops(old, "train-a1", keys.CHECK_CAPACITY_CLASS)
    released = jsonpatch.apply_patch(old, ops)
    with pytest.raises(jsonpatch.JsonPatchException):
        jsonpatch.apply_patch(released, ops)


def test_what_the_api_server_adds_to_a_pod_does_not_change_what_booking_covers_it() -> None:
    """A PodTemplate is stored as written; the pod made from it gets a default scheduler, default
    tolerations (DefaultTolerationSeconds, ExtendedResourceToleration) and perhaps a default priority."""
    template = {"containers": [container("w", limits=GPU)], "nodeSelector": {"pool": "a100"},
                "tolerations": [{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}
    pod_spec = {**template, "schedulerName": "default-scheduler", "priorityClassName": "team-default",
                "tolerations": [*template["tolerations"],
                                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                                 "tolerationSeconds": 300},
                                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    managed = {"nvidia.com/gpu": 1}
    assert podgate.match_digest(pod_spec, managed) == podgate.match_digest(template, managed)
    elsewhere = {**pod_spec, "nodeSelector": {"pool": "h100"}}
    assert podgate.match_digest(elsewhere, managed) != podgate.match_digest(template, managed)
    more = {**pod_spec, "tolerations": [*pod_spec["tolerations"], {"key": "spot", "operator": "Exists"}]}
    assert podgate.match_digest(more, managed) != podgate.match_digest(template, managed)
    assert podgate.match_digest(template, {"nvidia.com/gpu": 2}) != podgate.match_digest(template, managed)


# --- whose a pod is: decided at creation, never re-read from what may change ---------------------------

def record(stored: dict[str, Any]) -> str | None:
    return identity.recorded(stored)


def test_a_ray_pod_records_at_creation_the_ray_object_and_pod_set_that_made_it() -> None:
    stored = admit(pod(container("w", limits=GPU)))
    assert record(stored) == "RayCluster/c/u1/gpu"
    assert identity.RayOwner.parse(record(stored)) == identity.RayOwner("RayCluster", "c", "u1", "gpu")
    assert validate(request(stored), OPTED_IN, config()).allowed


def test_a_pod_of_no_ray_object_is_gated_and_recorded_as_none() -> None:
    stored = admit(bare(container("w", limits=GPU)), user="alice")
    assert podgate.gated(stored) and record(stored) == identity.NO_RAY_OWNER


@pytest.mark.parametrize("claim", ["owner", "labels"])
def test_a_gpu_pod_a_user_creates_claiming_a_ray_object_is_refused(claim: str) -> None:
    forged = pod(container("w", limits=GPU))
    if claim == "owner":
        forged["metadata"]["labels"] = {}
    else:
        del forged["metadata"]["ownerReferences"]
    d = mutate(request(forged, user="alice"), OPTED_IN, config())
    assert not d.allowed and d.code == 403 and "only KubeRay makes a Ray cluster's pods" in (d.message or "")


def test_kuberays_operator_makes_ray_pods() -> None:
    assert mutate(request(pod(container("w", limits=GPU))), OPTED_IN, config()).allowed


def test_a_user_cannot_write_the_record_or_a_booking_into_a_pod_at_creation() -> None:
    mine = bare(container("w", limits=GPU))
    mine["metadata"]["annotations"] = {keys.RAY_OWNER_ANNOTATION: "RayCluster/c/u1/gpu",
                                       keys.CONSUME_ANNOTATION: "someone-elses-request",
                                       keys.CLASS_ANNOTATION: keys.CHECK_CAPACITY_CLASS}
    stored = admit(mine, user="alice")
    assert stored["metadata"]["annotations"] == {keys.RAY_OWNER_ANNOTATION: identity.NO_RAY_OWNER}
    cpu = bare()
    cpu["metadata"]["annotations"] = {keys.CONSUME_ANNOTATION: "someone-elses-request"}
    d = mutate(request(cpu, user="alice"), OPTED_IN, config())
    assert d.outcome == "booking-claim-removed" and jsonpatch.apply_patch(cpu, d.patch)["metadata"]["annotations"] == {}
    assert not validate(request(cpu, user="alice"), OPTED_IN, config()).allowed  # stored with it: refused


def test_a_batch_jobs_pod_keeps_the_record_its_job_template_was_stamped_with() -> None:
    submitter = bare(container("w", limits=GPU))
    submitter["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "ju",
                                                 "controller": True}]
    submitter["metadata"]["annotations"] = {keys.RAY_OWNER_ANNOTATION: "RayJob/train/u9/submittergroup"}
    assert record(admit(submitter, user=JOB_CONTROLLER)) == "RayJob/train/u9/submittergroup"
    # The same pod created by a user is not the Job controller's: the record is not believed.
    assert record(admit(submitter, user="alice")) == identity.NO_RAY_OWNER
    # A Job from before raygate stamped Jobs: no record, read from its owners as it always was.
    del submitter["metadata"]["annotations"]
    assert record(admit(submitter, user=JOB_CONTROLLER)) is None


def released_pod() -> dict[str, Any]:
    old = admit(pod(container("w", limits=GPU)))
    return jsonpatch.apply_patch(old, podgate.release_ops(old, "train-a1", keys.CHECK_CAPACITY_CLASS))  # type: ignore


@pytest.mark.parametrize(("edit", "says"), [
    (lambda p: p["metadata"]["labels"].update({keys.RAY_GROUP_LABEL: "other"}), f"label {keys.RAY_GROUP_LABEL}"),
    (lambda p: p["metadata"]["labels"].pop(keys.RAY_NODE_TYPE_LABEL), f"label {keys.RAY_NODE_TYPE_LABEL}"),
    (lambda p: p["metadata"]["labels"].update({keys.RAY_CLUSTER_LABEL: "d"}), f"label {keys.RAY_CLUSTER_LABEL}"),
    (lambda p: p["metadata"].update({"ownerReferences": []}), "ownerReferences"),
    (lambda p: p["metadata"]["annotations"].pop(keys.CONSUME_ANNOTATION), f"annotation {keys.CONSUME_ANNOTATION}"),
    (lambda p: p["metadata"]["annotations"].update({keys.RAY_OWNER_ANNOTATION: "RayCluster/d/u2/gpu"}),
     f"annotation {keys.RAY_OWNER_ANNOTATION}"),
], ids=["relabel-group", "remove-node-type", "relabel-cluster", "null-owners", "drop-consume", "rewrite-record"])
def test_a_user_with_edit_on_pods_cannot_edit_a_ray_pods_identity_away(edit: Any, says: str) -> None:
    old = released_pod()
    new = copy.deepcopy(old)
    edit(new)
    d = update(old, new)
    assert not d.allowed and d.code == 403 and says in (d.message or ""), d.message
    assert "delete the pod" in (d.message or "")


def test_the_garbage_collector_may_orphan_a_ray_pod_and_kuberay_may_edit_its_own() -> None:
    old = released_pod()
    orphaned = copy.deepcopy(old)
    orphaned["metadata"]["ownerReferences"] = []
    assert update(old, orphaned, user=GC).allowed  # kubectl delete --cascade=orphan; the record stays
    assert not update(old, orphaned, user="alice").allowed
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"][keys.RAY_GROUP_LABEL] = "other"
    assert update(old, relabelled, user=OPERATOR).allowed
    unbooked = copy.deepcopy(old)
    del unbooked["metadata"]["annotations"][keys.CONSUME_ANNOTATION]
    assert not update(old, unbooked, user=OPERATOR).allowed  # the booking a pod consumes is raygate's alone


def test_no_pod_in_a_namespace_that_books_may_be_given_a_booking_later() -> None:
    cpu = admit(bare(), user="alice")
    booked = copy.deepcopy(cpu)
    booked["metadata"].setdefault("annotations", {})[keys.CONSUME_ANNOTATION] = "someone-elses-request"
    assert not update(cpu, booked).allowed


def test_selectors_the_api_server_merges_into_a_pod_at_creation_do_not_change_what_booking_covers_it() -> None:
    """kube-apiserver merges `key In [value]` (matchLabelKeys) and `key NotIn [value]` (mismatchLabelKeys) into a
    new pod's label selectors, from the pod's own labels: the template a booking was made from has only the keys."""
    spread = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": {"ray.io/cluster": "c"}}, "matchLabelKeys": ["ray.io/group"]}
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "ray"}},
            "matchLabelKeys": ["ray.io/cluster"], "mismatchLabelKeys": ["team"]}
    template = {"containers": [container("w", limits=GPU)], "topologySpreadConstraints": [spread],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]},
                             "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                                 {"weight": 1, "podAffinityTerm": term}]}}}
    merged_term = {**term, "labelSelector": {"matchLabels": {"app": "ray"}, "matchExpressions": [
        {"key": "ray.io/cluster", "operator": "In", "values": ["c"]},
        {"key": "team", "operator": "NotIn", "values": ["vision"]}]}}
    created = {**template,
               "topologySpreadConstraints": [{**spread, "labelSelector": {
                   "matchLabels": {"ray.io/cluster": "c"},
                   "matchExpressions": [{"key": "ray.io/group", "operator": "In", "values": ["gpu"]}]}}],
               "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [merged_term]},
                            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 1, "podAffinityTerm": merged_term}]}}}
    managed = {"nvidia.com/gpu": 1}
    assert podgate.match_digest(created, managed) == podgate.match_digest(template, managed)
    other = {**template, "topologySpreadConstraints": [{**spread, "topologyKey": "rack"}]}
    assert podgate.match_digest(other, managed) != podgate.match_digest(template, managed)


def test_a_template_born_gated_and_unstamped_is_as_it_was_other_gates_kept() -> None:
    """born_gated writes what the gate writes on a pod into a pod template; unstamp and the copy for capacity
    checking take out exactly that."""
    template = {"metadata": {"labels": {"team": "a"}}, "spec": {"schedulingGates": [{"name": "example.com/q"}],
                                                                "containers": [{"name": "w"}]}}
    at = ("spec", "workerGroupSpecs", 0, "template")
    job = {"spec": {"workerGroupSpecs": [{"template": template}]}}
    b = PatchBuilder(job)
    podgate.born_gated(b, template, at, "RayCluster/c/u1/gpu")
    stamped = jsonpatch.apply_patch(job, b.ops)
    got = stamped["spec"]["workerGroupSpecs"][0]["template"]
    assert podgate.gated(got) and got["metadata"]["labels"][keys.POD_GATE_LABEL] == keys.POD_GATED
    assert got["metadata"]["annotations"] == {keys.RAY_OWNER_ANNOTATION: "RayCluster/c/u1/gpu"}
    undo = PatchBuilder(stamped)
    podgate.unstamp(undo, got, at)
    back = jsonpatch.apply_patch(stamped, undo.ops)["spec"]["workerGroupSpecs"][0]["template"]
    copied = podgate.without_stamp(copy.deepcopy(got))
    for t in (back, copied):
        assert t["spec"] == template["spec"] and t["metadata"]["labels"] == {"team": "a"}
        assert keys.RAY_OWNER_ANNOTATION not in t["metadata"].get("annotations", {})
