"""The validating guard on UPDATE: what an untrusted user may not change on a Ray object raygate gates.

It covers every state, because each one is a way in: a held job must not be unsuspended or have
raygate's record of it edited; an admitted one must not grow past the capacity booked for it (KubeRay
would create the extra GPU pods at once); a failed one must not be unsuspended by hand; one that
predates raygate in its namespace has no booking at all, so it may not start or grow either.

Pure, like the rest of the decision: it compares the old and new objects and nothing else.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from raygate.core import keys
from raygate.core import quantity as q
from raygate.core.modes import ModeRules, decided_labels, template_annotations
from raygate.core.objects import get
from raygate.core.workload import ManifestError, Workload

# The queue labels raygate decides on, in any mode; a user may not pick their own queue past it.
QUEUE_LABELS = decided_labels()
# What raygate writes into pod templates (scheduler metadata, the booking its pods consume).
SCHEDULING_ANNOTATIONS = template_annotations()
# The one edit of raygate's record a user may make: start a failed job over.
RETRY = (keys.State.FAILED.value, keys.State.PENDING.value)

Envelope = dict[str, tuple[int, dict[str, Decimal]]]  # GPU pod set -> (most pods, managed request per pod)


def raygate_owned(key: str) -> bool:
    return key.startswith(keys.DOMAIN + "/")


def _guarded_keys(w: Workload) -> dict[str, Any]:
    """raygate's own labels and annotations plus the queue labels it decides on."""
    out: dict[str, Any] = {}
    for kind, found in (("label", w.labels), ("annotation", w.annotations)):
        for k, v in found.items():
            if raygate_owned(k) or k in QUEUE_LABELS:
                out[f"{kind} {k}"] = v
    return out


def _scheduling_metadata(w: Workload) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, path in w.template_paths():
        found = {"schedulerName": get(w.obj, (*path, "spec", "schedulerName"))}
        for a in SCHEDULING_ANNOTATIONS:
            found[a] = get(w.obj, (*path, "metadata", "annotations", a))
        # Only what is set: a worker group added without any of it changes no scheduling metadata.
        out.update({f"{path} {k}": v for k, v in found.items() if v is not None})
    return out


def envelope(w: Workload, managed: list[str]) -> Envelope:
    """The most pods KubeRay (and, under autoscaling, the Ray autoscaler) can run per GPU pod set."""
    if w.uses_cluster_selector:
        return {}  # runs on an existing cluster: KubeRay creates no pods of a gang for it
    out: Envelope = {}
    for p in w.gang().pod_sets:
        per_pod = {r: p.per_pod[r] for r in managed if p.per_pod.get(r, Decimal(0)) > 0}
        if per_pod and p.ceiling > 0:
            out[p.name] = (p.ceiling, per_pod)
    return out


def growth(old: Workload, new: Workload, managed: list[str]) -> list[str]:
    """How `new` could run more managed capacity than `old`: more pods, more per pod, new sets."""
    before, after = envelope(old, managed), envelope(new, managed)
    out = []
    for name, (pods, per_pod) in after.items():
        if name not in before:
            what = ", ".join(f"{q.format_quantity(v, binary=q.is_binary(r))} {r}" for r, v in per_pod.items())
            out.append(f"add pod set {name} with {pods} pod{'s' if pods != 1 else ''} requesting {what}")
            continue
        was_pods, was_per_pod = before[name]
        if pods > was_pods:
            out.append(f"grow pod set {name} from {was_pods} to {pods} pods")
        for r, v in per_pod.items():
            was = was_per_pod.get(r, Decimal(0))
            if v > was:
                out.append(f"raise {r} per pod of pod set {name} from {q.format_quantity(was)} to "
                           f"{q.format_quantity(v)}")
    return out


def forbidden_changes(old: Workload, new: Workload, mode: ModeRules, managed: list[str]) -> list[str]:
    """What this update would do that an untrusted user may not, each phrased after "You may not"."""
    state = old.labels.get(keys.STATE_LABEL)
    changed = []
    if old.suspended and not new.suspended:
        changed.append("unsuspend it")
    before, after = _guarded_keys(old), _guarded_keys(new)
    for k in sorted(set(before) | set(after)):
        if before.get(k) == after.get(k):
            continue
        if k == f"label {keys.STATE_LABEL}" and (before.get(k), after.get(k)) == RETRY and new.suspended:
            continue
        changed.append(f"{'remove' if k not in after else 'add' if k not in before else 'change'} {k}")
    try:
        if _scheduling_metadata(old) != _scheduling_metadata(new):
            changed.append("change the scheduling metadata of its pod templates")
        if state in keys.HELD_STATES:
            changed += mode.held_changes(old, new)
        elif state != keys.State.FAILED:  # admitted, or never held: nothing may outgrow what runs now
            changed += growth(old, new, managed)
    except ManifestError as err:
        changed.append(f"make it unreadable ({err})")
    return changed


def refusal(w: Workload, old: Workload, namespace: str, changes: list[str]) -> str:
    """The message for a refused update: what raygate knows of the object, and what the user can do."""
    state = old.labels.get(keys.STATE_LABEL)
    reason = old.annotations.get(keys.REASON_ANNOTATION)
    ref = f"{w.kind} {w.name}"
    look = (f"See why with `kubectl describe {w.kind.lower()} {w.name} -n {namespace}` or "
            f"`kubectl raygate status -n {namespace}`")
    you_may_not = f"You may not {', '.join(changes)}"
    if state in keys.HELD_STATES:
        return (f"{ref} is held by raygate (state {state}) while it waits for capacity"
                + (f": {reason}" if reason else "")
                + f". {you_may_not} meanwhile. {look}; delete and re-create the job to change it")
    if state == keys.State.ADMITTED:
        return (f"{ref} runs on the capacity raygate booked for it (state {state}). {you_may_not}: KubeRay would "
                "start GPU pods nobody booked. To run a larger gang, delete it and create it again with the new "
                "spec: raygate books the whole gang before it starts")
    if state == keys.State.FAILED:
        restart = (f"kubectl label {w.kind.lower()} {w.name} -n {namespace} "
                   f"{keys.STATE_LABEL}={keys.State.PENDING.value} --overwrite")
        return (f"raygate gave up on {ref} (state {state})" + (f": {reason}" if reason else "")
                + f". {you_may_not}. To try again, run: {restart}")
    return (f"{ref} was created before raygate gated namespace {namespace}, so no capacity is booked for it. "
            f"{you_may_not}. Delete it and create it again: raygate then books its whole gang before it starts")
