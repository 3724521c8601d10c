"""The scarce-capacity benchmark's bookkeeping: the order jobs ran in, pairs out of order, and GPU node-seconds
used against available while jobs wait; which jobs ended Failed, and why. Pure: marks and events are fed in by
hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.scarce_bench import (
    Plan,
    ScarceTracker,
    busy_at_once,
    figures,
    merge,
    overlap,
    pairs_out_of_order,
    passed_by,
)

NAMES = ["q1", "q2", "q3", "q4"]


def ran(*order: str) -> dict[str, dict[str, float]]:
    """Marks of jobs created 1 s apart that ran in `order`, one every 10 s."""
    marks: dict[str, dict[str, float]] = {n: {"created": float(i)} for i, n in enumerate(NAMES)}
    for i, n in enumerate(order):
        marks[n]["running"] = 10.0 * (i + 1)
    return marks


@pytest.mark.parametrize(("order", "out"), [
    (("q1", "q2", "q3", "q4"), 0),
    (("q4", "q3", "q2", "q1"), 6),
    (("q2", "q1", "q3", "q4"), 1),
    (("q1", "q4", "q2", "q3"), 2),
    (("q1", "q3", "q4"), 2),  # q2 never ran: q3 and q4 ran before it
    (("q1",), 0),  # the three that never ran are not pairs out of order among themselves
])
def test_pairs_out_of_order_count_the_later_job_that_ran_first(order: tuple[str, ...], out: int) -> None:
    assert pairs_out_of_order(NAMES, ran(*order)) == out


def test_each_job_counts_the_later_jobs_that_passed_it() -> None:
    assert passed_by(NAMES, ran("q3", "q1", "q4", "q2")) == {"q1": 1, "q2": 2, "q3": 0, "q4": 0}


def test_intervals_merge_and_overlap() -> None:
    window = merge([(5, 7), (0, 2), (1, 3), (9, 9)])
    assert window == [(0, 3), (5, 7)]
    assert overlap((2, 6), window) == 2.0
    assert overlap((10, 20), window) == 0.0


def test_busy_at_once_counts_the_time_k_spans_overlap() -> None:
    spans = [(0.0, 10.0), (5.0, 15.0), (8.0, 9.0)]
    assert busy_at_once(spans, 1) == 15.0 and busy_at_once(spans, 2) == 5.0 and busy_at_once(spans, 3) == 1.0
    assert busy_at_once([], 2) == 0.0


def test_node_seconds_count_only_while_a_job_waits() -> None:
    # q1 created at 0, runs 1.5-20; q2 created at 1, waits until 21 (runs to 30); q3 created at 2, runs at 8.
    marks = {"q1": {"created": 0.0, "running": 1.5, "deleted": 20.0},
             "q2": {"created": 1.0, "running": 21.0, "deleted": 30.0},
             "q3": {"created": 2.0, "running": 8.0, "deleted": 18.0}}
    # Node a from 0.2 to the end, node b from 7 until it is removed at 19, node c from 20.5.
    nodes = {"a": {"added": 0.2}, "b": {"added": 7.0, "deleted": 19.0}, "c": {"added": 20.5}}
    f = figures(["q1", "q2", "q3"], marks, nodes, end=40.0, nodes_max=2)
    assert f["waiting_s"] == 21.0  # 0 -> 21: someone waits all along
    assert f["gpu_node_seconds_used"] == pytest.approx(18.5 + 0 + 10)  # q1 1.5-20, q3 8-18
    assert f["gpu_node_seconds_available"] == pytest.approx(20.8 + 12 + 0.5)
    assert f["gpu_node_seconds_at_group_max"] == 42.0
    assert f["order"] == ["q1", "q3", "q2"] and f["pairs_out_of_order"] == 1
    assert f["waits_s"] == {"q1": 1.5, "q2": 20.0, "q3": 6.0} and f["makespan_s"] == 21.0
    assert (f["gpu_nodes_added"], f["gpu_nodes_removed"]) == (3, 1)
    assert f["all_nodes_busy_s"] == 10.0  # q1 and q3 both ran from 8 to 18


def test_a_failed_job_stops_waiting_and_leaves_the_makespan_open() -> None:
    marks = {"q1": {"created": 0.0, "running": 1.0, "deleted": 11.0}, "q2": {"created": 2.0, "failed": 5.0}}
    f = figures(["q1", "q2"], marks, {"a": {"added": 0.0}}, end=11.0, nodes_max=2)
    assert f["waiting_s"] == 4.0  # q1 0-1, q2 2-5
    assert f["never_ran"] == ["q2"] and math.isnan(f["makespan_s"])


def test_hold_times_are_the_same_for_every_run_of_a_seed() -> None:
    plan = Plan(jobs=12)
    assert plan.names()[0] == "q01" and plan.names()[-1] == "q12"
    assert plan.holds() == Plan(jobs=12).holds() != Plan(jobs=12, seed=2).holds()
    assert all(10 <= h <= 15 for h in plan.holds().values())


def job(name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}, "spec": {"suspend": True}}


def test_a_raygate_job_that_failed_is_reported_with_its_reason() -> None:
    t = ScarceTracker({"q1", "q2"})
    t.on_job("MODIFIED", job("q1", {"raygate.io/state": "Provisioning"}, {"raygate.io/reason": "waiting"}))
    t.on_job("MODIFIED", job("q2", {"raygate.io/state": "Failed"}, {"raygate.io/reason": "timed out"}))
    assert t.failed == {"q2": "timed out"} and "failed" in t.marks["q2"]


def test_a_kueue_workload_deactivated_is_its_jobs_failure() -> None:
    t = ScarceTracker({"q1"})
    workload = {"metadata": {"name": "rayjob-q1-x", "ownerReferences": [{"kind": "RayJob", "name": "q1"}]},
                "spec": {"active": True}, "status": {}}
    t.on_workload("ADDED", workload)
    assert t.failed == {}
    workload["spec"]["active"] = False
    workload["status"] = {"admissionChecks": [{"name": "gpu-provisioning", "state": "Rejected", "message": "no"}]}
    t.on_workload("MODIFIED", workload)
    assert t.failed == {"q1": "Workload deactivated: admission check gpu-provisioning Rejected: no"}
