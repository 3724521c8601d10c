"""provisioning mode: hold the job suspended until its ProvisioningRequest is Provisioned."""

from __future__ import annotations

from raygate.core import keys
from raygate.core.keys import Mode
from raygate.core.modes.base import ModeRules
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import Gang, Workload


def hold(b: PatchBuilder) -> None:
    """Suspend the job and mark it held. RayJob.spec.suspend is a bool and RayCluster.spec.suspend a
    *bool: both live at spec.suspend. Never spec.rayClusterSpec.suspend of a RayJob: KubeRay owns that."""
    b.set(("spec", "suspend"), True)
    b.set(("metadata", "labels", keys.STATE_LABEL), keys.State.PENDING.value)


class Provisioning(ModeRules):
    mode = Mode.PROVISIONING
    provisions_by_default = True
    # Written by the reconciler in the patch that admits the job: the booking its pods consume.
    template_annotations = (keys.CONSUME_ANNOTATION, keys.CLASS_ANNOTATION)

    def apply(self, b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
        hold(b)


RULES = Provisioning()
