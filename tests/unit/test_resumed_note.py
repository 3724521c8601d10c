"""The note raygate writes once KubeRay has taken up the unsuspend of an admitted RayCluster: when, and the wake-up
it is for KubeRay, whose reconcile that saw the unsuspend creates no pod until its next pass (admitted.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from builders import RayCluster, RayJob
from plans import applied, decide, kinds, needs_of

from raygate.core import keys
from raygate.core.policy import NamespacePolicy
from raygate.core.times import timestamp
from raygate.core.workload import Workload
from raygate.reconciler import children
from raygate.reconciler.plan import Observed

NOW = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
GPU = {"nvidia.com/gpu": "1"}


def kuberay_status(*, suspended: str = "False", observed: int = 4, state: str = "suspended") -> dict[str, Any]:
    """A RayCluster's status as KubeRay leaves it after the reconcile that saw the unsuspend (KubeRay 1.6)."""
    return {"state": state, "observedGeneration": observed,
            "conditions": [{"type": "RayClusterSuspended", "status": suspended, "reason": "RayClusterSuspended"},
                           {"type": "RayClusterSuspending", "status": "False", "reason": "RayClusterSuspending"}]}


def admitted(kind: type[RayCluster] | type[RayJob] = RayCluster, status: dict[str, Any] | None = None,
             **annotations: str) -> tuple[Workload, Observed]:
    """An admitted object (generation 4: the unsuspend bumped it) on a Provisioned request, with `status`."""
    b = (kind("train", "ns").meta(uid="c1", resourceVersion="41", generation=4)
         .label(keys.STATE_LABEL, "Admitted").annotation(keys.MODE_ANNOTATION, "provisioning").suspend(False)
         .head(requests={"cpu": "1"}).worker("gpu", replicas=2, limits=GPU)
         .set("status", value=status if status is not None else kuberay_status()))
    first = Workload(b.obj())
    name = needs_of(first, NamespacePolicy()).request_name(first, 1)
    for key, value in {keys.ATTEMPT_ANNOTATION: "1", keys.REQUEST_ANNOTATION: name, **annotations}.items():
        b.annotation(key, value)
    w = Workload(b.obj())
    gang = needs_of(w, NamespacePolicy())
    pr = children.provisioning_request(w, list(gang.managed), NamespacePolicy(), 1, "v1", gang.fingerprint)
    pr["status"] = {"conditions": [{"type": t, "status": "True", "reason": t} for t in ("Accepted", "Provisioned")]}
    templates = tuple(children.pod_template(w, p, NamespacePolicy().manages) for p in gang.managed)
    return w, Observed(requests=(pr,), templates=templates)


def test_once_kuberay_has_seen_the_unsuspend_raygate_notes_when_in_one_patch() -> None:
    w, obs = admitted()
    plan = decide(w, obs, NamespacePolicy(), NOW)
    assert kinds(plan) == ["patch resumed"]
    after = applied(w, plan)
    assert after["metadata"]["annotations"][keys.RESUMED_AT_ANNOTATION] == timestamp(NOW)
    assert after["spec"] == w.obj["spec"]  # an annotation, nothing KubeRay would act on but the wake-up


@pytest.mark.parametrize(("case", "kind", "status", "noted"), [
    ("KubeRay has not seen the unsuspend yet", RayCluster, kuberay_status(suspended="True", observed=3), {}),
    ("KubeRay is a generation behind", RayCluster, kuberay_status(observed=3), {}),
    ("its pods are up (KubeRay moved on by itself)", RayCluster, kuberay_status(state="ready"), {}),
    ("a KubeRay without status conditions", RayCluster, {"state": "suspended", "observedGeneration": 4}, {}),
    ("noted already", RayCluster, kuberay_status(), {keys.RESUMED_AT_ANNOTATION: "2030-01-01T11:59:59Z"}),
    ("a RayJob (KubeRay makes its cluster unsuspended)", RayJob, kuberay_status(), {}),
])
def test_no_note_unless_kuberay_waits_on_its_requeue(case: str, kind: type[RayCluster] | type[RayJob],
                                                     status: dict[str, Any], noted: dict[str, str]) -> None:
    w, obs = admitted(kind, status, **noted)
    assert "patch resumed" not in kinds(decide(w, obs, NamespacePolicy(), NOW)), case


def test_a_requeued_cluster_loses_the_note_so_its_next_admission_notes_again() -> None:
    w, obs = admitted(status=kuberay_status(), **{keys.RESUMED_AT_ANNOTATION: "2030-01-01T11:59:59Z"})
    suspended = Workload({**w.obj, "spec": {**w.obj["spec"], "suspend": True}})  # a user suspended it
    after = applied(suspended, decide(suspended, obs, NamespacePolicy(), NOW))
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
    assert keys.RESUMED_AT_ANNOTATION not in after["metadata"]["annotations"]


def test_an_admission_drops_a_note_left_from_an_earlier_run() -> None:
    """A cluster failed after it ran keeps its annotations; started over and admitted again, it is noted afresh."""
    w, obs = admitted(status=kuberay_status(suspended="True"), **{keys.RESUMED_AT_ANNOTATION: "2029-12-31T00:00:00Z"})
    held = Workload({**w.obj, "spec": {**w.obj["spec"], "suspend": True},
                     "metadata": {**w.obj["metadata"], "labels": {keys.STATE_LABEL: "Provisioning"}}})
    after = applied(held, decide(held, obs, NamespacePolicy(), NOW))
    assert after["spec"]["suspend"] is False and after["metadata"]["labels"][keys.STATE_LABEL] == "Admitted"
    assert keys.RESUMED_AT_ANNOTATION not in after["metadata"]["annotations"]
