"""The e2e benchmark's milestones in the queue's world: a job's request, Accepted and Provisioned are those of the
request that got it admitted, and a request withdrawn before any answer (its turn passed) is told apart from one
replaced after an answer. Pure: watch events are fed in by hand."""

from __future__ import annotations

from typing import Any

from benchmarks.e2e_bench import Tracker


def request(name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "ownerReferences": [{"kind": "RayJob", "name": "train-000"}]},
            "status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}


def feed(t: Tracker, *events: tuple[float, dict[str, Any]]) -> None:
    for when, obj in events:  # as on_request calls it, at a chosen time
        with t.changed:
            t._request("train-000", obj, when)


def test_a_request_withdrawn_unanswered_is_not_the_jobs_request() -> None:
    t = Tracker({"train-000"})
    feed(t, (1.0, request("r1")),  # the job was the front for a moment
         (3.0, request("r1r1")),  # its turn again, once the job that sorted ahead of it was admitted
         (4.0, request("r1r1", ("Accepted", "True"))),
         (5.0, request("r1r1", ("Accepted", "True"), ("Provisioned", "True"))))
    assert t.marks["train-000"] == {"request": 3.0, "accepted": 4.0, "provisioned": 5.0}
    assert t.replaced("train-000") == (1, 0)


def test_a_request_replaced_after_an_answer_is_a_second_request() -> None:
    t = Tracker({"train-000"})
    feed(t, (1.0, request("a1", ("Accepted", "True"), ("Provisioned", "False"))),
         (9.0, request("a2", ("Provisioned", "True"))))
    assert t.marks["train-000"] == {"request": 9.0, "accepted": 9.0, "provisioned": 9.0}
    assert t.replaced("train-000") == (0, 1)


def test_a_job_not_yet_provisioned_has_no_request_milestone() -> None:
    t = Tracker({"train-000"})
    feed(t, (1.0, request("a1", ("Accepted", "True"))))
    assert t.marks["train-000"] == {} and t.replaced("train-000") == (0, 0)
