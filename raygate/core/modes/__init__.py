"""The modes: one class each behind `ModeRules` (base.py), registered here by name.

Callers ask `rules_for(mode)` and never branch on a mode's name: the webhook asks a mode what to
refuse and what to add at creation, the validating guard what a held job may not change, the
reconciler whether raygate holds the job and, through `group_rules`, for the group object the
mode schedules a gang with. Adding a mode: its value in `Mode`, its module here, its line in
`RULES`, and its tests.
"""

from __future__ import annotations

from collections.abc import Mapping

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

__all__ = ["NO_MEMBERS", "RULES", "GroupRules", "GroupSpec", "GroupsAtThePod", "GroupsWithDrift",
           "GroupsWithPrerequisite", "Members", "ModeRules", "NoMembers", "Prerequisite", "all_group_rules",
           "all_groups_at_the_pod", "decided_labels", "group_rules", "recorded_mode", "rules_for",
           "template_annotations"]

RULES: dict[Mode, ModeRules] = {m.mode: m for m in (provisioning.RULES, volcano.RULES, kueue.RULES, native.RULES)}


def rules_for(mode: Mode) -> ModeRules:
    return RULES[mode]


def group_rules(mode: Mode) -> GroupRules | None:
    """The mode's group capability, when it schedules each gang through a group object."""
    rules = RULES[mode]
    return rules if isinstance(rules, GroupRules) else None


def all_group_rules() -> list[GroupRules]:
    return [r for r in RULES.values() if isinstance(r, GroupRules)]


def all_groups_at_the_pod() -> list[GroupsAtThePod]:
    """The modes whose pods name their group themselves: a pod is asked of each, whatever its namespace's mode
    is now (a job keeps the mode it was admitted under, and its template says which group)."""
    return [r for r in RULES.values() if isinstance(r, GroupsAtThePod)]


def recorded_mode(annotations: Mapping[str, str]) -> Mode | None:
    """The mode the webhook applied to an object, as it recorded it; None when absent or unknown."""
    try:
        return Mode(annotations[keys.MODE_ANNOTATION])
    except (KeyError, ValueError):
        return None


def decided_labels() -> frozenset[str]:
    """Every label some mode decides on: no user changes them on a gated job, whatever its mode."""
    return frozenset().union(*(r.decided_labels for r in RULES.values()))


def template_annotations() -> tuple[str, ...]:
    """Every pod-template annotation some mode writes, in a stable order."""
    return tuple(dict.fromkeys(a for r in RULES.values() for a in r.template_annotations))
