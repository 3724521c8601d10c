"""volcano mode: the PodGroup the webhook recorded (raygate.core.modes.volcano), created by the
reconciler and owned by the job.

Volcano rejects a PodGroup whose queue is missing or not Open, so the queue is checked first and a
job whose queue is not Open stays held with a reason naming the queue. The PodGroup carries the
name KubeRay's own Volcano integration uses (`ray-<name>-pg`): if that integration created it
already, the create answers AlreadyExists and raygate uses that group rather than making a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raygate.core import keys
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
