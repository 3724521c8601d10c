"""The burst's bookkeeping under the queue: which job patches were the queue's own, the hand-off from one
admission to the next request, how raygate's writes split, the model with one request out at a time, and the
benchmark playing the autoscaler (each request once, as it appears). Pure: events are fed in by hand."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from benchmarks.reconciler_bench import Autoscaler, Tracker, predicted_delay, writes_of_flow
from raygate.core import keys
from raygate.core.api import provisioning_requests
from raygate.kube.client import ApiError, Kube

FRONT = "at the front of queue default: waiting for ProvisioningRequest job-1-x-a1 to be Provisioned"


def job(version: str, state: str, reason: str = "", suspend: bool = True) -> dict[str, Any]:
    annotations = {keys.REASON_ANNOTATION: reason} if reason else {}
    return {"metadata": {"name": "job-1", "resourceVersion": version, "labels": {keys.STATE_LABEL: state},
                         "annotations": annotations}, "spec": {"suspend": suspend}}


def request(name: str, owner: str = "job-1", provisioned: bool = False) -> dict[str, Any]:
    conds = [{"type": "Provisioned", "status": "True", "reason": "Provisioned"}] if provisioned else []
    return {"metadata": {"name": name, "ownerReferences": [{"kind": "RayJob", "name": owner}]},
            "status": {"conditions": conds}}


def feed(t: Tracker, *versions: dict[str, Any]) -> None:
    for obj in versions:
        t.on_job("MODIFIED", obj)


def test_a_job_that_waits_behind_others_then_asks_costs_the_queue_its_reasons_only() -> None:
    t = Tracker({"job-1"})
    feed(t, job("1", "Pending"),
         job("2", "Pending", "waiting in queue default behind RayJob ns/a"),
         job("2", "Pending", "waiting in queue default behind RayJob ns/a"),  # the same version again: no patch
         job("3", "Pending", "waiting in queue default behind RayJob ns/b"),  # a job arrived between them
         job("4", "Provisioning", FRONT),
         job("5", "Admitted", "admitted", suspend=False))
    assert dict(t.queue_patches.counts) == {"'waiting in queue' reason": 2}
    assert set(t.placed) == set(t.queued) == set(t.unsuspended) == set(t.admitted) == {"job-1"}
    assert len(t.behind["job-1"]) == 2


def test_a_front_that_loses_its_turn_in_the_burst_withdraws_and_asks_again() -> None:
    t = Tracker({"job-1"})
    feed(t, job("1", "Pending"),
         job("2", "Provisioning", FRONT),
         job("3", "Pending", "in queue default: another job is ahead of it"),
         job("4", "Pending", "waiting in queue default behind RayJob ns/a"),
         job("5", "Provisioning", FRONT))
    assert dict(t.queue_patches.counts) == {"request withdrawn": 1, "'waiting in queue' reason": 1, "asks again": 1}


def test_a_job_is_placed_once_the_reconciler_gave_it_a_reason_not_when_the_webhook_labelled_it() -> None:
    t = Tracker({"job-1"})
    feed(t, job("1", "Pending"))
    assert t.placed == {}
    feed(t, job("2", "Provisioning", FRONT))
    assert "job-1" in t.placed and "job-1" not in t.queued


def test_the_hand_off_runs_from_the_latest_admission_before_each_request() -> None:
    t = Tracker({"a", "b", "c"})
    t.request_seen = {"a": 1.0, "b": 2.5, "c": 4.0}
    t.unsuspended = {"a": 2.0, "b": 3.0, "c": 4.5}
    assert t.handoffs() == pytest.approx([0.5, 1.0])  # the front asked before any admission: no hand-off


def test_the_most_requests_out_at_once_counts_only_those_not_provisioned() -> None:
    t = Tracker({"job-1", "job-2"})
    t.on_request("ADDED", request("r1"))
    t.on_request("ADDED", request("r0", owner="job-2"))
    t.on_request("DELETED", request("r0", owner="job-2"))  # withdrawn in the burst
    assert t.reset_most_open() == 2 and t.most_open == 1
    t.on_request("MODIFIED", request("r1", provisioned=True))
    t.on_request("ADDED", request("r2", owner="job-2"))
    assert t.most_open == 1 and t.on_request("ADDED", request("x", owner="someone-else")) is None


def row(resource: str, verb: str, by_raygate: int, non_2xx: int = 0) -> dict[str, Any]:
    return {"resource": resource, "verb": verb, "by_raygate": by_raygate, "non_2xx": non_2xx}


def test_raygates_writes_split_into_the_admission_the_queue_and_the_refused() -> None:
    pr = f"{keys.PROVREQ_GROUP}/provisioningrequests"
    flow = {"writes_by_resource": [row("ray.io/rayjobs", "PATCH", 74, non_2xx=2), row("events", "POST", 42, 2),
                                   row("podtemplates", "POST", 40), row(pr, "POST", 22), row(pr, "DELETE", 2),
                                   row("coordination.k8s.io/leases", "PUT", 6)],
            "queue_patches_of_jobs": {"'waiting in queue' reason": 28, "request withdrawn": 2, "asks again": 2},
            "front_of_queue_events": 20, "check": {"admitted": 20}}
    split = writes_of_flow(flow)
    assert split["total"] == 180 and split["refused"] == 4
    assert split["queue_by_what"] == {"'waiting in queue' reason": 28, "request withdrawn": 2, "asks again": 2,
                                      "FrontOfQueue Event": 20, "request deleted": 2, "request made again": 2}
    assert split["admission"] == 120  # 6 a job: 2 PodTemplates, the request, Provisioning, the admission, its Event


def test_the_model_counts_no_more_status_patches_in_flight_than_requests_out() -> None:
    def probe(apiserver_ms: float) -> dict[str, Any]:
        return {"cpu_ms_per_write": {"kube-apiserver": apiserver_ms, "etcd": 0.0}}

    costs = {"request status patch": probe(2.0), "job patch by the reconciler": probe(16.0), "Event": probe(2.0)}
    one = predicted_delay(costs, writers=8, cores=2, requests_out=1)
    assert one["writers"] == 8 and one["status_patches_in_flight"] == 1
    assert one["delay_s"] == pytest.approx(0.09)  # (1 + 8) in flight at 100/s
    assert predicted_delay(costs, writers=8, cores=2)["delay_s"] == pytest.approx(0.72)  # a pool: 8 out at once


class FakeKube:
    def __init__(self, gone: frozenset[str] = frozenset()) -> None:
        self.patched: list[str] = []
        self.gone = gone

    def patch(self, res: Any, name: str, body: Any, namespace: str, **_: Any) -> dict[str, Any]:
        if name in self.gone:
            raise ApiError(404, {"reason": "NotFound"}, "PATCH", name)
        self.patched.append(name)
        return {}


def test_the_autoscaler_patches_each_request_once_as_it_appears_and_skips_the_withdrawn() -> None:
    kube = FakeKube(gone=frozenset({"late"}))
    a = Autoscaler(cast(Kube, kube), provisioning_requests("v1"), "ns", writers=2)
    a.offer("job-1", request("r1"), 1.0)
    a.offer("job-1", request("r1"), 1.1)  # seen again (its own MODIFIED): once
    a.offer("job-2", request("withdrawn", owner="job-2"), 1.2)
    a.forget(request("withdrawn", owner="job-2"))
    a.offer("job-3", request("done", owner="job-3", provisioned=True), 1.3)  # already Provisioned: left alone
    started = a.start()
    a.offer("job-4", request("late", owner="job-4"), time.monotonic())  # deleted between the watch and the patch
    deadline = time.monotonic() + 5
    while (len(a.gone) < 2 or not kube.patched) and time.monotonic() < deadline:
        time.sleep(0.01)
    a.stop()
    assert kube.patched == ["r1"] and sorted(a.gone) == ["late", "withdrawn"] and a.patches == 2
    assert set(a.sent) == {"job-1"} and a.seen["job-1"] == started  # seen before the start: picked up from it
