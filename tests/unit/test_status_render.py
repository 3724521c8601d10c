"""`raygate status` rows and rendering, without a cluster."""

from __future__ import annotations

import datetime as dt
import io
import json
from dataclasses import replace
from typing import Any

import pytest

from raygate.core import keys
from raygate.status import Place, groups_by_owner, held_from, human_duration, render_json, render_table

NOW = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=dt.UTC)


def obj(name: str, state: str | None, created: str = "2025-06-01T11:50:00Z", ns: str = "ml",
        annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if state is not None:
        all_labels[keys.STATE_LABEL] = state
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": created, "labels": all_labels,
                         "annotations": annotations or {}}}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59, "59s"), (60, "1m"), (303, "5m3s"), (600, "10m"), (659, "10m"), (3600, "1h"),
     (3660, "1h1m"), (86400, "1d"), (90000, "1d1h")],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_only_held_and_failed_states_are_rows() -> None:
    objs = [obj("a", "Pending"), obj("b", "Provisioning"), obj("c", "Failed"), obj("d", "Admitted"),
            obj("e", None), obj("f", "pending")]
    assert [r.name for r in held_from("RayJob", objs, NOW)] == ["a", "b", "c"]


def test_an_admitted_object_whose_scale_up_waits_is_a_row_with_that_reason() -> None:
    waiting = obj("elastic", "Admitted", annotations={
        keys.SCALE_UP_REASON_ANNOTATION: "2 pods of pod set gpu wait gated for a booking: CapacityIsNotFound",
        keys.REASON_ANNOTATION: "admitted: ProvisioningRequest x is Provisioned"})
    (row,) = held_from("RayCluster", [waiting, obj("steady", "Admitted")], NOW)
    assert (row.name, row.state) == ("elastic", "Admitted")
    assert row.reason == "scale-up: 2 pods of pod set gpu wait gated for a booking: CapacityIsNotFound"


def test_row_fields() -> None:
    (row,) = held_from("RayJob", [obj("train", "Provisioning", annotations={
        keys.ATTEMPT_ANNOTATION: "3", keys.REASON_ANNOTATION: "waiting for 4 nvidia.com/gpu",
        keys.REQUEST_ANNOTATION: "train-gang-3"})], NOW)
    assert (row.namespace, row.kind, row.name, row.state, row.attempt, row.waiting_seconds, row.reason) == (
        "ml", "RayJob", "train", "Provisioning", 3, 600, "waiting for 4 nvidia.com/gpu")
    assert row.as_json()["provisioningRequest"] == "train-gang-3"


def test_missing_or_garbage_annotations_do_not_break_a_row() -> None:
    (row,) = held_from("RayCluster", [obj("c", "Pending", created="not a time",
                                          annotations={keys.ATTEMPT_ANNOTATION: "x"})], NOW)
    assert (row.attempt, row.waiting_seconds, row.reason) == (None, 0, "")


def test_raycluster_made_for_a_rayjob_is_not_a_second_row() -> None:
    # KubeRay makes a RayJob's cluster once the job is Admitted, and copies that state: no row of its own.
    made = obj("job-raycluster-abc", "Admitted", labels={keys.ORIGINATED_FROM_CRD_LABEL: "RayJob"})
    assert held_from("RayCluster", [made], NOW) == []


def test_held_raycluster_that_claims_a_rayjob_parent_is_a_row() -> None:
    # Anyone can write that label; raygate held this one in its own right, so it is shown.
    claims = obj("claims", "Pending", labels={keys.ORIGINATED_FROM_CRD_LABEL: "RayJob"})
    assert [r.name for r in held_from("RayCluster", [claims], NOW)] == ["claims"]


def test_table_aligns_columns_and_keeps_the_whole_reason() -> None:
    rows = held_from("RayJob", [
        obj("a", "Pending", annotations={keys.REASON_ANNOTATION: "queue full"}),
        obj("a-much-longer-name", "Failed", created="2025-05-30T12:00:00Z",
            annotations={keys.ATTEMPT_ANNOTATION: "12", keys.REASON_ANNOTATION: "ProvisioningRequest failed: x y"}),
    ], NOW)
    out = io.StringIO()
    render_table(rows, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "STATE", "QUEUE", "POSITION", "AHEAD", "ATTEMPT", "WAITING",
                                "GANG", "REASON"]
    starts = {line.index(cell) for line, cell in zip(lines, ["STATE", "Pending", "Failed"], strict=True)}
    assert len(starts) == 1, lines
    assert lines[1].split()[:8] == ["ml", "rayjob/a", "Pending", "-", "-", "-", "-", "10m"]
    assert lines[2].endswith("ProvisioningRequest failed: x y")
    assert lines[2].split()[6:8] == ["12", "2d"]


