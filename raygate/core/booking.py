"""What one ProvisioningRequest can book for a job: the rules shared by every mode that books.

(Whether a namespace books at all is its policy's `provisions`; how the request is built is the
reconciler's, reconciler/children.py.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from raygate.core import keys
from raygate.core.workload import Gang, PodSet

if TYPE_CHECKING:
    from raygate.core.policy import NamespacePolicy


def too_many_pod_sets(managed: Sequence[PodSet], policy: NamespacePolicy) -> str | None:
    """The one ProvisioningRequest a job gets has room for a limited number of pod sets."""
    if len(managed) <= keys.PROVREQ_MAX_POD_SETS:
        return None
    return (f"{len(managed)} pod sets request {', '.join(policy.managed_resources)}, but one "
            f"ProvisioningRequest books at most {keys.PROVREQ_MAX_POD_SETS}: merge worker groups")


def refusals(policy: NamespacePolicy, gang: Gang) -> list[str]:
    """What keeps a job's pod sets from fitting into one ProvisioningRequest, where the namespace books."""
    if not policy.provisions:
        return []
    problem = too_many_pod_sets(gang.managed_pod_sets(policy.managed_resources), policy)
    return [problem] if problem else []
