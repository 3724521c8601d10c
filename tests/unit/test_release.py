"""`raygate release`: which held jobs it releases, deletes or leaves alone, the patch it sends, and when
it refuses to run at all. The live run is tests/integration/test_uninstall.py."""

from __future__ import annotations

import copy
import datetime as dt
import io
from typing import Any

import jsonpatch
import pytest

from raygate.core import keys
from raygate.release import Child, blockers, child_of, job_release_ops, plan, render

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def job(name: str, state: str | None = "Provisioning", mode: str | None = "provisioning", *,
        kind: str = keys.RAYJOB_KIND, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}",
                            "labels": dict(labels or {}), "annotations": dict(annotations or {})}
    if state is not None:
        meta["labels"][keys.STATE_LABEL] = state
    if mode is not None:
        meta["annotations"][keys.MODE_ANNOTATION] = mode
    return kind, {"metadata": meta, "spec": {"suspend": True}}


def child(kind: str, name: str, owner: str | None) -> Child:
    return Child(kind, "team", name, None if owner is None else f"uid-{owner}")


KIDS = [child("ProvisioningRequest", "a-pr", "a"), child("PodTemplate", "a-gpu", "a"),
        child("PodGroup", "v-pg", "v"), child("PodTemplate", "v-gpu", "v"),
        child("ProvisioningRequest", "n-pr", "n"), child("PodGroup.scheduling.k8s.io", "n-g", "n"),
        child("Workload", "n-g", "n")]


@pytest.mark.parametrize(("jobs", "delete", "expected"), [
    pytest.param([job("a")], False, {"a": ("release", ["ProvisioningRequest/a-pr", "PodTemplate/a-gpu"], [])},
                 id="held-provisioning-released-children-deleted"),
    pytest.param([job("a", "Pending")], False, {"a": ("release", ["ProvisioningRequest/a-pr", "PodTemplate/a-gpu"],
                                                      [])}, id="pending-released"),
    pytest.param([job("a", "Failed")], False, {"a": ("release", ["ProvisioningRequest/a-pr", "PodTemplate/a-gpu"],
                                                     [])}, id="failed-released-too-nothing-else-would"),
    pytest.param([job("a")], True, {"a": ("delete", ["ProvisioningRequest/a-pr", "PodTemplate/a-gpu"], [])},
                 id="delete-takes-the-children"),
    pytest.param([job("a", "Admitted")], False, {}, id="admitted-runs-and-is-left-alone"),
    pytest.param([job("a", None, None)], False, {}, id="never-held-is-not-listed"),
    pytest.param([job("k", None, "kueue")], False, {}, id="kueue-mode-has-no-state-and-is-not-listed"),
    pytest.param([job("k", "Pending", "kueue")], False, {"k": ("skip", [], [])},
                 id="kueue-mode-never-unsuspended"),
    pytest.param([job("k", "Pending", labels={keys.KUEUE_QUEUE_LABEL: "q"})], True, {"k": ("skip", [], [])},
                 id="kueue-queue-label-never-touched-even-with-delete"),
    pytest.param([job("v", "Pending", "volcano")], False, {"v": ("release", ["PodTemplate/v-gpu"], ["PodGroup/v-pg"])},
                 id="volcano-keeps-its-podgroup"),
    pytest.param([job("w", "Pending", "volcano")], False, {"w": ("skip", [], [])},
                 id="volcano-without-podgroup-is-skipped"),
    pytest.param([job("v", "Pending", "volcano")], True, {"v": ("delete", ["PodTemplate/v-gpu", "PodGroup/v-pg"],
                                                                 [])}, id="volcano-delete-takes-the-podgroup"),
    # native mode: the pods name a group only from admission on, so a released job's would never be joined
    pytest.param([job("n", "Provisioning", "native")], False, {"n": ("release", [
        "ProvisioningRequest/n-pr", "PodGroup.scheduling.k8s.io/n-g", "Workload/n-g"], [])},
        id="native-deletes-its-workload-and-podgroup"),
    pytest.param([job("a", kind=keys.RAYCLUSTER_KIND)], False,
                 {"a": ("release", ["ProvisioningRequest/a-pr", "PodTemplate/a-gpu"], [])}, id="raycluster"),
])
def test_plan(jobs: list[tuple[str, dict[str, Any]]], delete: bool,
              expected: dict[str, tuple[str, list[str], list[str]]]) -> None:
    p = plan(jobs, KIDS, delete=delete)
    got = {i.name: (i.action, [f"{c.kind}/{c.name}" for c in i.delete_children],
                    [f"{c.kind}/{c.name}" for c in i.keep_children]) for i in p.items}
    assert got == expected
    for i in p.items:
        assert (i.action == "skip") == bool(i.why), i


