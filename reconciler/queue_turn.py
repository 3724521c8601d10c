"""A held job's turn in its queue: whether it waits with no request out, withdraws its request for the job
ahead, asks again when capacity freed, preempts for its gang, or is held out of the way when no node group
can hold it. The part of the held job's state machine (held.py) that the queue decides. Pure."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from raygate.core import booking, keys, preemption
from raygate.core import quantity as q
from raygate.core.conditions import Condition
from raygate.core.modes import ObjectRules
from raygate.core.patch import PatchBuilder, pointer
from raygate.core.times import parse_time, precise_timestamp, timestamp
from raygate.core.workload import ManifestError, Workload
from raygate.reconciler import children
from raygate.reconciler.children import BadInput
from raygate.reconciler.needs import Needs, needs_of
from raygate.reconciler.plan import (
    STATE_PATH,
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
    fail,
    hold,
    patch_step,
    positive_int,
)


def not_provisioned_since(w: Workload, request: str) -> dt.datetime | None:
    """When the autoscaler first answered `request` not Provisioned, as recorded on the job (None: not yet)."""
    name, _, when = str(w.annotations.get(keys.NOT_PROVISIONED_SINCE_ANNOTATION) or "").partition(" ")
    return parse_time(when) if name == request else None


def round_of(w: Workload) -> int:
    """How often the current attempt's request was withdrawn or asked again by the job's queue."""
    if not w.annotations.get(keys.REQUEST_ANNOTATION):
        return 0
    return positive_int(w.annotations.get(keys.ROUND_ANNOTATION)) or 0


def where(obs: Observed) -> str:
    """Where the job stands in its queue, as its reason starts (only what changes when the job's turn does)."""
    if obs.turn is None:
        return ""
    if obs.turn.front:
        return f"at the front of queue {obs.queue}: "
    return f"trying while the front of queue {obs.queue} waits: "


def front_of_queue(w: Workload, obs: Observed) -> Emit:
    return Emit("FrontOfQueue", f"at the front of queue {obs.queue}: it asks the cluster-autoscaler for its gang "
                "first", name=children.event_name(w, "FrontOfQueue", w.uid))


def became_front(w: Workload, obs: Observed) -> bool:
    """At the front of its queue now, and its reason does not say so yet: it asked while behind the front, and the
    jobs ahead went. (One FrontOfQueue Event each: its name is the job's.)"""
    return obs.turn is not None and obs.turn.front and \
        not str(w.annotations.get(keys.REASON_ANNOTATION) or "").startswith(where(obs))


def queued(w: Workload, obs: Observed, plan: Plan) -> Plan:
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


def withdraw(w: Workload, obs: Observed, needs: Needs, attempt: int, rounds: int, why: str,
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


def waits_its_turn(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, plan: Plan, needs: Needs,
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
        return withdraw(w, obs, needs, attempt, rounds, "capacity freed since the autoscaler's last answer: it "
                         "asks again" if not stale else f"asks again after {timeout:g}s without capacity")
    said = obs.said.get(name, "")
    if said and booking.never_fits(said):
        return _never_fits(w, obs, rules, name, said, plan)
    if obs.preempt is not None and obs.turn is not None and obs.turn.front and \
            (made_room := _preempt(w, obs, obs.preempt, rules, now, plan)) is not None:
        return made_room
    msg = f": {provisioned.message}" if provisioned.message else ""
    reason = where(obs) + f"ProvisioningRequest {name} is not Provisioned ({provisioned.reason}){msg}; it waits " \
        "for capacity to free" + (f" (cluster-autoscaler: {said})" if said else "")
    recorded = f"{name} {precise_timestamp(since)}"
    before = str(w.annotations.get(keys.REASON_ANNOTATION) or "")
    if before != reason or w.annotations.get(keys.NOT_PROVISIONED_SINCE_ANNOTATION) != recorded:
        b = builder(w)
        b.set(annotation(keys.REASON_ANNOTATION), reason[:1000])
        b.set(annotation(keys.NOT_PROVISIONED_SINCE_ANNOTATION), recorded)
        plan.actions.append(patch_step(b, Step.HOLD))
        if became_front(w, obs):
            plan.actions.append(front_of_queue(w, obs))
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
        hold(w, f"{where(obs)}it preempted {victims} at {at} to make room; " + (
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
    why = (f"{where(obs)}the cluster-autoscaler has no room now: it preempted {', '.join(names)} (lower "
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
    b.remove(annotation(keys.RESUMED_AT_ANNOTATION))
    why = f"preempted at {when} to make room for {who}, of higher priority; it waits in its queue again"
    obs = replace(obs, queue=rules.policy.queue)  # a running job is in no queue until it is held again
    plan = withdraw(w, obs, needs, positive_int(w.annotations.get(keys.ATTEMPT_ANNOTATION)) or 1, round_of(w),
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
