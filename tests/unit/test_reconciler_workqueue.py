"""The work queue: dedup, no key twice at once, per-key backoff, delayed requeue; lease timing."""

from __future__ import annotations

import threading

import pytest
from waiting import wait

from raygate.reconciler.leader import LeaseTiming
from raygate.reconciler.workqueue import Backoff, WorkQueue, run_workers


def test_a_key_added_twice_is_handed_out_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert [q.get(0), q.get(0), q.get(0)] == ["a", "b", None]


def test_a_key_added_while_processing_comes_back_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    assert q.get(0) is None  # not to a second worker while the first holds it
    q.done("a")
    assert q.get(0) == "a"


def test_delayed_keys_wait_their_time() -> None:
    now = [100.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    q.add_after("a", 5)
    assert q.get(0) is None
    now[0] = 105.0
    assert q.get(0) == "a"


@pytest.mark.parametrize(("failures", "delay"), [(1, 0.1), (2, 0.2), (5, 1.6), (30, 10.0)])
def test_backoff_doubles_up_to_the_cap(failures: int, delay: float) -> None:
    assert Backoff(0.1, 10.0).delay(failures) == pytest.approx(delay)


def test_failures_back_off_per_key_and_forget_resets() -> None:
    q: WorkQueue[str] = WorkQueue(Backoff(1.0, 60.0))
    assert q.add_rate_limited("bad") == 1.0
    assert q.add_rate_limited("bad") == 2.0
    assert q.failures("good") == 0
    q.forget("bad")
    assert q.add_rate_limited("bad") == 1.0


def test_workers_process_every_key_and_a_failing_key_does_not_stall_others() -> None:
    q: WorkQueue[str] = WorkQueue(Backoff(0.01, 0.05))
    seen: list[str] = []
    lock = threading.Lock()

    def handle(key: str) -> None:
        with lock:
            seen.append(key)
        if key == "bad":
            raise RuntimeError("boom")

    run_workers(q, handle, 3)
    for k in ("bad", "a", "b", "c"):
        q.add(k)
    try:
        # "bad" is retried with backoff, not dropped, and does not hold up the others.
        wait(lambda: {"a", "b", "c"} <= set(seen) and seen.count("bad") >= 3, 30,
             "every key handled and the failing one retried twice")
    finally:
        q.shutdown()


@pytest.mark.parametrize(("duration", "deadline", "retry"), [(10, 10, 2), (10, 12, 2), (10, 5, 0), (10, 5, 6)])
def test_lease_timing_must_be_ordered(duration: float, deadline: float, retry: float) -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseTiming(duration, deadline, retry)


@pytest.mark.parametrize(("adds", "order"), [
    ([("a", False), ("b", False), ("c", True)], ["c", "a", "b"]),  # urgent goes ahead of the waiting
    ([("a", True), ("b", True), ("c", False)], ["a", "b", "c"]),  # urgent keys keep their own order
    ([("a", False), ("b", False), ("b", True)], ["b", "a"]),  # a waiting key moves ahead, once
    ([("a", True), ("a", False), ("b", False)], ["a", "b"]),  # a plain add does not move it back
    ([("a", False), ("a", True), ("a", True)], ["a"]),  # never handed out twice
])
def test_urgent_keys_are_handed_out_first(adds: list[tuple[str, bool]], order: list[str]) -> None:
    q: WorkQueue[str] = WorkQueue()
    for key, urgent in adds:
        q.add(key, urgent=urgent)
    got = []
    while (key := q.get(0)) is not None:
        got.append(key)
        q.done(key)
    assert got == order


def test_a_key_made_urgent_while_processing_comes_back_ahead() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get(0) == "a"
    q.add("b")
    q.add("a", urgent=True)
    assert q.get(0) == "b"  # "a" is still held by its first worker
    q.add("c")
    q.done("a")
    q.add("d")
    assert [q.get(0), q.get(0), q.get(0)] == ["a", "c", "d"]


def test_a_key_handed_out_from_one_lane_is_not_handed_out_again_from_the_other() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a", urgent=True)
    assert q.get(0) == "a"
    assert q.get(0) is None  # its normal-lane place is skipped
    q.done("a")
    assert q.get(0) is None
    assert len(q) == 0 and not q.busy()


def test_each_key_reports_how_long_it_waited_for_a_worker() -> None:
    now = [10.0]
    waits: list[float] = []
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0], on_wait=waits.append)
    q.add("a")
    now[0] = 10.5
    q.add("a")  # already waiting: its wait still counts from the first add
    q.add("b", urgent=True)
    assert q.waiting() == 2
    now[0] = 12.0
    assert q.get(0) == "b"
    assert q.get(0) == "a"
    assert waits == [1.5, 2.0]
    assert q.waiting() == 0