def test_children_of_missing_jobs_are_orphans_and_of_listed_jobs_are_not() -> None:
    p = plan([job("a", "Admitted"), job("k", "Pending", "kueue"), job("n", "Admitted", "native")],
             [*KIDS, child("PodTemplate", "k-x", "k"), child("PodTemplate", "loose", None)], delete=False)
    assert [f"{c.kind}/{c.name}" for c in p.orphans] == ["PodTemplate/loose", "PodTemplate/v-gpu", "PodGroup/v-pg"]


def test_release_patch_unsuspends_and_removes_only_raygates_keys() -> None:
    _, obj = job("a", annotations={
        keys.ATTEMPT_ANNOTATION: "2", keys.REQUEST_ANNOTATION: "a-pr", keys.REASON_ANNOTATION: "waiting",
        f"{keys.PROVREQ_PARAM_PREFIX}ValidUntilSeconds": "60", "team/owner": "alice"},
        labels={"app": "train"})
    released = jsonpatch.apply_patch(copy.deepcopy(obj), job_release_ops(obj))
    assert released["spec"]["suspend"] is False
    assert released["metadata"]["labels"] == {"app": "train"}
    assert released["metadata"]["annotations"] == {f"{keys.PROVREQ_PARAM_PREFIX}ValidUntilSeconds": "60",
                                                   "team/owner": "alice"}


def test_release_patch_adds_suspend_false_when_absent() -> None:
    _, obj = job("c", kind=keys.RAYCLUSTER_KIND)
    del obj["spec"]["suspend"]
    assert jsonpatch.apply_patch(copy.deepcopy(obj), job_release_ops(obj))["spec"]["suspend"] is False


@pytest.mark.parametrize("change", ["state", "uid"])
def test_release_patch_fails_on_a_job_changed_since_listing(change: str) -> None:
    _, obj = job("a")
    ops = job_release_ops(obj)
    if change == "state":
        obj["metadata"]["labels"][keys.STATE_LABEL] = "Admitted"
    else:
        obj["metadata"]["uid"] = "uid-recreated"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(obj, ops)


def lease(holder: str | None, renewed_ago: float, duration: int = 15) -> dict[str, Any]:
    renew = (NOW - dt.timedelta(seconds=renewed_ago)).isoformat().replace("+00:00", "Z")
    return {"spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}}


@pytest.mark.parametrize(("mutating", "validating", "policy", "the_lease", "expected"), [
    pytest.param(False, False, False, None, [], id="uninstalled"),
    pytest.param(True, False, False, None,
                 [f"MutatingWebhookConfiguration {keys.MUTATING_WEBHOOK_CONFIG} is registered"], id="mutating-left"),
    pytest.param(False, True, False, None,
                 [f"ValidatingWebhookConfiguration {keys.VALIDATING_WEBHOOK_CONFIG} is registered"],
                 id="validating-left"),
    pytest.param(False, False, True, None, ["MutatingAdmissionPolicy raygate-pod-gate is registered"],
                 id="pod-gate-policy-left"),
    pytest.param(False, False, False, lease("r1", 3), ["reconciler r1 holds Lease"], id="live-reconciler"),
    pytest.param(False, False, False, lease("r1", 16), [], id="expired-lease"),
    pytest.param(False, False, False, lease(None, 1, 1), [], id="released-lease"),
])
def test_blockers(mutating: bool, validating: bool, policy: bool, the_lease: dict[str, Any] | None,
                  expected: list[str]) -> None:
    found = blockers(mutating, validating, the_lease, NOW, policy=policy)
    assert len(found) == len(expected)
    for text, start in zip(found, expected, strict=True):
        assert text.startswith(start), text


def test_render_names_every_job_action_and_child() -> None:
    p = plan([job("a"), job("k", "Pending", "kueue")], [*KIDS[:2], child("PodTemplate", "gone", "x")], delete=False)
    out = io.StringIO()
    render(p, out)
    text = out.getvalue()
    assert "rayjob/a" in text and "release" in text and "delete ProvisioningRequest/a-pr" in text
    assert "team/rayjob/k: skipped: Kueue owns spec.suspend" in text
    assert "team/PodTemplate/gone: its job is gone: delete" in text


def test_child_of_reads_the_controller_reference() -> None:
    obj = {"metadata": {"name": "t", "namespace": "team", "ownerReferences": [
        {"uid": "other", "controller": False}, {"uid": "uid-a", "controller": True}]}}
    assert child_of("PodTemplate", obj) == Child("PodTemplate", "team", "t", "uid-a")
