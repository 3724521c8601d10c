"""The admitted object's loop: its gated pods released into the slots its bookings hold, what the spec asks
beyond them booked as scale-ups, its group objects kept, and a lost booking or a suspension sent back to the
held job's state machine (held.py). Pure: (job, observed children and pods, rules, now) -> plan.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Mapping

from raygate.core import booking, keys, podgate
from raygate.core import quantity as q
from raygate.core.conditions import conditions
from raygate.core.keys import ChildKind
from raygate.core.modes import GroupsAtThePod, GroupsWithDrift, ObjectRules
from raygate.core.objects import JSON, get
from raygate.core.policy import CapacityRevokedAction, NamespacePolicy
from raygate.core.times import timestamp
from raygate.core.workload import ManifestError, PodSet, Workload
from raygate.reconciler import children, gating
from raygate.reconciler.held import requeue
from raygate.reconciler.plan import (
    GENERATION_PATH,
    GROUP_GONE_RECHECK_SECONDS,
    Action,
    Create,
    Delete,
    Emit,
    Observed,
    Outcome,
    PatchChild,
    Plan,
    ReleasePod,
    Step,
    annotation,
    builder,
    delete_requests,
    deleting,
    fail,
    hold,
    name_of,
    patch_step,
    template_refs,
)
from raygate.reconciler.queue_turn import preempted


def admitted(w: Workload, obs: Observed, rules: ObjectRules, now: dt.datetime, version: str | None) -> Plan:
    if (rewritten := _group_rewritten(w, obs, rules)) is not None:
        return rewritten
    name = w.annotations.get(keys.REQUEST_ANNOTATION)
    plan = Plan(delete_requests(obs, keep=name), outcome=Outcome.ADMITTED)
    if w.suspended and keys.PREEMPTED_BY_ANNOTATION in w.annotations:
        return preempted(w, obs, rules)
    if w.suspended:
        # Suspended by a user after admission: its pods are gone, and so will its booking be before it
        # could start again. It waits for capacity anew, as any held job.
        return requeue(w, obs, rules, name, "was suspended after admission", "Requeued")
    if rules.gates_pods:
        _gate(w, obs, rules, plan, version, now)
    else:
        _ungate(w, obs, plan)
    _note_resumed(w, plan, now)
    pr = obs.request(name) if name else None
    revoked = conditions(pr).get(booking.CAPACITY_REVOKED) if pr is not None else None
    if revoked is None or not revoked.true or name is None:
        return plan
    detail = f"{revoked.reason}: {revoked.message}" if revoked.message else revoked.reason
    if rules.policy.provisioning.capacity_revoked is CapacityRevokedAction.REPORT:
        hold(w, f"capacity of ProvisioningRequest {name} was revoked ({detail}); the job keeps running",
              "CapacityRevoked", plan, name)
        plan.outcome = Outcome.REVOKED_REPORTED
        return plan
    return requeue(w, obs, rules, name, f"lost the capacity of ProvisioningRequest {name} ({detail})",
                    "CapacityRevoked", suspend=True)



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
    group = next((g for g in obs.groups if name_of(g) == spec.name), None)
    changes = drifts.drift(spec, group) if group is not None else []
    if not changes or group is None:
        return None
    plan = fail(w, obs, rules, drifts.rewritten(spec, changes), event_reason=drifts.rewritten_reason, suspend=True)
    plan.actions.append(Delete(drifts.kind_of(group), spec.name))
    plan.outcome = Outcome.GROUP_REWRITTEN
    return plan



def _note_resumed(w: Workload, plan: Plan, now: dt.datetime) -> None:
    """Note when KubeRay took up the unsuspend of an admitted RayCluster, once per admission.

    The note is also a wake-up. KubeRay's reconcile that sees the unsuspend of a cluster it had suspended only
    clears its Suspended condition; having written its status, it creates the pods on its next pass, which its
    2 s requeue schedules. Its watch passes annotation changes, so this write starts that pass at once.
    """
    if w.kind != keys.RAYCLUSTER_KIND or keys.RESUMED_AT_ANNOTATION in w.annotations:
        return
    suspended = conditions(w.obj).get(keys.RAYCLUSTER_SUSPENDED_CONDITION)
    seen = get(w.obj, ("status", "observedGeneration")) == get(w.obj, GENERATION_PATH)
    if (suspended is None or suspended.true or not seen
            or get(w.obj, ("status", "state")) != keys.RAYCLUSTER_SUSPENDED_STATE):
        return
    b = builder(w)
    b.set(annotation(keys.RESUMED_AT_ANNOTATION), timestamp(now))
    plan.actions.append(patch_step(b, Step.RESUMED))


def _ungate(w: Workload, obs: Observed, plan: Plan) -> None:
    """Admitted where pods are not gated (its namespace's config changed since): its gated pods need no booking
    here, so their gate is lifted, and its pod templates no longer make new pods gated."""
    plan.actions += [ReleasePod(p.name, tuple(podgate.release_ops(p.obj, None, None))) for p in obs.pods if p.gated]
    b = builder(w)
    tests = len(b.ops)
    for _, path in w.template_paths():
        template = get(w.obj, path)
        if isinstance(template, Mapping):
            podgate.unstamp(b, template, path)
    if len(b.ops) > tests:
        plan.actions.append(patch_step(b, Step.UNGATE))


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
    made = frozenset(name_of(g) for g in obs.groups if not deleting(g))
    closing = frozenset(name_of(g) for g in obs.groups if deleting(g))
    g = gating.plan(obs.pods, obs.requests, obs.scale_ups, obs.templates,
                    desired={key: count for key, (count, _, _) in desired.items()},
                    room=policy.limits.max_pods - booked, most_per_request=policy.limits.max_request_pods,
                    most_pending=policy.limits.max_pending_scale_ups,
                    made=made if at_pod is not None else None, closing=closing, now=now)
    if g.gathering is not None:
        plan.requeue(g.gathering)  # the rest of the pod set may not come: its pods go when the wait ends
    if at_pod is not None:
        plan.actions += _increments(w, obs, at_pod, g, made)
        plan.actions += [PatchChild(at_pod.kind_of(grp), name_of(grp), tuple(ops)) for grp in obs.groups
                         if not deleting(grp) and (ops := at_pod.marks(grp, obs.bound.get(name_of(grp), {})))]
        if any(p.group in closing for p in obs.pods if p.gated):
            plan.requeue(GROUP_GONE_RECHECK_SECONDS)  # its pods are released into the group made again
    classes = {name_of(r): str(get(r, ("spec", "provisioningClassName")) or "") for r in every}
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
        named.add(name_of(template))
        if name_of(template) not in have:
            plan.actions.append(Create(ChildKind.POD_TEMPLATE, template))
        request = children.scale_up_request(w, pod_set, name_of(template), count, existing, policy, version)
        if name_of(request) not in classes:
            plan.actions.append(Create(ChildKind.PROVISIONING_REQUEST, request))
    plan.actions += [PatchChild(ChildKind.PROVISIONING_REQUEST, name_of(r), tuple(booking.consumed_ops(r, now)),
                                status=True) for r in every if name_of(r) in g.consumed]
    deleted = {name for name in g.delete if not obs.consumers.get(name)}
    plan.actions += [Delete(ChildKind.PROVISIONING_REQUEST, name) for name in sorted(deleted)]
    # A PodTemplate goes with the last request that names it: none is left for requests replaced or deleted.
    named |= {t for r in every if name_of(r) not in deleted for t in template_refs(r)}
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
    out += [Delete(rules.kind_of(grp), name_of(grp)) for grp in obs.groups
            if rules.is_increment(grp) and name_of(grp) not in named and not deleting(grp)]
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
        said = [f"{name_of(r)} {t}={c.status} ({c.reason}{': ' + c.message if c.message else ''})"
                for r in requests for t, c in conditions(r).items()
                if t in (booking.PROVISIONED, booking.FAILED) and c.reason]
        parts.append(f"{n} pod{'s' if n != 1 else ''} of pod set {pod_set} wait gated for a booking"
                     + (f": ProvisioningRequest {'; '.join(said)}" if said else
                        f" (ProvisioningRequest {', '.join(name_of(r) for r in requests)})" if requests else ""))
    return "; ".join([*parts, *g.refused])[:1000]



def _say_scale_up(w: Workload, reason: str | None, plan: Plan) -> None:
    """The scale-up reason annotation on the object, and an Event, only when it changes."""
    if w.annotations.get(keys.SCALE_UP_REASON_ANNOTATION) == reason:
        return
    b = builder(w)
    if reason is None:
        b.remove(annotation(keys.SCALE_UP_REASON_ANNOTATION))
        plan.actions.append(patch_step(b, Step.SCALE_UP))
        return
    b.set(annotation(keys.SCALE_UP_REASON_ANNOTATION), reason)
    plan.actions += [patch_step(b, Step.SCALE_UP),
                     Emit("ScaleUpWaiting", reason, warning=True,
                          name=children.event_name(w, "ScaleUpWaiting", reason))]
