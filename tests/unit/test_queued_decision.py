"""The held job's decision in a queue: it asks only in its turn, withdraws when another job is ahead, asks again
when capacity frees, and an answer "not now" never fails it."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from plans import applied, decide, kinds
from test_reconciler_decision import NOW, job, policy, provisioning, request, templates

from raygate.core import keys
from raygate.core.queueing import Turn
from raygate.core.workload import Workload
from raygate.reconciler.plan import Observed, Outcome

FRONT = Turn(True, 1, 3)
SECOND = Turn(False, 2, 3, "RayJob ns/first")


def in_queue(turn: Turn, **extra: object) -> Observed:
    return Observed(turn=turn, queue="default", **extra)  # type: ignore[arg-type]


def reason(plan_obj: object, w: object) -> str:
    return applied(w, plan_obj)["metadata"]["annotations"][keys.REASON_ANNOTATION]  # type: ignore[arg-type]


def test_a_job_not_at_its_turn_asks_nothing_and_says_whom_it_waits_behind() -> None:
    w = job()
    plan = decide(w, in_queue(SECOND), policy(), NOW)
    assert plan.outcome is Outcome.QUEUED and kinds(plan) == ["patch hold"]
    assert reason(plan, w) == "waiting in queue default behind RayJob ns/first"
    again = job(annotations={keys.REASON_ANNOTATION: reason(plan, w)})
    assert kinds(decide(again, in_queue(SECOND), policy(), NOW)) == []  # no write while nothing changes


def test_the_front_asks_and_says_so_once() -> None:
    w = job()
    plan = decide(w, in_queue(FRONT), policy(), NOW)
    assert plan.outcome is Outcome.REQUESTED
    assert "event FrontOfQueue" in kinds(plan)
    assert reason(plan, w).startswith("at the front of queue default: waiting for ProvisioningRequest")


def test_a_job_whose_turn_passed_withdraws_its_request_and_asks_with_a_new_one_later() -> None:
    w = provisioning()
    pr = request(w, 1, ("Accepted", "True", "Accepted"))
    plan = decide(w, in_queue(SECOND, requests=(pr,), templates=templates(w)), policy(), NOW)
    assert plan.outcome is Outcome.WITHDRAWN
    assert kinds(plan) == ["patch withdraw", f"delete ProvisioningRequest {pr['metadata']['name']}"]
    after = applied(w, plan)
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
    assert after["metadata"]["annotations"][keys.ROUND_ANNOTATION] == "1"
    assert after["metadata"]["annotations"][keys.REQUEST_ANNOTATION] != pr["metadata"]["name"]


def not_now(w: object, answered: dt.datetime) -> dict[str, object]:
    pr = request(w, 1, ("Accepted", "True", "Accepted"), ("Provisioned", "False", "CapacityIsNotFound"))  # type: ignore[arg-type]
    for c in pr["status"]["conditions"]:
        c["lastTransitionTime"] = answered.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pr


def test_not_now_for_longer_than_every_timeout_and_retry_is_still_held_never_failed() -> None:
    w = provisioning()
    pol = policy(retry={"limit": 0})
    pr = not_now(w, NOW - dt.timedelta(seconds=30))
    plan = decide(w, in_queue(FRONT, requests=(pr,), templates=templates(w)), pol, NOW)
    assert plan.outcome is Outcome.WAITING and "patch fail" not in kinds(plan)
    assert "it waits for capacity to free" in reason(plan, w)
    # The autoscaler writes its answer anew on every loop: the wait counts from the first answer, which the job
    # records, not from the answer's lastTransitionTime.
    waited = Workload(applied(w, plan))
    later = NOW + dt.timedelta(hours=5)  # far past provisionedTimeoutSeconds x (retries + 1)
    fresh = not_now(w, later - dt.timedelta(seconds=5))
    plan = decide(waited, in_queue(FRONT, requests=(fresh,), templates=templates(w)), pol, later)
    assert plan.outcome is Outcome.WITHDRAWN  # it asks again, as a new request, and stays held
    assert applied(waited, plan)["metadata"]["labels"][keys.STATE_LABEL] == "Pending"


def test_the_front_asks_again_when_capacity_freed_after_its_answer() -> None:
    w = provisioning()
    pr = not_now(w, NOW - dt.timedelta(seconds=30))
    obs = in_queue(FRONT, requests=(pr,), templates=templates(w))
    assert decide(w, obs, policy(), NOW).outcome is Outcome.WAITING
    freed = replace(obs, freed=(NOW - dt.timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert decide(w, freed, policy(), NOW).outcome is Outcome.WITHDRAWN


def test_a_provisioned_request_is_admitted_whatever_the_turn() -> None:
    w = provisioning()
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    plan = decide(w, in_queue(SECOND, requests=(pr,), templates=templates(w)), policy(), NOW)
    assert plan.outcome is Outcome.ADMITTED  # the booking exists: nothing is gained by giving it back


def test_a_job_that_asked_behind_the_front_says_it_reached_the_front_when_answered_or_admitted() -> None:
    trying = "trying while the front of queue default waits: waiting for ProvisioningRequest x to be Provisioned"
    w = provisioning(**{keys.REASON_ANNOTATION: trying})
    booked = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    admitted = decide(w, in_queue(FRONT, requests=(booked,), templates=templates(w)), policy(), NOW)
    assert admitted.outcome is Outcome.ADMITTED and "event FrontOfQueue" in kinds(admitted)
    still_behind = decide(w, in_queue(SECOND, requests=(booked,), templates=templates(w)), policy(), NOW)
    assert still_behind.outcome is Outcome.ADMITTED and "event FrontOfQueue" not in kinds(still_behind)

    unanswered = request(w, 1, ("Accepted", "True", "A"))
    obs = in_queue(FRONT, requests=(unanswered,), templates=templates(w))
    assert kinds(decide(w, obs, policy(), NOW)) == []  # no write while the autoscaler has not answered
    not_yet = not_now(w, NOW - dt.timedelta(seconds=1))
    plan = decide(w, replace(obs, requests=(not_yet,)), policy(), NOW)
    assert "event FrontOfQueue" in kinds(plan) and reason(plan, w).startswith("at the front of queue default: ")


def test_a_job_no_node_group_can_hold_says_so_and_is_held_out_of_the_way_or_failed() -> None:
    w = provisioning()
    pr = not_now(w, NOW - dt.timedelta(seconds=10))
    said = {pr["metadata"]["name"]: "pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu"}  # type: ignore[index]
    obs = in_queue(FRONT, requests=(pr,), templates=templates(w), said=said)
    plan = decide(w, obs, policy(), NOW)
    assert "event NeverFits" in kinds(plan)
    after = applied(w, plan)["metadata"]["annotations"]
    assert after[keys.NEVER_FITS_ANNOTATION] == said[pr["metadata"]["name"]]  # type: ignore[index]
    assert "no node group of the cluster-autoscaler can hold its pods (pod didn't trigger scale-up: 1 " \
           "Insufficient nvidia.com/gpu)" in after[keys.REASON_ANNOTATION]
    failing = decide(w, replace(obs, never_fits=keys.NeverFits.FAIL), policy(), NOW)
    assert applied(w, failing)["metadata"]["labels"][keys.STATE_LABEL] == "Failed"
    busy = {pr["metadata"]["name"]: "pod didn't trigger scale-up: 1 max node group size reached"}  # type: ignore[index]
    assert "event NeverFits" not in kinds(decide(w, replace(obs, said=busy), policy(), NOW))

    parked = provisioning(**{keys.NEVER_FITS_ANNOTATION: "pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu"})
    freed = replace(obs, freed=NOW.strftime("%Y-%m-%dT%H:%M:%SZ"), said=busy)
    assert kinds(decide(parked, freed, policy(), NOW)) == []  # it keeps its request; the autoscaler retries it
