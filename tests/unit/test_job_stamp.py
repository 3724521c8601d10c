"""The batch Job webhook: the Ray owner of a Job's pods is stamped into its pod template when it is created."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from builders import config
from builders import request as review_request

from raygate.core import identity, keys
from raygate.core.policy import KUBERAY_OPERATOR_USER as OPERATOR
from raygate.webhook.decision import mutate, validate
from raygate.webhook.jobs import STAMP

OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}


def job(owner: str | None = "RayJob") -> dict[str, Any]:
    refs = [{"apiVersion": "ray.io/v1", "kind": owner, "name": "train", "uid": "u9", "controller": True}
            ] if owner else []
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "team", "ownerReferences": refs},
            "spec": {"template": {"spec": {"containers": [{"name": "submit", "image": "ray"}]}}}}


def request(obj: dict[str, Any], user: str, **kwargs: Any) -> Any:
    return review_request(obj, user=user, **kwargs)


def stamped(obj: dict[str, Any], user: str) -> dict[str, Any]:
    d = mutate(request(obj, user), OPTED_IN, config())
    assert d.allowed, d.message
    return jsonpatch.apply_patch(obj, d.patch)  # type: ignore[no-any-return]


def stamp(obj: dict[str, Any]) -> Any:
    found: Any = obj
    for part in STAMP:
        found = found.get(part, {}) if isinstance(found, dict) else {}
    return found or None


def test_kuberays_submitter_job_is_stamped_with_its_rayjob() -> None:
    stored = stamped(job(), OPERATOR)
    assert stamp(stored) == "RayJob/train/u9/submittergroup"
    assert validate(request(stored, OPERATOR), OPTED_IN, config()).allowed
    assert stamped(stored, OPERATOR) == stored  # idempotent


def test_a_job_a_user_creates_is_stamped_none_whatever_it_claims() -> None:
    forged = job()
    forged["spec"]["template"]["metadata"] = {"annotations": {keys.RAY_OWNER_ANNOTATION: "RayJob/train/u9/x"}}
    assert stamp(stamped(forged, "alice")) == identity.NO_RAY_OWNER
    assert stamp(stamped(job(owner=None), OPERATOR)) == identity.NO_RAY_OWNER
    assert not validate(request(forged, "alice"), OPTED_IN, config()).allowed  # stored with the forged record


def test_nobody_but_raygate_changes_the_stamp() -> None:
    old = stamped(job(), OPERATOR)
    new = copy.deepcopy(old)
    new["spec"]["template"]["metadata"]["annotations"][keys.RAY_OWNER_ANNOTATION] = "RayJob/other/u2/submittergroup"
    d = validate(request(new, "alice", operation="UPDATE", old=old), OPTED_IN, config())
    assert not d.allowed and d.code == 403
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "ml"}
    assert validate(request(relabelled, "alice", operation="UPDATE", old=old), OPTED_IN, config()).allowed


def test_jobs_outside_opted_in_namespaces_are_left_alone() -> None:
    assert mutate(request(job(), OPERATOR), {}, config()).outcome == "skipped-namespace"


def test_a_gpu_job_a_user_creates_claiming_a_ray_object_is_refused() -> None:
    forged = job()
    forged["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    d = mutate(request(forged, "bob"), OPTED_IN, config())
    assert not d.allowed and d.code == 403 and "only KubeRay makes a Ray object's Jobs" in (d.message or "")
    assert mutate(request(forged, OPERATOR), OPTED_IN, config()).allowed
    mine = job(owner=None)
    mine["spec"]["template"] = forged["spec"]["template"]
    assert stamp(stamped(mine, "bob")) == identity.NO_RAY_OWNER  # a GPU Job of his own: not a Ray object's
