"""The queue held jobs wait in: their order, and whose turn it is to ask the cluster-autoscaler.

Where raygate books capacity, every held job used to get its ProvisioningRequest at once, and the
cluster-autoscaler (which serves about one request per loop, picked in no set order) decided who ran
next. Now raygate decides: held jobs wait in a named queue, ordered by priority, then creation time,
then uid (so the order is the same for every replica, and after every restart: it is read from the
objects), and only the jobs whose turn it is have a request outstanding.

- StrictFIFO: only the head asks. Nobody passes it, even when it cannot be provisioned now.
- BestEffortFIFO: the head asks; when it is answered "not now" (Provisioned=False), the next job may
  ask too, and so on, so that capacity the head cannot use does not sit idle. A job that asks at least
  as much of the same nodes as one ahead of it that was answered "not now" does not try (it could not
  fit either), and at most `lookahead` jobs behind the head ask at once. When capacity frees, the jobs
  behind the head withdraw their unanswered requests and the head asks again first.

Under both, a job whose request is Provisioned holds its capacity and is out of the way: the job behind it
asks while the first is admitted.

Pure: jobs in, turns out. Positions are computed when asked, never written per job.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raygate.core import keys, podgate
from raygate.core.keys import QueueStrategy as Strategy
from raygate.core.objects import Key, get
from raygate.core.policy import NamespacePolicy
from raygate.core.preemption import JobId
from raygate.core.workload import Gang, Manages, Workload

Shape = Mapping[tuple[str, str], int]  # (placement digest, managed request per pod) -> pods


@dataclass(frozen=True)
class Waiting:
    """A held job as its queue sees it."""

    key: Key
    priority: int
    created: str  # RFC 3339, UTC: sorts as text
    uid: str
    answered: str | None = None  # when the autoscaler last answered its request "not now" (Provisioned=False)
    shape: Shape = field(default_factory=dict, compare=False)  # what its gang asks of which nodes
    parked: bool = False  # no node group can hold it: it keeps its request, out of the way of the jobs behind
    yields_to: JobId | None = None  # preempted to make room for this job: it does not ask while that one waits
    provisioned: bool = False  # its request booked capacity (booking.provisioned): it is about to be admitted

    @property
    def order(self) -> tuple[int, str, str]:
        return -self.priority, self.created, self.uid

    @property
    def name(self) -> str:
        return str(self.key)

    @property
    def aside(self) -> bool:
        """Its request stays out whatever its place, out of the way of the jobs behind: it never fits, or it is
        Provisioned."""
        return self.parked or self.provisioned

    def not_now(self, freed: str) -> bool:
        """Answered "not now" since capacity last freed (an older answer is out of date: it asks again)."""
        return self.answered is not None and self.answered > freed


@dataclass(frozen=True)
class Turn:
    """Whether a held job may have a request outstanding, and where it stands."""

    may_ask: bool
    position: int  # 1 is the front
    length: int  # jobs in the queue
    behind: str | None = None  # the job right ahead of it ("RayJob ns/name"), when it may not ask

    @property
    def front(self) -> bool:
        return self.position == 1


def ordered(jobs: Iterable[Waiting]) -> list[Waiting]:
    return sorted(jobs, key=lambda j: j.order)


def covers(bigger: Shape, smaller: Shape) -> bool:
    """`bigger` asks at least what `smaller` asks of the same nodes (so it cannot fit where `smaller` did not)."""
    return bool(smaller) and all(bigger.get(k, 0) >= n for k, n in smaller.items())


# How far behind the head BestEffortFIFO looks for a job that may try: further back, jobs wait for the front to
# move (each update of a queue walks at most this far, whatever its length).
SCAN = 1000


def askers(queue: Sequence[Waiting], strategy: Strategy, lookahead: int, freed: str = "") -> list[Key]:
    """The jobs whose turn it is to have a request outstanding, `queue` in order (see ordered); every other job
    waits, behind the job right ahead of it."""
    held = {j.key: j.uid for j in queue}
    out = [j.key for j in queue if j.aside]
    # A job preempted for another does not take the room it gave while that one still waits.
    queue = [j for j in queue if not j.aside and (j.yields_to is None or not j.yields_to.is_current(held))]
    if not queue:
        return out
    asking = [queue[0]]
    if strategy is Strategy.BEST_EFFORT_FIFO:
        for job in queue[1:SCAN]:
            # One at a time (the autoscaler answers one before the next asks), at most `lookahead` behind the head.
            if len(asking) > lookahead or any(not a.not_now(freed) for a in asking):
                break
            if not any(covers(job.shape, a.shape) for a in asking):  # else it could not fit either
                asking.append(job)
    return [*out, *(j.key for j in asking)]


def turns(queue: Sequence[Waiting], strategy: Strategy, lookahead: int, freed: str = "") -> dict[Key, Turn]:
    """Each job's turn, `queue` in order (for tests and status; the reconciler keeps only the askers)."""
    may = set(askers(queue, strategy, lookahead, freed))
    aside = [j.order for j in queue if j.aside]
    return {j.key: turn_at(queue, i, j.key in may, aside) for i, j in enumerate(queue)}