def test_a_held_jobs_place_in_its_queue_is_shown() -> None:
    (row,) = held_from("RayJob", [obj("a", "Pending")], NOW)
    placed = replace(row, place=Place("default", 3, 7, "RayJob ml/ahead", 100))
    out = io.StringIO()
    render_table([placed], out)
    assert out.getvalue().splitlines()[1].split()[3:7] == ["default", "3/7", "RayJob", "ml/ahead"]
    assert placed.as_json()["queue"] == {"name": "default", "position": 3, "length": 7, "ahead": "RayJob ml/ahead",
                                         "priority": 100}


def test_a_job_out_of_the_way_shows_its_queue_but_no_position() -> None:
    (row,) = held_from("RayJob", [obj("a", "Provisioning")], NOW)
    aside = replace(row, place=Place("default", None, 6, None, 100))
    out = io.StringIO()
    render_table([aside], out)
    assert out.getvalue().splitlines()[1].split()[3:6] == ["default", "-", "-"]
    assert aside.as_json()["queue"] == {"name": "default", "position": None, "length": 6, "ahead": None,
                                        "priority": 100}


def test_json_output() -> None:
    out = io.StringIO()
    render_json(held_from("RayJob", [obj("a", "Pending")], NOW), out)
    doc = json.loads(out.getvalue())
    assert doc["items"] == [{
        "namespace": "ml", "kind": "RayJob", "name": "a", "state": "Pending", "attempt": None,
        "creationTimestamp": "2025-06-01T11:50:00Z", "waitingSeconds": 600, "reason": "",
        "provisioningRequest": None, "podGroups": [], "queue": None, "preemptedBy": None,
    }]


def test_a_preempted_job_says_by_whom_and_when() -> None:
    o = obj("low", "Pending")
    o["metadata"]["annotations"] = {keys.PREEMPTED_BY_ANNOTATION: "RayJob ml/high@u-high 2025-06-01T11:59:00.000Z",
                                    keys.REASON_ANNOTATION: "waiting in queue default behind RayJob ml/high"}
    row = held_from("RayJob", [o], NOW)[0]
    assert row.as_json()["preemptedBy"] == {"job": "RayJob ml/high", "at": "2025-06-01T11:59:00.000Z"}
    out = io.StringIO()
    render_table([row], out)
    assert "preempted by RayJob ml/high at 2025-06-01T11:59:00.000Z: waiting in queue" in out.getvalue()


def group(name: str, owner: str, status: str | None, reason: str = "", message: str = "") -> dict[str, Any]:
    """A PodGroup of Kubernetes' gang scheduling as raygate makes it, with kube-scheduler's condition."""
    conditions = [] if status is None else [{"type": keys.GANG_SCHEDULED_CONDITION, "status": status,
                                             "reason": reason, "message": message}]
    return {"metadata": {"name": name, "ownerReferences": [{"kind": "RayJob", "name": "x", "uid": owner,
                                                            "controller": True}]},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 5}}}, "status": {"conditions": conditions}}


@pytest.mark.parametrize(("state", "status", "reason", "row", "gang"), [
    ("Pending", None, "", True, "train-1 NotTriedYet"),
    ("Provisioning", "False", "Unschedulable", True, "train-1 Unschedulable"),
    ("Admitted", "False", "Unschedulable", True, "train-1 Unschedulable"),  # admitted, but not bound: shown
    ("Admitted", None, "", True, "train-1 NotTriedYet"),
    ("Admitted", "True", "Scheduled", False, None),  # bound whole: nothing to say
    ("Failed", "True", "Scheduled", True, "train-1 Scheduled"),
])
def test_native_rows_show_the_schedulers_verdict(state: str, status: str | None, reason: str, row: bool,
                                                 gang: str | None) -> None:
    job = obj("train", state)
    job["metadata"]["uid"] = "u1"
    by_owner = groups_by_owner([group("train-1", "u1", status, reason, "pod group is unschedulable"),
                                group("other", "u2", "False", "Unschedulable")])
    rows = held_from("RayJob", [job], NOW, by_owner)
    assert [r.gang for r in rows] == ([gang] if row else [])
    if row:
        (entry,) = rows[0].as_json()["podGroups"]
        assert (entry["name"], entry["minCount"], entry["scheduled"]) == ("train-1", 5, status)


def test_a_job_without_pod_groups_shows_a_dash() -> None:
    (row,) = held_from("RayJob", [obj("a", "Pending")], NOW, {})
    assert row.gang == "-"
