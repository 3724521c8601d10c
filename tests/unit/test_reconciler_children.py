"""Builders of the reconciler's children: deterministic names, owner references, counts, parameters."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import RayJob, container, pod_template, worker_group
from plans import needs_of

from raygate.core import keys
from raygate.core.api import OFFLINE
from raygate.core.keys import ChildKind
from raygate.core.modes import volcano
from raygate.core.objects import JSON, controller_uid
from raygate.core.policy import NamespacePolicy, merge_override
from raygate.core.workload import ManifestError, PodSet, Workload
from raygate.reconciler import children
from raygate.reconciler.children import BadInput

GPU = {"limits": {"nvidia.com/gpu": "1"}}


def group(name: str, replicas: int = 1, hosts: int = 1, resources: dict[str, Any] | None = None) -> dict[str, Any]:
    """A worker group whose pod template carries an annotation of its own (a copy must keep it)."""
    res = resources or GPU
    template = pod_template(container("w", requests=res.get("requests"), limits=res.get("limits")))
    template["metadata"] = {"annotations": {"keep": "me"}}
    return worker_group(name, replicas=replicas, min_replicas=0, max_replicas=10, hosts=hosts, template=template)


def rayjob(name: str = "train", *groups: dict[str, Any], annotations: dict[str, str] | None = None,
           uid: str = "uid-1") -> Workload:
    b = (RayJob(name, "ns").meta(uid=uid, resourceVersion="7").label(keys.STATE_LABEL, "Pending").suspend(True)
         .groups(*(groups or [group("gpu")])))
    for key, value in (annotations or {}).items():
        b.annotation(key, value)
    return Workload(b.obj())


def policy(**override: Any) -> NamespacePolicy:
    return merge_override(NamespacePolicy(), override)


def pod_set(w: Workload, name: str) -> PodSet:
    return next(p for p in w.gang().pod_sets if p.name == name)


def gpu_sets(w: Workload) -> list[PodSet]:
    return w.gang().managed_pod_sets(NamespacePolicy().manages)


def request_for(w: Workload, sets: list[PodSet], pol: NamespacePolicy, attempt: int, version: str) -> JSON:
    return children.provisioning_request(w, sets, pol, attempt, version, children.fingerprint(w, sets))


@pytest.mark.parametrize(("name", "pod_set", "attempt"), [
    ("train", "gpu", 1),
    ("a" * 63, "gpu", 12),
    ("Upper_Case.job", "Group_With.Dots", 3),
    ("x" * 40, "y" * 60, 100),
])
def test_names_are_dns_labels_of_at_most_63(name: str, pod_set: str, attempt: int) -> None:
    w = rayjob(name, group(pod_set))
    fp = children.fingerprint(w, gpu_sets(w))
    for n in (children.request_name(w, attempt, fp), children.template_name(w, gpu_sets(w)[0])):
        assert len(n) <= 63
        assert n == n.lower() and not n.startswith("-") and not n.endswith("-")
        assert all(c.isalnum() or c == "-" for c in n)
    assert children.request_name(w, attempt, fp).endswith(f"-a{attempt}")


def test_names_are_deterministic_and_differ_by_uid_attempt_and_pod_set() -> None:
    w, same, other = rayjob(uid="u1"), rayjob(uid="u1"), rayjob(uid="u2")
    assert children.request_name(w, 1, "f") == children.request_name(same, 1, "f")
    assert children.request_name(w, 1, "f") != children.request_name(other, 1, "f")
    assert children.request_name(w, 1, "f") != children.request_name(w, 2, "f")
    assert children.request_name(w, 1, "f") != children.request_name(w, 1, "g")  # other pod sets booked
    long_a, long_b = "g" * 40 + "a", "g" * 40 + "b"  # shorten to the same text
    two = rayjob("train", group(long_a), group(long_b))
    assert children.template_name(two, pod_set(two, long_a)) != children.template_name(two, pod_set(two, long_b))


def test_fingerprint_follows_counts_and_templates_but_not_consume_annotations() -> None:
    base = rayjob("train", group("gpu", replicas=2))
    fp = children.fingerprint(base, gpu_sets(base))
    more = rayjob("train", group("gpu", replicas=3))
    assert children.fingerprint(more, gpu_sets(more)) != fp
    other = group("gpu", replicas=2)
    other["template"]["spec"]["nodeSelector"] = {"gpu": "h100"}
    assert children.fingerprint(rayjob("train", other), gpu_sets(rayjob("train", other))) != fp
    consumed = group("gpu", replicas=2)
    consumed["template"]["metadata"]["annotations"][keys.CONSUME_ANNOTATION] = "x"
    assert children.fingerprint(rayjob("train", consumed), gpu_sets(rayjob("train", consumed))) == fp


def test_fingerprint_survives_what_a_typed_client_writes_back() -> None:
    """KubeRay updates jobs through Go structs: nulls, empty objects and canonical quantities come back,
    and an image or a command may change; none of it changes what is booked, so no request is replaced."""
    base = rayjob("train", group("gpu", replicas=2, resources={"requests": {"cpu": "1000m"}, **GPU}))
    echoed = group("gpu", replicas=2, resources={"requests": {"cpu": "1"}, **GPU})
    echoed["template"]["metadata"]["creationTimestamp"] = None
    echoed["template"]["spec"]["containers"][0].update({"image": "ray:other", "command": ["x"], "env": []})
    echoed["template"]["spec"]["tolerations"] = []
    fp = children.fingerprint(base, gpu_sets(base))
    assert children.fingerprint(rayjob("train", echoed), gpu_sets(rayjob("train", echoed))) == fp
    tolerates = group("gpu", replicas=2, resources={"requests": {"cpu": "1"}, **GPU})
    tolerates["template"]["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    assert children.fingerprint(rayjob("train", tolerates), gpu_sets(rayjob("train", tolerates))) != fp


def test_request_records_the_fingerprint_of_what_it_books() -> None:
    w = rayjob()
    pr = request_for(w, gpu_sets(w), policy(), 1, "v1")
    assert pr["metadata"]["annotations"] == {keys.POD_SETS_ANNOTATION: children.fingerprint(w, gpu_sets(w)),
                                             keys.RAY_OWNER_ANNOTATION: f"RayJob/{w.name}/{w.uid}"}


def test_owner_reference_is_the_controlling_job() -> None:
    w = rayjob()
    pt = children.pod_template(w, gpu_sets(w)[0], NamespacePolicy().manages)
    assert pt["metadata"]["ownerReferences"] == [{
        "apiVersion": "ray.io/v1", "kind": "RayJob", "name": "train", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True,
    }]
    assert pt["metadata"]["labels"] == {keys.MANAGED_BY_LABEL: keys.MANAGED_BY_VALUE}
    assert controller_uid(pt) == "uid-1"
    assert children.controller_key(pt) == ("RayJob", "ns", "train")


def test_pod_template_copies_the_template_without_a_consume_annotation() -> None:
    g = group("gpu")
    g["template"]["metadata"]["annotations"][keys.CONSUME_ANNOTATION] = "old-request"
    w = rayjob("train", g)
    pt = children.pod_template(w, gpu_sets(w)[0], NamespacePolicy().manages)
    assert pt["template"]["metadata"]["annotations"] == {"keep": "me"}
    assert pt["template"]["spec"] == g["template"]["spec"]
    assert w.obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["metadata"]["annotations"][
        keys.CONSUME_ANNOTATION] == "old-request"  # the job itself is untouched


@pytest.mark.parametrize(("groups", "expected"), [
    ([group("gpu", replicas=3)], [("gpu", 3)]),
    ([group("gpu", replicas=2, hosts=4)], [("gpu", 8)]),
    ([group("cpu", resources={"requests": {"cpu": "1"}}), group("gpu", replicas=2)], [("gpu", 2)]),
    ([group("a", replicas=1, hosts=2), group("b", replicas=5)], [("a", 2), ("b", 5)]),
])
def test_request_counts_pods_of_gpu_sets_only(groups: list[dict[str, Any]], expected: list[tuple[str, int]]) -> None:
    w = rayjob("train", *groups)
    sets = gpu_sets(w)
    pr = request_for(w, sets, policy(), 2, "v1")
    assert pr["apiVersion"] == "autoscaling.x-k8s.io/v1"
    assert pr["metadata"]["name"] == children.request_name(w, 2, children.fingerprint(w, sets))
    assert pr["spec"]["provisioningClassName"] == keys.CHECK_CAPACITY_CLASS
    assert [(ps["podTemplateRef"]["name"], ps["count"]) for ps in pr["spec"]["podSets"]] == [
        (children.template_name(w, pod_set(w, n)), c) for n, c in expected]


@pytest.mark.parametrize(("config", "annotations", "expected"), [
    ({}, {}, None),
    ({"noRetry": "true"}, {}, {"noRetry": "true"}),
    ({"noRetry": "true"}, {"provreq.raygate.io/noRetry": "false"}, {"noRetry": "false"}),
    ({}, {"provreq.raygate.io/processorInstance": "p5"}, {"processorInstance": "p5"}),
])
def test_parameters_from_config_with_per_job_overrides(config: dict[str, str], annotations: dict[str, str],
                                                        expected: dict[str, str] | None) -> None:
    w = rayjob("train", annotations=annotations)
    pr = request_for(w, gpu_sets(w), policy(provisioning={"parameters": config}), 1, "v1beta1")
    assert pr["apiVersion"] == "autoscaling.x-k8s.io/v1beta1"
    assert pr["spec"].get("parameters") == expected


@pytest.mark.parametrize(("annotations", "message"), [
    ({"provreq.raygate.io/x": "v" * 256}, "longer than 255"),
    ({"provreq.raygate.io/": "v"}, "names no parameter"),
])
def test_bad_parameter_overrides_are_refused_with_a_reason(annotations: dict[str, str], message: str) -> None:
    w = rayjob("train", annotations=annotations)
    with pytest.raises(BadInput, match=message):
        request_for(w, gpu_sets(w), policy(), 1, "v1")


def test_more_than_32_pod_sets_is_refused() -> None:
    w = rayjob("train", *[group(f"g{i}") for i in range(33)])
    with pytest.raises(BadInput, match="books at most 32"):
        needs_of(w, policy())


@pytest.mark.parametrize(("text", "message"), [
    (None, "needs the PodGroup spec"),
    ("{not json", "not valid JSON"),
    ('["a"]', "minMember"),
    ('{"minMember": 3}', "names no queue"),
])
def test_missing_or_corrupted_pod_group_annotation_is_bad_input(text: str | None, message: str) -> None:
    w = rayjob("train", annotations={keys.POD_GROUP_ANNOTATION: text} if text is not None else None)
    with pytest.raises(ManifestError, match=message):
        volcano.RULES.recorded(w)
    with pytest.raises(BadInput, match=message):  # and the reconciler fails the job with that reason
        needs_of(w, policy(mode="volcano"))


def test_pod_group_from_the_recorded_spec() -> None:
    spec = {"minMember": 3, "minResources": {"nvidia.com/gpu": "2"}, "queue": "team-a"}
    w = rayjob("train", annotations={keys.POD_GROUP_ANNOTATION: json.dumps(spec)})
    recorded = volcano.RULES.recorded(w)
    assert recorded.spec["queue"] == "team-a"
    [(kind, pg)] = volcano.RULES.group_objects(w, recorded, OFFLINE)
    assert kind == ChildKind.POD_GROUP
    assert (pg["apiVersion"], pg["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert pg["metadata"]["name"] == "ray-train-pg"  # the name the pods' group-name annotation points to
    assert pg["spec"] == spec
    assert pg["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize(("queue", "is_open", "words"), [
    (None, False, "does not exist"),
    ({"status": {"state": "Closed"}}, False, "is Closed"),
    ({"status": {}}, False, "not reported"),
    ({"status": {"state": "Open"}}, True, ""),
])
def test_the_pod_group_waits_for_an_open_queue(queue: dict[str, Any] | None, is_open: bool, words: str) -> None:
    spec = volcano.RULES.recorded(rayjob("train", annotations={keys.POD_GROUP_ANNOTATION: json.dumps(
        {"minMember": 3, "queue": "team-a"})}))
    needed = volcano.RULES.prerequisite(spec)
    assert (needed.resource.plural, needed.name) == ("queues", "team-a")
    problem = volcano.RULES.prerequisite_problem(spec, queue)
    assert (problem is None) is is_open
    if problem is not None:
        assert "team-a" in problem and words in problem



def test_every_child_records_its_job_where_the_garbage_collector_cannot_strip_it() -> None:
    """`kubectl delete --cascade=orphan` strips the owner references of a job's children: they are still
    raygate's to delete, once no pod consumes their booking."""
    w = rayjob()
    pr = request_for(w, gpu_sets(w), policy(), 1, "v1")
    orphaned = {**pr, "metadata": {**pr["metadata"], "ownerReferences": []}}
    assert children.controller_key(orphaned) == ("RayJob", w.namespace, w.name)
    assert children.owner_of(orphaned) == children.owner_of(pr)
    assert children.controller_key({"metadata": {"namespace": "ns", "name": "x"}}) is None
