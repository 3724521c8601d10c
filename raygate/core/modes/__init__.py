"""The modes, one module each, holding everything a mode means (as KubeRay's batch schedulers do).

Every mode module implements `ModeRules` with module-level names; mypy checks each against the
protocol through `RULES`. The webhook calls `refusals` and `apply` when a job is created; the
reconciler asks `HOLDS` and `pod_group` for a held job. Adding a mode: its value in
`policy.Mode`, its module here, its line in `RULES`, and its tests.
"""

from __future__ import annotations

from typing import Protocol

from raygate.core.modes import kueue, provisioning, volcano
from raygate.core.modes.volcano import PodGroupSpec
from raygate.core.patch import PatchBuilder
from raygate.core.policy import Mode, NamespacePolicy
from raygate.core.workload import Gang, Workload


class ModeRules(Protocol):
    HOLDS: bool
    """Whether raygate holds the job (suspended, state label) until it admits it. False: another
    system admits it (Kueue) and raygate only labels and validates."""

    def refusals(self, w: Workload, policy: NamespacePolicy, gang: Gang) -> list[str]:
        """Why the job cannot be admitted in this mode, each saying what to change; [] when it can."""

    def apply(self, b: PatchBuilder, w: Workload, policy: NamespacePolicy, gang: Gang) -> None:
        """Add to the job being created what this mode needs (labels, hold, scheduler metadata)."""

    def pod_group(self, w: Workload) -> PodGroupSpec | None:
        """The PodGroup the reconciler creates for the held job, as `apply` recorded it; None when the
        mode has none. Raises ManifestError when the record is missing or unusable."""


RULES: dict[Mode, ModeRules] = {Mode.PROVISIONING: provisioning, Mode.VOLCANO: volcano, Mode.KUEUE: kueue}


def rules_for(mode: Mode) -> ModeRules:
    return RULES[mode]
