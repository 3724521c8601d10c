"""The modes: one class each behind `ModeRules` (base.py), registered here by name.

One object's rules are resolved once, here (`for_object`: once per review in the webhook, once per
reconcile in the reconciler), and passed down; nothing else looks a mode up or branches on a mode's
name. The webhook asks the rules what to refuse and what to add at creation, the validating guard
what a held job may not change, the reconciler whether raygate holds the job and, through `group`,
for the group objects the mode schedules a gang with. Adding a mode: its value in `keys.Mode`, its
module here, its line in `RULES`, and its tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raygate.core import keys
from raygate.core.keys import Mode
from raygate.core.modes import kueue, native, provisioning, volcano
from raygate.core.modes.base import (
    NO_MEMBERS,
    GroupRules,
    GroupsAtThePod,
    GroupSpec,
    GroupsWithDrift,
    GroupsWithPrerequisite,
    Members,
    ModeRules,
    NoMembers,
    Prerequisite,
)
from raygate.core.policy import NamespacePolicy

__all__ = ["NO_MEMBERS", "RULES", "GroupRules", "GroupSpec", "GroupsAtThePod", "GroupsWithDrift",
           "GroupsWithPrerequisite", "Members", "ModeRules", "NoMembers", "ObjectRules", "Prerequisite",
           "admitted_elsewhere", "all_group_rules", "all_groups_at_the_pod", "decided_labels", "for_object",
           "template_annotations"]

RULES: dict[Mode, ModeRules] = {m.mode: m for m in (provisioning.RULES, volcano.RULES, kueue.RULES, native.RULES)}


@dataclass(frozen=True)
class ObjectRules:
    """One Ray object's rules, as `for_object` resolved them."""

    mode: Mode
    policy: NamespacePolicy
    """Its namespace's policy as it applies under `mode` (NamespacePolicy.for_mode)."""
    mode_rules: ModeRules
    group: GroupRules | None
    """How the mode schedules each gang through group objects; None in a mode without them."""
    books: bool
    """raygate books its capacity with ProvisioningRequests: provisioning.enabled, else the mode's default."""
    gates_pods: bool
    """Its pods that ask for a managed resource are gated until a booking covers them: where raygate holds jobs
    and books their capacity. In kueue mode Kueue is the gate; in volcano mode without ProvisioningRequests the
    PodGroup is (Volcano binds the gang whole or not at all, and growth after admission is refused there)."""

    @property
    def holds(self) -> bool:
        """raygate suspends the object until it admits it (False: another system admits it, ModeRules.holds)."""
        return self.mode_rules.holds


def for_object(policy: NamespacePolicy, annotations: Mapping[str, str] | None = None) -> ObjectRules:
    """The rules of one object in the namespace whose policy is `policy`.

    The mode is the one the webhook recorded on the object (`annotations`): a held job finishes under the mode
    it was held with, whatever its namespace changed to since. Without one (no `annotations`: an object being
    created, whose annotations are still the user's to write, or a pod; or an object the webhook never saw)
    it is the namespace's mode, the one raygate acts on such an object under everywhere: what the reconciler
    creates for it under that mode is what it deletes again when the object stops."""
    mode = _recorded_mode(annotations or {}) or policy.mode
    rules = RULES[mode]
    policy = policy.for_mode(mode)
    enabled = policy.provisioning.enabled
    books = enabled if enabled is not None else rules.provisions_by_default
    return ObjectRules(mode, policy, rules, rules if isinstance(rules, GroupRules) else None, books,
                       gates_pods=rules.holds and books)


def _recorded_mode(annotations: Mapping[str, str]) -> Mode | None:
    """The mode the webhook applied to an object, as it recorded it; None when absent or unknown."""
    try:
        return Mode(annotations[keys.MODE_ANNOTATION])
    except (KeyError, ValueError):
        return None


# --- what every mode says together (no object's mode looked up) -----------------------------------------

def all_group_rules() -> list[GroupRules]:
    return [r for r in RULES.values() if isinstance(r, GroupRules)]


def all_groups_at_the_pod() -> list[GroupsAtThePod]:
    """The modes whose pods name their group themselves: a pod is asked of each, whatever its namespace's mode
    is now (a job keeps the mode it was admitted under, and its template says which group)."""
    return [r for r in RULES.values() if isinstance(r, GroupsAtThePod)]


def admitted_elsewhere(labels: Mapping[str, str]) -> ModeRules | None:
    """The mode whose admitting system (not raygate) owns an object by its labels alone (Kueue: its queue label)."""
    return next((r for r in RULES.values() if not r.holds and r.claims(labels)), None)


def decided_labels() -> frozenset[str]:
    """Every label some mode decides on: no user changes them on a gated job, whatever its mode."""
    return frozenset().union(*(r.decided_labels for r in RULES.values()))


def template_annotations() -> tuple[str, ...]:
    """Every pod-template annotation some mode writes, in a stable order."""
    return tuple(dict.fromkeys(a for r in RULES.values() for a in r.template_annotations))
