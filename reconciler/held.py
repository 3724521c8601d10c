"""The held job's state machine: Pending -> Provisioning -> Admitted, with retries, or Failed.

Per attempt n a job has one ProvisioningRequest, named `<job>-<hash>-a<n>`. The job's annotations say
which request is current; any other request the job owns is stale and is deleted. Pure: (job, observed
children, rules, now) -> plan.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from raygate.core import booking, identity, keys, limits, podgate, preemption
from raygate.core import quantity as q
from raygate.core.conditions import Condition, conditions
from raygate.core.keys import ChildKind
from raygate.core.modes import GroupRules, GroupSpec, GroupsWithPrerequisite, ObjectRules, Prerequisite
from raygate.core.objects import get
from raygate.core.patch import PatchBuilder, pointer
from raygate.core.policy import NamespacePolicy
from raygate.core.times import parse_time, precise_timestamp, timestamp
from raygate.core.workload import ManifestError, PodSet, Workload
from raygate.reconciler import children
from raygate.reconciler.children import BadInput
from raygate.reconciler.plan import (
    GENERATION_PATH,
    GROUP_GONE_RECHECK_SECONDS,
    STATE_PATH,
    Action,
    Create,
    Delete,
    Emit,
    Observed,
    Outcome,
    Plan,
    Preempt,
    Preempting,
    Step,
    annotation,
    builder,
    delete_requests,
    deleting,
    fail,
    hold,
    name_of,
    patch_step,
    positive_int,
)

PREREQUISITE_RECHECK_SECONDS = 10.0


# What a held job's request that ended did, by the condition that ended it (each of booking.ENDED).
ENDED_BEFORE_ADMISSION = {booking.FAILED: "failed",
                          booking.BOOKING_EXPIRED: "lost its booking before the job was admitted",
                          booking.CAPACITY_REVOKED: "lost its capacity before the job was admitted"}



@dataclass(frozen=True)
class Needs:
    """What one held job needs: the pod sets that go into a request, and its mode's group object (built by
    its ObjectRules.group).

    (Not workload.Gang, the whole gang of a job: these are the parts of it raygate books.)"""

    managed: tuple[PodSet, ...]
    provision: bool
    group: GroupSpec | None
    fingerprint: str = ""  # of the managed pod sets: what a request for them books

    def request_name(self, w: Workload, attempt: int, rounds: int = 0) -> str:
        return children.request_name(w, attempt, self.fingerprint, rounds)



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



def pending(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, version: str | None) -> Plan:
    policy = rules.policy
    try:
        needs = needs_of(w, rules)
        attempt, rounds = _pending_attempt(w), _rounds(w)
        name = needs.request_name(w, attempt, rounds)
        plan = Plan(delete_requests(obs, keep=name if needs.provision else None))
        if needs.group is not None and rules.group is not None:
            held = _ensure_group(w, obs, rules, needs.group, rules.group, plan)
            if held is not None:
                return held
        if not needs.provision:
            return _admit(w, plan, None, rules, needs, now)
        if obs.turn is not None and not obs.turn.may_ask:
            return _queued(w, obs, plan)
        plan.actions += _ensure_request(w, obs, policy, needs, attempt, version, rounds)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    b = builder(w)
    b.set(STATE_PATH, keys.State.PROVISIONING.value)
    b.set(annotation(keys.REQUEST_ANNOTATION), name)
    b.set(annotation(keys.ATTEMPT_ANNOTATION), str(attempt))
    counts = ", ".join(f"{p.name} x{p.count}" for p in needs.managed)
    b.set(annotation(keys.REASON_ANNOTATION), _where(obs) + f"waiting for ProvisioningRequest {name} "
          f"({policy.provisioning.class_name}; {counts}) to be Provisioned")
    b.remove(annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    # No Event for a plain wait: the state label and this reason say it, and at most 6 writes per
    # admitted job leave room for one normal Event (Admitted) with two GPU pod sets. Anything
    # unusual while held (no capacity, retries, a closed queue) gets a Warning Event; reaching the
    # front of its queue, one normal Event.
    plan.actions.append(patch_step(b, Step.PROVISIONING))
    if obs.turn is not None and obs.turn.front:
        plan.actions.append(_front_of_queue(w, obs))
    plan.requeue(policy.provisioning.provisioned_timeout_seconds)
    plan.outcome = Outcome.REQUESTED
    return plan



def _ensure_group(w: Workload, obs: Observed, rules: ObjectRules, spec: GroupSpec, group: GroupRules,
                  plan: Plan) -> Plan | None:
    """The held job's group objects (`group`: its rules.group): create what is missing (once the prerequisite
    is met), delete those made for its gang as it was before an edit. Returns the plan when the job must wait
    first."""
    if obs.served.known and not group.resources(obs.served):
        raise BadInput("; ".join(rules.mode_rules.cluster_problems(obs.served))
                       or f"this cluster serves no API for {', '.join(group.group_kinds)}")
    mine = [g for g in obs.groups if name_of(g) == spec.name]
    # Group objects are immutable where they are native: a job whose gang changed while held gets new ones.
    plan.actions += [Delete(group.kind_of(g), name_of(g)) for g in obs.groups
                     if name_of(g) != spec.name and not deleting(g)]
    if any(deleting(g) for g in mine):
        # Created again under the same name before it is gone, it would vanish under the job's pods.
        why = f"waiting for {spec.name}, which is being deleted, to go before it is made again"
        hold(w, why, "GroupDeleting", plan, spec.name)
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
            hold(w, problem, group.prerequisite_reason, plan, problem)
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
    attempt = positive_int(w.annotations.get(keys.ATTEMPT_ANNOTATION))
    if attempt and w.annotations.get(keys.REQUEST_ANNOTATION):
        return attempt
    return 1



def _ensure_request(w: Workload, obs: Observed, policy: NamespacePolicy, needs: Needs, attempt: int,
                    version: str | None, rounds: int = 0) -> list[Action]:
    """PodTemplates first (a request whose templates are missing fails), then the request."""
    if version is None:
        raise BadInput(f"this cluster serves no ProvisioningRequest API ({keys.PROVREQ_GROUP}): install the "
                       "cluster-autoscaler's CRD, or turn provisioning off for this namespace in raygate-config")
    actions: list[Action] = []
    have = obs.template_names()
    wanted = set()
    for p in needs.managed:
        t = children.pod_template(w, p, policy.manages)
        wanted.add(name_of(t))
        if name_of(t) not in have:
            actions.append(Create(ChildKind.POD_TEMPLATE, t))
    # Templates of pod sets as they were before an edit: no request needs them any more.
    actions += [Delete(ChildKind.POD_TEMPLATE, name) for name in sorted(have - wanted)]
    pr = children.provisioning_request(w, list(needs.managed), policy, attempt, version, needs.fingerprint, rounds)
    if obs.request(name_of(pr)) is None:
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
    b = builder(w)
    generation = get(w.obj, GENERATION_PATH)
    if generation is not None:
        b.ops.append({"op": "test", "path": pointer(GENERATION_PATH), "value": generation})
    if needs.group is not None and rules.group is not None:
        # In the patch that unsuspends: no pod of the job can ever be created without it.
        rules.group.admit(b, w, needs.group)
    # A RayCluster's pods, where they are gated: born gated from templates that say so, as the gate would leave
    # them, so that the API server calls no admission for them. (A RayJob's pods belong to the RayCluster KubeRay
    # makes for it, whose uid their record names and which does not exist yet.) Elsewhere the templates name the
    # booking, for the autoscaler to match the pods to it.
    uid = get(w.obj, ("metadata", "uid"))
    stamped = rules.gates_pods and w.kind == keys.RAYCLUSTER_KIND and isinstance(uid, str) and bool(uid)
    for p in needs.managed:
        if p.template_path is None:
            continue
        if stamped:
            record = identity.RayOwner(w.kind, w.name, str(uid), p.name).render()
            podgate.born_gated(b, get(w.obj, p.template_path) or {}, p.template_path, record)
        elif request is not None:
            b.set((*p.template_path, "metadata", "annotations", keys.CONSUME_ANNOTATION), request)
            b.set((*p.template_path, "metadata", "annotations", keys.CLASS_ANNOTATION),
                  rules.policy.provisioning.class_name)
    b.set(("spec", "suspend"), False)
    b.set(STATE_PATH, keys.State.ADMITTED.value)
    b.remove(annotation(keys.NEVER_FITS_ANNOTATION))
    b.remove(annotation(keys.PREEMPTED_BY_ANNOTATION))
    b.remove(annotation(keys.PREEMPTING_ANNOTATION))
    b.set(annotation(keys.ADMITTED_AT_ANNOTATION), timestamp(now))
    b.remove(annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    if request is not None:
        why = f"ProvisioningRequest {request} is Provisioned"
    elif needs.group is not None and rules.group is not None:
        why = rules.group.schedules(needs.group)
    elif needs.managed:
        why = "ProvisioningRequests are disabled for this namespace"
    else:
        why = f"no pod set requests {rules.policy.managed_names()}, so no capacity request was needed"
    b.set(annotation(keys.REASON_ANNOTATION), f"admitted: {why}")
    created = parse_time(get(w.obj, ("metadata", "creationTimestamp")))
    held = f" after {max((now - created).total_seconds(), 0):.0f}s held" if created else ""
    plan.actions += [
        patch_step(b, Step.ADMIT),
        Emit("Admitted", f"unsuspended{held}: {why}", name=children.event_name(w, "Admitted", request or "")),
    ]
    plan.outcome = Outcome.ADMITTED
    return plan



def provisioning(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime,
                  version: str | None) -> Plan:
    policy = rules.policy
    attempt = positive_int(w.annotations.get(keys.ATTEMPT_ANNOTATION))
    name = w.annotations.get(keys.REQUEST_ANNOTATION)
    if attempt is None or not name:
        return pending(w, obs, rules, now, version)  # annotations lost: begin again, as Pending
    try:
        needs = needs_of(w, rules)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    rounds = _rounds(w)
    if name != needs.request_name(w, attempt, rounds):
        return _replace(w, obs, rules, now, version, name)
    plan = Plan(delete_requests(obs, keep=name))
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
    if obs.turn is not None and not obs.turn.may_ask and (pr is None or not booking.provisioned(pr)):
        return _withdraw(w, obs, needs, attempt, rounds, "another job is ahead of it now")
    if pr is None:
        try:
            plan.actions += _ensure_request(w, obs, policy, needs, attempt, version, rounds)
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
        if _became_front(w, obs):  # the jobs ahead went just before its booking came
            plan.actions.append(_front_of_queue(w, obs))
        return _admit(w, plan, name, rules, needs, now)
    provisioned = cond.get(booking.PROVISIONED)
    if obs.turn is not None:
        return _waits_its_turn(w, obs, rules, now, plan, needs, (attempt, rounds), provisioned)
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
        hold(w, f"ProvisioningRequest {name} is not Provisioned ({provisioned.reason}){msg}", "WaitingForCapacity",
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
    plan = pending(w, obs, rules, now, version)
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
    b = builder(w)
    b.set(annotation(keys.ATTEMPT_ANNOTATION), str(attempt + 1))
    b.set(annotation(keys.REQUEST_ANNOTATION), nxt)
    b.remove(annotation(keys.ROUND_ANNOTATION))
    b.set(annotation(keys.NEXT_ATTEMPT_ANNOTATION), precise_timestamp(due))
    b.remove(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    reason = f"ProvisioningRequest {name} {why} ({detail}); attempt {attempt + 1} as {nxt} after {timestamp(due)}"
    b.set(annotation(keys.REASON_ANNOTATION), reason[:1000])
    # The patch comes first: if the reconciler dies before the delete, the stale request is deleted next time.
    plan.actions = [patch_step(b, Step.RETRY),
                    Emit("ProvisioningRetry", reason, warning=True, name=children.event_name(w, "Retry", name)),
                    *delete_requests(obs, keep=nxt)]
    plan.requeue(delay)
    plan.outcome = Outcome.RETRY
    return plan



def requeue(w: Workload, obs: Observed, rules: ObjectRules, name: str | None, why: str, event_reason: str,
             *, suspend: bool = False) -> Plan:
    """Back to Pending with the next attempt: the job waits for a new request, suspended."""
    attempt = (positive_int(w.annotations.get(keys.ATTEMPT_ANNOTATION)) or 1) + 1
    try:
        nxt = needs_of(w, rules).request_name(w, attempt)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    reason = f"{why}; {'suspended and ' if suspend else ''}queued again for capacity as {nxt}"
    b = builder(w)
    if suspend:
        b.set(("spec", "suspend"), True)
    b.set(STATE_PATH, keys.State.PENDING.value)
    b.set(annotation(keys.ATTEMPT_ANNOTATION), str(attempt))
    b.set(annotation(keys.REQUEST_ANNOTATION), nxt)
    b.set(annotation(keys.REASON_ANNOTATION), reason[:1000])
    b.remove(annotation(keys.ROUND_ANNOTATION))
    b.remove(annotation(keys.ADMITTED_AT_ANNOTATION))
    return Plan([patch_step(b, Step.REQUEUE),
                 Emit(event_reason, reason, warning=True, name=children.event_name(w, event_reason, name or "")),
                 *delete_requests(obs, keep=nxt)], outcome=Outcome.REQUEUED)


# --- the queue ---------------------------------------------------------------------------------------

def _rounds(w: Workload) -> int:
    """How often the current attempt's request was withdrawn or asked again by the job's queue."""
    if not w.annotations.get(keys.REQUEST_ANNOTATION):
        return 0
    return positive_int(w.annotations.get(keys.ROUND_ANNOTATION)) or 0


def _where(obs: Observed) -> str:
    """Where the job stands in its queue, as its reason starts (only what changes when the job's turn does)."""
    if obs.turn is None:
        return ""
    if obs.turn.front:
        return f"at the front of queue {obs.queue}: "
    return f"trying while the front of queue {obs.queue} waits: "


def _front_of_queue(w: Workload, obs: Observed) -> Emit:
    return Emit("FrontOfQueue", f"at the front of queue {obs.queue}: it asks the cluster-autoscaler for its gang "
                "first", name=children.event_name(w, "FrontOfQueue", w.uid))


def _became_front(w: Workload, obs: Observed) -> bool:
    """At the front of its queue now, and its reason does not say so yet: it asked while behind the front, and the
    jobs ahead went. (One FrontOfQueue Event each: its name is the job's.)"""
    return obs.turn is not None and obs.turn.front and \
        not str(w.annotations.get(keys.REASON_ANNOTATION) or "").startswith(_where(obs))


def _queued(w: Workload, obs: Observed, plan: Plan) -> Plan:
    """Not its turn: it waits, with no request out, behind the job right ahead of it. (Its position is computed
    when asked, `kubectl raygate status`: a queue that moves writes nothing to the jobs behind.)"""
    turn = obs.turn
    behind = turn.behind if turn is not None and turn.behind else "the jobs ahead of it"
    reason = f"waiting in queue {obs.queue} behind {behind}"
    if w.annotations.get(keys.REASON_ANNOTATION) != reason:
        b = builder(w)
        b.set(annotation(keys.REASON_ANNOTATION), reason)
        plan.actions.append(patch_step(b, Step.HOLD))
    plan.outcome = Outcome.QUEUED
    return plan


def _withdraw(w: Workload, obs: Observed, needs: Needs, attempt: int, rounds: int, why: str,
              b: PatchBuilder | None = None) -> Plan:
    """Its request goes, not Provisioned, and the job is Pending again (in the same attempt: it failed nothing).
    Its next request has a new name, so the autoscaler takes it as new, without the backoff of the old one."""
    nxt = needs.request_name(w, attempt, rounds + 1)
    b = b or builder(w)
    b.set(STATE_PATH, keys.State.PENDING.value)
    b.set(annotation(keys.REQUEST_ANNOTATION), nxt)
    b.set(annotation(keys.ROUND_ANNOTATION), str(rounds + 1))
    b.set(annotation(keys.REASON_ANNOTATION), f"in queue {obs.queue}: {why}")
    b.remove(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    return Plan([patch_step(b, Step.WITHDRAW), *delete_requests(obs, keep=nxt)], outcome=Outcome.WITHDRAWN)


def _waits_its_turn(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, plan: Plan, needs: Needs,
                    attempt_round: tuple[int, int], provisioned: Condition | None) -> Plan:
    """A queued job's request that is out and not Provisioned. Waiting is not failing: an answer "not now"
    (Provisioned=False) never gives up on the job. It asks again, with a new request, when capacity freed after
    that answer (the front asks first then), or when the answer is provisionedTimeoutSeconds old (so the
    autoscaler's backoff for one request never grows past it)."""
    attempt, rounds = attempt_round
    name = w.annotations.get(keys.REQUEST_ANNOTATION) or ""
    if keys.NEVER_FITS_ANNOTATION in w.annotations:
        plan.outcome = Outcome.WAITING  # out of the way, its request kept: the autoscaler tries it now and then
        return plan
    if provisioned is None or provisioned.true or not provisioned.reason:
        # Not answered yet: its turn at the autoscaler. Having become the front meanwhile, it says so with the answer
        # (below) or its admission: a patch of the reason now would cost a write per job in a burst.
        plan.outcome = Outcome.WAITING
        return plan
    # The pinned autoscaler writes its answer anew on every loop (a fresh lastTransitionTime), so how long the
    # job has waited counts from the first answer to this request, recorded on the job.
    answered = parse_time(provisioned.last_transition)
    since = not_provisioned_since(w, name) or now
    timeout = rules.policy.provisioning.provisioned_timeout_seconds
    stale = (now - since).total_seconds() >= timeout
    if (answered is not None and obs.freed and obs.freed > timestamp(answered)) or stale:
        return _withdraw(w, obs, needs, attempt, rounds, "capacity freed since the autoscaler's last answer: it "
                         "asks again" if not stale else f"asks again after {timeout:g}s without capacity")
    said = obs.said.get(name, "")
    if said and booking.never_fits(said):
        return _never_fits(w, obs, rules, name, said, plan)
    if obs.preempt is not None and obs.turn is not None and obs.turn.front and \
            (made_room := _preempt(w, obs, obs.preempt, rules, now, plan)) is not None:
        return made_room
    msg = f": {provisioned.message}" if provisioned.message else ""
    reason = _where(obs) + f"ProvisioningRequest {name} is not Provisioned ({provisioned.reason}){msg}; it waits " \
        "for capacity to free" + (f" (cluster-autoscaler: {said})" if said else "")
    recorded = f"{name} {precise_timestamp(since)}"
    before = str(w.annotations.get(keys.REASON_ANNOTATION) or "")
    if before != reason or w.annotations.get(keys.NOT_PROVISIONED_SINCE_ANNOTATION) != recorded:
        b = builder(w)
        b.set(annotation(keys.REASON_ANNOTATION), reason[:1000])
        b.set(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION), recorded)
        plan.actions.append(patch_step(b, Step.HOLD))
        if _became_front(w, obs):
            plan.actions.append(_front_of_queue(w, obs))
    plan.requeue(timeout - (now - since).total_seconds())
    plan.outcome = Outcome.WAITING
    return plan


def _preempt(w: Workload, obs: Observed, preempt: Preempting, rules: ObjectRules, now: dt.datetime,
             plan: Plan) -> Plan | None:
    """The front, answered "not now", in a queue that preempts: it suspends the fewest running jobs of lower
    priority whose bookings cover its gang, and asks again once their pods are gone (capacity freed). None: it
    waits as any front does (nobody to preempt, or it waits for those it preempted)."""
    at, before = preemption.recorded(str(w.annotations.get(keys.PREEMPTING_ANNOTATION) or ""))
    since = parse_time(at)
    freed = parse_time(obs.freed)
    # It waits for its victims' pods to go, however long KubeRay and the kubelets take: their room is on its way,
    # and suspending another job for it would stop one more for nothing. Then it waits for the autoscaler to see
    # the room (its first answers after that may still be "not now": its view of the nodes lags a loop or more),
    # at most provisionedTimeoutSeconds, after which it may preempt again. A victim that ran no pod frees
    # nothing: that wait counts from the preemption.
    # Its record names each victim's uid: a job made anew under a victim's name runs on its own booking, and its
    # pods are not the room the front is owed. (A record from before raygate recorded uids names jobs only.)
    going = [str(v.key) for v in before if preempt.going.get(v.key) and v.is_current(preempt.uids)]
    gone = freed is not None and since is not None and freed > since
    start = freed if gone else since
    timeout = rules.policy.provisioning.provisioned_timeout_seconds
    if since is not None and start is not None and (
            going or (left := timeout - (now - start).total_seconds()) > 0):
        victims = ", ".join(str(v.key) for v in before)
        hold(w, f"{_where(obs)}it preempted {victims} at {at} to make room; " + (
            f"it waits for the pods of {', '.join(going)} to go" if going else
            "their pods are gone, and it waits for the cluster-autoscaler to see the room" if gone else
            "it asks the cluster-autoscaler again when their pods are gone"), "Preempting", plan, at)
        plan.requeue(timeout if going else left)  # a pod going is an event too; this is the backstop
        plan.outcome = Outcome.WAITING
        return plan
    try:
        need = preemption.room(w, w.gang(), rules.policy.manages)
    except ManifestError:
        return None
    chosen = preemption.victims(preempt.priority, need, preempt.running, now, preempt.min_run_seconds)
    if not chosen:
        return None
    stamp = precise_timestamp(now)
    names = [str(v.key) for v in chosen]
    freeing = ", ".join(f"{r}={q.format_quantity(v)}" for r, v in sorted(preemption.totals([v.room for v in chosen])
                                                                          .items()))
    why = (f"{_where(obs)}the cluster-autoscaler has no room now: it preempted {', '.join(names)} (lower "
           f"priority; their bookings hold {freeing}) and asks again when their pods are gone")
    b = builder(w)
    b.set(annotation(keys.PREEMPTING_ANNOTATION), preemption.record(stamp, [v.id for v in chosen]))
    b.set(annotation(keys.REASON_ANNOTATION), why[:1000])
    suspend = ({"op": "test", "path": pointer(STATE_PATH), "value": keys.State.ADMITTED.value},
               {"op": "add", "path": "/spec/suspend", "value": True},
               {"op": "add", "path": pointer(annotation(keys.PREEMPTED_BY_ANNOTATION)),
                "value": preemption.preempted_by_record(preemption.JobId.of(w), stamp)})
    plan.actions += [patch_step(b, Step.HOLD), *(Preempt(v.key, suspend) for v in chosen),
                     Emit("Preempting", f"preempted {', '.join(names)} to make room for its gang",
                          name=children.event_name(w, "Preempting", stamp))]
    plan.outcome = Outcome.PREEMPTING
    return plan


def preempted(w: Workload, obs: Observed, rules: ObjectRules) -> Plan:
    """Suspended by raygate to make room for a job of higher priority: back in its queue (by its own priority and
    creation time, as any held job), behind that job, in the same attempt (it failed nothing); its booking goes
    when its pods have."""
    front, when = preemption.preempted_by(w.annotations.get(keys.PREEMPTED_BY_ANNOTATION, ""))
    who = str(front.key) if front is not None else "a job"
    try:
        needs = needs_of(w, rules)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    b = builder(w)
    b.remove(annotation(keys.ADMITTED_AT_ANNOTATION))
    why = f"preempted at {when} to make room for {who}, of higher priority; it waits in its queue again"
    obs = replace(obs, queue=rules.policy.queue)  # a running job is in no queue until it is held again
    plan = _withdraw(w, obs, needs, positive_int(w.annotations.get(keys.ATTEMPT_ANNOTATION)) or 1, _rounds(w),
                     why, b)
    plan.actions.append(Emit("Preempted", f"suspended to make room for {who}, of higher priority", warning=True,
                             name=children.event_name(w, "Preempted", when)))
    plan.outcome = Outcome.PREEMPTED
    return plan


def _never_fits(w: Workload, obs: Observed, rules: ObjectRules, name: str, said: str, plan: Plan) -> Plan:
    """The cluster-autoscaler says no node group could hold a pod of the job, as the node groups are. Its queue's
    `neverFits` says what then: Fail, or Hold it out of the way of the jobs behind, its request kept (the
    autoscaler keeps trying it, so a node group added or grown later still runs it)."""
    why = f"no node group of the cluster-autoscaler can hold its pods ({said})"
    if obs.never_fits is keys.NeverFits.FAIL:
        return fail(w, obs, rules, f"ProvisioningRequest {name}: {why}", event_reason="NeverFits",
                    restartable=True)
    b = builder(w)
    b.set(annotation(keys.NEVER_FITS_ANNOTATION), said[:500])
    b.set(annotation(keys.REASON_ANNOTATION), f"{why}; it stays held, out of the way of the jobs behind it in queue "
          f"{obs.queue}, until the node groups change or it is deleted")
    plan.actions += [patch_step(b, Step.HOLD),
                     Emit("NeverFits", f"{why}: held out of queue {obs.queue}'s way", warning=True,
                          name=children.event_name(w, "NeverFits", name))]
    plan.outcome = Outcome.WAITING
    return plan
