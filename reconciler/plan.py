"""What the reconciler's decision returns, and what both of its loops build it from.

A decision reads `Observed` (the job's children and pods, from the caches) and returns a `Plan`: tagged
actions (Create, Delete, PatchJob, PatchChild, ReleasePod, Emit, Preempt) that the controller applies at the edge.
Every patch of a job opens with JSON-patch `test` operations on raygate's own fields (`builder`), so a
decision made on a stale view fails instead of overwriting a newer one. Giving up (`fail`) and the
deletes that end a job are shared by the held job's state machine (held.py) and the admitted object's
gate (admitted.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from raygate.core import keys
from raygate.core.api import OFFLINE, Served
from raygate.core.keys import ChildKind
from raygate.core.modes import GroupRules, ObjectRules
from raygate.core.objects import JSON, Key, get, meta_str
from raygate.core.patch import PatchBuilder, PatchOp, pointer
from raygate.core.preemption import Running
from raygate.core.queueing import Turn
from raygate.core.workload import Workload
from raygate.reconciler import children, gating

STATE_PATH = ("metadata", "labels", keys.STATE_LABEL)



GENERATION_PATH = ("metadata", "generation")  # bumped by spec edits, not by status writes



GROUP_GONE_RECHECK_SECONDS = 1.0  # a group being deleted with no pods goes within a second or two



class Step(StrEnum):
    """What one patch of the job does (logged; admit, retry and fail are counted in metrics)."""

    PROVISIONING = "provisioning"  # a request is out: state Provisioning
    ADMIT = "admit"  # unsuspended: state Admitted
    RETRY = "retry"  # the next attempt is scheduled
    FAIL = "fail"  # gave up: state Failed
    REQUEUE = "requeue"  # back to Pending for new capacity
    HOLD = "hold"  # still held, with a new reason
    SCALE_UP = "scale-up"  # admitted, with a new word on the pods its scale-up books
    WITHDRAW = "withdraw"  # its queue took its request back: Pending again
    UNGATE = "ungate"  # admitted where pods are no longer gated: the gate taken out of its pod templates
    RESUMED = "resumed"  # KubeRay took up the unsuspend of an admitted RayCluster: noted, which wakes KubeRay



class Outcome(StrEnum):
    """What one decision came to (logs and tests)."""

    NONE = "none"
    NOT_HELD = "not-held"  # a mode in which raygate holds nothing (kueue)
    CLEANUP = "cleanup"  # finished, deleted or failed: children to delete
    FINISHED = "finished"
    FAILED = "failed"
    UNKNOWN_STATE = "unknown-state"
    PREREQUISITE_MISSING = "prerequisite-missing"  # a group's prerequisite (Volcano: an Open queue) is not met
    REQUESTED = "requested"
    REPLACED = "replaced"  # the pod sets changed: a new request in the same attempt
    WAITING = "waiting"
    BACKOFF = "backoff"
    RETRY = "retry"  # this attempt failed; the next one is scheduled
    RETRIED = "retried"  # the request of a later attempt was (re)created
    ADMITTED = "admitted"
    REVOKED_REPORTED = "revoked-reported"
    REQUEUED = "requeued"
    QUEUED = "queued"  # not its turn: no request out
    WITHDRAWN = "withdrawn"  # its request taken back (another job ahead, or to ask again)
    PREEMPTING = "preempting"  # the front of its queue suspends lower-priority running jobs to make room
    PREEMPTED = "preempted"  # suspended to make room for a higher-priority job: in its queue again
    GROUP_REWRITTEN = "group-rewritten"  # another writer changed the group object raygate made (Volcano)



@dataclass(frozen=True)
class Create:
    kind: ChildKind
    obj: JSON



@dataclass(frozen=True)
class Delete:
    kind: ChildKind
    name: str



@dataclass(frozen=True)
class PatchJob:
    ops: tuple[PatchOp, ...]
    step: Step

    @property
    def changes(self) -> bool:
        return any(op["op"] != "test" for op in self.ops)



@dataclass(frozen=True)
class PatchChild:
    """A JSON patch of a child raygate made (what it records on a group object; `status`: of its status)."""

    kind: ChildKind
    name: str
    ops: tuple[PatchOp, ...]
    status: bool = False



@dataclass(frozen=True)
class ReleasePod:
    """Lift raygate's gate from a pod, naming the booking it consumes (a JSON patch that tests the gate)."""

    name: str
    ops: tuple[PatchOp, ...]



