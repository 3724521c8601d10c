"""Which of the APIs raygate's children live in the cluster serves (asked once, at start)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raygate.core import keys
from raygate.core.api import PODTEMPLATES, Resource, Served, provisioning_requests
from raygate.core.keys import ChildKind
from raygate.core.modes import all_group_rules
from raygate.kube.client import ApiError, Kube


def served_provreq_version(kube: Kube) -> str | None:
    """The ProvisioningRequest version to use (v1 before v1beta1), or None when neither is served."""
    for version in keys.PROVREQ_VERSIONS:
        if kube.served(keys.PROVREQ_GROUP, version):
            return version
    return None


def group_versions(listing: Mapping[str, Any]) -> frozenset[str]:
    """Every group/version of an APIGroupList (GET /apis)."""
    out = set()
    for group in listing.get("groups") or []:
        for version in (group or {}).get("versions") or []:
            if isinstance(version, Mapping) and isinstance(version.get("groupVersion"), str):
                out.add(version["groupVersion"])
    return frozenset(out)


def gang_version(found: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The scheduling.k8s.io version that serves both Workload and PodGroup, v1beta1 before v1alpha2, from the
    APIResourceLists found per version (scheduling.k8s.io/v1beta1 once served PriorityClasses only)."""
    for version in keys.GANG_VERSIONS:
        listing = found.get(version)
        names = {r.get("name") for r in (listing or {}).get("resources") or [] if isinstance(r, Mapping)}
        if set(keys.GANG_RESOURCES) <= names:
            return version
    return None


def served(kube: Kube) -> Served:
    """What the cluster serves of the optional APIs the modes use (two to four GETs)."""
    versions = group_versions(kube.request("GET", "/apis"))
    found: dict[str, Mapping[str, Any]] = {}
    for version in keys.GANG_VERSIONS:
        if f"{keys.GANG_GROUP}/{version}" in versions:
            try:
                found[version] = kube.request("GET", f"/apis/{keys.GANG_GROUP}/{version}")
            except ApiError as err:
                if not err.not_found:
                    raise
    return Served(group_versions=versions, gang_version=gang_version(found))


def child_resources(kube: Kube, provreq_version: str | None, found: Served | None = None) -> dict[ChildKind, Resource]:
    """The kinds of child raygate can create here: PodTemplates always, ProvisioningRequests and the
    modes' group objects (Volcano PodGroups; Workloads and PodGroups) where their APIs are served."""
    found = found if found is not None else served(kube)
    out: dict[ChildKind, Resource] = {ChildKind.POD_TEMPLATE: PODTEMPLATES}
    if provreq_version is not None:
        out[ChildKind.PROVISIONING_REQUEST] = provisioning_requests(provreq_version)
    for rules in all_group_rules():
        out.update(rules.resources(found))
    return out


def served_at(kubeconfig: str) -> Served:
    """What the cluster a kubeconfig names serves (`raygate explain --kubeconfig`)."""
    from raygate.core.errors import RaygateError

    kube = Kube.connect(kubeconfig, user_agent="raygate-explain")
    try:
        return served(kube)
    except ApiError as err:
        raise RaygateError(f"cannot ask the API server at {kube.host} what it serves: {err.status} {err.message}"
                           ) from None
