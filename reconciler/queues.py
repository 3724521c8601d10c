"""The held jobs of each queue, kept from the reconciler's caches, and whose turn it is to ask.

The order is read from the objects (priority, creation time, uid) whenever a job comes, goes or changes,
so a restarted or newly elected reconciler builds the same queues. Only the jobs whose turn changes are
reconciled again: the askers at the front (raygate.core.queueing), and the job right behind one that came
or went (its reason names the job right ahead of it). Positions are computed when asked (status, metrics):
ten thousand held jobs cost no write when the queue moves.

When capacity frees (a job's last pod consuming its booking ends, or a job goes), its queue's answers
from before are out of date: the jobs behind the head withdraw their requests and the head asks again.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from raygate.core import booking, keys, preemption, queueing
from raygate.core.conditions import conditions
from raygate.core.keys import QueueStrategy as Strategy
from raygate.core.modes import ObjectRules
from raygate.core.objects import JSON, Key, meta_str
from raygate.core.policy import QueuePolicy
from raygate.core.preemption import Running
from raygate.core.queueing import PriorityClasses, Turn, Waiting, askers
from raygate.core.times import parse_time
from raygate.core.workload import ManifestError, Workload
from raygate.reconciler.children import made_for


def waiting_of(key: Key, w: Workload, rules: ObjectRules, classes: PriorityClasses, global_default: int,
               request: JSON | None) -> Waiting | None:
    """The job as its queue sees it, or None when it waits in no queue: it is not held (admitted, failed, or
    admitted by another system), or raygate books nothing for it (then nothing is scarce to wait for)."""
    if not (rules.holds and rules.books) or w.labels.get(keys.STATE_LABEL) not in keys.HELD_STATES:
        return None
    try:
        shape = queueing.shape(w, w.gang(), rules.policy.manages)
    except ManifestError:
        shape = {}  # unreadable: its decision fails it with the reason
    name = queueing.priority_class_name(w, rules.policy.default_priority_class_name)
    if request is not None and made_for(request) != w.uid:
        request = None  # not raygate's for this job (its owner is another uid, or none): it books nothing
    provisioned = conditions(request).get("Provisioned") if request is not None else None
    answered = provisioned.last_transition if provisioned is not None and not provisioned.true and \
        provisioned.reason else None
    parked = keys.NEVER_FITS_ANNOTATION in w.annotations
    return Waiting(key, queueing.priority(name, classes, global_default), meta_str(w.obj, "creationTimestamp"),
                   w.uid, answered or None, shape, parked,
                   preemption.preempted_by(w.annotations.get(keys.PREEMPTED_BY_ANNOTATION, ""))[0],
                   request is not None and booking.provisioned(request) and not booking.ended(request))


def running_of(key: Key, w: Workload, rules: ObjectRules, classes: PriorityClasses,
               global_default: int) -> Running | None:
    """The job as a preemption in its queue sees it, or None when it is not an admitted job raygate booked for."""
    if not (rules.holds and rules.books) or w.labels.get(keys.STATE_LABEL) != keys.State.ADMITTED or w.suspended:
        return None
    try:
        room = preemption.room(w, w.gang(), rules.policy.manages)
    except ManifestError:
        return None
    if not room:
        return None  # it books nothing: suspending it frees nothing
    name = queueing.priority_class_name(w, rules.policy.default_priority_class_name)
    return Running(key, w.uid, queueing.priority(name, classes, global_default),
                   parse_time(w.annotations.get(keys.ADMITTED_AT_ANNOTATION)), room)


def rules_of(queue: QueuePolicy) -> Rules:
    return Rules(queue.strategy, queue.lookahead)


def _order(job: Waiting) -> tuple[int, str, str]:
    return job.order


@dataclass(frozen=True)
class Rules:
    strategy: Strategy
    lookahead: int


@dataclass(frozen=True)
class Placement:
    """Where a job belongs now: held in `queue`, or admitted there (where a preemption may pick it)."""
    queue: str
    rules: Rules
    job: Waiting | Running


@dataclass
class _Queue:
    rules: Rules
    jobs: list[Waiting]  # in order
    askers: frozenset[Key] = frozenset()
    aside: list[tuple[int, str, str]] = field(default_factory=list)  # the order of its jobs out of the way, sorted
    freed: str = ""  # RFC 3339: when capacity last freed (answers before it are out of date)


class QueueIndex:
    def __init__(self, on_change: Callable[[Key], None]) -> None:
        """`on_change(job)`: the job's turn changed (it may ask now, or must withdraw, or waits behind another)."""
        self._on_change = on_change
        self._lock = threading.Lock()
        # One placement at a time, from its read of the caches to its write here. Several threads place jobs (the
        # jobs' cache, the requests' cache, config and PriorityClass changes): without this, a placement read just
        # before a job was deleted could land after the drop its deletion caused, and the deleted job would stay
        # in its queue, ahead of everyone behind it, with no event left to remove it.
        self._placing = threading.Lock()
        self._queues: dict[str, _Queue] = {}
        self._where: dict[Key, tuple[str, Waiting]] = {}
        self._running: dict[str, dict[Key, Running]] = {}  # queue -> its admitted jobs (for preemption)
        self._runs_in: dict[Key, str] = {}

    def place(self, key: Key, decide: Callable[[], Placement | None]) -> None:
        """The job's place as `decide` reads it from the caches now (None: in no queue), read and written as one
        step with respect to every other placement."""
        with self._placing:
            found = decide()
            if found is None:
                self.drop(key)
            elif isinstance(found.job, Running):
                self.run(found.queue, found.job)
            else:
                self.put(found.queue, found.rules, found.job)

    def put(self, queue: str, rules: Rules, job: Waiting) -> None:
        """A held job as it is now, in the queue its namespace maps to."""
        with self._lock:
            changed = self._remove(job.key)
            self._stopped(job.key)
            q = self._queues.setdefault(queue, _Queue(rules, []))
            q.rules = rules
            i = bisect.bisect_left(q.jobs, job.order, key=_order)
            q.jobs.insert(i, job)
            if job.aside:
                bisect.insort(q.aside, job.order)
            self._where[job.key] = (queue, job)
            changed |= self._neighbour(q, i + 1) | self._reask(queue)
        self._notify(changed)

    def drop(self, key: Key) -> None:
        """The job is no longer held: admitted, failed, or gone."""
        with self._lock:
            changed = self._remove(key)
            self._stopped(key)
        self._notify(changed)

    def run(self, queue: str, job: Running) -> None:
        """An admitted job of `queue`, which a preemption may pick."""
        with self._lock:
            changed = self._remove(job.key)
            self._stopped(job.key)
            self._running.setdefault(queue, {})[job.key] = job
            self._runs_in[job.key] = queue
        self._notify(changed)

    def running(self, queue: str) -> list[Running]:
        with self._lock:
            return list(self._running.get(queue, {}).values())

    def waiting(self, key: Key) -> Waiting | None:
        with self._lock:
            found = self._where.get(key)
            return found[1] if found else None

    def freed(self, queue: str, at: str) -> None:
        """Capacity of this queue's jobs freed at `at`: answers from before are out of date. Every job that asks
        is told (the front asks again first; the jobs behind it that may no longer try withdraw)."""
        with self._lock:
            q = self._queues.get(queue)
            if q is None or at <= q.freed:
                return
            q.freed = at
            changed = set(q.askers) | self._reask(queue)
        self._notify(changed)

    def freed_at(self, queue: str) -> str:
        with self._lock:
            q = self._queues.get(queue)
            return q.freed if q is not None else ""

    def queue_of(self, key: Key) -> str | None:
        with self._lock:
            found = self._where.get(key)
            return found[0] if found else None

    def turn(self, key: Key) -> Turn | None:
        """The job's turn, or None for a job in no queue (not held, or not yet seen)."""
        with self._lock:
            found = self._where.get(key)
            if found is None:
                return None
            q = self._queues[found[0]]
            return queueing.turn_at(q.jobs, self._index(q, found[1]), key in q.askers, q.aside)

    def lengths(self) -> dict[str, int]:
        with self._lock:
            return {name: len(q.jobs) for name, q in self._queues.items()}

    def oldest(self) -> dict[str, str]:
        """Per queue, the creation time of its job that has waited longest."""
        with self._lock:
            return {name: min(j.created for j in q.jobs) for name, q in self._queues.items() if q.jobs}

    # --- under the lock ---------------------------------------------------------------------------
    def _stopped(self, key: Key) -> None:
        if (queue := self._runs_in.pop(key, None)) is not None:
            self._running[queue].pop(key, None)

    @staticmethod
    def _index(q: _Queue, job: Waiting) -> int:
        return bisect.bisect_left(q.jobs, job.order, key=_order)

    def _remove(self, key: Key) -> set[Key]:
        found = self._where.pop(key, None)
        if found is None:
            return set()
        name, job = found
        q = self._queues[name]
        i = self._index(q, job)
        del q.jobs[i]
        if job.aside:
            q.aside.remove(job.order)
        return (self._neighbour(q, i) | self._reask(name)) - {key}

    @staticmethod
    def _neighbour(q: _Queue, i: int) -> set[Key]:
        """The job at `i` has another job right ahead of it now. When it is aside (named as ahead of no one), so has
        the first job behind it that is not."""
        out = set()
        while i < len(q.jobs):
            out.add(q.jobs[i].key)
            if not q.jobs[i].aside:
                break
            i += 1
        return out

    def _reask(self, name: str) -> set[Key]:
        """Recompute who asks; the jobs that start or stop asking."""
        q = self._queues[name]
        now = frozenset(askers(q.jobs, q.rules.strategy, q.rules.lookahead, q.freed))
        changed = set(now ^ q.askers)
        q.askers = now
        return changed

    def _notify(self, keys: set[Key]) -> None:
        for key in sorted(keys):
            self._on_change(key)
