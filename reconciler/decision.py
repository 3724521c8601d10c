"""The reconciler's decision, as a pure function: (job, its observed children, its rules, now) -> plan.

Level-triggered: everything it needs is on the job (state label and annotations) or among the
children the cluster holds, so a reconciler restarted at any instant decides the same thing again.
Every write to the job is a JSON patch that first tests the job's raygate state, so a decision made
on a stale view fails instead of overwriting a newer one.

Per attempt n a job has one ProvisioningRequest, named `<job>-<hash>-a<n>`. The job's annotations
say which request is current; any other request the job owns is stale and is deleted.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from raygate.core import booking, keys, limits, podgate
from raygate.core import quantity as q
from raygate.core.api import OFFLINE, Served
from raygate.core.conditions import Condition, conditions
from raygate.core.keys import ChildKind
from raygate.core.modes import (
    GroupRules,
    GroupsAtThePod,
    GroupSpec,
    GroupsWithDrift,
    GroupsWithPrerequisite,
    ObjectRules,
    Prerequisite,
)
from raygate.core.objects import JSON, get, meta_str
from raygate.core.patch import PatchBuilder, PatchOp, pointer
from raygate.core.policy import CapacityRevokedAction, NamespacePolicy
from raygate.core.times import parse_time, precise_timestamp, timestamp
from raygate.core.workload import ManifestError, PodSet, Workload
from raygate.reconciler import children, gating
from raygate.reconciler.children import BadInput

PREREQUISITE_RECHECK_SECONDS = 10.0
GROUP_GONE_RECHECK_SECONDS = 1.0  # a group being deleted with no pods goes within a second or two
STATE_PATH = ("metadata", "labels", keys.STATE_LABEL)
GENERATION_PATH = ("metadata", "generation")  # bumped by spec edits, not by status writes
# What a held job's request that ended did, by the condition that ended it (each of booking.ENDED).
ENDED_BEFORE_ADMISSION = {booking.FAILED: "failed",
                          booking.BOOKING_EXPIRED: "lost its booking before the job was admitted",
                          booking.CAPACITY_REVOKED: "lost its capacity before the job was admitted"}


# --- the decision ---------------------------------------------------------------------------------

def decide(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime,
           provreq_version: str | None = keys.PROVREQ_VERSIONS[0]) -> Plan:
    """`rules`: the job's, resolved once per reconcile (raygate.core.modes.for_object: a held job finishes
    under the mode it was held with, whatever the namespace changed to since); `provreq_version`: the
    ProvisioningRequest API version served (None: not installed)."""
    if not rules.holds:
        return Plan(outcome=Outcome.NOT_HELD)  # another system admits it and owns spec.suspend
    state = w.labels.get(keys.STATE_LABEL)
    rejected = w.rejected_by_kuberay()
    if rejected is not None and state != keys.State.FAILED:
        return fail(w, obs, rules, f"KubeRay refused this RayJob and will never run it ({rejected})",
                    event_reason="RejectedByKubeRay", restartable=False)
    if w.finished() or get(w.obj, ("metadata", "deletionTimestamp")):
        actions = delete_all(obs)
        if (group := rules.group) is not None:
            # A PodGroup stays (its protection finalizer) until its pods are terminal, then goes.
            actions += [Delete(group.kind_of(g), _name(g)) for g in obs.groups if not _deleting(g)]
        return Plan(actions, outcome=Outcome.CLEANUP if actions else Outcome.FINISHED)
    if state == keys.State.PENDING:
        return _pending(w, obs, rules, now, provreq_version)
    if state == keys.State.PROVISIONING:
        return _provisioning(w, obs, rules, now, provreq_version)
    if state == keys.State.ADMITTED:
        return _admitted(w, obs, rules, now, provreq_version)
    if state == keys.State.FAILED:
        # finishes a give-up interrupted before its deletes
        actions = [*delete_all(obs), *_stopped_groups(obs, rules.group)]
        return Plan(actions, outcome=Outcome.CLEANUP if actions else Outcome.FAILED)
    return Plan(outcome=Outcome.UNKNOWN_STATE)


def fail(w: Workload, obs: Observed, rules: ObjectRules, message: str, *, event_reason: str = "InvalidJob",
         restartable: bool = True, suspend: bool = False) -> Plan:
    """Give up on the job: state Failed with the reason, an Event, its requests and templates deleted.

    The job stays suspended (`suspend`: is suspended again, for one that ran). Relabelling it Pending
    starts over at attempt 1, unless KubeRay itself refused the job (`restartable` False): then only
    a new job can run.
    """
    b = _builder(w)
    if suspend:
        b.set(("spec", "suspend"), True)
    message += booking_kept(obs)
    b.set(STATE_PATH, keys.State.FAILED.value)
    b.set(_annotation(keys.REASON_ANNOTATION), message[:1000])
    b.remove(_annotation(keys.REQUEST_ANNOTATION))
    b.remove(_annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(_annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    restart = (f"to start over run: kubectl label {w.kind.lower()} {w.name} -n {w.namespace} "
               f"{keys.STATE_LABEL}={keys.State.PENDING.value} --overwrite" if restartable else
               "delete it, fix the spec and create it again")
    held = "The job stays suspended" if suspend or w.suspended else "raygate will not start it again"
    actions: list[Action] = [
        _patch(b, Step.FAIL),
        Emit(event_reason, f"{message}. {held}; {restart}", warning=True,
             name=children.event_name(w, event_reason, str(get(w.obj, ("metadata", "resourceVersion"), "")))),
    ]
    return Plan([*actions, *delete_all(obs), *_stopped_groups(obs, rules.group)], outcome=Outcome.FAILED)


def _stopped_groups(obs: Observed, group: GroupRules | None) -> list[Action]:
    """A stopped job's group objects where its pods name one per admission (native mode): a new start makes
    its own, and the stopped one's record of a bound gang must not reach it. (Volcano's are kept: its pod
    templates name the group from creation on.)"""
    if group is None or group.named_at_creation:
        return []
    return [Delete(group.kind_of(g), _name(g)) for g in obs.groups if not _deleting(g)]


def prerequisite_to_check(w: Workload, rules: ObjectRules, obs: Observed) -> Prerequisite | None:
    """What the controller must read before deciding (a mode's group still to create may need it), or None."""
    group = rules.group
    if not isinstance(group, GroupsWithPrerequisite) or w.labels.get(keys.STATE_LABEL) != keys.State.PENDING \
            or obs.groups:
        return None
    try:
        return group.prerequisite(group.recorded(w))
    except ManifestError:
        return None


# --- the plan it returns ------------------------------------------------------------------------

class Step(StrEnum):
    """What one patch of the job does (logged; admit, retry and fail are counted in metrics)."""

    PROVISIONING = "provisioning"  # a request is out: state Provisioning
    ADMIT = "admit"  # unsuspended: state Admitted
    RETRY = "retry"  # the next attempt is scheduled
    FAIL = "fail"  # gave up: state Failed
    REQUEUE = "requeue"  # back to Pending for new capacity
    HOLD = "hold"  # still held, with a new reason
    SCALE_UP = "scale-up"  # admitted, with a new word on the pods its scale-up books


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


Action = Create | Delete | PatchJob | PatchChild | ReleasePod | Emit


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None
    outcome: Outcome = Outcome.NONE

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


# --- what it reads: the job's children, and what the job needs --------------------------------

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

    def request(self, name: str) -> JSON | None:
        return next((r for r in self.requests if _name(r) == name), None)

    def template_names(self) -> set[str]:
        return {_name(t) for t in self.templates}


@dataclass(frozen=True)
class Needs:
    """What one held job needs: the pod sets that go into a request, and its mode's group object (built by
    its ObjectRules.group).

    (Not workload.Gang, the whole gang of a job: these are the parts of it raygate books.)"""

    managed: tuple[PodSet, ...]
    provision: bool
    group: GroupSpec | None
    fingerprint: str = ""  # of the managed pod sets: what a request for them books

    def request_name(self, w: Workload, attempt: int) -> str:
        return children.request_name(w, attempt, self.fingerprint)


def needs_of(w: Workload, rules: ObjectRules) -> Needs:
    """Raises BadInput for a job that cannot be admitted as written."""
    policy = rules.policy
    try:
        gang = w.gang()
    except ManifestError as err:
        raise BadInput(f"raygate cannot read this {w.kind}: {err}") from None
    managed = tuple(gang.managed_pod_sets(policy.manages))
    try:
        group = rules.group.recorded(w) if rules.group is not None else None
    except ManifestError as err:
        raise BadInput(str(err)) from None
    # The webhook refused these at create and on update; checked again before anything is asked of the
    # autoscaler (a job held before a limit was lowered, or past a webhook that was down).
    problems = booking.refusals(policy, gang) if rules.books else []
    if problems := [*problems, *limits.problems(w.namespace, policy, gang, books=rules.books)]:
        raise BadInput("; ".join(problems))
    try:
        fingerprint = children.fingerprint(w, managed)
    except ManifestError as err:
        raise BadInput(f"raygate cannot read this {w.kind}: {err}") from None
    return Needs(managed, rules.books and bool(managed), group, fingerprint)


# --- one function per state ---------------------------------------------------------------------

def _pending(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, version: str | None) -> Plan:
    policy = rules.policy
    try:
        needs = needs_of(w, rules)
        attempt = _pending_attempt(w)
        name = needs.request_name(w, attempt)
        plan = Plan(_delete_requests(obs, keep=name if needs.provision else None))
        if needs.group is not None and rules.group is not None:
            held = _ensure_group(w, obs, rules, needs.group, rules.group, plan)
            if held is not None:
                return held
        if not needs.provision:
            return _admit(w, plan, None, rules, needs, now)
        plan.actions += _ensure_request(w, obs, policy, needs, attempt, version)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    b = _builder(w)
    b.set(STATE_PATH, keys.State.PROVISIONING.value)
    b.set(_annotation(keys.REQUEST_ANNOTATION), name)
    b.set(_annotation(keys.ATTEMPT_ANNOTATION), str(attempt))
    counts = ", ".join(f"{p.name} x{p.count}" for p in needs.managed)
    b.set(_annotation(keys.REASON_ANNOTATION), f"waiting for ProvisioningRequest {name} "
          f"({policy.provisioning.class_name}; {counts}) to be Provisioned")
    b.remove(_annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(_annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    # No Event for a plain wait: the state label and this reason say it, and at most 6 writes per
    # admitted job leave room for one normal Event (Admitted) with two GPU pod sets. Anything
    # unusual while held (no capacity, retries, a closed queue) gets a Warning Event.
    plan.actions.append(_patch(b, Step.PROVISIONING))
    plan.requeue(policy.provisioning.provisioned_timeout_seconds)
    plan.outcome = Outcome.REQUESTED
    return plan


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool(get(obj, ("metadata", "deletionTimestamp")))


def _ensure_group(w: Workload, obs: Observed, rules: ObjectRules, spec: GroupSpec, group: GroupRules,
                  plan: Plan) -> Plan | None:
    """The held job's group objects (`group`: its rules.group): create what is missing (once the prerequisite
    is met), delete those made for its gang as it was before an edit. Returns the plan when the job must wait
    first."""
    if obs.served.known and not group.resources(obs.served):
        raise BadInput("; ".join(rules.mode_rules.cluster_problems(obs.served))
                       or f"this cluster serves no API for {', '.join(group.group_kinds)}")
    mine = [g for g in obs.groups if _name(g) == spec.name]
    # Group objects are immutable where they are native: a job whose gang changed while held gets new ones.
    plan.actions += [Delete(group.kind_of(g), _name(g)) for g in obs.groups
                     if _name(g) != spec.name and not _deleting(g)]
    if any(_deleting(g) for g in mine):
        # Created again under the same name before it is gone, it would vanish under the job's pods.
        why = f"waiting for {spec.name}, which is being deleted, to go before it is made again"
        _hold(w, why, "GroupDeleting", plan, spec.name)
        plan.requeue(GROUP_GONE_RECHECK_SECONDS)
        plan.outcome = Outcome.WAITING
        return plan
    have = {group.kind_of(g) for g in mine}
    missing = [(kind, obj) for kind, obj in group.group_objects(w, spec, obs.served) if kind not in have]
    if not missing:
        return None
    if not mine and isinstance(group, GroupsWithPrerequisite):
        problem = group.prerequisite_problem(spec, obs.prerequisite)
        if problem is not None:
            _hold(w, problem, group.prerequisite_reason, plan, problem)
            plan.requeue(min(PREREQUISITE_RECHECK_SECONDS, rules.policy.retry.base_seconds))
            plan.outcome = Outcome.PREREQUISITE_MISSING
            return plan
    plan.actions += [Create(kind, obj) for kind, obj in missing]
    return None


def _pending_attempt(w: Workload) -> int:
    """The attempt a Pending job starts: the one a requeue or a replaced request recorded, else 1.

    A job relabelled Pending after Failed has no current request (giving up removes it), so it
    starts over at attempt 1. (Only raygate writes these annotations: users cannot.)
    """
    attempt = _int(w.annotations.get(keys.ATTEMPT_ANNOTATION))
    if attempt and w.annotations.get(keys.REQUEST_ANNOTATION):
        return attempt
    return 1


def _ensure_request(w: Workload, obs: Observed, policy: NamespacePolicy, needs: Needs, attempt: int,
                    version: str | None) -> list[Action]:
    """PodTemplates first (a request whose templates are missing fails), then the request."""
    if version is None:
        raise BadInput(f"this cluster serves no ProvisioningRequest API ({keys.PROVREQ_GROUP}): install the "
                       "cluster-autoscaler's CRD, or turn provisioning off for this namespace in raygate-config")
    actions: list[Action] = []
    have = obs.template_names()
    wanted = set()
    for p in needs.managed:
        t = children.pod_template(w, p, policy.manages)
        wanted.add(_name(t))
        if _name(t) not in have:
            actions.append(Create(ChildKind.POD_TEMPLATE, t))
    # Templates of pod sets as they were before an edit: no request needs them any more.
    actions += [Delete(ChildKind.POD_TEMPLATE, name) for name in sorted(have - wanted)]
    pr = children.provisioning_request(w, list(needs.managed), policy, attempt, version, needs.fingerprint)
    if obs.request(_name(pr)) is None:
        actions.append(Create(ChildKind.PROVISIONING_REQUEST, pr))
    return actions


def _admit(w: Workload, plan: Plan, request: str | None, rules: ObjectRules, needs: Needs,
           now: dt.datetime) -> Plan:
    """One patch: consume annotations on the booked pod templates, unsuspend, state Admitted.

    It also tests the spec's generation (bumped by spec edits, not by status writes): a user who grows
    a held job between this decision and the patch must not have it unsuspended on the booking made
    for its old size. (Only here: KubeRay's own first update of a new job bumps it too, and the
    earlier patches unsuspend nothing; a request made for an older spec is replaced before admission.)
    """
    b = _builder(w)
    generation = get(w.obj, GENERATION_PATH)
    if generation is not None:
        b.ops.append({"op": "test", "path": pointer(GENERATION_PATH), "value": generation})
    if needs.group is not None and rules.group is not None:
        # In the patch that unsuspends: no pod of the job can ever be created without it.
        rules.group.admit(b, w, needs.group)
    if request is not None:
        for p in needs.managed:
            if p.template_path is None:
                continue
            b.set((*p.template_path, "metadata", "annotations", keys.CONSUME_ANNOTATION), request)
            b.set((*p.template_path, "metadata", "annotations", keys.CLASS_ANNOTATION),
                  rules.policy.provisioning.class_name)
    b.set(("spec", "suspend"), False)
    b.set(STATE_PATH, keys.State.ADMITTED.value)
    b.set(_annotation(keys.ADMITTED_AT_ANNOTATION), timestamp(now))
    b.remove(_annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(_annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    if request is not None:
        why = f"ProvisioningRequest {request} is Provisioned"
    elif needs.group is not None and rules.group is not None:
        why = rules.group.schedules(needs.group)
    elif needs.managed:
        why = "ProvisioningRequests are disabled for this namespace"
    else:
        why = f"no pod set requests {rules.policy.managed_names()}, so no capacity request was needed"
    b.set(_annotation(keys.REASON_ANNOTATION), f"admitted: {why}")
    created = parse_time(get(w.obj, ("metadata", "creationTimestamp")))
    held = f" after {max((now - created).total_seconds(), 0):.0f}s held" if created else ""
    plan.actions += [
        _patch(b, Step.ADMIT),
        Emit("Admitted", f"unsuspended{held}: {why}", name=children.event_name(w, "Admitted", request or "")),
    ]
    plan.outcome = Outcome.ADMITTED
    return plan


def _provisioning(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime,
                  version: str | None) -> Plan:
    policy = rules.policy
    attempt = _int(w.annotations.get(keys.ATTEMPT_ANNOTATION))
    name = w.annotations.get(keys.REQUEST_ANNOTATION)
    if attempt is None or not name:
        return _pending(w, obs, rules, now, version)  # annotations lost: begin again, as Pending
    try:
        needs = needs_of(w, rules)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    if name != needs.request_name(w, attempt):
        return _replace(w, obs, rules, now, version, name)
    plan = Plan(_delete_requests(obs, keep=name))
    if needs.group is not None and rules.group is not None:
        try:  # the gang may change without changing what is booked (a CPU group): its group follows
            held = _ensure_group(w, obs, rules, needs.group, rules.group, plan)
        except BadInput as err:
            return fail(w, obs, rules, str(err))
        if held is not None:
            return held
    due = parse_time(w.annotations.get(keys.NEXT_ATTEMPT_ANNOTATION))
    if due is not None and now < due:
        plan.requeue((due - now).total_seconds())
        plan.outcome = Outcome.BACKOFF
        return plan
    pr = obs.request(name)
    if pr is None:
        try:
            plan.actions += _ensure_request(w, obs, policy, needs, attempt, version)
        except BadInput as err:
            return fail(w, obs, rules, str(err))
        plan.requeue(policy.provisioning.provisioned_timeout_seconds)
        plan.outcome = Outcome.RETRIED if attempt > 1 else Outcome.REQUESTED
        return plan
    cond = conditions(pr)
    for ctype, why in ENDED_BEFORE_ADMISSION.items():
        c = cond.get(ctype)
        if c is not None and c.true:
            return _retry_or_fail(w, obs, rules, now, attempt, name, why, c, plan, needs)
    if get(pr, ("metadata", "annotations", keys.POD_SETS_ANNOTATION)) != needs.fingerprint:
        return _replace(w, obs, rules, now, version, name)  # it books other pod sets than the job has now
    if booking.provisioned(pr):
        return _admit(w, plan, name, rules, needs, now)
    provisioned = cond.get(booking.PROVISIONED)
    # provisionedTimeoutSeconds counts from the autoscaler's first answer that this request is not Provisioned,
    # recorded on the job. A request it has not answered is queued: the cluster-autoscaler takes one request
    # per loop, in no set order, so a new request would only join the same queue, behind a backoff.
    timeout = policy.provisioning.provisioned_timeout_seconds
    answered = provisioned is not None and not provisioned.true and bool(provisioned.reason)
    since = not_provisioned_since(w, name)
    if answered and since is None:
        since = now
    left = timeout - (now - since).total_seconds() if since is not None else timeout
    if left <= 0:
        expired = Condition("True", "ProvisionedTimeout", f"not Provisioned within {timeout:g}s of the "
                            "autoscaler's first answer")
        return _retry_or_fail(w, obs, rules, now, attempt, name, "timed out", expired, plan, needs)
    if answered and provisioned is not None and since is not None:
        msg = f": {provisioned.message}" if provisioned.message else ""
        _hold(w, f"ProvisioningRequest {name} is not Provisioned ({provisioned.reason}){msg}", "WaitingForCapacity",
              plan, f"{name}/{provisioned.reason}",
              annotations={keys.NOT_PROVISIONED_SINCE_ANNOTATION: f"{name} {precise_timestamp(since)}"})
    plan.requeue(left)
    plan.outcome = Outcome.WAITING
    return plan


def not_provisioned_since(w: Workload, request: str) -> dt.datetime | None:
    """When the autoscaler first answered `request` not Provisioned, as recorded on the job (None: not yet)."""
    name, _, when = str(w.annotations.get(keys.NOT_PROVISIONED_SINCE_ANNOTATION) or "").partition(" ")
    return parse_time(when) if name == request else None


def _replace(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, version: str | None,
             old: str) -> Plan:
    """The job's pod sets changed while it was held: a request for the new ones, in the same attempt."""
    plan = _pending(w, obs, rules, now, version)
    if plan.outcome == Outcome.REQUESTED:
        why = (f"its pod sets changed after ProvisioningRequest {old} was made; the request was replaced, "
               "so the capacity booked is the capacity it will use")
        plan.actions.append(Emit("PodSetsChanged", why, name=children.event_name(w, "PodSetsChanged", old)))
        plan.outcome = Outcome.REPLACED
    return plan


def _retry_or_fail(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, attempt: int, name: str,
                   why: str, cond: Condition, plan: Plan, needs: Needs) -> Plan:
    policy = rules.policy
    detail = f"{cond.reason}: {cond.message}" if cond.message else cond.reason
    if attempt > policy.retry.limit:
        return fail(w, obs, rules, f"ProvisioningRequest {name} {why} ({detail}); gave up after {attempt} attempt"
                            f"{'s' if attempt > 1 else ''}", event_reason="ProvisioningFailed")
    delay = policy.retry.delay(attempt)
    due = now + dt.timedelta(seconds=delay)
    nxt = needs.request_name(w, attempt + 1)
    b = _builder(w)
    b.set(_annotation(keys.ATTEMPT_ANNOTATION), str(attempt + 1))
    b.set(_annotation(keys.REQUEST_ANNOTATION), nxt)
    b.set(_annotation(keys.NEXT_ATTEMPT_ANNOTATION), precise_timestamp(due))
    b.remove(_annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    reason = f"ProvisioningRequest {name} {why} ({detail}); attempt {attempt + 1} as {nxt} after {timestamp(due)}"
    b.set(_annotation(keys.REASON_ANNOTATION), reason[:1000])
    # The patch comes first: if the reconciler dies before the delete, the stale request is deleted next time.
    plan.actions = [_patch(b, Step.RETRY),
                    Emit("ProvisioningRetry", reason, warning=True, name=children.event_name(w, "Retry", name)),
                    *_delete_requests(obs, keep=nxt)]
    plan.requeue(delay)
    plan.outcome = Outcome.RETRY
    return plan


def _group_rewritten(w: Workload, obs: Observed, rules: ObjectRules) -> Plan | None:
    """Someone else rewrote the group object raygate made for this job (KubeRay's own Volcano integration
    does, to its own counts): stop the job rather than let the scheduler run another gang than the one
    admitted, and delete the group, so that a new start makes it afresh."""
    drifts = rules.group
    if not isinstance(drifts, GroupsWithDrift):
        return None
    try:
        spec = drifts.recorded(w)
    except ManifestError:
        return None
    group = next((g for g in obs.groups if _name(g) == spec.name), None)
    changes = drifts.drift(spec, group) if group is not None else []
    if not changes or group is None:
        return None
    plan = fail(w, obs, rules, drifts.rewritten(spec, changes), event_reason=drifts.rewritten_reason, suspend=True)
    plan.actions.append(Delete(drifts.kind_of(group), spec.name))
    plan.outcome = Outcome.GROUP_REWRITTEN
    return plan


def _admitted(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, version: str | None) -> Plan:
    if (rewritten := _group_rewritten(w, obs, rules)) is not None:
        return rewritten
    name = w.annotations.get(keys.REQUEST_ANNOTATION)
    plan = Plan(_delete_requests(obs, keep=name), outcome=Outcome.ADMITTED)
    if w.suspended:
        # Suspended by a user after admission: its pods are gone, and so will its booking be before it
        # could start again. It waits for capacity anew, as any held job.
        return _requeue(w, obs, rules, name, "was suspended after admission", "Requeued")
    if rules.gates_pods:
        _gate(w, obs, rules, plan, version, now)
    pr = obs.request(name) if name else None
    revoked = conditions(pr).get(booking.CAPACITY_REVOKED) if pr is not None else None
    if revoked is None or not revoked.true or name is None:
        return plan
    detail = f"{revoked.reason}: {revoked.message}" if revoked.message else revoked.reason
    if rules.policy.provisioning.capacity_revoked is CapacityRevokedAction.REPORT:
        _hold(w, f"capacity of ProvisioningRequest {name} was revoked ({detail}); the job keeps running",
              "CapacityRevoked", plan, name)
        plan.outcome = Outcome.REVOKED_REPORTED
        return plan
    return _requeue(w, obs, rules, name, f"lost the capacity of ProvisioningRequest {name} ({detail})",
                    "CapacityRevoked", suspend=True)


def _gate(w: Workload, obs: Observed, rules: ObjectRules, plan: Plan, version: str | None,
          now: dt.datetime) -> None:
    """The pod gate of an admitted object: release its gated pods into the slots its Provisioned requests
    book, book the rest as scale-ups, and say why any still wait."""
    every = [*obs.requests, *obs.scale_ups]
    booked = sum(int(ps.get("count") or 0) for r in every if booking.provisioned(r) or not booking.ended(r)
                 for ps in get(r, ("spec", "podSets")) or [] if isinstance(ps, Mapping))
    policy = rules.policy
    desired = _desired(w, obs, policy)
    at_pod = rules.group if isinstance(rules.group, GroupsAtThePod) else None
    made = frozenset(_name(g) for g in obs.groups if not _deleting(g))
    closing = frozenset(_name(g) for g in obs.groups if _deleting(g))
    g = gating.plan(obs.pods, obs.requests, obs.scale_ups, obs.templates,
                    desired={key: count for key, (count, _, _) in desired.items()},
                    room=policy.limits.max_pods - booked, most_per_request=policy.limits.max_request_pods,
                    most_pending=policy.limits.max_pending_scale_ups,
                    made=made if at_pod is not None else None, closing=closing)
    if at_pod is not None:
        plan.actions += _increments(w, obs, at_pod, g, made)
        plan.actions += [PatchChild(at_pod.kind_of(grp), _name(grp), tuple(ops)) for grp in obs.groups
                         if not _deleting(grp) and (ops := at_pod.marks(grp, obs.bound.get(_name(grp), {})))]
        if any(p.group in closing for p in obs.pods if p.gated):
            plan.requeue(GROUP_GONE_RECHECK_SECONDS)  # its pods are released into the group made again
    classes = {_name(r): str(get(r, ("spec", "provisioningClassName")) or "") for r in every}
    plan.actions += [ReleasePod(p.name, tuple(podgate.release_ops(p.obj, r, classes[r]))) for p, r in g.release]
    existing = sorted(classes)
    have = obs.template_names()
    named: set[str] = set()  # the templates of the requests this plan creates
    for (pod_set, digest), count, pod in g.create:
        if version is None:
            g.refused.append(f"this cluster serves no ProvisioningRequest API ({keys.PROVREQ_GROUP})")
            break
        if pod is not None:  # gated pods the spec does not explain: booked as they are
            managed, _ = podgate.managed_request(pod.obj, policy, w.claim_templates, w.namespace)
            template = children.scale_up_template(w, pod_set, digest, podgate.template_of_pod(pod.obj), managed)
        else:
            _, spec_template, managed = desired[(pod_set, digest)]
            template = children.scale_up_template(w, pod_set, digest, spec_template, managed)
        named.add(_name(template))
        if _name(template) not in have:
            plan.actions.append(Create(ChildKind.POD_TEMPLATE, template))
        request = children.scale_up_request(w, pod_set, _name(template), count, existing, policy, version)
        if _name(request) not in classes:
            plan.actions.append(Create(ChildKind.PROVISIONING_REQUEST, request))
    plan.actions += [PatchChild(ChildKind.PROVISIONING_REQUEST, _name(r), tuple(booking.consumed_ops(r, now)),
                                status=True) for r in every if _name(r) in g.consumed]
    deleted = {name for name in g.delete if not obs.consumers.get(name)}
    plan.actions += [Delete(ChildKind.PROVISIONING_REQUEST, name) for name in sorted(deleted)]
    # A PodTemplate goes with the last request that names it: none is left for requests replaced or deleted.
    named |= {t for r in every if _name(r) not in deleted for t in _template_refs(r)}
    plan.actions += [Delete(ChildKind.POD_TEMPLATE, name) for name in sorted(have - named)]
    _say_scale_up(w, _scale_up_reason(g, obs.scale_ups), plan)


def _increments(w: Workload, obs: Observed, rules: GroupsAtThePod, g: gating.GatePlan, made: frozenset[str]
                ) -> list[Action]:
    """The groups of the pods released now that name one raygate has not made (a scale-up's increment, named by
    the pod webhook), made before their gates are lifted, with minCount = the pods released into them; and the
    increments none of whose pods is left."""
    releasing: dict[str, list[gating.Pod]] = {}
    for p, _ in g.release:
        if p.group is not None and p.group not in made:
            releasing.setdefault(p.group, []).append(p)
    running = Counter(p.group for p in obs.pods if p.group is not None and not p.gated and p.runs)
    out: list[Action] = [Create(kind, obj) for name, pods in sorted(releasing.items())
                         for kind, obj in rules.increment_objects(w, name, pods[0].pod_set, len(pods) + running[name],
                                                                  obs.served)]
    named = {p.group for p in obs.pods if p.gated or p.runs}
    out += [Delete(rules.kind_of(grp), _name(grp)) for grp in obs.groups
            if rules.is_increment(grp) and _name(grp) not in named and not _deleting(grp)]
    return out


def _desired(w: Workload, obs: Observed, policy: NamespacePolicy) -> dict[gating.Key, tuple[int, JSON, q.Resources]]:
    """Per (pod set, digest): the GPU pods the spec KubeRay runs now asks for, the template they are made
    from, and what each asks of the managed resources. A RayJob's pods come from KubeRay's cluster for
    it (a scale-up edits that cluster), and its submitter from the RayJob."""
    sources: list[tuple[Workload, Callable[[PodSet], bool]]] = [(w, lambda p: True)]
    if obs.cluster is not None:
        cluster = Workload(obs.cluster, w.claim_templates)
        sources = [(cluster, lambda p: True), (w, lambda p: p.name == keys.SUBMITTER_TASK)]
    out: dict[gating.Key, tuple[int, JSON, q.Resources]] = {}
    for source, wanted in sources:
        try:
            pod_sets = source.gang().pod_sets
        except ManifestError:
            continue  # unreadable now: its gated pods are booked as they are
        for p in pod_sets:
            managed = p.managed(policy.manages)
            if not wanted(p) or not managed or p.count == 0 or p.template_path is None:
                continue
            template = children.template_copy(get(source.obj, p.template_path) or {})
            key = (p.name, podgate.match_digest(template.get("spec"), managed))
            out[key] = (out.get(key, (0, template, managed))[0] + p.count, template, managed)
    return out


def _scale_up_reason(g: gating.GatePlan, scale_ups: tuple[JSON, ...]) -> str | None:
    """Why pods of the object wait for a booking, with the autoscaler's own word on their request."""
    if not g.waiting:
        return None
    parts = []
    for (pod_set, _), n in sorted(g.waiting.items()):
        requests = [r for r in scale_ups if get(r, ("metadata", "annotations", keys.SCALE_UP_ANNOTATION)) == pod_set
                    and not booking.provisioned(r)]
        said = [f"{_name(r)} {t}={c.status} ({c.reason}{': ' + c.message if c.message else ''})"
                for r in requests for t, c in conditions(r).items()
                if t in (booking.PROVISIONED, booking.FAILED) and c.reason]
        parts.append(f"{n} pod{'s' if n != 1 else ''} of pod set {pod_set} wait gated for a booking"
                     + (f": ProvisioningRequest {'; '.join(said)}" if said else
                        f" (ProvisioningRequest {', '.join(_name(r) for r in requests)})" if requests else ""))
    return "; ".join([*parts, *g.refused])[:1000]


def _say_scale_up(w: Workload, reason: str | None, plan: Plan) -> None:
    """The scale-up reason annotation on the object, and an Event, only when it changes."""
    if w.annotations.get(keys.SCALE_UP_REASON_ANNOTATION) == reason:
        return
    b = _builder(w)
    if reason is None:
        b.remove(_annotation(keys.SCALE_UP_REASON_ANNOTATION))
        plan.actions.append(_patch(b, Step.SCALE_UP))
        return
    b.set(_annotation(keys.SCALE_UP_REASON_ANNOTATION), reason)
    plan.actions += [_patch(b, Step.SCALE_UP),
                     Emit("ScaleUpWaiting", reason, warning=True,
                          name=children.event_name(w, "ScaleUpWaiting", reason))]


def _requeue(w: Workload, obs: Observed, rules: ObjectRules, name: str | None, why: str, event_reason: str,
             *, suspend: bool = False) -> Plan:
    """Back to Pending with the next attempt: the job waits for a new request, suspended."""
    attempt = (_int(w.annotations.get(keys.ATTEMPT_ANNOTATION)) or 1) + 1
    try:
        nxt = needs_of(w, rules).request_name(w, attempt)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    reason = f"{why}; {'suspended and ' if suspend else ''}queued again for capacity as {nxt}"
    b = _builder(w)
    if suspend:
        b.set(("spec", "suspend"), True)
    b.set(STATE_PATH, keys.State.PENDING.value)
    b.set(_annotation(keys.ATTEMPT_ANNOTATION), str(attempt))
    b.set(_annotation(keys.REQUEST_ANNOTATION), nxt)
    b.set(_annotation(keys.REASON_ANNOTATION), reason[:1000])
    b.remove(_annotation(keys.ADMITTED_AT_ANNOTATION))
    return Plan([_patch(b, Step.REQUEUE),
                 Emit(event_reason, reason, warning=True, name=children.event_name(w, event_reason, name or "")),
                 *_delete_requests(obs, keep=nxt)], outcome=Outcome.REQUEUED)


def _hold(w: Workload, reason: str, event_reason: str, plan: Plan, detail: str = "",
          annotations: Mapping[str, str] | None = None) -> None:
    """Keep the job held and say why: the reason annotation and one Event, only when it changes; `annotations`
    are recorded in the same patch (one is written alone only when it is missing or different)."""
    extra = dict(annotations or {})
    new_reason = w.annotations.get(keys.REASON_ANNOTATION) != reason
    if not new_reason and all(w.annotations.get(k) == v for k, v in extra.items()):
        return
    b = _builder(w)
    b.set(_annotation(keys.REASON_ANNOTATION), reason)
    for key, value in extra.items():
        b.set(_annotation(key), value)
    plan.actions.append(_patch(b, Step.HOLD))
    if new_reason:
        plan.actions.append(Emit(event_reason, reason, warning=True, name=children.event_name(w, event_reason, detail)))


# --- helpers -----------------------------------------------------------------------------------

def _int(text: object) -> int | None:
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value >= 1 else None


def _builder(w: Workload) -> PatchBuilder:
    """A patch that applies only while the job is in the state the decision was made on.

    It tests raygate's own fields (state, attempt, request) rather than the resourceVersion: KubeRay
    writes the status of a held job too, and that must not turn every first patch into a conflict
    (and an extra write); a competing reconciler, the only other writer of these fields, still fails
    the test.
    """
    b = PatchBuilder(w.obj)
    for path in (STATE_PATH, _annotation(keys.ATTEMPT_ANNOTATION), _annotation(keys.REQUEST_ANNOTATION)):
        value = get(w.obj, path)
        if value is not None:
            b.ops.append({"op": "test", "path": pointer(path), "value": value})
    return b


def _patch(b: PatchBuilder, step: Step) -> PatchJob:
    return PatchJob(tuple(b.ops), step)


def _delete_requests(obs: Observed, keep: str | None = None) -> list[Action]:
    """Every request but `keep`, except those pods still consume: a booking lives as long as its pods."""
    return [Delete(ChildKind.PROVISIONING_REQUEST, _name(r)) for r in obs.requests
            if _name(r) != keep and not obs.consumers.get(_name(r))]


def delete_all(obs: Observed) -> list[Action]:
    """The job's requests (scale-ups too) and templates, but for requests pods still consume and the
    templates they name (also what the controller deletes of the children of a job that is gone)."""
    every = [*obs.requests, *obs.scale_ups]
    kept = {t for r in every if obs.consumers.get(_name(r)) for t in _template_refs(r)}
    out = _delete_requests(obs)
    out += [Delete(ChildKind.PROVISIONING_REQUEST, _name(r)) for r in obs.scale_ups if not obs.consumers.get(_name(r))]
    out += [Delete(ChildKind.POD_TEMPLATE, _name(t)) for t in obs.templates if _name(t) not in kept]
    return out


def _template_refs(request: Mapping[str, Any]) -> set[str]:
    sets = get(request, ("spec", "podSets"))
    return {str(get(p, ("podTemplateRef", "name")) or "") for p in sets if isinstance(p, Mapping)} \
        if isinstance(sets, list) else set()


def booking_kept(obs: Observed) -> str:
    """What a job's deletes leave for its running pods, as a reason says it ("" when nothing)."""
    kept = sorted((_name(r), obs.consumers[_name(r)]) for r in (*obs.requests, *obs.scale_ups)
                  if obs.consumers.get(_name(r)))
    if not kept:
        return ""
    pods = sum(n for _, n in kept)
    return (f"; ProvisioningRequest {', '.join(n for n, _ in kept)} stays while {pods} of its pods "
            f"{'still run' if pods != 1 else 'still runs'}, and goes when they end")


def _name(obj: Mapping[str, Any]) -> str:
    return meta_str(obj, "name")


def _annotation(key: str) -> tuple[str, ...]:
    return ("metadata", "annotations", key)
