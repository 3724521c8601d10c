"""The modes as one interface: every mode has rules, and each says whether raygate holds its jobs."""

from __future__ import annotations

import json

import jsonpatch
import pytest
from builders import gpu_job

from raygate.core import keys
from raygate.core.modes import RULES, rules_for, volcano
from raygate.core.patch import PatchBuilder
from raygate.core.policy import Mode, NamespacePolicy, merge_override
from raygate.core.workload import Workload


def job(annotations: dict[str, str]) -> Workload:
    b = gpu_job("train", "ns")
    for key, value in annotations.items():
        b.annotation(key, value)
    return Workload(b.obj())


def test_every_mode_has_rules() -> None:
    assert set(RULES) == set(Mode)


@pytest.mark.parametrize(("mode", "holds"), [(Mode.PROVISIONING, True), (Mode.VOLCANO, True), (Mode.KUEUE, False)])
def test_raygate_holds_jobs_in_every_mode_but_kueue(mode: Mode, holds: bool) -> None:
    assert rules_for(mode).HOLDS is holds


@pytest.mark.parametrize("mode", [Mode.PROVISIONING, Mode.KUEUE])
def test_only_volcano_has_a_pod_group(mode: Mode) -> None:
    recorded = {keys.POD_GROUP_ANNOTATION: json.dumps({"minMember": 2, "queue": "q"})}
    assert rules_for(mode).pod_group(job(recorded)) is None


def test_volcano_reads_back_the_pod_group_it_recorded() -> None:
    """One module writes the PodGroup spec at admission and reads it for the reconciler."""
    w = Workload(gpu_job("train", "team").obj())
    policy = merge_override(NamespacePolicy(), {"mode": "volcano", "queueName": "research"})
    b = PatchBuilder(w.obj)
    volcano.apply(b, w, policy, w.gang())
    group = volcano.pod_group(Workload(jsonpatch.apply_patch(w.obj, b.ops)))
    assert group is not None and (group.name, group.queue) == (w.pod_group_name, "research")
    assert group.spec["minMember"] == w.gang().min_member
