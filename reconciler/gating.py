"""Which gated pods a booking covers, and what a scale-up must book: pure.

A Provisioned ProvisioningRequest has, per pod set, a number of booked slots. A pod fills a slot
when it consumes the request (raygate wrote the consume annotation when it lifted the pod's gate)
and still runs. A gated pod is released into a free slot of a request whose pod set is the pod's
own and whose PodTemplate was made for pods like it (same managed request per pod, same node
selection: raygate.io/placement). A slot is never filled twice: the count comes from the pods
themselves, which is what a restarted or newly elected reconciler reads too.

Gated pods no slot covers are a scale-up (the Ray autoscaler raised replicas, or anyone did): per
pod set and placement, a request of their own for exactly the pods no request covers yet, pending
ones included, so overlapping scale-ups each book their own increment. When pods go before their
request is Provisioned, a pending request larger than what still waits is replaced by one of the
right size; a Provisioned scale-up whose pods are all gone is deleted (a booking lives as long as
its pods, and no longer).

A pod set's gated pods are released together, once every pod its spec asks for is there, or once none has
come for GATHER_SECONDS. KubeRay makes a gang's pods one by one; a pod released as it comes has the scheduler
and its bind work on the same API server while KubeRay still creates the rest, which slows those creates. A pod
that never comes (a quota, a create that keeps failing) holds the others back no longer than that.

Where pods name a group that gang-schedules them (Kubernetes' PodGroup, spec.schedulingGroup), a group
raygate has still to make (a scale-up's increment: made with minCount = the pods released into it) gets
its gated pods released all together or not yet, and a group being deleted gets none.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raygate.core import keys, podgate
from raygate.core.booking import booking_done, ended, provisioned
from raygate.core.objects import JSON, get, meta_str
from raygate.core.times import parse_time

Key = tuple[str, str]  # (pod set, placement digest)

GATHER_SECONDS = 5.0  # how long a pod set's booked pods wait for the rest of it after the newest came


@dataclass(frozen=True)
class Pod:
    """A pod of a Ray object as the reconciler sees it."""

    name: str
    created: str
    pod_set: str
    gated: bool
    runs: bool
    consumes: str | None  # the request named in its consume annotation (released pods)
    digest: str = ""  # gated pods: match_digest of the pod
    obj: JSON = field(default_factory=dict, compare=False, repr=False)  # gated pods: the pod, to template it
    group: str | None = None  # the PodGroup it names (spec.schedulingGroup.podGroupName)
    unreadable: str | None = None  # gated pods raygate cannot read the requests of: why (never released or booked)
    bound: bool = False  # scheduled to a node
    arrived: int = 0  # the order the reconciler first saw it in: who came first within one creation second


@dataclass
class Slots:
    request: str
    pod_set: str
    digest: str
    count: int
    used: int = 0

    @property
    def free(self) -> int:
        return self.count - self.used


@dataclass
class GatePlan:
    release: list[tuple[Pod, str]] = field(default_factory=list)  # (pod, request it consumes)
    # ((pod set, digest), pods to book, a gated pod like them, or None: the spec's pods, none there yet)
    create: list[tuple[Key, int, Pod | None]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # scale-up requests no longer needed
    waiting: dict[Key, int] = field(default_factory=dict)  # gated pods no Provisioned booking covers yet
    refused: list[str] = field(default_factory=list)  # why some waiting pods get no request (limits)
    consumed: list[str] = field(default_factory=list)  # Provisioned requests every booked pod of which is bound
    gathering: float | None = None  # seconds until the pods held back for the rest of their pod set go anyway


def slots(requests: Sequence[JSON], templates: Sequence[JSON]) -> list[Slots]:
    """The booked slots of the Provisioned requests, per pod set, from the PodTemplates they name."""
    by_name = {meta_str(t, "name"): t for t in templates}
    out = []
    for r in requests:
        if not provisioned(r):
            continue
        for ps in get(r, ("spec", "podSets")) or []:
            template = by_name.get(str(get(ps, ("podTemplateRef", "name")) or ""))
            pod_set = get(template, ("metadata", "annotations", keys.POD_SET_ANNOTATION))
            digest = get(template, ("metadata", "annotations", keys.PLACEMENT_ANNOTATION))
            count = ps.get("count") if isinstance(ps, Mapping) else None
            if isinstance(pod_set, str) and isinstance(digest, str) and isinstance(count, int):
                out.append(Slots(meta_str(r, "name"), pod_set, digest, count))
    return out


def pending_scale_ups(scale_ups: Sequence[JSON], templates: Sequence[JSON]) -> dict[Key, list[tuple[str, int]]]:
    """Scale-up requests still on their way, per (pod set, digest), oldest first: (name, pods)."""
    by_name = {meta_str(t, "name"): t for t in templates}
    out: dict[Key, list[tuple[str, int]]] = defaultdict(list)
    for r in sorted(scale_ups, key=lambda r: (meta_str(r, "creationTimestamp"), meta_str(r, "name"))):
        if provisioned(r) or ended(r):
            continue
        for ps in get(r, ("spec", "podSets")) or []:
            template = by_name.get(str(get(ps, ("podTemplateRef", "name")) or ""))
            digest = get(template, ("metadata", "annotations", keys.PLACEMENT_ANNOTATION))
            pod_set = get(r, ("metadata", "annotations", keys.SCALE_UP_ANNOTATION))
            if isinstance(pod_set, str) and isinstance(digest, str):
                out[(pod_set, digest)].append((meta_str(r, "name"), int(ps.get("count") or 0)))
    return out


def plan(pods: Sequence[Pod], requests: Sequence[JSON], scale_ups: Sequence[JSON], templates: Sequence[JSON],
         *, desired: Mapping[Key, int] | None = None, room: int, most_per_request: int, most_pending: int = 1 << 30,
         made: frozenset[str] | None = None, closing: frozenset[str] = frozenset(),
         now: dt.datetime | None = None) -> GatePlan:
    """Release what the bookings cover, book what they do not.

    `desired`: per (pod set, digest), the pods the object's spec runs now (KubeRay creates them one by one:
    a scale-up is booked for the whole increment the spec asks for, not pod by pod); `room`: pods the
    object may still have booked (limits.maxPods less every request's pods); `most_per_request`:
    limits.maxRequestPods; `most_pending`: limits.maxPendingScaleUps, the scale-up requests of the object
    that may wait for the autoscaler at once. `made`: the groups that exist (None: pods name none raygate
    makes); `closing`: groups being deleted. A pod naming a group not made is released only with every gated
    pod naming it; a pod naming a closing group is not released (its slot stays its own). `now`: releases wait
    for the rest of their pod set (GATHER_SECONDS; None: each pod goes as it comes)."""
    out = GatePlan()
    desired = desired or {}
    free = slots([*requests, *scale_ups], templates)
    bound: dict[str, int] = defaultdict(int)  # request -> its released pods that run and are bound
    for p in pods:
        if not p.gated and p.runs and p.consumes is not None:
            s = next((s for s in free if s.request == p.consumes and s.pod_set == p.pod_set and s.free > 0), None)
            if s is not None:
                s.used += 1
                bound[s.request] += p.bound
    out.consumed = _consumed(requests, scale_ups, free, bound)
    released: dict[Key, int] = defaultdict(int)
    for s in free:
        released[(s.pod_set, s.digest)] += s.used
    uncovered: dict[Key, list[Pod]] = defaultdict(list)
    unreadable: dict[str, int] = defaultdict(int)  # pod set -> gated pods whose requests cannot be read
    for p in sorted((p for p in pods if p.gated and p.runs), key=lambda p: (p.created, p.arrived, p.name)):
        if p.unreadable is not None:
            unreadable[p.pod_set] += 1
            out.refused.append(f"pod {p.name} stays gated: raygate cannot read what it asks for ({p.unreadable})")
            continue
        s = next((s for s in free if s.pod_set == p.pod_set and s.digest == p.digest and s.free > 0), None)
        if s is None:
            uncovered[(p.pod_set, p.digest)].append(p)
            continue
        s.used += 1
        released[(p.pod_set, p.digest)] += 1
        out.release.append((p, s.request))
    if made is not None:
        _whole_groups(out, uncovered, made, closing)
    if now is not None:
        _gather(out, pods, desired, now)
    want = _wanted(desired, released, uncovered, unreadable)
    pending = pending_scale_ups(scale_ups, templates)
    scale_up_names = {meta_str(r, "name") for r in scale_ups}
    asking = sum(len(v) for v in pending.values())
    keys_ = set(uncovered) | set(pending) | set(desired) | {(s.pod_set, s.digest) for s in free}
    for key in sorted(keys_):
        waiting = uncovered.get(key, [])
        booked = sum(s.count for s in free if (s.pod_set, s.digest) == key)
        asked = list(pending.get(key, []))
        # Fewer pods than asked for (scaled down, or the pods went): drop the newest requests beyond the need.
        while asked and booked + sum(n for _, n in asked) > want.get(key, 0):
            out.delete.append(asked.pop()[0])
            asking -= 1
        missing = want.get(key, 0) - booked - sum(n for _, n in asked)
        if missing > 0:
            ask = min(missing, most_per_request, room)
            if ask < missing:
                out.refused.append(f"{missing} pod{'s' if missing != 1 else ''} of pod set {key[0]} need a booking, "
                                   f"but limits.maxPods and limits.maxRequestPods leave room for {max(ask, 0)}")
            if ask > 0 and asking >= most_pending:
                out.refused.append(f"{missing} pod{'s' if missing != 1 else ''} of pod set {key[0]} wait for a "
                                   f"scale-up request until one of the {asking} this object has out is answered "
                                   "(limits.maxPendingScaleUps)")
            elif ask > 0:
                out.create.append((key, ask, waiting[-1] if waiting else None))
                room -= ask
                asking += 1
        if waiting:
            out.waiting[key] = out.waiting.get(key, 0) + len(waiting)
        # A Provisioned scale-up that covers no pod and no pod the spec still asks for has done its work.
        for s in (s for s in free if (s.pod_set, s.digest) == key and s.request in scale_up_names and s.used == 0):
            if booked - s.count >= want.get(key, 0) and s.request not in out.delete:
                out.delete.append(s.request)
                booked -= s.count
    # A scale-up that failed is replaced (above, as if it were not there) and goes.
    out.delete += [meta_str(r, "name") for r in scale_ups if ended(r) and not provisioned(r)]
    return out


def _consumed(requests: Sequence[JSON], scale_ups: Sequence[JSON], free: Sequence[Slots],
              bound: Mapping[str, int]) -> list[str]:
    """Provisioned requests whose every booked pod runs bound to a node: their booking has done its work. The
    pinned cluster-autoscaler keeps placing a booking's pods in its simulation for 10 minutes after Provisioned
    even once the real pods run, so the same room counts twice and other requests are answered "not now"
    (kubernetes/autoscaler#9805); newer autoscalers mark such a booking BookingExpired (CapacityBookingConsumed,
    #9806), and raygate does the same."""
    total: dict[str, int] = defaultdict(int)
    for s in free:
        total[s.request] += s.count
    return sorted(meta_str(r, "name") for r in [*requests, *scale_ups]
                  if provisioned(r) and not booking_done(r) and total[meta_str(r, "name")]
                  and bound.get(meta_str(r, "name"), 0) >= total[meta_str(r, "name")])


def _wanted(desired: Mapping[Key, int], released: Mapping[Key, int], uncovered: Mapping[Key, list[Pod]],
            unreadable: Mapping[str, int]) -> dict[Key, int]:
    """Per (pod set, digest), the pods that need a booking: those there are, and those the spec has still to
    make. KubeRay keeps a pod made from an older template when the template changes, so the pods still to come
    are what the spec asks of a pod set beyond every pod of that set there is, whatever its placement, and they
    come with the spec's placement: an edit of where pods go books nothing for pods that exist already."""
    have = {k: released.get(k, 0) + len(uncovered.get(k, ())) for k in {*released, *uncovered}}
    out = {k: n for k, n in have.items() if n}
    asked = _asked(desired)
    for pod_set in sorted(asked):
        there = sum(n for k, n in have.items() if k[0] == pod_set) + unreadable.get(pod_set, 0)
        to_come = asked[pod_set] - there
        for key in sorted(k for k in desired if k[0] == pod_set):
            extra = min(max(desired[key] - have.get(key, 0), 0), max(to_come, 0))
            if extra:
                out[key] = out.get(key, 0) + extra
                to_come -= extra
    return out


def _whole_groups(out: GatePlan, uncovered: Mapping[Key, list[Pod]], made: frozenset[str],
                  closing: frozenset[str]) -> None:
    """Hold back the releases of groups still to make whose gated pods are not all covered yet, and of groups
    being deleted: their slots stay reserved for them, and they count as waiting."""
    incomplete = {p.group for waiting in uncovered.values() for p in waiting if p.group and p.group not in made}
    held = incomplete | closing
    kept = []
    for p, request in out.release:
        if p.group is not None and p.group in held:
            key = (p.pod_set, p.digest)
            out.waiting[key] = out.waiting.get(key, 0) + 1
        else:
            kept.append((p, request))
    out.release = kept


def _gather(out: GatePlan, pods: Sequence[Pod], desired: Mapping[Key, int], now: dt.datetime) -> None:
    """Hold back the releases of pod sets the spec asks more pods of than there are, unless the newest of their
    pods came GATHER_SECONDS ago or more. Held pods keep their slots: nothing is booked for them twice."""
    there = Counter(p.pod_set for p in pods if p.runs)
    asked = _asked(desired)
    newest: dict[str, dt.datetime] = {}
    for p in pods:
        created = parse_time(p.created)
        if p.runs and created is not None and (p.pod_set not in newest or created > newest[p.pod_set]):
            newest[p.pod_set] = created
    waits = {pod_set: GATHER_SECONDS - (now - newest[pod_set]).total_seconds() for pod_set in newest
             if asked[pod_set] > there[pod_set]}
    held = {p.pod_set for p, _ in out.release if waits.get(p.pod_set, 0) > 0}
    if held:
        out.release = [(p, r) for p, r in out.release if p.pod_set not in held]
        out.gathering = min(waits[pod_set] for pod_set in held)


def _asked(desired: Mapping[Key, int]) -> Counter[str]:
    """The pods the spec asks of each pod set, over all its templates."""
    asked: Counter[str] = Counter()
    for (pod_set, _), count in desired.items():
        asked[pod_set] += count
    return asked


def pod_of(pod: Mapping[str, Any], digest: str, pod_set: str, unreadable: str | None = None, arrived: int = 0
           ) -> Pod:
    annotations = get(pod, ("metadata", "annotations")) or {}
    consumes = annotations.get(keys.CONSUME_ANNOTATION) if isinstance(annotations, Mapping) else None
    is_gated = podgate.gated(pod)
    return Pod(name=meta_str(pod, "name"), created=meta_str(pod, "creationTimestamp"),
               pod_set=pod_set, gated=is_gated,
               runs=get(pod, ("status", "phase")) not in TERMINAL_POD_PHASES,
               consumes=consumes if isinstance(consumes, str) and consumes else None,
               digest=digest, obj=dict(pod) if is_gated else {},
               group=group if isinstance(group := get(pod, keys.POD_GROUP_NAME_PATH), str) and group else None,
               unreadable=unreadable if is_gated else None, bound=bool(get(pod, ("spec", "nodeName"))),
               arrived=arrived)


TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
