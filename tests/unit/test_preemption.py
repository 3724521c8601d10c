"""Preemption (queues.<name>.preemption: LowerPriority): which running jobs make room for the front of a queue,
how the front suspends them, and how a preempted job goes back to its queue."""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

from plans import applied, decide, kinds
from test_queued_decision import FRONT, in_queue, not_now, reason
from test_reconciler_decision import NOW, job, policy, provisioning, templates

from raygate.core import keys, podgate, preemption
from raygate.core.keys import QueueStrategy as Strategy
from raygate.core.objects import Key
from raygate.core.preemption import Running
from raygate.core.queueing import Waiting, askers
from raygate.core.workload import Workload
from raygate.reconciler.plan import Observed, Outcome, Preempt, Preempting

NODE = {podgate.ANYWHERE: {"nvidia.com/gpu": Decimal(4)}}  # one whole 4-GPU node, anywhere


def running(name: str, priority: int, admitted_minutes_ago: float, room: preemption.Room = NODE) -> Running:
    return Running(Key("RayJob", "ns", name), f"uid-{name}", priority,
                   NOW - dt.timedelta(minutes=admitted_minutes_ago), room)


def picked(need: preemption.Room, jobs: list[Running], priority: int = 100, min_run: float = 0) -> list[str]:
    return [r.key.name for r in preemption.victims(priority, need, jobs, NOW, min_run)]


def test_a_one_node_job_preempts_one_of_two_low_jobs_the_most_recently_admitted() -> None:
    assert picked(NODE, [running("old", 0, 60), running("new", 0, 5)]) == ["new"]


def test_lowest_priority_goes_first_whatever_its_age() -> None:
    assert picked(NODE, [running("mid", 50, 60), running("low", 10, 120)]) == ["low"]


def test_equal_or_higher_priority_is_never_preempted() -> None:
    assert picked(NODE, [running("same", 100, 60), running("higher", 200, 60)]) == []


def test_a_job_admitted_less_than_min_run_seconds_ago_stays() -> None:
    assert picked(NODE, [running("fresh", 0, 1)], min_run=300) == []
    assert picked(NODE, [running("fresh", 0, 1)], min_run=0) == ["fresh"]


def test_never_more_than_needed_and_none_when_all_together_do_not_cover() -> None:
    two_nodes = {podgate.ANYWHERE: {"nvidia.com/gpu": Decimal(8)}}
    half = {podgate.ANYWHERE: {"nvidia.com/gpu": Decimal(2)}}
    # The half (lowest priority) is picked first and does not cover; the whole node then covers alone, so the
    # half goes back.
    assert picked(NODE, [running("h1", 0, 5, half), running("whole", 1, 5)]) == ["whole"]
    assert picked(two_nodes, [running("h1", 0, 5, half), running("h2", 0, 6, half), running("n", 1, 5)]) == \
        ["h1", "h2", "n"]
    assert picked(two_nodes, [running("only", 0, 5)]) == []  # 4 of 8 GPUs: suspending it frees too little


def test_room_elsewhere_does_not_count_for_a_front_that_must_run_on_other_nodes() -> None:
    pinned = {"digest-of-h100-nodes": {"nvidia.com/gpu": Decimal(4)}}
    assert picked(pinned, [running("anywhere", 0, 5)]) == []  # its pods may have run on any node
    assert picked(pinned, [running("there", 0, 5, pinned)]) == ["there"]
    assert picked(NODE, [running("there", 0, 5, pinned)]) == ["there"]  # a front that may go anywhere


def test_a_preempted_job_does_not_ask_while_the_job_it_made_room_for_waits() -> None:
    high = Waiting(Key("RayJob", "ns", "high"), 100, "2030-01-01T00:00:09Z", "u-high", "2030-01-01T00:01:00Z")
    low = Waiting(Key("RayJob", "ns", "low"), 0, "2030-01-01T00:00:01Z", "u-low",
                  yields_to=preemption.JobId(high.key, high.uid))
    assert askers([high, low], Strategy.BEST_EFFORT_FIFO, 8) == [high.key]  # high answered not now: low may not try
    assert askers([low], Strategy.STRICT_FIFO, 8) == [low.key]  # once high is admitted, low asks
    # A job made anew under high's name is not the one low made room for: low tries as any job behind would.
    anew = dataclasses.replace(high, uid="u-high-2")
    assert askers([anew, low], Strategy.BEST_EFFORT_FIFO, 8) == [high.key, low.key]


def preempting(*jobs: Running, priority: int = 100) -> Observed:
    w = provisioning()
    return in_queue(FRONT, requests=(not_now(w, NOW - dt.timedelta(seconds=30)),), templates=templates(w),
                    preempt=Preempting(0, priority, jobs))


