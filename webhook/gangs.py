"""The gang groups raygate made (Kubernetes' PodGroups, native mode), kept current by a watch, so the pod
webhook decides which group a pod joins without an API call (raygate.core.modes.native says how).

Only where the cluster serves Kubernetes' gang scheduling (scheduling.k8s.io Workload and PodGroup), and
only raygate's own PodGroups (label app.kubernetes.io/managed-by=raygate): their names, and whether
kube-scheduler has bound each one's gang (condition PodGroupScheduled). No pod is read.
"""

from __future__ import annotations

from raygate.core import keys
from raygate.core.api import Served, gang_pod_groups
from raygate.core.conditions import conditions
from raygate.core.objects import JSON, meta_str
from raygate.kube.client import Kube
from raygate.kube.informer import Informer

MANAGED = f"{keys.MANAGED_BY_LABEL}={keys.MANAGED_BY_VALUE}"


def group_view(group: JSON) -> JSON:
    """What the webhook needs of a PodGroup: its name, and whether its gang is bound."""
    scheduled = conditions(group).get(keys.GANG_SCHEDULED_CONDITION)
    return {"metadata": {"name": meta_str(group, "name"), "namespace": meta_str(group, "namespace")},
            "scheduled": scheduled is not None and scheduled.true}


class GangGroups:
    """raygate.core.modes.Members from the cache."""

    def __init__(self, kube: Kube, served: Served, resync_seconds: float = 600.0) -> None:
        if served.gang_version is None:
            raise ValueError("the cluster serves no gang scheduling API")
        self.informer = Informer(kube, gang_pod_groups(served.gang_version), label_selector=MANAGED,
                                 resync_seconds=resync_seconds, transform=group_view)

    def start(self) -> GangGroups:
        self.informer.start()
        return self

    def exists(self, namespace: str, group: str) -> bool:
        return self.informer.get(namespace, group) is not None

    def scheduled(self, namespace: str, group: str) -> bool:
        found = self.informer.get(namespace, group)
        return found is not None and found.get("scheduled") is True
