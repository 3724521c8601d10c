"""Which of the APIs raygate's children live in the cluster serves (asked once, at start)."""

from __future__ import annotations

from raygate.core import keys
from raygate.core.api import PODTEMPLATES, Resource, provisioning_requests
from raygate.core.keys import ChildKind
from raygate.core.modes import all_group_rules
from raygate.kube.client import Kube


def served_provreq_version(kube: Kube) -> str | None:
    """The ProvisioningRequest version to use (v1 before v1beta1), or None when neither is served."""
    for version in keys.PROVREQ_VERSIONS:
        if kube.served(keys.PROVREQ_GROUP, version):
            return version
    return None


def child_resources(kube: Kube, provreq_version: str | None) -> dict[ChildKind, Resource]:
    """The kinds of child raygate can create here: PodTemplates always, ProvisioningRequests and the
    modes' group objects (Volcano PodGroups) where their APIs are served."""
    out: dict[ChildKind, Resource] = {ChildKind.POD_TEMPLATE: PODTEMPLATES}
    if provreq_version is not None:
        out[ChildKind.PROVISIONING_REQUEST] = provisioning_requests(provreq_version)
    for rules in all_group_rules():
        res = rules.group_resource
        if kube.served(res.group, res.version):
            out[ChildKind(res.kind)] = res
    return out