def test_the_front_answered_not_now_suspends_its_victims_and_says_so() -> None:
    w = provisioning()
    need = preemption.room(w, w.gang(), policy().manages)
    low = Running(Key("RayCluster", "other", "low"), "uid-low", 0, NOW - dt.timedelta(hours=1), need)
    plan = decide(w, preempting(low), policy(), NOW)
    assert plan.outcome is Outcome.PREEMPTING
    assert kinds(plan) == ["patch hold", "preempt RayCluster other/low", "event Preempting"]
    suspend = next(a for a in plan.actions if isinstance(a, Preempt))
    assert {"op": "add", "path": "/spec/suspend", "value": True} in suspend.ops
    assert suspend.ops[0] == {"op": "test", "path": "/metadata/labels/raygate.io~1state", "value": "Admitted"}
    by = suspend.ops[2]["value"]  # raygate.io/preempted-by on the victim: the front by name and uid, and when
    assert by.startswith(f"RayJob ns/train@{w.uid} ") and preemption.preempted_by(by)[0] == preemption.JobId.of(w)
    assert "it preempted RayCluster other/low" in reason(plan, w)
    # Until their pods are gone (capacity freed), it waits for them and preempts nobody else.
    after = Workload(applied(w, plan))
    again = decide(after, preempting(low), policy(), NOW + dt.timedelta(seconds=5))
    assert again.outcome is Outcome.WAITING and not any(isinstance(a, Preempt) for a in again.actions)


def test_nobody_is_preempted_with_equal_priority_or_when_the_queue_never_preempts() -> None:
    w = provisioning()
    need = preemption.room(w, w.gang(), policy().manages)
    same = Running(Key("RayJob", "ns", "same"), "uid-same", 100, NOW - dt.timedelta(hours=1), need)
    assert decide(w, preempting(same), policy(), NOW).outcome is Outcome.WAITING
    never = in_queue(FRONT, requests=(not_now(w, NOW - dt.timedelta(seconds=30)),), templates=templates(w))
    assert decide(w, never, policy(), NOW).outcome is Outcome.WAITING


def test_a_preempted_job_goes_back_to_its_queue_in_the_same_attempt_and_says_for_whom() -> None:
    w = job("Admitted", suspend=True, annotations={
        keys.ATTEMPT_ANNOTATION: "2", keys.ADMITTED_AT_ANNOTATION: "2030-01-01T11:00:00Z",
        keys.PREEMPTED_BY_ANNOTATION: "RayJob ns/high@u-high 2030-01-01T12:00:00.000Z"})
    w = job("Admitted", suspend=True, annotations={**w.annotations, keys.REQUEST_ANNOTATION: "train-x-a2"})
    plan = decide(w, Observed(), policy(), NOW)
    assert plan.outcome is Outcome.PREEMPTED
    assert "event Preempted" in kinds(plan)
    after = applied(w, plan)
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
    annotations = after["metadata"]["annotations"]
    assert annotations[keys.ATTEMPT_ANNOTATION] == "2"  # it failed nothing
    assert keys.ADMITTED_AT_ANNOTATION not in annotations
    assert annotations[keys.REASON_ANNOTATION].startswith("in queue default: preempted at 2030-01-01T12:00:00.000Z "
                                                          "to make room for RayJob ns/high")


def test_a_front_whose_victims_freed_nothing_may_preempt_again_after_provisioned_timeout_seconds() -> None:
    w = provisioning()
    need = preemption.room(w, w.gang(), policy().manages)
    low = Running(Key("RayJob", "ns", "low"), "uid-low", 0, NOW - dt.timedelta(hours=1), need)
    after = Workload(applied(w, decide(w, preempting(low), policy(), NOW)))
    other = Running(Key("RayJob", "ns", "other"), "uid-other", 0, NOW - dt.timedelta(hours=1), need)
    later = NOW + dt.timedelta(seconds=301)  # provisionedTimeoutSeconds is 300 here
    plan = decide(after, preempting(other), policy(), later)
    assert plan.outcome is Outcome.PREEMPTING and "preempt RayJob ns/other" in kinds(plan)


def test_once_its_victims_pods_are_gone_the_front_gives_the_autoscaler_time_to_see_the_room() -> None:
    """The autoscaler's first answers after the pods went may still be "not now" (its view lags a loop or more):
    preempting again on them would suspend a second job for room the first already gave."""
    w = provisioning()
    need = preemption.room(w, w.gang(), policy().manages)
    low = Running(Key("RayJob", "ns", "low"), "uid-low", 0, NOW - dt.timedelta(hours=1), need)
    after = Workload(applied(w, decide(w, preempting(low), policy(), NOW)))
    other = Running(Key("RayJob", "ns", "other"), "uid-other", 0, NOW - dt.timedelta(hours=1), need)
    freed = NOW + dt.timedelta(seconds=10)  # low's pods gone; the front asked again and was answered not now
    stale = Observed(turn=FRONT, queue="default", freed=freed.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                     requests=(not_now(after, freed + dt.timedelta(seconds=5)),), templates=templates(w),
                     preempt=Preempting(0, 100, (other,)))
    waits = decide(after, stale, policy(), freed + dt.timedelta(seconds=20))
    assert waits.outcome is Outcome.WAITING and not any(isinstance(a, Preempt) for a in waits.actions)
    assert "their pods are gone, and it waits for the cluster-autoscaler to see the room" in reason(waits, after)
    # Still not Provisioned provisionedTimeoutSeconds (300 here) after the room was freed: it preempts again.
    plan = decide(after, stale, policy(), freed + dt.timedelta(seconds=301))
    assert plan.outcome is Outcome.PREEMPTING and "preempt RayJob ns/other" in kinds(plan)


