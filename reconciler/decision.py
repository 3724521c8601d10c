"""The reconciler's decision, as a pure function: (job, its observed children, its rules, now) -> plan.

Level-triggered: everything it needs is on the job (state label and annotations) or among the
children the cluster holds, so a reconciler restarted at any instant decides the same thing again.
A held job goes through the state machine in held.py; an admitted one through its pod gate and
scale-ups in admitted.py; what both return and share is in plan.py.
"""

from __future__ import annotations

import datetime as dt

from raygate.core import keys
from raygate.core.modes import ObjectRules
from raygate.core.objects import get
from raygate.core.workload import Workload
from raygate.reconciler.admitted import admitted
from raygate.reconciler.held import pending, provisioning
from raygate.reconciler.plan import Delete, Observed, Outcome, Plan, delete_all, deleting, fail, name_of, stopped_groups


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
            actions += [Delete(group.kind_of(g), name_of(g)) for g in obs.groups if not deleting(g)]
        return Plan(actions, outcome=Outcome.CLEANUP if actions else Outcome.FINISHED)
    if state == keys.State.PENDING:
        return pending(w, obs, rules, now, provreq_version)
    if state == keys.State.PROVISIONING:
        return provisioning(w, obs, rules, now, provreq_version)
    if state == keys.State.ADMITTED:
        return admitted(w, obs, rules, now, provreq_version)
    if state == keys.State.FAILED:
        # finishes a give-up interrupted before its deletes
        actions = [*delete_all(obs), *stopped_groups(obs, rules.group)]
        return Plan(actions, outcome=Outcome.CLEANUP if actions else Outcome.FAILED)
    return Plan(outcome=Outcome.UNKNOWN_STATE)
