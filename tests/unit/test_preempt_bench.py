"""The preemption benchmark's bookkeeping: when a job turns running or stops, each arm's figures from the two jobs'
timelines, the median and counts over rounds, and its raygate-config as raygate reads it. Pure: events are fed in by
hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.preempt_bench import (
    NAMESPACES,
    NEVER,
    PREEMPT,
    RAYGATE_CONFIG,
    ROWS,
    Plan,
    Tracker,
    arm_figures,
    between,
    first,
    rayjob,
    summary,
    summary_table,
    targets,
)
from raygate.core import keys
from raygate.core.config import parse_config

NS = NAMESPACES[PREEMPT]


def pod(name: str, cluster: str, *, node: str = "", phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "labels": {keys.RAY_CLUSTER_LABEL: cluster,
                                                                   keys.RAY_NODE_TYPE_LABEL: "worker"}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def cluster(name: str, job: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "labels": {keys.ORIGINATED_FROM_NAME_LABEL: job}}}


def whats(t: Tracker, job: str) -> list[str]:
    return [w for _, w in t.events[f"{NS}/{job}"]]


def test_a_job_runs_when_all_its_ray_pods_run_and_stops_when_one_goes() -> None:
    t = Tracker({NS})
    t.on_pod("ADDED", pod("head", "low-abc", node="n1", phase="Running"))  # before its cluster is known
    t.on_cluster("ADDED", cluster("low-abc", "low"))
    assert f"{NS}/low" not in t.events  # one of two pods
    t.on_pod("ADDED", pod("worker", "low-abc"))
    t.on_pod("MODIFIED", pod("worker", "low-abc", node="gpu-1", phase="Running"))
    t.on_pod("MODIFIED", pod("worker", "low-abc", node="gpu-1", phase="Running"))  # no change: no second mark
    assert whats(t, "low") == ["running"]
    t.on_pod("DELETED", pod("worker", "low-abc", node="gpu-1", phase="Running"))
    t.on_pod("DELETED", pod("head", "low-abc", node="n1", phase="Running"))
    assert whats(t, "low") == ["running", "stopped"]
    # Admitted again: KubeRay makes a new cluster.
    t.on_cluster("ADDED", cluster("low-def", "low"))
    for name, node in (("head-2", "n1"), ("worker-2", "gpu-1")):
        t.on_pod("ADDED", pod(name, "low-def", node=node, phase="Running"))
    assert whats(t, "low") == ["running", "stopped", "running"]


def test_suspend_is_noted_when_it_turns_and_other_namespaces_are_ignored() -> None:
    t = Tracker({NS})

    def job(suspend: bool, ns: str = NS) -> dict[str, Any]:
        return {"metadata": {"name": "low", "namespace": ns, "uid": f"uid-{ns}"}, "spec": {"suspend": suspend}}

    for j in (job(True), job(True), job(False), job(False), job(True), job(True, "elsewhere")):
        t.on_job("MODIFIED", j)
    assert whats(t, "low") == ["suspended", "unsuspended", "suspended"]
    assert list(t.events) == [f"{NS}/low"]
    assert t.snapshot()[1] == {f"uid-{NS}"}  # whose Events count: this job's, not an earlier one's of its name


def test_first_and_between_find_moments_of_a_timeline() -> None:
    events = [(1.0, "running"), (2.0, "stopped"), (5.0, "running")]
    assert first(events, "running") == 1.0 and first(events, "running", 1.5) == 5.0
    assert first(events, "suspended") is None
    assert between(events, "running", 0.0, 5.0) == [1.0]


PREEMPTED = {"low": f"Preempted by RayJob {NS}/high (priority 1000)"}


def preempt_arm(*, back: bool = True) -> dict[str, Any]:
    low = [(0.0, "created"), (0.1, "suspended"), (0.2, "unsuspended"), (8.0, "running"), (20.5, "suspended"),
           (21.0, "stopped")]
    if back:
        low += [(45.0, "unsuspended"), (50.0, "running")]
    high = [(20.0, "created"), (20.1, "suspended"), (30.0, "unsuspended"), (34.0, "running"), (40.0, "deleted")]
    return arm_figures(PREEMPT, low, high, PREEMPTED)


def test_the_preempting_arm_times_the_high_job_the_preemption_and_the_low_jobs_way_back() -> None:
    f = preempt_arm()
    assert f["low_create_to_running_s"] == 8.0 and f["high_create_to_running_s"] == 14.0
    assert f["high_create_to_low_suspended_s"] == 0.5  # the webhook's suspend at its create is not the preemption
    assert f["low_suspended_to_its_pods_gone_s"] == 0.5 and f["low_pods_gone_to_high_running_s"] == 13.0
    assert f["high_deleted_to_low_running_again_s"] == 10.0 and f["low_ran_again"] and f["high_ran"]
    assert f["low_preempted_event"] and f["preempted_message"].startswith("Preempted by")
    assert f["other_preempted_events"] == []


def test_a_low_job_that_never_came_back_says_so() -> None:
    f = preempt_arm(back=False)
    assert not f["low_ran_again"] and math.isnan(f["high_deleted_to_low_running_again_s"])


def never_arm(low_extra: list[tuple[float, str]] | None = None) -> dict[str, Any]:
    low = [(0.0, "created"), (8.0, "running"), *(low_extra or []), (80.0, "deleted"), (80.5, "stopped")]
    high = [(20.0, "created"), (85.0, "running")]
    return arm_figures(NEVER, low, high, {})


def test_the_never_arm_times_the_high_job_from_its_create_and_from_the_low_jobs_delete() -> None:
    f = never_arm()
    assert f["high_create_to_running_s"] == 65.0 and f["low_deleted_after_s"] == 60.0
    assert f["low_deleted_to_high_running_s"] == 5.0
    assert f["low_ran_until_deleted"] and not f["low_preempted_event"]


def test_a_low_job_suspended_in_a_queue_that_never_preempts_did_not_run_until_deleted() -> None:
    assert not never_arm([(30.0, "suspended"), (30.5, "stopped")])["low_ran_until_deleted"]


def test_the_summary_takes_medians_of_durations_and_counts_the_rounds_that_said_yes() -> None:
    rounds = [{PREEMPT: preempt_arm(), NEVER: never_arm()}, {PREEMPT: preempt_arm(back=False), NEVER: never_arm()},
              {PREEMPT: {**preempt_arm(), "high_create_to_running_s": 20.0}, NEVER: never_arm()}]
    med = summary(rounds)
    assert med[PREEMPT]["high_create_to_running_s"] == 14.0  # of 14, 14, 20
    assert med[PREEMPT]["high_deleted_to_low_running_again_s"] == 10.0  # NaN (never came back) left out
    assert med[PREEMPT]["low_ran_again"] == 2 and med[PREEMPT]["low_preempted_event"] == 3
    assert med[NEVER]["low_ran_until_deleted"] == 3
    verdicts = {t.name: t.met for t in targets(rounds)}
    assert verdicts == {"LowerPriority: rounds the high job ran": True,
                        "LowerPriority: rounds the low job's Events say Preempted": True,
                        "LowerPriority: rounds the low job ran again once the high one was gone": False,
                        "Never: rounds the high job ran": True, "Never: rounds the low job ran on until deleted": True}
    text = summary_table(rounds, Plan(rounds=3, low_seconds=60))
    assert "2 of 3" in text and "14.0 s" in text and "round 3" in text
    assert len(text.splitlines()) == 4 + len(ROWS)  # title, its underline, the header, its rule; a line per figure


def test_the_config_is_one_raygate_accepts_with_a_queue_per_namespace() -> None:
    cfg = parse_config(RAYGATE_CONFIG)
    assert cfg.queues["preempting"].preemption == keys.Preemption.LOWER_PRIORITY
    assert cfg.queues["preempting"].min_run_seconds == 0
    assert cfg.queues["never"].preemption == keys.Preemption.NEVER
    assert {ns: cfg.policy_for(ns).queue for ns in NAMESPACES.values()} == {
        NAMESPACES[PREEMPT]: "preempting", NAMESPACES[NEVER]: "never"}


@pytest.mark.parametrize("priority", [None, "raygate-bench-high"])
def test_every_job_is_one_worker_that_needs_the_whole_node(priority: str | None) -> None:
    job = rayjob("high", NS, priority)
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] == 1 and group["template"]["spec"]["containers"][0]["resources"]["requests"][
        "nvidia.com/gpu"] == "4"
    assert job["metadata"]["labels"].get(keys.RAY_PRIORITY_CLASS_LABEL) == priority