@dataclass(frozen=True)
class Emit:
    reason: str  # PascalCase
    message: str
    warning: bool = False
    name: str | None = None  # deterministic, so a replay records no second Event


@dataclass(frozen=True)
class Preempt:
    """Suspend another job of the queue to make room (a JSON patch that tests it is still Admitted; its own
    decision then puts it back in its queue and says so)."""

    victim: Key
    ops: tuple[PatchOp, ...]


Action = Create | Delete | PatchJob | PatchChild | ReleasePod | Emit | Preempt


@dataclass(frozen=True)
class Preempting:
    """What the front of a queue that preempts (queues.<name>.preemption: LowerPriority) may suspend."""

    min_run_seconds: int
    priority: int  # the job's own
    running: tuple[Running, ...]  # the admitted jobs of its queue
    # The names of the jobs it preempted (its raygate.io/preempting record) -> the pods of the job that has that
    # name now that consume a booking and still run, and that job's uid (no entry when none has it). The pods of
    # the very jobs it preempted are room on its way, which nothing else may be suspended for.
    going: Mapping[Key, int] = field(default_factory=dict)
    uids: Mapping[Key, str] = field(default_factory=dict)



@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None
    outcome: Outcome = Outcome.NONE

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)



@dataclass(frozen=True)
class Observed:
    requests: tuple[JSON, ...] = ()  # ProvisioningRequests this job controls for its gang
    scale_ups: tuple[JSON, ...] = ()  # ProvisioningRequests for pods beyond the admitted gang
    pods: tuple[gating.Pod, ...] = ()  # its pods that raygate gated (gated, or released)
    cluster: JSON | None = None  # a RayJob's: KubeRay's RayCluster for it, whose spec KubeRay runs now
    consumers: Mapping[str, int] = field(default_factory=dict)  # request name -> its pods that still run
    templates: tuple[JSON, ...] = ()  # PodTemplates this job controls
    # Group objects raygate created for this job (Volcano PodGroups; Workloads and PodGroups), with kind set.
    groups: tuple[JSON, ...] = ()
    prerequisite: JSON | None = None  # a group still to create: its prerequisite as read (None: missing)
    served: Served = OFFLINE  # what the cluster serves (discovery, when the reconciler started)
    bound: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # group -> Ray cluster -> bound pods
    turn: Turn | None = None  # its turn in its queue (None: in none, as where raygate books nothing)
    queue: str = ""  # the queue's name
    freed: str = ""  # RFC 3339: when capacity of its queue last freed (answers before it are out of date)
    never_fits: keys.NeverFits = keys.NeverFits.HOLD  # its queue's word on a job no node group can hold
    said: Mapping[str, str] = field(default_factory=dict)  # request -> the autoscaler's NotTriggerScaleUp words
    preempt: Preempting | None = None  # its queue preempts: what it may suspend (None: its queue never does)

    def request(self, name: str) -> JSON | None:
        return next((r for r in self.requests if name_of(r) == name), None)

    def template_names(self) -> set[str]:
        return {name_of(t) for t in self.templates}



