"""The pods that joined each gang group and the groups raygate made, kept current by two watches, so the
pod webhook decides which group a pod joins without an API call (raygate.core.modes.native says how).

Only where the cluster serves Kubernetes' gang scheduling (scheduling.k8s.io Workload and PodGroup):
- the pods raygate gated (label raygate.io/pod-gate), counted per namespace, group and pod set while they
  run (a deleted or finished pod no longer holds a seat);
- raygate's PodGroups (label app.kubernetes.io/managed-by=raygate): a scale-up's increment is named after
  the first whose PodGroup does not exist yet.
"""

from __future__ import annotations

import threading

from raygate.core import keys
from raygate.core.api import PODS, Served, gang_pod_groups
from raygate.core.objects import JSON, get, meta_str, metadata
from raygate.core.workload import pod_set_of
from raygate.kube.client import Kube
from raygate.kube.informer import Informer

MANAGED = f"{keys.MANAGED_BY_LABEL}={keys.MANAGED_BY_VALUE}"
TERMINAL = frozenset({"Succeeded", "Failed"})
Seat = tuple[str, str, str]  # (namespace, group, pod set)


def member_view(pod: JSON) -> JSON:
    """What the count needs of a pod: its group, its pod set, whether it still runs."""
    meta = metadata(pod)
    labels = meta.get("labels") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "deletionTimestamp": meta.get("deletionTimestamp"),
                         "labels": {k: labels[k] for k in (keys.RAY_GROUP_LABEL,) if k in labels}},
            "spec": {"schedulingGroup": get(pod, ("spec", "schedulingGroup"))},
            "status": {"phase": get(pod, ("status", "phase"))}}


def seat(pod: JSON) -> Seat | None:
    """The seat a pod holds in its group, or None when it names none or no longer runs."""
    group = get(pod, keys.POD_GROUP_NAME_PATH)
    if not isinstance(group, str) or not group or get(pod, ("metadata", "deletionTimestamp")) \
            or get(pod, ("status", "phase")) in TERMINAL:
        return None
    return meta_str(pod, "namespace"), group, pod_set_of(pod)


class GangMembers:
    """raygate.core.modes.Members from the caches."""

    def __init__(self, kube: Kube, served: Served, resync_seconds: float = 600.0) -> None:
        if served.gang_version is None:
            raise ValueError("the cluster serves no gang scheduling API")
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], Seat] = {}  # pod -> its seat
        self._counts: dict[Seat, int] = {}
        self.pods = Informer(kube, PODS, label_selector=keys.POD_GATE_LABEL, handler=self._event,
                             resync_seconds=resync_seconds, transform=member_view)
        self.groups = Informer(kube, gang_pod_groups(served.gang_version), label_selector=MANAGED,
                               resync_seconds=resync_seconds, transform=lambda o: {"metadata": {
                                   "name": meta_str(o, "name"), "namespace": meta_str(o, "namespace")}})

    def start(self) -> GangMembers:
        self.pods.start()
        self.groups.start()
        return self

    def informers(self) -> list[Informer]:
        return [self.pods, self.groups]

    def _event(self, event: str, pod: JSON) -> None:
        key = (meta_str(pod, "namespace"), meta_str(pod, "name"))
        now = None if event == "DELETED" else seat(pod)
        with self._lock:
            before = self._held.pop(key, None)
            if before is not None:
                self._counts[before] -= 1
                if not self._counts[before]:
                    del self._counts[before]
            if now is not None:
                self._held[key] = now
                self._counts[now] = self._counts.get(now, 0) + 1

    def count(self, namespace: str, group: str, pod_set: str) -> int:
        with self._lock:
            return self._counts.get((namespace, group, pod_set), 0)

    def exists(self, namespace: str, group: str) -> bool:
        return self.groups.get(namespace, group) is not None
