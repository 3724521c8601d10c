"""The reconciler's queues: kept from job events; only jobs whose turn changes are reconciled again."""

from __future__ import annotations

import copy
import threading
from dataclasses import replace

from raygate.core.keys import QueueStrategy as Strategy
from raygate.core.objects import Key
from raygate.core.queueing import Waiting
from raygate.reconciler.queues import Placement, QueueIndex, Rules

STRICT = Rules(Strategy.STRICT_FIFO, 8)
BEST = Rules(Strategy.BEST_EFFORT_FIFO, 8)


def job(name: str, created: int, priority: int = 0, answered: str | None = None) -> Waiting:
    return Waiting(Key("RayJob", "ns", name), priority, f"2030-01-01T00:00:{created:02d}Z", f"uid-{name}", answered,
                   {("a100", "gpu=4"): 1} if name != "elsewhere" else {("h100", "gpu=8"): 1})


def index() -> tuple[QueueIndex, list[str]]:
    seen: list[str] = []
    return QueueIndex(lambda key: seen.append(key[2])), seen


def test_jobs_wait_in_order_and_only_the_ones_whose_turn_changes_are_told() -> None:
    q, seen = index()
    for i in range(1, 6):
        q.put("default", STRICT, job(f"q{i}", i))
    assert seen == ["q1"]  # the head may ask; the others wait behind the job ahead, which did not change
    seen.clear()
    q.drop(("RayJob", "ns", "q1"))  # admitted
    assert seen == ["q2"]
    turn = q.turn(("RayJob", "ns", "q4"))
    assert turn is not None and (turn.may_ask, turn.position, turn.length, turn.behind) == (False, 3, 4, "RayJob ns/q3")


def test_a_higher_priority_job_goes_to_the_front_and_the_old_head_stops_asking() -> None:
    q, seen = index()
    q.put("default", STRICT, job("q1", 1))
    q.put("default", STRICT, job("q2", 2))
    seen.clear()
    q.put("default", STRICT, job("urgent", 9, priority=1000))
    assert sorted(seen) == ["q1", "urgent"]  # urgent asks; q1 withdraws and now waits behind it
    assert q.turn(("RayJob", "ns", "urgent")).front  # type: ignore[union-attr]


def test_when_capacity_frees_the_jobs_behind_the_head_withdraw_and_the_head_asks_again() -> None:
    q, seen = index()
    q.put("default", BEST, job("head", 1, answered="2030-01-01T00:01:00Z"))
    q.put("default", BEST, job("elsewhere", 2, answered="2030-01-01T00:01:30Z"))
    assert q.turn(("RayJob", "ns", "elsewhere")).may_ask  # type: ignore[union-attr]
    seen.clear()
    q.freed("default", "2030-01-01T00:02:00Z")
    # Both are told: the head asks again first, and the job behind it withdraws its request.
    assert sorted(seen) == ["elsewhere", "head"] and not q.turn(("RayJob", "ns", "elsewhere")).may_ask  # type: ignore[union-attr]
    assert q.freed_at("default") == "2030-01-01T00:02:00Z"


def test_queues_are_separate() -> None:
    q, _ = index()
    q.put("a100", STRICT, job("a", 1))
    q.put("h100", STRICT, job("b", 2))
    assert q.turn(("RayJob", "ns", "b")).front and q.lengths() == {"a100": 1, "h100": 1}  # type: ignore[union-attr]



def test_a_provisioned_job_is_out_of_the_way_and_the_next_asks_while_it_is_admitted() -> None:
    q, seen = index()
    for i in range(1, 4):
        q.put("default", STRICT, job(f"q{i}", i))
    seen.clear()
    q.put("default", STRICT, replace(job("q1", 1), provisioned=True))  # capacity found for q1
    q2, q3 = q.turn(Key("RayJob", "ns", "q2")), q.turn(Key("RayJob", "ns", "q3"))
    assert "q2" in seen and q2 is not None and q2.may_ask and q2.front  # it asks as the front it is about to be
    assert q3 is not None and (q3.may_ask, q3.position, q3.length, q3.behind) == (False, 2, 2, "RayJob ns/q2")
    q.put("default", STRICT, job("q1", 1))  # its booking ended: it is ahead again
    q2 = q.turn(Key("RayJob", "ns", "q2"))
    assert q2 is not None and (q2.may_ask, q2.position) == (False, 2)