def fail(w: Workload, obs: Observed, rules: ObjectRules, message: str, *, event_reason: str = "InvalidJob",
         restartable: bool = True, suspend: bool = False) -> Plan:
    """Give up on the job: state Failed with the reason, an Event, its requests and templates deleted.

    The job stays suspended (`suspend`: is suspended again, for one that ran). Relabelling it Pending
    starts over at attempt 1, unless KubeRay itself refused the job (`restartable` False): then only
    a new job can run.
    """
    b = builder(w)
    if suspend:
        b.set(("spec", "suspend"), True)
    message += booking_kept(obs)
    b.set(STATE_PATH, keys.State.FAILED.value)
    b.set(annotation(keys.REASON_ANNOTATION), message[:1000])
    b.remove(annotation(keys.REQUEST_ANNOTATION))
    b.remove(annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    restart = (f"to start over run: kubectl label {w.kind.lower()} {w.name} -n {w.namespace} "
               f"{keys.STATE_LABEL}={keys.State.PENDING.value} --overwrite" if restartable else
               "delete it, fix the spec and create it again")
    held = "The job stays suspended" if suspend or w.suspended else "raygate will not start it again"
    actions: list[Action] = [
        patch_step(b, Step.FAIL),
        Emit(event_reason, f"{message}. {held}; {restart}", warning=True,
             name=children.event_name(w, event_reason, str(get(w.obj, ("metadata", "resourceVersion"), "")))),
    ]
    return Plan([*actions, *delete_all(obs), *stopped_groups(obs, rules.group)], outcome=Outcome.FAILED)



def stopped_groups(obs: Observed, group: GroupRules | None) -> list[Action]:
    """A stopped job's group objects where its pods name one per admission (native mode): a new start makes
    its own, and the stopped one's record of a bound gang must not reach it. (Volcano's are kept: its pod
    templates name the group from creation on.)"""
    if group is None or group.named_at_creation:
        return []
    return [Delete(group.kind_of(g), name_of(g)) for g in obs.groups if not deleting(g)]



def hold(w: Workload, reason: str, event_reason: str, plan: Plan, detail: str = "",
          annotations: Mapping[str, str] | None = None) -> None:
    """Keep the job held and say why: the reason annotation and one Event, only when it changes; `annotations`
    are recorded in the same patch (one is written alone only when it is missing or different)."""
    extra = dict(annotations or {})
    new_reason = w.annotations.get(keys.REASON_ANNOTATION) != reason
    if not new_reason and all(w.annotations.get(k) == v for k, v in extra.items()):
        return
    b = builder(w)
    b.set(annotation(keys.REASON_ANNOTATION), reason)
    for key, value in extra.items():
        b.set(annotation(key), value)
    plan.actions.append(patch_step(b, Step.HOLD))
    if new_reason:
        plan.actions.append(Emit(event_reason, reason, warning=True, name=children.event_name(w, event_reason, detail)))



def positive_int(text: object) -> int | None:
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value >= 1 else None



def builder(w: Workload) -> PatchBuilder:
    """A patch that applies only while the job is in the state the decision was made on.

    It tests raygate's own fields (state, attempt, request) rather than the resourceVersion: KubeRay
    writes the status of a held job too, and that must not turn every first patch into a conflict
    (and an extra write); a competing reconciler, the only other writer of these fields, still fails
    the test.
    """
    b = PatchBuilder(w.obj)
    for path in (STATE_PATH, annotation(keys.ATTEMPT_ANNOTATION), annotation(keys.REQUEST_ANNOTATION)):
        value = get(w.obj, path)
        if value is not None:
            b.ops.append({"op": "test", "path": pointer(path), "value": value})
    return b



def patch_step(b: PatchBuilder, step: Step) -> PatchJob:
    return PatchJob(tuple(b.ops), step)



def delete_requests(obs: Observed, keep: str | None = None) -> list[Action]:
    """Every request but `keep`, except those pods still consume: a booking lives as long as its pods."""
    return [Delete(ChildKind.PROVISIONING_REQUEST, name_of(r)) for r in obs.requests
            if name_of(r) != keep and not obs.consumers.get(name_of(r))]



def delete_all(obs: Observed) -> list[Action]:
    """The job's requests (scale-ups too) and templates, but for requests pods still consume and the
    templates they name (also what the controller deletes of the children of a job that is gone)."""
    every = [*obs.requests, *obs.scale_ups]
    kept = {t for r in every if obs.consumers.get(name_of(r)) for t in template_refs(r)}
    out = delete_requests(obs)
    out += [Delete(ChildKind.PROVISIONING_REQUEST, name_of(r)) for r in obs.scale_ups
            if not obs.consumers.get(name_of(r))]
    out += [Delete(ChildKind.POD_TEMPLATE, name_of(t)) for t in obs.templates if name_of(t) not in kept]
    return out



def template_refs(request: Mapping[str, Any]) -> set[str]:
    sets = get(request, ("spec", "podSets"))
    return {str(get(p, ("podTemplateRef", "name")) or "") for p in sets if isinstance(p, Mapping)} \
        if isinstance(sets, list) else set()



def booking_kept(obs: Observed) -> str:
    """What a job's deletes leave for its running pods, as a reason says it ("" when nothing)."""
    kept = sorted((name_of(r), obs.consumers[name_of(r)]) for r in (*obs.requests, *obs.scale_ups)
                  if obs.consumers.get(name_of(r)))
    if not kept:
        return ""
    pods = sum(n for _, n in kept)
    return (f"; ProvisioningRequest {', '.join(n for n, _ in kept)} stays while {pods} of its pods "
            f"{'still run' if pods != 1 else 'still runs'}, and goes when they end")



def name_of(obj: Mapping[str, Any]) -> str:
    return meta_str(obj, "name")



def annotation(key: str) -> tuple[str, ...]:
    return ("metadata", "annotations", key)



def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(get(obj, ("metadata", "deletionTimestamp")))
