"""A reconciler plan as a list of words, so a test can say in one line what raygate would do, and the job as the
plan's patches leave it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import jsonpatch

from raygate.core import keys
from raygate.core.modes import for_object
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Workload
from raygate.reconciler import decision, needs
from raygate.reconciler.needs import Needs
from raygate.reconciler.plan import Create, Delete, Emit, Observed, PatchChild, PatchJob, Plan, Preempt, ReleasePod


def kinds(plan: Plan) -> list[str]:
    """Every action of the plan, in order, as a word or two: an exact assertion on it sees each one."""
    out = []
    for a in plan.actions:
        if isinstance(a, Create):
            out.append(f"create {a.kind}")
        elif isinstance(a, Delete):
            out.append(f"delete {a.kind} {a.name}")
        elif isinstance(a, PatchJob):
            out.append(f"patch {a.step}")
        elif isinstance(a, PatchChild):
            out.append(f"patch {a.kind} {a.name}")
        elif isinstance(a, Emit):
            out.append(f"event {a.reason}")
        elif isinstance(a, ReleasePod):
            out.append(f"release {a.name}")
        elif isinstance(a, Preempt):
            out.append(f"preempt {a.victim}")
        else:  # an action kind this does not know yet must not vanish from the words
            raise AssertionError(f"kinds() has no word for {a!r}")
    return out


def applied(w: Workload, plan: Plan) -> dict[str, Any]:
    """The job after the plan's patches, applied as the API server would."""
    obj = json.loads(json.dumps(w.obj))
    for a in plan.actions:
        if isinstance(a, PatchJob):
            obj = jsonpatch.apply_patch(obj, list(a.ops))
    return dict(obj)


def decide(w: Workload, obs: Observed, policy: NamespacePolicy, now: dt.datetime,
           provreq_version: str | None = keys.PROVREQ_VERSIONS[0]) -> Plan:
    """The reconciler's decision on `w` in a namespace with `policy`, its rules resolved as the controller does."""
    return decision.decide(w, obs, for_object(policy, w.annotations), now, provreq_version)


def needs_of(w: Workload, policy: NamespacePolicy) -> Needs:
    return needs.needs_of(w, for_object(policy, w.annotations))