def test_a_delayed_key_waits_from_when_it_fell_due() -> None:
    now = [0.0]
    waits: list[float] = []
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0], on_wait=waits.append)
    q.add_after("a", 5)
    assert q.waiting() == 0  # not due yet: no job is waiting for a worker
    now[0] = 6.0
    assert q.waiting() == 1
    now[0] = 6.25
    assert q.get(0) == "a"
    assert waits == [0.25]


def test_a_key_readded_while_processing_waits_from_when_the_worker_let_go() -> None:
    now = [0.0]
    waits: list[float] = []
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0], on_wait=waits.append)
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    now[0] = 3.0
    q.done("a")
    now[0] = 3.5
    assert q.get(0) == "a"
    assert waits == [0.0, 0.5]


def test_batched_adds_of_a_key_within_its_period_are_handed_out_once_when_it_ends() -> None:
    now = [100.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    q.add_batched("a", 0.2)
    now[0] = 100.1
    q.add_batched("a", 0.2)  # joins the first: not pushed out to 100.3
    assert q.get(0) is None
    now[0] = 100.2
    assert q.get(0) == "a"
    q.done("a")
    assert q.get(0) is None  # one reconcile for both changes


def test_a_batched_add_of_a_key_waiting_or_being_worked_on_again_adds_nothing() -> None:
    now = [100.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    q.add("a")
    q.add_batched("a", 0.2)  # its worker reads the caches after this change anyway
    assert q.get(0) == "a"
    q.add_batched("a", 0.2)  # being worked on, maybe on what it read before: once more, after the period
    q.done("a")
    assert q.get(0) is None
    now[0] = 100.2
    assert q.get(0) == "a"
    q.done("a")
    q.add_batched("a", 0.2)  # a new period starts after the last one was handed out
    now[0] = 100.3
    assert q.get(0) is None
    now[0] = 100.4
    assert q.get(0) == "a"


def test_a_batch_period_of_zero_queues_at_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_batched("a", 0)
    assert q.get(0) == "a"


def test_a_burst_of_batched_adds_is_handed_out_once_when_it_has_been_quiet() -> None:
    now = [100.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    for t in (100.0, 100.1, 100.25):  # each within the quiet period of the one before
        now[0] = t
        q.add_batched("a", 0.2, 2.0)
    now[0] = 100.44
    assert q.get(0) is None  # 0.19 s after the last: not quiet yet
    now[0] = 100.45
    assert q.get(0) == "a"
    q.done("a")
    assert q.get(0) is None and len(q) == 0  # the pushed-out entries are gone, not handed out later


def test_a_burst_that_does_not_end_is_handed_out_at_its_most() -> None:
    now = [100.0]
    q: WorkQueue[str] = WorkQueue(clock=lambda: now[0])
    handed = []
    for i in range(31):  # an event every 0.1 s for 3 s
        now[0] = 100.0 + i / 10
        q.add_batched("a", 0.2, 2.0)
        if (key := q.get(0)) is not None:
            handed.append(now[0])
            q.done(key)
    assert handed == [pytest.approx(102.0)]
