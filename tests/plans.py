"""A reconciler plan as a list of words, so a test can say in one line what raygate would do, and the job as the
plan's patches leave it."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from raygate.core.workload import Workload
from raygate.reconciler.decision import Create, Delete, Emit, PatchJob, Plan, ReleasePod


def kinds(plan: Plan) -> list[str]:
    out = []
    for a in plan.actions:
        if isinstance(a, Create):
            out.append(f"create {a.kind}")
        elif isinstance(a, Delete):
            out.append(f"delete {a.kind} {a.name}")
        elif isinstance(a, PatchJob):
            out.append(f"patch {a.step}")
        elif isinstance(a, Emit):
            out.append(f"event {a.reason}")
        elif isinstance(a, ReleasePod):
            out.append(f"release {a.name}")
    return out


def applied(w: Workload, plan: Plan) -> dict[str, Any]:
    """The job after the plan's patches, applied as the API server would."""
    obj = json.loads(json.dumps(w.obj))
    for a in plan.actions:
        if isinstance(a, PatchJob):
            obj = jsonpatch.apply_patch(obj, list(a.ops))
    return dict(obj)
