"""The soak's end in the queue's world: a held job asking again (a new request every provisionedTimeoutSeconds) does
not keep the stack from settling, and a job waiting in its queue counts as held, but as a violation when it has a
request out in two snapshots running. Pure: snapshots are built by hand."""

from __future__ import annotations

import random
from typing import Any, cast

from benchmarks.soak_bench import Snapshot, Traffic, judge
from raygate.core import keys
from raygate.kube.client import Kube

PR = keys.ChildKind.PROVISIONING_REQUEST


def job(name: str, state: str, reason: str, request: str = "", version: str = "1") -> dict[str, Any]:
    annotations = {keys.REASON_ANNOTATION: reason, **({keys.REQUEST_ANNOTATION: request} if request else {})}
    return {"kind": "RayJob", "metadata": {"name": name, "namespace": "soak-a", "uid": f"uid-{name}",
                                           "resourceVersion": version, "labels": {keys.STATE_LABEL: state},
                                           "annotations": annotations}, "spec": {"suspend": True}}


def request(name: str, owner: str) -> tuple[str, dict[str, Any]]:
    return PR, {"metadata": {"name": name, "namespace": "soak-a", "ownerReferences": [
        {"kind": "RayJob", "name": owner, "uid": f"uid-{owner}", "controller": True}]}, "status": {}}


FRONT = "at the front of queue default: ProvisioningRequest {} is not Provisioned (CapacityIsNotFound)"
BEHIND = "waiting in queue default behind RayJob soak-a/front"


def test_a_held_job_asking_again_leaves_the_stack_settled_but_an_admission_does_not() -> None:
    before = Snapshot([job("front", "Provisioning", FRONT.format("front-a1"), "front-a1")],
                      [request("front-a1", "front")], [])
    asked_again = Snapshot([job("front", "Provisioning", FRONT.format("front-a1r1"), "front-a1r1", version="2")],
                           [request("front-a1r1", "front")], [])
    between = Snapshot([job("front", "Pending", "in queue default: asks again after 30s without capacity",
                            "front-a1r1", version="2")], [], [])
    admitted = Snapshot([job("front", "Admitted", "admitted", "front-a1r1", version="3")],
                        [request("front-a1r1", "front")], [])
    assert before.fingerprint() == asked_again.fingerprint() == between.fingerprint()
    assert admitted.fingerprint() != asked_again.fingerprint()
    assert asked_again.held_requests() == {("RayJob", "soak-a", "front"): "front-a1r1"}


def traffic() -> Traffic:
    return Traffic(cast(Kube, None), random.Random(1))


def test_a_job_waiting_in_its_queue_with_no_request_is_held() -> None:
    snap = Snapshot([job("front", "Provisioning", FRONT.format("front-a1"), "front-a1"),
                     job("next", "Pending", BEHIND, "next-a1")], [request("front-a1", "front")], [])
    final = judge(snap, traffic(), snap)
    assert final["counts"]["held, waiting in its queue behind another job"] == 1
    assert final["counts"]["held, waiting for capacity the node group cannot give"] == 1
    assert sum(final["violations"].values()) == 0


def test_a_job_waiting_in_its_queue_with_a_request_out_is_a_violation_only_when_it_stays_so() -> None:
    waiting = job("next", "Pending", BEHIND, "next-a1r1", version="5")
    snap = Snapshot([waiting], [request("next-a1", "next")], [])
    assert judge(snap, traffic(), snap)["violations"]["waiting in its queue with a request out"] == 1
    # Seen first without it, or changed since: its turn came between the two lists of one snapshot.
    earlier = Snapshot([job("next", "Pending", BEHIND, "next-a1r1", version="4")], [request("next-a1", "next")], [])
    assert judge(snap, traffic(), earlier)["violations"]["waiting in its queue with a request out"] == 0
    assert judge(snap, traffic(), Snapshot([waiting], [], []))["violations"][
        "waiting in its queue with a request out"] == 0
