"""`raygate status` (also `kubectl raygate status`): the RayJobs and RayClusters raygate holds or has
failed, and the admitted ones whose scale-up waits for a booking, read from the cluster, with how long
each has waited and why; and, where the cluster serves Kubernetes' gang scheduling (native mode), each
one's PodGroups with kube-scheduler's verdict (condition PodGroupScheduled), admitted jobs whose gang the
scheduler has not bound included."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

from raygate.core import keys, preemption
from raygate.core.errors import RaygateError
from raygate.core.times import parse_time

if TYPE_CHECKING:
    from raygate.core.api import Resource
    from raygate.core.objects import JSON
    from raygate.kube.client import ApiError, Kube

SHOWN_STATES = (keys.State.PENDING, keys.State.PROVISIONING, keys.State.FAILED)
SELECTOR = keys.STATE_LABEL  # admitted objects too: one whose scale-up or gang waits is shown with that reason
COLUMNS = ("NAMESPACE", "NAME", "STATE", "QUEUE", "POSITION", "AHEAD", "ATTEMPT", "WAITING", "GANG", "REASON")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="list held and failed RayJobs and RayClusters, and admitted ones whose scale-up waits",
        description="List the RayJobs and RayClusters raygate holds (state Pending or Provisioning) or has "
        f"failed (state Failed), from the label {keys.STATE_LABEL}, and admitted ones whose scale-up waits gated "
        "for a booking: state, attempt, time waiting since creation, the reason, and (native mode) their "
        "PodGroups with kube-scheduler's verdict, admitted jobs whose gang is not bound yet included. Also runs "
        "as `kubectl raygate status`.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", default=None,
                       help="namespace to list (default: the kubeconfig context's namespace, else default)")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    p.add_argument("--kubeconfig", default=None, metavar="PATH",
                   help="kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Held:
    namespace: str
    kind: str
    name: str
    state: str
    attempt: int | None
    created: str
    waiting_seconds: int
    reason: str
    provisioning_request: str
    pod_groups: tuple[GroupVerdict, ...] = ()
    place: Place | None = None  # its place in its queue, while it is held there
    preempted_by: str = ""  # its raygate.io/preempted-by record: suspended to make room for that job

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {
            "namespace": d["namespace"], "kind": d["kind"], "name": d["name"], "state": d["state"],
            "attempt": d["attempt"], "creationTimestamp": d["created"], "waitingSeconds": d["waiting_seconds"],
            "reason": d["reason"], "provisioningRequest": d["provisioning_request"] or None,
            "podGroups": [g.as_json() for g in self.pod_groups],
            "queue": None if self.place is None else {
                "name": self.place.queue, "position": self.place.position, "length": self.place.length,
                "ahead": self.place.ahead, "priority": self.place.priority},
            "preemptedBy": self._preempted_by(),
        }

    def _preempted_by(self) -> dict[str, str] | None:
        who, when = preemption.preempted_by(self.preempted_by)
        return {"job": str(who.key), "at": when} if who is not None else None

    @property
    def preemption(self) -> str:
        """Who preempted it and when, as its reason in the table starts."""
        found = self._preempted_by()
        return f"preempted by {found['job']} at {found['at']}: " if found else ""

    @property
    def gang(self) -> str:
        return "; ".join(g.summary for g in self.pod_groups) or "-"


@dataclass(frozen=True)
class Place:
    """Where a held job stands in its queue, computed when asked (raygate writes no position on the jobs)."""

    queue: str
    position: int | None  # 1 is the front; None for a job out of the way (Provisioned, or never fits)
    length: int  # jobs in line, those out of the way not counted
    ahead: str | None  # the job right ahead of it
    priority: int


@dataclass(frozen=True)
class GroupVerdict:
    """One of a job's PodGroups (Kubernetes' own, native mode) and kube-scheduler's word on it."""

    name: str
    min_count: int | None
    scheduled: str | None  # the PodGroupScheduled condition's status: True, False, or None before the first try
    reason: str
    message: str

    @property
    def bound(self) -> bool:
        return self.scheduled == "True"

    @property
    def summary(self) -> str:
        said = "NotTriedYet" if self.scheduled is None else self.reason or f"Scheduled={self.scheduled}"
        return f"{self.name} {said}"

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "minCount": self.min_count, "scheduled": self.scheduled, "reason": self.reason,
                "message": self.message}


