"""API coordinates of every kind raygate reads or writes: group, version, plural, kind.

Pure data, so the modes can name the objects they need (a Volcano PodGroup, its Queue) without
importing the client; raygate.kube.client turns them into requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

from raygate.core import keys


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base


NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
EVENTS = Resource("", "v1", "events", "Event")
PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODTEMPLATES = Resource("", "v1", "podtemplates", keys.ChildKind.POD_TEMPLATE)
SECRETS = Resource("", "v1", "secrets", "Secret")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)
RAYJOBS = Resource(keys.RAY_GROUP, keys.RAY_VERSION, keys.RAYJOB_PLURAL, keys.RAYJOB_KIND)
RAYCLUSTERS = Resource(keys.RAY_GROUP, keys.RAY_VERSION, keys.RAYCLUSTER_PLURAL, keys.RAYCLUSTER_KIND)
RAYSERVICES = Resource(keys.RAY_GROUP, keys.RAY_VERSION, "rayservices", "RayService")
PODGROUPS = Resource(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, "podgroups", keys.ChildKind.POD_GROUP)
VOLCANO_QUEUES = Resource(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION, "queues", "Queue", namespaced=False)
CLAIM_TEMPLATES = Resource(keys.DRA_GROUP, keys.DRA_VERSION, "resourceclaimtemplates", "ResourceClaimTemplate")
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
    namespaced=False,
)
MUTATING_POLICIES = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies", "MutatingAdmissionPolicy", namespaced=False,
)
VALIDATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
    namespaced=False,
)


def provisioning_requests(version: str) -> Resource:
    return Resource(keys.PROVREQ_GROUP, version, keys.PROVREQ_PLURAL, keys.ChildKind.PROVISIONING_REQUEST)



def gang_workloads(version: str) -> Resource:
    return Resource(keys.GANG_GROUP, version, "workloads", keys.ChildKind.WORKLOAD)


def gang_pod_groups(version: str) -> Resource:
    return Resource(keys.GANG_GROUP, version, "podgroups", "PodGroup")


@dataclass(frozen=True)
class Served:
    """What a cluster serves of the optional APIs raygate's modes use, as discovery found it when the
    component started (kube/discovery.py). `known` False: nobody asked (offline: `raygate explain` without
    a cluster, unit tests), so nothing is refused for want of an API."""

    group_versions: frozenset[str] = field(default_factory=frozenset)  # "group/version"
    gang_version: str | None = None  # scheduling.k8s.io's Workload and PodGroup (v1beta1, else v1alpha2)
    known: bool = True

    def serves(self, group: str, version: str) -> bool:
        return f"{group}/{version}" in self.group_versions


OFFLINE = Served(known=False)
# What raygate assumes offline: the version Kubernetes 1.36 (the pinned stack) serves.
ASSUMED_GANG_VERSION = "v1alpha2"