def turn_at(queue: Sequence[Waiting], i: int, may_ask: bool, aside: Sequence[tuple[int, str, str]]) -> Turn:
    """The turn of the job at `i` of `queue` (in order); `aside`: the order of its jobs out of the way (they never
    fit, or are Provisioned), sorted. Those are not counted ahead of anyone, nor named as the job one waits behind:
    so the job behind a Provisioned one asks as the front, as it is once that one is admitted."""
    j = i - 1
    while j >= 0 and queue[j].aside:  # jobs aside are few (Provisioned ones are admitted within seconds): a short walk
        j -= 1
    ahead = bisect.bisect_left(aside, queue[i].order)
    return Turn(may_ask, i + 1 - ahead, len(queue) - len(aside), None if may_ask or j < 0 else queue[j].name)


# --- what a held job is, to its queue -------------------------------------------------------------

PriorityClasses = Mapping[str, int]  # PriorityClass name -> value


def priority_class_name(w: Workload, default: str | None) -> str | None:
    """The PriorityClass a Ray object runs with: its label ray.io/priority-class-name (which KubeRay's Volcano and
    YuniKorn integrations read too), else the one its head pod asks for, else its namespace's default."""
    label = w.labels.get(keys.RAY_PRIORITY_CLASS_LABEL)
    if label:
        return label
    for _, path in w.template_paths():
        found = get(w.obj, (*path, "spec", "priorityClassName"))
        if isinstance(found, str) and found:
            return found
    return default


def priority_class_names(w: Workload) -> set[str]:
    """Every PriorityClass the object names: its label, and each pod template's priorityClassName."""
    named = {w.labels.get(keys.RAY_PRIORITY_CLASS_LABEL)}
    named |= {get(w.obj, (*path, "spec", "priorityClassName")) for _, path in w.template_paths()}
    return {n for n in named if isinstance(n, str) and n}


def priority_problem(namespace: str, policy: NamespacePolicy, w: Workload) -> str | None:
    """A PriorityClass the namespace does not allow (allowedPriorityClassNames): a user's own pick of priority
    would put the job ahead of everyone's in the queue, and suspend theirs where the queue preempts."""
    allowed = policy.allowed_priority_class_names
    if allowed is None:
        return None
    if not (bad := sorted(priority_class_names(w) - set(allowed))):
        return None
    return (f"it names PriorityClass {', '.join(bad)}, but namespace {namespace} allows "
            f"{'only ' + ', '.join(allowed) if allowed else 'none'} (allowedPriorityClassNames in raygate-config): "
            f"name one of those in label {keys.RAY_PRIORITY_CLASS_LABEL} and priorityClassName, or none")


def priority_classes(objects: Iterable[Mapping[str, Any]]) -> tuple[PriorityClasses, int]:
    """The value of each PriorityClass (as the API returns them) by name, and the cluster's global default's (0
    without one)."""
    listed = list(objects)
    classes = {str(get(o, ("metadata", "name"))): int(o.get("value") or 0) for o in listed}
    default = next((int(o.get("value") or 0) for o in listed if o.get("globalDefault") is True), 0)
    return classes, default


def priority(name: str | None, classes: PriorityClasses, global_default: int = 0) -> int:
    """A PriorityClass's value; the cluster's global default for none (as the Priority admission plugin sets
    pods); 0 for a name that does not exist (the API server would refuse such pods anyway)."""
    if name is None:
        return global_default
    return classes.get(name, 0)


def shape(w: Workload, gang: Gang, manages: Manages) -> dict[tuple[str, str], int]:
    """What the gang asks of which nodes: pods per (placement, managed request per pod)."""
    out: dict[tuple[str, str], int] = {}
    for p in gang.managed_pod_sets(manages):
        per_pod = p.managed(manages)
        spec = get(w.obj, (*p.template_path, "spec")) if p.template_path is not None else None
        key = (podgate.match_digest(spec, per_pod), ",".join(f"{r}={v}" for r, v in sorted(per_pod.items())))
        out[key] = out.get(key, 0) + p.count
    return out
