"""The modes as one interface: every mode has rules, each says whether raygate holds its jobs, and no
code outside raygate/core/modes/ branches on a mode's name."""

from __future__ import annotations

import ast
from pathlib import Path

import jsonpatch
import pytest
from builders import gpu_job

from raygate.core import keys
from raygate.core.config import parse_config
from raygate.core.keys import Mode
from raygate.core.modes import (
    RULES,
    GroupRules,
    GroupsAtThePod,
    GroupsWithDrift,
    GroupsWithPrerequisite,
    for_object,
    volcano,
)
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy, merge_override
from raygate.core.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
MODES_DIR = ROOT / "raygate" / "core" / "modes"
# The local stack (raygate/devenv) names the processes it runs (Volcano's scheduler, Kueue's controller):
# those are programs, not modes.
NOT_MODES = (MODES_DIR, ROOT / "raygate" / "devenv")
SOURCES = ("raygate", "webhook", "reconciler", "certs")


def job(annotations: dict[str, str]) -> Workload:
    b = gpu_job("train", "ns")
    for key, value in annotations.items():
        b.annotation(key, value)
    return Workload(b.obj())


def test_every_mode_has_rules() -> None:
    assert set(RULES) == set(Mode)
    assert all(RULES[m].mode is m for m in Mode)


@pytest.mark.parametrize(("mode", "holds"), [(Mode.PROVISIONING, True), (Mode.VOLCANO, True), (Mode.KUEUE, False),
                                             (Mode.NATIVE, True)])
def test_raygate_holds_jobs_in_every_mode_but_kueue(mode: Mode, holds: bool) -> None:
    assert RULES[mode].holds is holds


# What each mode has beyond ModeRules, as its class line says: every mode is in the table.
CAPABILITIES = {
    Mode.PROVISIONING: set(),
    Mode.KUEUE: set(),
    Mode.VOLCANO: {GroupRules, GroupsWithPrerequisite, GroupsWithDrift},
    Mode.NATIVE: {GroupRules, GroupsAtThePod},
}


@pytest.mark.parametrize("mode", list(Mode))
def test_each_mode_has_the_capabilities_of_the_table(mode: Mode) -> None:
    rules = RULES[mode]
    have = {c for c in (GroupRules, GroupsWithPrerequisite, GroupsWithDrift, GroupsAtThePod) if isinstance(rules, c)}
    assert have == CAPABILITIES[mode]
    assert (for_object(merge_override(NamespacePolicy(), {"mode": mode.value})).group is rules) is (GroupRules in have)


def test_volcano_reads_back_the_pod_group_it_recorded() -> None:
    """One module writes the PodGroup spec at admission and reads it for the reconciler."""
    w = Workload(gpu_job("train", "team").obj())
    policy = merge_override(NamespacePolicy(), {"mode": "volcano", "queueName": "research"})
    b = PatchBuilder(w.obj)
    volcano.RULES.apply(b, w, policy, w.gang())
    group = volcano.RULES.recorded(Workload(jsonpatch.apply_patch(w.obj, b.ops)))
    assert (group.name, group.spec["queue"]) == (w.pod_group_name, "research")
    assert group.spec["minMember"] == w.gang().min_member


def test_a_mode_names_what_its_config_cannot_do() -> None:
    """The mode's own rule reaches the admin as a config error under the namespace's path."""
    with pytest.raises(ValueError, match=r"namespaces\.ml: kueue mode cannot use raygate's own"):
        parse_config("namespaces:\n  ml:\n    mode: kueue\n    provisioning:\n      enabled: true\n")


def test_kueue_mode_refuses_a_job_that_would_be_stored_unsuspended() -> None:
    running = Workload({**gpu_job("train", "ns").obj(), "spec": {"suspend": False}, "kind": keys.RAYJOB_KIND})
    assert "would start at once" in (RULES[Mode.KUEUE].stored_problem(running, "ns") or "")
    assert RULES[Mode.PROVISIONING].stored_problem(running, "ns") is None


# --- no branch on a mode's name, and no lookup of a mode, outside the modes ----------------------------

MODE_NAMES = {m.value for m in Mode}
MODE_MEMBERS = {m.name for m in Mode}


def _names_a_mode(node: ast.AST) -> bool:
    """`Mode.KUEUE`, or the string "kueue"."""
    if isinstance(node, ast.Attribute) and node.attr in MODE_MEMBERS and isinstance(node.value, ast.Name) \
            and node.value.id == "Mode":
        return True
    return isinstance(node, ast.Constant) and node.value in MODE_NAMES


def mode_branches(source: str) -> list[int]:
    """Lines that compare with a concrete mode, match on one, import a concrete mode's module, or look a mode's
    rules up in the registry (RULES) instead of asking for an object's (for_object)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_a_mode(n) for n in (node.left, *node.comparators)):
            out.append(node.lineno)
        elif isinstance(node, ast.match_case) and any(_names_a_mode(n) for n in ast.walk(node.pattern)):
            out.append(node.pattern.lineno)
        elif _imports_a_mode(node) or _looks_a_mode_up(node):
            out.append(node.lineno)
    return sorted(set(out))


def _imports_a_mode(node: ast.AST) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module is not None and (
        (node.module.startswith("raygate.core.modes.") and node.module != "raygate.core.modes.base")
        or (node.module == "raygate.core.modes" and any(a.name in MODE_NAMES for a in node.names)))


def _looks_a_mode_up(node: ast.AST) -> bool:
    """The registry asked directly (`RULES[...]`, `modes.RULES`, importing RULES), not through for_object."""
    return ((isinstance(node, ast.Name) and node.id == "RULES")
            or (isinstance(node, ast.Attribute) and node.attr == "RULES")
            or (isinstance(node, ast.ImportFrom) and any(a.name == "RULES" for a in node.names)))


def test_the_check_finds_a_branch_on_a_mode_name() -> None:
    assert mode_branches("if mode is Mode.KUEUE:\n    pass\n") == [1]
    assert mode_branches("x = 1\nif policy.mode == 'volcano':\n    pass\n") == [2]
    assert mode_branches("from raygate.core.modes import volcano\n") == [1]
    assert mode_branches("from raygate.core.modes import RULES\nrules = RULES[policy.mode]\n") == [1, 2]
    assert mode_branches("if modes.RULES[mode].holds:\n    pass\n") == [1]
    assert mode_branches("if for_object(policy).holds:\n    pass\n") == []


def test_no_code_outside_the_modes_branches_on_a_mode_name_or_looks_one_up() -> None:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if any(path.resolve().is_relative_to(d) for d in NOT_MODES) or ".venv" in path.parts:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}" for line in mode_branches(path.read_text())]
    assert found == [], "ask the object's rules (raygate.core.modes.for_object) instead of naming a mode"
