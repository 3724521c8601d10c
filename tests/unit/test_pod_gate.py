"""The pod webhook: every pod that asks for a managed resource is born gated, and only raygate lifts the gate."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from builders import config, container, request

from raygate.core import keys, podgate
from raygate.webhook.decision import mutate, validate

OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}
TRUSTED = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
GPU = {"nvidia.com/gpu": "1"}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers) or [container("main", requests={"cpu": "1"})], **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ray-worker-x", "namespace": "team", "labels": {keys.RAY_GROUP_LABEL: "gpu"}},
            "spec": body}


def admit(obj: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    d = mutate(request(obj), OPTED_IN, config(**defaults))
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


def update(old: dict[str, Any], new: dict[str, Any], user: str = "alice") -> Any:
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
    annotated["metadata"]["annotations"] = {"team": "vision"}
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
