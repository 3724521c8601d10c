"""kueue mode: label the job for its LocalQueue and refuse what Kueue cannot run.

Kueue owns spec.suspend here, so raygate never touches it and never marks the job as held. Kueue's
own webhook suspends a job that carries its queue label, but only if the API server calls it after
raygate's; the validating webhook refuses a job that arrives unsuspended (decision.py says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raygate.core import keys, queue_labels
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, Workload

if TYPE_CHECKING:
    from raygate.core.modes.volcano import PodGroupSpec

HOLDS = False  # Kueue admits: raygate labels and validates, and never touches spec.suspend


def refusals(w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
    out = []
    groups = w.worker_groups()
    if len(groups) > keys.KUEUE_MAX_WORKER_GROUPS:
        out.append(
            f"Kueue runs at most {keys.KUEUE_MAX_WORKER_GROUPS} worker groups and this has {len(groups)}: "
            "merge worker groups"
        )
    if any(g.get("groupName") == "head" for _, g in groups):
        out.append('a worker group is named "head", which Kueue reserves for the head pod: rename it')
    if w.autoscaling and w.annotations.get(keys.KUEUE_ELASTIC_ANNOTATION) != "true":
        out.append(
            "Kueue admits in-tree autoscaling only for elastic jobs: set enableInTreeAutoscaling: false, "
            f'or add annotation {keys.KUEUE_ELASTIC_ANNOTATION}: "true" if your Kueue enables elastic jobs'
        )
    if not queue_labels.chosen(w, policy, keys.KUEUE_QUEUE_LABEL, policy.queue_name):
        out.append(
            f"no Kueue LocalQueue for namespace {w.namespace}: "
            + (
                f"add label {keys.KUEUE_QUEUE_LABEL}: <local queue>"
                if policy.allow_user_queue
                else "ask your cluster admin to set queueName for it in the raygate-config ConfigMap"
            )
        )
    return out


def apply(b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
    queue_labels.apply_labels(
        b, w, policy, queue_label=keys.KUEUE_QUEUE_LABEL, priority_label=keys.KUEUE_PRIORITY_LABEL,
        default_queue=None,
    )


def pod_group(w: Workload) -> PodGroupSpec | None:
    return None
