"""provisioning mode: hold the job suspended until its ProvisioningRequest is Provisioned."""

from __future__ import annotations

from raygate.core import keys
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, Workload


def refusals(w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
    if not policy.provisions:
        return []
    managed = gang.managed_pod_sets(policy.managed_resources)
    if len(managed) > keys.PROVREQ_MAX_POD_SETS:
        return [f"{len(managed)} pod sets request {', '.join(policy.managed_resources)}, but one "
                f"ProvisioningRequest books at most {keys.PROVREQ_MAX_POD_SETS}: merge worker groups"]
    return []


def apply(b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
    # RayJob.spec.suspend is a bool and RayCluster.spec.suspend a *bool: both live at spec.suspend.
    # Never spec.rayClusterSpec.suspend of a RayJob: KubeRay owns that.
    b.set(("spec", "suspend"), True)
    b.set(("metadata", "labels", keys.STATE_LABEL), keys.State.PENDING.value)
