"""Which running jobs make room for the job at the front of a queue (queues.<name>.preemption: LowerPriority).

raygate sees bookings, not the scheduler's node fit: a victim frees what its admitted gang booked, counted per
managed resource, and only where the front's pods may go (nodes picked the same way, or any when the front's
pods pick none of their own). The pick is the fewest jobs that cover the front's gang: strictly lower priority
only, lowest priority first, then the most recently admitted (the least work lost), none admitted less than
`minRunSeconds` ago. Pure: jobs in, victims out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from raygate.core import podgate
from raygate.core.objects import Key, get
from raygate.core.workload import Gang, Manages, Workload

# What a gang books, per placement (podgate.placement_digest): managed resource -> total.
Room = Mapping[str, Mapping[str, Decimal]]


class JobId(NamedTuple):
    """A job as raygate's preemption records name it: by name, and which job of that name (its uid), so that one
    made anew under the name is not taken for it."""

    key: Key
    uid: str  # "" in a record from before raygate recorded uids: whichever job has the name

    def __str__(self) -> str:
        return f"{self.key}@{self.uid}"  # a name cannot hold "@"

    @classmethod
    def parse(cls, text: str) -> JobId | None:
        named, at_sign, uid = text.rpartition("@")
        key = Key.parse(named if at_sign else text)
        return cls(key, uid if at_sign else "") if key is not None else None

    @classmethod
    def of(cls, w: Workload) -> JobId:
        return cls(Key(w.kind, w.namespace, w.name), w.uid)

    def is_current(self, uids: Mapping[Key, str]) -> bool:
        """Whether the job that has its name now is this one (`uids`: name -> the uid of the job that has it)."""
        return self.key in uids and self.uid in ("", uids[self.key])


@dataclass(frozen=True)
class Running:
    """An admitted job of a queue, as a preemption sees it."""

    key: Key
    uid: str
    priority: int
    admitted: dt.datetime | None  # None: not recorded (admitted before raygate recorded it): as the oldest
    room: Room  # what its admitted gang booked

    @property
    def id(self) -> JobId:
        return JobId(self.key, self.uid)


def room(w: Workload, gang: Gang, manages: Manages) -> dict[str, dict[str, Decimal]]:
    """What a gang books, per placement."""
    out: dict[str, dict[str, Decimal]] = {}
    for p in gang.managed_pod_sets(manages):
        per_pod = p.managed(manages)
        spec = get(w.obj, (*p.template_path, "spec")) if p.template_path is not None else None
        totals = out.setdefault(podgate.placement_digest(spec, per_pod), {})
        for resource, amount in per_pod.items():
            totals[resource] = totals.get(resource, Decimal(0)) + amount * p.count
    return out


def _usable(front: str, placement: str) -> bool:
    """Room freed on nodes a pod of `placement` used is room a front pod of placement `front` may use."""
    return front in (placement, podgate.ANYWHERE)


def _covered(need: Room, freed: Sequence[Running]) -> bool:
    return all(sum((r.room[p].get(resource, Decimal(0)) for r in freed for p in r.room if _usable(placement, p)),
                   Decimal(0)) >= amount
               for placement, wants in need.items() for resource, amount in wants.items())


def _helps(need: Room, r: Running) -> bool:
    return any(_usable(p, q) and set(need[p]) & set(r.room[q]) for p in need for q in r.room)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def victims(priority: int, need: Room, running: Sequence[Running], now: dt.datetime,
            min_run_seconds: float) -> list[Running]:
    """The fewest running jobs of a priority below `priority` whose bookings cover `need`; none when all of
    them together would not (preempting would free nothing the front could use)."""
    def may_go(r: Running) -> bool:
        ran = (now - r.admitted).total_seconds() if r.admitted is not None else float("inf")
        return r.priority < priority and ran >= min_run_seconds and _helps(need, r)

    candidates = sorted(filter(may_go, running), key=lambda r: (r.priority, -(r.admitted or _EPOCH).timestamp()))
    chosen: list[Running] = []
    for r in candidates:
        chosen.append(r)
        if _covered(need, chosen):
            break
    else:
        return []
    # Never more than needed: a victim picked early whose room the later picks cover stays.
    for r in reversed(chosen[:-1]):
        rest = [c for c in chosen if c is not r]
        if _covered(need, rest):
            chosen = rest
    return chosen if need else []


def recorded(value: str) -> tuple[str, tuple[JobId, ...]]:
    """When the front preempted and whom, from its raygate.io/preempting annotation ("<time> <job>,<job>")."""
    at, _, jobs = value.partition(" ")
    return at, tuple(j for j in map(JobId.parse, jobs.split(",")) if j is not None)


def record(at: str, victims: Sequence[JobId]) -> str:
    """The raygate.io/preempting annotation's value (recorded() reads it). A name cannot hold ","."""
    return f"{at} {','.join(map(str, victims))}"


def preempted_by(value: str) -> tuple[JobId | None, str]:
    """The job a victim was preempted for, and when, from its raygate.io/preempted-by annotation ("<job> <time>");
    (None, "") when it was not."""
    who, _, when = value.rpartition(" ")
    job = JobId.parse(who)
    return (job, when) if job is not None else (None, "")


def preempted_by_record(front: JobId, at: str) -> str:
    """The raygate.io/preempted-by annotation's value (preempted_by() reads it)."""
    return f"{front} {at}"


def totals(rooms: Sequence[Room]) -> dict[str, Decimal]:
    """Totals per resource (for what a message says was freed)."""
    out: dict[str, Decimal] = {}
    for r in rooms:
        for per_resource in r.values():
            for resource, amount in per_resource.items():
                out[resource] = out.get(resource, Decimal(0)) + amount
    return out
