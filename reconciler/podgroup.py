"""volcano mode: the PodGroup the webhook recorded (raygate.core.modes.volcano), created by the
reconciler and owned by the job.

Volcano rejects a PodGroup whose queue is missing or not Open, so the queue is checked first and a
job whose queue is not Open stays held with a reason naming the queue.

The PodGroup carries the name KubeRay's own Volcano integration uses (`ray-<name>-pg`), so the two
never make two groups for one job. They cannot share one either: with the operator flag
`--batch-scheduler=volcano`, KubeRay updates any PodGroup of that name to its own minMember and
minResources once the job runs (v1.6 leaves init containers, pod overhead and its autoscaler
sidecar out of minResources; v1.7 also resets the group when a job is suspended), so Volcano would
no longer schedule the gang raygate admitted. raygate does not fight over the object: `drift` finds
the rewrite, and the reconciler stops the job with the reason (decision.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raygate.core import keys
from raygate.core import quantity as q
from raygate.core.modes.volcano import PodGroupSpec
from raygate.core.workload import JSON, Workload, get
from raygate.reconciler.children import child_metadata

OPEN = "Open"


@dataclass(frozen=True)
class QueueState:
    name: str
    state: str | None  # status.state; None when the Queue does not exist

    @property
    def open(self) -> bool:
        return self.state == OPEN

    def why_closed(self) -> str:
        if self.state is None:
            return f"Volcano queue {self.name} does not exist; create it or set queueName in raygate-config"
        return f"Volcano queue {self.name} is {self.state or 'not reported by Volcano'}, not {OPEN}"


def queue_state(name: str, queue: Mapping[str, Any] | None) -> QueueState:
    if queue is None:
        return QueueState(name, None)
    return QueueState(name, str(get(queue, ("status", "state")) or ""))


def pod_group(w: Workload, spec: PodGroupSpec) -> JSON:
    return {
        "apiVersion": f"{keys.VOLCANO_GROUP}/{keys.VOLCANO_VERSION}",
        "kind": "PodGroup",
        "metadata": child_metadata(w, spec.name),
        "spec": spec.spec,
    }


def _resources(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    try:
        return {str(k): q.parse(v) for k, v in value.items()}
    except q.QuantityError:
        return None


def drift(recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """What a PodGroup's spec says differently from the spec raygate recorded for it: the fields that
    decide the gang, with quantities compared by value (another writer may spell them otherwise)."""
    out = []
    for key in ("minMember", "queue"):
        if recorded.get(key) != actual.get(key):
            out.append(f"{key} {recorded.get(key)} -> {actual.get(key)}")
    if (recorded.get("minTaskMember") or {}) != (actual.get("minTaskMember") or {}):
        out.append(f"minTaskMember {recorded.get('minTaskMember') or {}} -> {actual.get('minTaskMember') or {}}")
    want, have = _resources(recorded.get("minResources")), _resources(actual.get("minResources"))
    if want != have:
        out.append(f"minResources {dict(recorded.get('minResources') or {})} -> {actual.get('minResources')}")
    return out
