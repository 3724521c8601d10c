"""provisioning mode: hold the job suspended until its ProvisioningRequest is Provisioned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from raygate.core import keys
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, PodSet, Workload

if TYPE_CHECKING:
    from raygate.core.modes.volcano import PodGroupSpec

HOLDS = True


def too_many_pod_sets(managed: Sequence[PodSet], policy: NamespacePolicy) -> str | None:
    """The one ProvisioningRequest a job gets has room for a limited number of pod sets."""
    if len(managed) <= keys.PROVREQ_MAX_POD_SETS:
        return None
    return (f"{len(managed)} pod sets request {', '.join(policy.managed_resources)}, but one "
            f"ProvisioningRequest books at most {keys.PROVREQ_MAX_POD_SETS}: merge worker groups")


def refusals(w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
    if not policy.provisions:
        return []
    problem = too_many_pod_sets(gang.managed_pod_sets(policy.managed_resources), policy)
    return [problem] if problem else []


def apply(b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
    # RayJob.spec.suspend is a bool and RayCluster.spec.suspend a *bool: both live at spec.suspend.
    # Never spec.rayClusterSpec.suspend of a RayJob: KubeRay owns that.
    b.set(("spec", "suspend"), True)
    b.set(("metadata", "labels", keys.STATE_LABEL), keys.State.PENDING.value)


def pod_group(w: Workload) -> PodGroupSpec | None:
    return None