def test_only_a_request_whose_booking_holds_puts_its_job_out_of_the_way() -> None:
    """The booking rule is booking.provisioned and not ended: a Provisioned request whose booking expired (or
    that failed) books nothing, so the job behind it must not ask as if it did."""
    from test_reconciler_decision import policy, provisioning, request

    from raygate.core.modes import for_object
    from raygate.reconciler.queues import waiting_of

    w = provisioning()
    rules = for_object(policy(), w.annotations)
    key = Key("RayJob", w.namespace, w.name)
    booked = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    expired = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"), ("BookingExpired", "True", "E"))
    assert waiting_of(key, w, rules, {}, 0, booked).provisioned  # type: ignore[union-attr]
    assert not waiting_of(key, w, rules, {}, 0, expired).provisioned  # type: ignore[union-attr]
    assert not waiting_of(key, w, rules, {}, 0, None).provisioned  # type: ignore[union-attr]
    # One of that name whose owner is another uid (not raygate's for this job) is not its booking.
    earlier = copy.deepcopy(booked)
    earlier["metadata"]["ownerReferences"][0]["uid"] = "uid-of-an-earlier-job"
    assert not waiting_of(key, w, rules, {}, 0, earlier).provisioned  # type: ignore[union-attr]


def test_the_job_behind_one_aside_is_told_when_the_job_it_names_goes() -> None:
    """It names the first job ahead that is not aside: when that one goes, its reason must not name a job gone."""
    q, seen = index()
    for name, created in (("w", 1), ("x", 2), ("p", 3), ("y", 4)):
        q.put("default", STRICT, job(name, created))
    q.put("default", STRICT, replace(job("p", 3), provisioned=True))
    assert q.turn(Key("RayJob", "ns", "y")).behind == "RayJob ns/x"  # type: ignore[union-attr]
    seen.clear()
    q.drop(Key("RayJob", "ns", "x"))  # deleted while it waited
    assert "y" in seen and q.turn(Key("RayJob", "ns", "y")).behind == "RayJob ns/w"  # type: ignore[union-attr]


def test_a_placement_read_before_a_job_went_never_lands_after_its_drop() -> None:
    """Two caches' threads place the same job: one read it just before it was deleted, the other placed it after.
    The deleted job must not be left in its queue, ahead of everyone behind it, with no event to remove it."""
    q, _ = index()
    cache = {"gone": job("gone", 1)}  # the jobs' cache
    key = Key("RayJob", "ns", "gone")
    read, resume = threading.Event(), threading.Event()

    def stale() -> Placement | None:  # the requests' thread: reads the job, then is descheduled
        found = cache.get("gone")
        read.set()
        resume.wait(5)
        return Placement("default", STRICT, found) if found else None

    def current() -> Placement | None:  # the jobs' thread, on the DELETED event (its cache already updated)
        found = cache.get("gone")
        return Placement("default", STRICT, found) if found else None

    first = threading.Thread(target=q.place, args=(key, stale))
    first.start()
    read.wait(5)
    del cache["gone"]
    second = threading.Thread(target=q.place, args=(key, current))
    second.start()
    second.join(0.3)  # serialized: it waits for the first placement to finish
    resume.set()
    first.join(5)
    second.join(5)
    assert q.turn(key) is None
    q.put("default", STRICT, job("behind", 2))
    turn = q.turn(Key("RayJob", "ns", "behind"))
    assert turn is not None and turn.front and turn.length == 1
