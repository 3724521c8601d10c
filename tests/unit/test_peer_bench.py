"""The benchmarks' bookkeeping: which job a request is for, when a job counts as unsuspended, how a
py-spy profile and the reconciler's histograms are summed up, and the model of the API server's
wall. Pure: events are fed in by hand."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.peer_bench import Tracker, kueue_objects
from benchmarks.reconciler_bench import latency_between, predicted_delay, summarize_profile


def owned(name: str, kind: str, owner: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "ownerReferences": [{"kind": kind, "name": owner, "controller": True}]}}


def test_a_raygate_request_is_its_jobs_at_once() -> None:
    t = Tracker({"job-1"})
    t.on_request("ADDED", owned("job-1-abc-a1", "RayJob", "job-1"))
    assert t.request_of == {"job-1": "job-1-abc-a1"} and "job-1" in t.request_seen


@pytest.mark.parametrize("workload_first", [True, False])
def test_a_kueue_request_is_the_job_of_its_workload_in_either_order(workload_first: bool) -> None:
    t = Tracker({"job-1", "job-2"})
    events = [(t.on_workload, owned("rayjob-job-1-x", "RayJob", "job-1")),
              (t.on_request, owned("rayjob-job-1-x-check-1", "Workload", "rayjob-job-1-x"))]
    for handler, obj in events if workload_first else reversed(events):
        handler("ADDED", obj)
    assert t.request_of == {"job-1": "rayjob-job-1-x-check-1"}
    assert set(t.request_seen) == {"job-1"} and not t.owners.early


def test_the_first_request_of_a_job_is_the_one_timed() -> None:
    t = Tracker({"job-1"})
    t.on_request("ADDED", owned("r1", "RayJob", "job-1"))
    first = t.request_seen["job-1"]
    t.on_request("ADDED", owned("r2", "RayJob", "job-1"))
    assert t.request_of["job-1"] == "r1" and t.request_seen["job-1"] == first


@pytest.mark.parametrize(("spec", "unsuspended"), [
    ({"suspend": True}, False),
    ({"suspend": False}, True),  # raygate writes false
    ({}, True),  # Kueue's update drops the field (Go's omitted zero value)
])
def test_a_job_counts_as_unsuspended_when_suspend_is_no_longer_true(spec: dict[str, Any], unsuspended: bool) -> None:
    t = Tracker({"job-1"})
    t.on_job("MODIFIED", {"metadata": {"name": "job-1"}, "spec": spec})
    t.on_job("MODIFIED", {"metadata": {"name": "other"}, "spec": {}})
    assert ("job-1" in t.unsuspended) is unsuspended and "other" not in t.unsuspended


def test_the_cluster_queue_requires_the_provisioning_check_and_has_room_for_every_resource() -> None:
    objs = {o["kind"]: o for o in kueue_objects("ns", "check-capacity.autoscaling.x-k8s.io")}
    cq = objs["ClusterQueue"]["spec"]
    assert cq["admissionChecksStrategy"]["admissionChecks"] == [{"name": objs["AdmissionCheck"]["metadata"]["name"]}]
    assert set(cq["resourceGroups"][0]["coveredResources"]) == {"cpu", "memory", "nvidia.com/gpu"}
    assert objs["ProvisioningRequestConfig"]["spec"]["managedResources"] == ["nvidia.com/gpu"]
    assert objs["LocalQueue"]["metadata"]["namespace"] == "ns"


def test_a_profile_counts_each_function_once_per_sample_on_stack_and_on_top() -> None:
    text = ("thread (0x1);loop (workqueue.py:10);request (kube.py:5);read (ssl.py:1) 3\n"
            "thread (0x1);loop (workqueue.py:10);decide (decision.py:7) 1\n"
            "garbage\n")
    out = summarize_profile(text)
    assert out["samples"] == 4
    assert dict(out["inclusive_pct"])["loop (workqueue.py)"] == 100.0
    assert dict(out["self_pct"]) == {"read (ssl.py)": 75.0, "decide (decision.py)": 25.0}


def test_latency_between_two_scrapes_counts_only_what_happened_between_them() -> None:
    before = {"queue_wait_seconds": {"0.01": 5, "0.1": 5, "1.0": 5, "+Inf": 5, "count": 5, "sum": 0.02}}
    after = {"queue_wait_seconds": {"0.01": 5, "0.1": 104, "1.0": 105, "+Inf": 105, "count": 105, "sum": 5.02}}
    got = latency_between(before, after)["queue_wait_seconds"]
    assert got["count"] == 100
    assert got["mean_s"] == pytest.approx(0.05)
    assert got["p99_under_s"] == 0.1  # 99 of the 100 new waits were under 100 ms
    assert latency_between(after, after) == {}  # nothing new: no row rather than a division by zero


def test_the_model_of_the_api_servers_wall() -> None:
    def probe(apiserver_ms: float) -> dict[str, Any]:
        return {"cpu_ms_per_write": {"kube-apiserver": apiserver_ms, "etcd": 0.0}}

    m = predicted_delay({"request status patch": probe(2.0), "job patch by the reconciler": probe(16.0),
                         "Event": probe(2.0)}, writers=8, cores=2)
    assert m["admissions_per_s"] == pytest.approx(100)  # 2 cores / 20 ms
    assert m["raygate_patches_in_flight"] == pytest.approx(64)  # the server shares its cores 8 : 64
    assert m["delay_s"] == pytest.approx(0.72)  # (8 + 64) in flight at 100/s


def test_every_request_goes_to_the_autoscaler_and_a_job_is_taken_in_by_its_request_or_its_place_in_the_queue() -> None:
    offered: list[tuple[str, str]] = []
    t = Tracker({"job-1", "job-2"}, offer=lambda job, obj, seen: offered.append((job, obj["metadata"]["name"])))
    t.on_request("ADDED", owned("r1", "RayJob", "job-1"))
    t.on_request("ADDED", owned("r2", "RayJob", "job-1"))  # made again after a withdrawal: patched too
    assert offered == [("job-1", "r1"), ("job-1", "r2")] and t.request_of == {"job-1": "r1"}
    queued = {"name": "job-2", "annotations": {"raygate.io/reason": "waiting in queue default behind RayJob ns/job-1"}}
    t.on_job("MODIFIED", {"metadata": queued, "spec": {"suspend": True}})
    assert set(t.taken_in) == {"job-1", "job-2"} and set(t.request_seen) == {"job-1"} and not t.unsuspended
