"""The gang groups raygate made (Kubernetes' PodGroups, native mode), kept current by a watch, so the pod
webhook decides which group a pod joins without an API call (raygate.core.modes.native says how).

Only where the cluster serves Kubernetes' gang scheduling (scheduling.k8s.io Workload and PodGroup), and
only raygate's own PodGroups (label app.kubernetes.io/managed-by=raygate): their names, and the Ray
cluster whose gang kube-scheduler bound in each, as the reconciler records it (annotation
raygate.io/gang-bound). No pod is read.
"""

from __future__ import annotations

from raygate.core import keys
from raygate.core.api import Served, gang_pod_groups
from raygate.core.objects import JSON, get, meta_str
from raygate.kube.client import Kube
from raygate.kube.informer import Informer


def group_view(group: JSON) -> JSON:
    """What the webhook needs of a PodGroup: its name, and the Ray cluster whose gang is bound in it."""
    bound = get(group, ("metadata", "annotations", keys.GANG_BOUND_ANNOTATION))
    return {"metadata": {"name": meta_str(group, "name"), "namespace": meta_str(group, "namespace")},
            "bound": bound if isinstance(bound, str) and bound else None}


class GangGroups:
    """raygate.core.modes.Members from the cache."""

    def __init__(self, kube: Kube, served: Served, resync_seconds: float = 600.0) -> None:
        if served.gang_version is None:
            raise ValueError("the cluster serves no gang scheduling API")
        self.informer = Informer(kube, gang_pod_groups(served.gang_version), label_selector=keys.MANAGED_SELECTOR,
                                 resync_seconds=resync_seconds, transform=group_view)

    def start(self) -> GangGroups:
        self.informer.start()
        return self

    def exists(self, namespace: str, group: str) -> bool:
        return self.informer.get(namespace, group) is not None

    def bound_cluster(self, namespace: str, group: str) -> str | None:
        found = self.informer.get(namespace, group)
        bound = found.get("bound") if found is not None else None
        return bound if isinstance(bound, str) else None