def verdict(group: Mapping[str, Any]) -> GroupVerdict:
    meta = group.get("metadata") or {}
    count = ((group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang", {}).get("minCount")
    cond = next((c for c in (group.get("status") or {}).get("conditions") or []
                 if isinstance(c, Mapping) and c.get("type") == keys.GANG_SCHEDULED_CONDITION), {})
    return GroupVerdict(str(meta.get("name", "")), count if isinstance(count, int) else None,
                        str(cond["status"]) if cond.get("status") else None, str(cond.get("reason") or ""),
                        str(cond.get("message") or ""))


def groups_by_owner(groups: Iterable[Mapping[str, Any]]) -> dict[str, list[GroupVerdict]]:
    """PodGroups by the uid of the job that controls them."""
    out: dict[str, list[GroupVerdict]] = {}
    for g in groups:
        refs = (g.get("metadata") or {}).get("ownerReferences") or []
        uid = next((r.get("uid") for r in refs if isinstance(r, Mapping) and r.get("controller")), None)
        if uid:
            out.setdefault(str(uid), []).append(verdict(g))
    return out


def _attempt(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def held_from(kind: str, objects: Iterable[Mapping[str, Any]], now: dt.datetime,
              groups: Mapping[str, list[GroupVerdict]] | None = None) -> list[Held]:
    """The rows for `objects` (RayJobs or RayClusters as the API returns them); `groups`: their PodGroups by
    owner uid. An Admitted object is a row while one of its PodGroups is not bound by the scheduler."""
    rows = []
    for obj in objects:
        meta = obj.get("metadata", {})
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        state = labels.get(keys.STATE_LABEL, "")
        scale_up = annotations.get(keys.SCALE_UP_REASON_ANNOTATION) if state == keys.State.ADMITTED else None
        mine = tuple(sorted((groups or {}).get(str(meta.get("uid", "")), []), key=lambda g: g.name))
        unbound = state == keys.State.ADMITTED and any(not g.bound for g in mine)
        if state not in SHOWN_STATES and not scale_up and not unbound:
            continue
        # KubeRay's cluster of a RayJob carries the job's labels, but only once the job is Admitted, a state
        # this table leaves out; a held RayCluster that claims a RayJob parent is held in its own right.
        created = str(meta.get("creationTimestamp", ""))
        since = parse_time(created)
        rows.append(Held(
            namespace=str(meta.get("namespace", "")),
            kind=kind,
            name=str(meta.get("name", "")),
            state=state,
            attempt=_attempt(annotations.get(keys.ATTEMPT_ANNOTATION)),
            created=created,
            waiting_seconds=max(0, int((now - since).total_seconds())) if since else 0,
            reason=f"scale-up: {scale_up}" if scale_up else str(annotations.get(keys.REASON_ANNOTATION, "")),
            provisioning_request=str(annotations.get(keys.REQUEST_ANNOTATION, "")),
            pod_groups=mine,
            preempted_by=str(annotations.get(keys.PREEMPTED_BY_ANNOTATION, "")),
        ))
    return rows


def human_duration(seconds: int) -> str:
    """kubectl's AGE style: 42s, 5m3s, 3h12m, 2d4h."""
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s}s" if minutes < 10 and s else f"{minutes}m"
    hours, m = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{m}m" if m else f"{hours}h"
    days, h = divmod(hours, 24)
    return f"{days}d{h}h" if h else f"{days}d"


def render_table(rows: list[Held], out: TextIO) -> None:
    table = [COLUMNS] + [
        (r.namespace, f"{r.kind.lower()}/{r.name}", r.state, r.place.queue if r.place else "-",
         f"{r.place.position}/{r.place.length}" if r.place and r.place.position else "-",
         (r.place.ahead or "-") if r.place else "-", "-" if r.attempt is None else str(r.attempt),
         human_duration(r.waiting_seconds), r.gang, r.preemption + (r.reason or "-"))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    for row in table:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)]
        out.write("   ".join([*cells, row[-1]]).rstrip() + "\n")


def render_json(rows: list[Held], out: TextIO) -> None:
    out.write(json.dumps({"kind": "RaygateStatus", "items": [r.as_json() for r in rows]}, indent=2) + "\n")


def _explain(err: ApiError, kube: Kube, res: Resource, namespace: str | None) -> RaygateError:
    where = f"in namespace {namespace}" if namespace else "in all namespaces"
    what = f"{res.plural}.{res.group}"
    if err.status == 0:
        return RaygateError(f"cannot reach the API server at {kube.host}: {err.message}")
    if err.status == 401:
        return RaygateError(f"the API server at {kube.host} rejected the credentials: check the kubeconfig")
    if err.status == 403:
        return RaygateError(f"forbidden: cannot list {what} {where}: {err.message}")
    if err.status == 404:
        return RaygateError(f"{what} is not served by {kube.host}: install KubeRay's CRDs (ray.io/v1)")
    return RaygateError(f"listing {what} {where} failed: {err.status} {err.reason}: {err.message}")


def _pod_groups(kube: Kube, namespace: str | None) -> list[JSON]:
    """raygate's PodGroups where the cluster serves Kubernetes' gang scheduling ([] where it does not)."""
    from raygate.core.api import gang_pod_groups
    from raygate.kube import discovery
    from raygate.kube.client import ApiError

    try:
        version = discovery.served(kube).gang_version
    except ApiError as err:
        raise _explain(err, kube, gang_pod_groups("v1alpha2"), namespace) from None
    if version is None:
        return []
    res = gang_pod_groups(version)
    try:
        listed = kube.list(res, namespace, labelSelector=keys.MANAGED_SELECTOR)
    except ApiError as err:
        raise _explain(err, kube, res, namespace) from None
    return list(listed.get("items") or [])


def collect(kube: Kube, namespace: str | None, now: dt.datetime | None = None) -> list[Held]:
    from raygate.core.api import RAYCLUSTERS, RAYJOBS
    from raygate.kube.client import ApiError

    now = now or dt.datetime.now(dt.UTC)
    groups = _pod_groups(kube, namespace)
    by_owner = groups_by_owner(groups)
    rows: list[Held] = []
    for res in (RAYJOBS, RAYCLUSTERS):
        try:
            listed = list(kube.list(res, namespace, labelSelector=SELECTOR).get("items") or [])
        except ApiError as err:
            raise _explain(err, kube, res, namespace) from None
        rows += held_from(res.kind, listed, now, by_owner)
    places = queue_places(kube, namespace)
    rows = [replace(r, place=places.get((r.kind, r.namespace, r.name))) for r in rows]
    # In its queue's section, a job out of the way (no position) first: it is being admitted, or never fits.
    rows.sort(key=lambda r: (r.namespace, r.place.queue if r.place else "~", (r.place and r.place.position) or 0,
                             -r.waiting_seconds, r.kind, r.name))
    return rows


def queue_places(kube: Kube, namespace: str | None) -> dict[tuple[str, str, str], Place]:
    """Every held job's place in its queue, from the objects as the reconciler reads them: the held jobs of every
    namespace (a queue spans namespaces), raygate's config and the PriorityClasses. A user who may not list
    those everywhere gets the places among what they may list."""
    from raygate.core import queueing
    from raygate.core.api import CONFIGMAPS, PRIORITY_CLASSES, RAYCLUSTERS, RAYJOBS, provisioning_requests
    from raygate.core.config import parse_config
    from raygate.core.modes import for_object
    from raygate.core.objects import Key, meta_str, with_kind
    from raygate.core.policy import DEFAULT_CONFIG
    from raygate.core.workload import Workload
    from raygate.kube.client import ApiError
    from raygate.kube.discovery import served_provreq_version
    from raygate.reconciler.queues import waiting_of

    def listed(res: Resource, where: str | None, **selector: str) -> list[JSON]:
        try:
            return list(kube.list(res, where, **selector).get("items") or [])
        except ApiError as err:
            if err.status == 403 and where is None and namespace is not None:
                return listed(res, namespace, **selector)
            if err.status in (403, 404):
                return []
            raise
    try:
        cm = kube.get(CONFIGMAPS, keys.CONFIGMAP_NAME, keys.SYSTEM_NAMESPACE)
        config = parse_config(str((cm.get("data") or {}).get(keys.CONFIGMAP_KEY, "")))
    except (ApiError, ValueError):
        config = DEFAULT_CONFIG  # unreadable here: the reconciler's own view may differ, the order does not
    classes, default = queueing.priority_classes(listed(PRIORITY_CLASSES, None))
    # A job whose request is Provisioned is out of the way of the jobs behind it, as the reconciler counts them.
    version = served_provreq_version(kube)
    mine = listed(provisioning_requests(version), None, labelSelector=keys.MANAGED_SELECTOR) if version else []
    requests = {(meta_str(r, "namespace"), meta_str(r, "name")): r for r in mine}
    queues: dict[str, list[queueing.Waiting]] = {}
    held = ",".join(s.value for s in keys.HELD_STATES)
    for res in (RAYJOBS, RAYCLUSTERS):
        for obj in listed(res, None, labelSelector=f"{keys.STATE_LABEL} in ({held})"):
            w = Workload(with_kind(obj, res.kind, res.api_version))
            rules = for_object(config.policy_for(w.namespace), w.annotations)
            request = requests.get((w.namespace, w.annotations.get(keys.REQUEST_ANNOTATION) or ""))
            waiting = waiting_of(Key(res.kind, w.namespace, w.name), w, rules, classes, default, request)
            if waiting is not None:
                queues.setdefault(rules.policy.queue, []).append(waiting)
    out: dict[tuple[str, str, str], Place] = {}
    for name, jobs in queues.items():
        order = queueing.ordered(jobs)
        aside = [j.order for j in order if j.aside]
        for i, job in enumerate(order):
            turn = queueing.turn_at(order, i, False, aside)
            # A job out of the way stands in no line: its count would be that of the job behind it.
            out[(job.key.kind, job.key.namespace, job.key.name)] = Place(
                name, None if job.aside else turn.position, turn.length, None if job.aside else turn.behind,
                job.priority)
    return out


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from raygate.kube.client import Kube, context_namespace

    out = out or sys.stdout
    kube = Kube.connect(args.kubeconfig, user_agent="raygate-status")
    namespace = None if args.all_namespaces else (args.namespace or context_namespace(args.kubeconfig))
    rows = collect(kube, namespace)
    if args.output == "json":
        render_json(rows, out)
    elif rows:
        render_table(rows, out)
    else:
        where = "in any namespace" if namespace is None else f"in namespace {namespace}"
        out.write(f"No held or failed RayJobs or RayClusters {where}.\n")
    return 0
