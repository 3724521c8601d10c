"""The queue held jobs wait in: order by priority, then creation, then uid; whose turn it is to ask."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raygate.core.keys import QueueStrategy as Strategy
from raygate.core.objects import Key
from raygate.core.queueing import Waiting, askers, ordered, priority, priority_classes, turns

ONE_NODE = {("a100", "gpu=4"): 1}
TWO_NODES = {("a100", "gpu=4"): 2}


def job(name: str, created: int, priority: int = 0, not_now: bool = False,
        shape: dict[tuple[str, str], int] | None = None) -> Waiting:
    return Waiting(Key("RayJob", "ns", name), priority, f"2030-01-01T00:00:{created:02d}Z", f"uid-{name}",
                   "2030-01-01T00:01:00Z" if not_now else None, ONE_NODE if shape is None else shape)


def may_ask(queue: list[Waiting], strategy: Strategy, lookahead: int = 8) -> list[str]:
    got = turns(ordered(queue), strategy, lookahead)
    return [k[2] for k, t in got.items() if t.may_ask]


def test_priority_first_then_creation_then_uid() -> None:
    queue = [job("late-high", 9, priority=100), job("b", 2), job("a", 1), job("tie-b", 5), job("tie-a", 5)]
    assert [j.key[2] for j in ordered(queue)] == ["late-high", "a", "b", "tie-a", "tie-b"]


def test_strict_fifo_lets_only_the_head_ask_even_when_it_cannot_be_provisioned_now() -> None:
    queue = [job("q1", 1, not_now=True), job("q2", 2, shape={("a100", "gpu=1"): 1})]
    assert may_ask(queue, Strategy.STRICT_FIFO) == ["q1"]
    got = turns(ordered(queue), Strategy.STRICT_FIFO, 8)[("RayJob", "ns", "q2")]
    assert (got.position, got.length, got.behind) == (2, 2, "RayJob ns/q1")


def test_a_job_waits_behind_the_job_right_ahead_of_it() -> None:
    """Its reason names that job: it changes only when the job right ahead comes, goes or is admitted."""
    queue = [job(f"q{i}", i) for i in range(1, 5)]
    got = turns(ordered(queue), Strategy.STRICT_FIFO, 8)
    assert [t.behind for t in got.values()] == [None, "RayJob ns/q1", "RayJob ns/q2", "RayJob ns/q3"]


def test_an_answer_from_before_capacity_freed_is_out_of_date_and_the_head_asks_again_first() -> None:
    queue = [job("big", 1, not_now=True, shape=TWO_NODES), job("small", 2, not_now=True)]
    assert may_ask(queue, Strategy.BEST_EFFORT_FIFO) == ["big", "small"]
    freed = "2030-01-01T00:02:00Z"  # after both answers
    assert askers(ordered(queue), Strategy.BEST_EFFORT_FIFO, 8, freed) == [("RayJob", "ns", "big")]


def test_best_effort_lets_the_next_job_try_once_the_head_is_answered_not_now() -> None:
    small = {("a100", "gpu=4"): 1}
    queue = [job("big", 1, shape=TWO_NODES), job("small", 2, shape=small), job("later", 3, shape=small)]
    assert may_ask(queue, Strategy.BEST_EFFORT_FIFO) == ["big"]  # the head's answer first
    queue[0] = job("big", 1, not_now=True, shape=TWO_NODES)
    assert may_ask(queue, Strategy.BEST_EFFORT_FIFO) == ["big", "small"]  # one at a time
    queue[1] = job("small", 2, not_now=True, shape=small)
    # "later" asks as much of the same nodes as "small", which was answered not now: it could not fit either.
    assert may_ask(queue, Strategy.BEST_EFFORT_FIFO) == ["big", "small"]


def test_best_effort_skips_jobs_that_ask_at_least_what_a_refused_job_ahead_asked() -> None:
    queue = [job("q1", 1, not_now=True), job("q2", 2), job("q3", 3)]
    assert may_ask(queue, Strategy.BEST_EFFORT_FIFO) == ["q1"]  # the same one-node gangs: nobody behind tries
    elsewhere = job("h100", 4, shape={("h100", "gpu=8"): 1})
    assert may_ask([*queue, elsewhere], Strategy.BEST_EFFORT_FIFO) == ["q1", "h100"]


def test_best_effort_bounds_how_many_jobs_behind_the_head_ask() -> None:
    queue = [job("head", 0, not_now=True, shape=TWO_NODES)]
    queue += [job(f"j{i}", i, not_now=True, shape={(f"pool{i}", "gpu=1"): 1}) for i in range(1, 6)]
    assert may_ask(queue, Strategy.BEST_EFFORT_FIFO, lookahead=2) == ["head", "j1", "j2"]


def test_a_job_no_node_group_can_hold_keeps_its_request_out_of_the_way_of_the_jobs_behind() -> None:
    parked = Waiting(Key("RayJob", "ns", "toobig"), 0, "2030-01-01T00:00:00Z", "uid-toobig", None, ONE_NODE, True)
    queue = [parked, job("q1", 1), job("q2", 2)]
    assert may_ask(queue, Strategy.STRICT_FIFO) == ["toobig", "q1"]


@pytest.mark.parametrize("aside", [{"parked": True}, {"provisioned": True}], ids=["never fits", "provisioned"])
def test_a_job_out_of_the_way_is_out_of_the_way_of_positions_too(aside: dict[str, bool]) -> None:
    """The job behind one that never fits, or whose capacity is booked, is the front: position 1, waiting behind
    nobody, and it is the one to ask (so its reason says "at the front", and its FrontOfQueue Event comes then)."""
    first = replace(job("first", 0), **aside)
    queue = ordered([first, job("next", 1), job("last", 2)])
    got = turns(queue, Strategy.STRICT_FIFO, 8)
    front, last = got[("RayJob", "ns", "next")], got[("RayJob", "ns", "last")]
    assert (front.may_ask, front.position, front.length, front.front, front.behind) == (True, 1, 2, True, None)
    assert (last.may_ask, last.position, last.behind) == (False, 2, "RayJob ns/next")


def test_a_provisioned_job_holds_its_capacity_so_the_next_job_asks_meanwhile() -> None:
    """Under StrictFIFO too: the front's capacity is booked, the job behind cannot take it."""
    queue = [replace(job("q1", 1), provisioned=True), job("q2", 2), job("q3", 3)]
    assert may_ask(queue, Strategy.STRICT_FIFO) == ["q1", "q2"]
    assert turns(ordered(queue), Strategy.STRICT_FIFO, 8)[("RayJob", "ns", "q3")].behind == "RayJob ns/q2"


def test_priority_classes_by_name_and_the_global_default_for_a_job_that_names_none() -> None:
    listed = [{"metadata": {"name": "low"}, "value": 10},
              {"metadata": {"name": "usual"}, "value": 100, "globalDefault": True},
              {"metadata": {"name": "unset"}}]
    classes, default = priority_classes(listed)
    assert (classes, default) == ({"low": 10, "usual": 100, "unset": 0}, 100)
    assert (priority(None, classes, default), priority("low", classes, default), priority("gone", classes, default)) \
        == (100, 10, 0)
    assert priority_classes([{"metadata": {"name": "low"}, "value": 10}])[1] == 0  # no global default