def test_while_its_victims_pods_still_run_the_front_preempts_nobody_else_however_long_they_take() -> None:
    """KubeRay deletes a suspended job's pods, and a loaded node takes its time: the room they hold is on its way,
    and suspending a second job for it would stop one more for nothing."""
    w = provisioning()
    need = preemption.room(w, w.gang(), policy().manages)
    low = Running(Key("RayJob", "ns", "low"), "uid-low", 0, NOW - dt.timedelta(hours=1), need)
    after = Workload(applied(w, decide(w, preempting(low), policy(), NOW)))
    other = Running(Key("RayJob", "ns", "other"), "uid-other", 0, NOW - dt.timedelta(hours=1), need)
    later = NOW + dt.timedelta(seconds=301)  # past provisionedTimeoutSeconds (300 here)
    obs = in_queue(FRONT, requests=(not_now(after, later - dt.timedelta(seconds=1)),), templates=templates(w),
                   preempt=Preempting(0, 100, (other,), going={low.key: 2}, uids={low.key: low.uid}))
    assert after.annotations[keys.PREEMPTING_ANNOTATION].endswith(f" RayJob ns/low@{low.uid}")  # whom, by uid
    waits = decide(after, obs, policy(), later)
    assert waits.outcome is Outcome.WAITING and not any(isinstance(a, Preempt) for a in waits.actions)
    assert "it waits for the pods of RayJob ns/low to go" in reason(waits, after)
    # Once they are gone (and the autoscaler had its time), it may preempt again.
    gone = dataclasses.replace(obs, preempt=Preempting(0, 100, (other,), going={low.key: 0}, uids={low.key: low.uid}))
    assert "preempt RayJob ns/other" in kinds(decide(after, gone, policy(), later))
    # A job under the victim's name that is another (deleted and made anew, admitted in any queue) runs on its own
    # booking: its pods are not room on the way, and the front may preempt again once the wait is over.
    anew = dataclasses.replace(obs, preempt=Preempting(0, 100, (other,), going={low.key: 2}, uids={low.key: "u2"}))
    assert decide(after, anew, policy(), later).outcome is Outcome.PREEMPTING


def test_a_record_from_before_uids_names_jobs_whichever_job_has_the_name() -> None:
    w = provisioning()
    need = preemption.room(w, w.gang(), policy().manages)
    low = Running(Key("RayJob", "ns", "low"), "uid-low", 0, NOW - dt.timedelta(hours=1), need)
    after = applied(w, decide(w, preempting(low), policy(), NOW))
    annotations = after["metadata"]["annotations"]
    annotations[keys.PREEMPTING_ANNOTATION] = annotations[keys.PREEMPTING_ANNOTATION].rpartition("@")[0]
    later = NOW + dt.timedelta(seconds=301)
    obs = in_queue(FRONT, requests=(not_now(Workload(after), later - dt.timedelta(seconds=1)),),
                   templates=templates(w), preempt=Preempting(0, 100, (), going={low.key: 1}, uids={low.key: "u2"}))
    plan = decide(Workload(after), obs, policy(), later)
    assert "it waits for the pods of RayJob ns/low to go" in reason(plan, Workload(after))


def test_the_preempted_by_record_reads_back_and_reads_one_from_before_uids() -> None:
    front = preemption.JobId(Key("RayJob", "ns", "high"), "u1")
    assert preemption.preempted_by(preemption.preempted_by_record(front, "2030-01-01T12:00:00.000Z")) == (
        front, "2030-01-01T12:00:00.000Z")
    assert preemption.preempted_by("RayJob ns/high 2030-01-01T12:00:00.000Z") == (
        preemption.JobId(Key("RayJob", "ns", "high"), ""), "2030-01-01T12:00:00.000Z")
    assert preemption.preempted_by("") == (None, "")


def test_the_preempting_record_reads_back_the_victims_it_wrote() -> None:
    victims = [preemption.JobId(Key("RayJob", "ns", "a"), "u1"), preemption.JobId(Key("RayCluster", "other", "b"),
                                                                                      "u2")]
    assert preemption.recorded(preemption.record("2030-01-01T12:00:00.000Z", victims)) == (
        "2030-01-01T12:00:00.000Z", tuple(victims))
    assert preemption.recorded("") == ("", ())
    assert preemption.recorded("2030-01-01T12:00:00.000Z RayJob ns/a,nonsense") == (
        "2030-01-01T12:00:00.000Z", (preemption.JobId(Key("RayJob", "ns", "a"), ""),))
