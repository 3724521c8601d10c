"""The held job's state machine: Pending -> Provisioning -> Admitted, with retries, or Failed.

Per attempt n a job has one ProvisioningRequest, named `<job>-<hash>-a<n>`. The job's annotations say
which request is current; any other request the job owns is stale and is deleted. What the job books is
needs.py's; what its turn in its queue makes it do (wait, withdraw, preempt), queue_turn.py's. Pure: (job,
observed children, rules, now) -> plan.
"""

from __future__ import annotations

import datetime as dt

from raygate.core import booking, identity, keys, podgate
from raygate.core.conditions import Condition, conditions
from raygate.core.keys import ChildKind
from raygate.core.modes import GroupRules, GroupSpec, GroupsWithPrerequisite, ObjectRules, Prerequisite
from raygate.core.objects import get
from raygate.core.patch import pointer
from raygate.core.policy import NamespacePolicy
from raygate.core.times import parse_time, precise_timestamp, timestamp
from raygate.core.workload import ManifestError, Workload
from raygate.reconciler import children
from raygate.reconciler.children import BadInput
from raygate.reconciler.needs import Needs, needs_of
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
from raygate.reconciler.queue_turn import (
    became_front,
    front_of_queue,
    not_provisioned_since,
    queued,
    round_of,
    waits_its_turn,
    where,
    withdraw,
)

PREREQUISITE_RECHECK_SECONDS = 10.0


# What a held job's request that ended did, by the condition that ended it (each of booking.ENDED).
ENDED_BEFORE_ADMISSION = {booking.FAILED: "failed",
                          booking.BOOKING_EXPIRED: "lost its booking before the job was admitted",
                          booking.CAPACITY_REVOKED: "lost its capacity before the job was admitted"}


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
        attempt, rounds = _pending_attempt(w), round_of(w)
        name = needs.request_name(w, attempt, rounds)
        plan = Plan(delete_requests(obs, keep=name if needs.provision else None))
        if needs.group is not None and rules.group is not None:
            held = _ensure_group(w, obs, rules, needs.group, rules.group, plan)
            if held is not None:
                return held
        if not needs.provision:
            return _admit(w, plan, None, rules, needs, now)
        if obs.turn is not None and not obs.turn.may_ask:
            return queued(w, obs, plan)
        plan.actions += _ensure_request(w, obs, policy, needs, attempt, version, rounds)
    except BadInput as err:
        return fail(w, obs, rules, str(err))
    b = builder(w)
    b.set(STATE_PATH, keys.State.PROVISIONING.value)
    b.set(annotation(keys.REQUEST_ANNOTATION), name)
    b.set(annotation(keys.ATTEMPT_ANNOTATION), str(attempt))
    counts = ", ".join(f"{p.name} x{p.count}" for p in needs.managed)
    b.set(annotation(keys.REASON_ANNOTATION), where(obs) + f"waiting for ProvisioningRequest {name} "
          f"({policy.provisioning.class_name}; {counts}) to be Provisioned")
    b.remove(annotation(keys.NEXT_ATTEMPT_ANNOTATION))
    b.remove(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION))
    # No Event for a plain wait: the state label and this reason say it, and at most 6 writes per
    # admitted job leave room for one normal Event (Admitted) with two GPU pod sets. Anything
    # unusual while held (no capacity, retries, a closed queue) gets a Warning Event; reaching the
    # front of its queue, one normal Event.
    plan.actions.append(patch_step(b, Step.PROVISIONING))
    if obs.turn is not None and obs.turn.front:
        plan.actions.append(front_of_queue(w, obs))
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
    b.remove(annotation(keys.RESUMED_AT_ANNOTATION))  # a run before this one's
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
    rounds = round_of(w)
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
        return withdraw(w, obs, needs, attempt, rounds, "another job is ahead of it now")
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
        if became_front(w, obs):  # the jobs ahead went just before its booking came
            plan.actions.append(front_of_queue(w, obs))
        return _admit(w, plan, name, rules, needs, now)
    provisioned = cond.get(booking.PROVISIONED)
    if obs.turn is not None:
        return waits_its_turn(w, obs, rules, now, plan, needs, (attempt, rounds), provisioned)
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
    b.remove(annotation(keys.RESUMED_AT_ANNOTATION))
    return Plan([patch_step(b, Step.REQUEUE),
                 Emit(event_reason, reason, warning=True, name=children.event_name(w, event_reason, name or "")),
                 *delete_requests(obs, keep=nxt)], outcome=Outcome.REQUEUED)
