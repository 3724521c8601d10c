"""The pure decision: job + observed children + policy + now -> actions. One case per behaviour."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

import jsonpatch
import pytest
from builders import RayJob
from plans import applied, decide, kinds, needs_of

from raygate.core import keys, podgate
from raygate.core.api import OFFLINE
from raygate.core.keys import ChildKind
from raygate.core.modes import GroupSpec, for_object, volcano
from raygate.core.objects import get
from raygate.core.patch import PatchBuilder
from raygate.core.policy import NamespacePolicy, merge_override
from raygate.core.times import parse_time, precise_timestamp, timestamp
from raygate.core.workload import Workload
from raygate.reconciler import children, gating
from raygate.reconciler.held import prerequisite_to_check
from raygate.reconciler.plan import Create, Delete, Emit, Observed, PatchJob, Plan, ReleasePod, delete_all

NOW = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
GPU = {"nvidia.com/gpu": "1"}
CPU = {"cpu": "1"}


def job(state: str = "Pending", *, gpu: bool = True, annotations: dict[str, str] | None = None,
        suspend: bool = True, status: dict[str, Any] | None = None, workers: int = 2) -> Workload:
    """A RayJob as the API server returns it while raygate holds it (state `state`, provisioning mode)."""
    b = (RayJob("train", "ns")
         .meta(uid="u1", resourceVersion="41", generation=3, creationTimestamp="2030-01-01T11:59:00Z")
         .label(keys.STATE_LABEL, state).annotation(keys.MODE_ANNOTATION, "provisioning").suspend(suspend)
         .head(requests=CPU)
         .worker("gpu", replicas=workers, min_replicas=0, max_replicas=9,
                 limits=GPU if gpu else None, requests=None if gpu else CPU)
         .set("status", value=status or {}))
    for key, value in (annotations or {}).items():
        b.annotation(key, value)
    return Workload(b.obj())


def policy(**override: Any) -> NamespacePolicy:
    base = {"retry": {"limit": 2, "baseSeconds": 10, "maxSeconds": 15},
            "provisioning": {"provisionedTimeoutSeconds": 300}}
    return merge_override(NamespacePolicy(), {**base, **override})


def rname(w: Workload, attempt: int) -> str:
    """The name the reconciler gives attempt `attempt` of `w` as it is now."""
    return needs_of(w, policy()).request_name(w, attempt)


def tname(w: Workload, pod_set: str) -> str:
    return children.template_name(w, next(p for p in w.gang().pod_sets if p.name == pod_set))


def request(w: Workload, attempt: int, *conds: tuple[str, str, str], age: float = 5) -> dict[str, Any]:
    created = (NOW - dt.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    gang = needs_of(w, policy())
    pr = children.provisioning_request(w, list(gang.managed), policy(), attempt, "v1", gang.fingerprint)
    pr["metadata"]["creationTimestamp"] = created
    pr["status"] = {"conditions": [{"type": t, "status": s, "reason": r, "message": f"{t} says {r}"}
                                   for t, s, r in conds]}
    return pr


def templates(w: Workload) -> tuple[dict[str, Any], ...]:
    manages = NamespacePolicy().manages
    return tuple(children.pod_template(w, p, manages) for p in w.gang().managed_pod_sets(manages))


def provisioning(attempt: int = 1, **extra: str) -> Workload:
    w = job()
    return job("Provisioning", annotations={keys.ATTEMPT_ANNOTATION: str(attempt),
                                            keys.REQUEST_ANNOTATION: rname(w, attempt), **extra})


def test_cpu_only_job_is_admitted_at_once_without_a_request() -> None:
    w = job(gpu=False)
    plan = decide(w, Observed(), policy(), NOW)
    assert kinds(plan) == ["patch admit", "event Admitted"]
    after = applied(w, plan)
    assert after["spec"]["suspend"] is False
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Admitted"
    assert "no capacity request" in after["metadata"]["annotations"][keys.REASON_ANNOTATION]


def test_gpu_job_gets_templates_then_request_then_state_provisioning() -> None:
    w = job()
    plan = decide(w, Observed(), policy(), NOW)
    assert kinds(plan) == ["create PodTemplate", "create ProvisioningRequest", "patch provisioning"]
    assert plan.actions[0].obj["metadata"]["name"] == tname(w, "gpu")  # type: ignore[union-attr]
    pr = plan.actions[1].obj  # type: ignore[union-attr]
    assert pr["spec"]["podSets"] == [{"podTemplateRef": {"name": tname(w, "gpu")}, "count": 2}]
    ann = applied(w, plan)["metadata"]["annotations"]
    assert ann[keys.REQUEST_ANNOTATION] == rname(w, 1) and ann[keys.ATTEMPT_ANNOTATION] == "1"
    assert plan.requeue_after == 300


def test_patches_first_test_the_state_they_were_decided_on() -> None:
    w = provisioning(2)
    pr = request(w, 2, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    patch = next(a for a in plan.actions if isinstance(a, PatchJob))
    assert patch.step == "admit" and patch.ops[:4] == (
        {"op": "test", "path": "/metadata/labels/raygate.io~1state", "value": "Provisioning"},
        {"op": "test", "path": "/metadata/annotations/raygate.io~1attempt", "value": "2"},
        {"op": "test", "path": "/metadata/annotations/raygate.io~1provisioning-request",
         "value": rname(w, 2)},
        {"op": "test", "path": "/metadata/generation", "value": 3},  # admission only: spec as decided on
    )
    moved_on = json.loads(json.dumps(w.obj))
    moved_on["metadata"]["annotations"][keys.ATTEMPT_ANNOTATION] = "3"
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved_on, list(patch.ops))
    # A user grew the job after the decision: the admission made for the old size must not apply.
    grown_since = json.loads(json.dumps(w.obj))
    grown_since["metadata"]["generation"] = 4
    grown_since["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 20
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(grown_since, list(patch.ops))


def test_replay_after_a_crash_creates_only_what_is_missing() -> None:
    w = job()
    obs = Observed(requests=(request(w, 1),), templates=templates(w))
    assert kinds(decide(w, obs, policy(), NOW)) == ["patch provisioning"]


def test_no_provisioning_request_api_fails_the_job_with_a_reason() -> None:
    w = job()
    plan = decide(w, Observed(), policy(), NOW, provreq_version=None)
    after = applied(w, plan)
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Failed"
    assert "serves no ProvisioningRequest API" in after["metadata"]["annotations"][keys.REASON_ANNOTATION]


@pytest.mark.parametrize(("conds", "expected"), [
    ((), "waiting"),
    ((("Accepted", "True", "Accepted"),), "waiting"),
    ((("Provisioned", "True", "Provisioned"),), "waiting"),  # Accepted too is required
    ((("Accepted", "True", "A"), ("Provisioned", "True", "P")), "admitted"),
    ((("Accepted", "True", "A"), ("Provisioned", "True", "P"), ("Failed", "True", "F")), "retry"),
    ((("Accepted", "True", "A"), ("Failed", "True", "F")), "retry"),
    ((("Accepted", "True", "A"), ("Provisioned", "True", "P"), ("BookingExpired", "True", "E")), "retry"),
    ((("Accepted", "True", "A"), ("Provisioned", "True", "P"), ("CapacityRevoked", "True", "R")), "retry"),
    ((("Accepted", "True", "A"), ("Failed", "False", "F")), "waiting"),
])
def test_conditions_of_the_current_request(conds: tuple[tuple[str, str, str], ...], expected: str) -> None:
    w = provisioning()
    obs = Observed(requests=(request(w, 1, *conds),), templates=templates(w))
    assert decide(w, obs, policy(), NOW).outcome == expected


def test_provisioned_admits_in_one_patch_with_consume_annotations() -> None:
    w = provisioning()
    name = rname(w, 1)
    obs = Observed(requests=(request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P")),),
                   templates=templates(w))
    plan = decide(w, obs, policy(), NOW)
    assert kinds(plan) == ["patch admit", "event Admitted"]
    after = applied(w, plan)
    assert after["spec"]["suspend"] is False
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Admitted"
    assert after["metadata"]["annotations"][keys.ADMITTED_AT_ANNOTATION] == "2030-01-01T12:00:00Z"
    gpu_tpl = after["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    assert gpu_tpl["metadata"]["annotations"] == {keys.CONSUME_ANNOTATION: name,
                                                  keys.CLASS_ANNOTATION: keys.CHECK_CAPACITY_CLASS}
    head_tpl = after["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert "metadata" not in head_tpl  # only the pod sets that were booked consume the booking


def test_provisioned_admits_a_raycluster_whose_gpu_pods_are_born_as_the_pod_gate_leaves_them() -> None:
    """Where pods are gated, an admitted RayCluster's GPU template carries the gate, the gated label and the record,
    and names no booking: the pods KubeRay makes from it are ones the pod webhook leaves unchanged, so the API
    server need not call it (podgate_policy.ARRIVES_GATED)."""
    from builders import RayCluster, config
    from builders import request as review_request

    from raygate.core.policy import KUBERAY_OPERATOR_USER
    from raygate.webhook.decision import mutate

    held = Workload(RayCluster("train", "ns").meta(uid="c1", resourceVersion="41", generation=3)
                    .label(keys.STATE_LABEL, "Pending").annotation(keys.MODE_ANNOTATION, "provisioning")
                    .suspend(True).head(requests=CPU).worker("gpu", replicas=2, limits=GPU).obj())
    w = Workload({**held.obj, "metadata": {**held.obj["metadata"], "labels": {keys.STATE_LABEL: "Provisioning"},
                                           "annotations": {**held.annotations, keys.ATTEMPT_ANNOTATION: "1",
                                                           keys.REQUEST_ANNOTATION: rname(held, 1)}}})
    obs = Observed(requests=(request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P")),),
                   templates=templates(w))
    after = applied(w, decide(w, obs, policy(), NOW))
    assert after["spec"]["suspend"] is False
    gpu_tpl = after["spec"]["workerGroupSpecs"][0]["template"]
    assert podgate.gated(gpu_tpl) and gpu_tpl["metadata"]["labels"] == {keys.POD_GATE_LABEL: keys.POD_GATED}
    assert gpu_tpl["metadata"]["annotations"] == {keys.RAY_OWNER_ANNOTATION: "RayCluster/train/c1/gpu"}
    assert "metadata" not in after["spec"]["headGroupSpec"]["template"]  # no GPU: never gated
    assert not podgate.gated(children.template_copy(gpu_tpl))  # what the autoscaler simulates carries no gate

    # The pod KubeRay creates from it: its own labels on top, its controller reference, the template's spec.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "train-gpu-worker-x", "namespace": "ns",
        "labels": {**gpu_tpl["metadata"]["labels"], keys.RAY_CLUSTER_LABEL: "train", keys.RAY_GROUP_LABEL: "gpu",
                   keys.RAY_NODE_TYPE_LABEL: "worker"},
        "annotations": dict(gpu_tpl["metadata"]["annotations"]),
        "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "train", "uid": "c1",
                             "controller": True}]}, "spec": gpu_tpl["spec"]}
    d = mutate(review_request(pod, user=KUBERAY_OPERATOR_USER, namespace="ns"),
               {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}, config(mode="provisioning"))
    assert d.allowed and d.outcome == "unchanged" and not d.patch, d


def test_provisioned_admits_a_rayjob_naming_its_booking_in_its_templates_not_born_gated() -> None:
    """A RayJob's pods belong to the RayCluster KubeRay makes for it: their record names that cluster's uid, which
    does not exist at admission, so its templates are not stamped (the pod gate gates its pods at create)."""
    w = provisioning()
    obs = Observed(requests=(request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P")),),
                   templates=templates(w))
    gpu_tpl = applied(w, decide(w, obs, policy(), NOW))["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    assert not podgate.gated(gpu_tpl) and keys.POD_GATE_LABEL not in (gpu_tpl["metadata"].get("labels") or {})


@pytest.mark.parametrize(("attempt", "delay"), [(1, 10), (2, 15)])
def test_failed_request_retries_under_a_new_name_after_backoff(attempt: int, delay: float) -> None:
    w = provisioning(attempt)
    old = rname(w, attempt)
    obs = Observed(requests=(request(w, attempt, ("Failed", "True", "OutOfQuota")),), templates=templates(w))
    plan = decide(w, obs, policy(), NOW)
    assert kinds(plan) == ["patch retry", "event ProvisioningRetry", f"delete ProvisioningRequest {old}"]
    ann = applied(w, plan)["metadata"]["annotations"]
    assert ann[keys.ATTEMPT_ANNOTATION] == str(attempt + 1)
    assert ann[keys.REQUEST_ANNOTATION] == rname(w, attempt + 1)
    assert parse_time(ann[keys.NEXT_ATTEMPT_ANNOTATION]) == NOW + dt.timedelta(seconds=delay)
    assert "OutOfQuota" in ann[keys.REASON_ANNOTATION]
    assert plan.requeue_after == delay


def test_backoff_waits_then_creates_the_next_attempt() -> None:
    due = timestamp(NOW + dt.timedelta(seconds=4))
    w = provisioning(2, **{keys.NEXT_ATTEMPT_ANNOTATION: due})
    waiting = decide(w, Observed(templates=templates(w)), policy(), NOW)
    assert waiting.actions == [] and waiting.requeue_after == 4
    later = decide(w, Observed(templates=templates(w)), policy(), NOW + dt.timedelta(seconds=5))
    assert kinds(later) == ["create ProvisioningRequest"] and later.outcome == "retried"
    assert later.actions[0].obj["metadata"]["name"] == rname(w, 2)  # type: ignore[union-attr]


def test_past_the_limit_the_job_fails_stays_suspended_and_its_children_go() -> None:
    w = provisioning(3)  # limit 2: attempts 1, 2 and 3 are allowed
    pr = request(w, 3, ("Failed", "True", "OutOfQuota"))
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert kinds(plan) == ["patch fail", "event ProvisioningFailed",
                           f"delete ProvisioningRequest {rname(w, 3)}",
                           f"delete PodTemplate {tname(w, 'gpu')}"]
    after = applied(w, plan)
    assert after["spec"]["suspend"] is True
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Failed"
    assert keys.REQUEST_ANNOTATION not in after["metadata"]["annotations"]
    assert "Failed says OutOfQuota" in after["metadata"]["annotations"][keys.REASON_ANNOTATION]
    event = next(a for a in plan.actions if isinstance(a, Emit))
    assert "Failed says OutOfQuota" in event.message and "raygate.io/state=Pending --overwrite" in event.message


def test_relabelled_pending_after_failed_starts_over_at_attempt_1() -> None:
    w = job("Pending", annotations={keys.ATTEMPT_ANNOTATION: "3", keys.REASON_ANNOTATION: "gave up"})
    plan = decide(w, Observed(templates=templates(w)), policy(), NOW)
    assert kinds(plan)[0] == "create ProvisioningRequest"
    assert applied(w, plan)["metadata"]["annotations"][keys.ATTEMPT_ANNOTATION] == "1"


def since(w: Workload, attempt: int, seconds_ago: float) -> str:
    return f"{rname(w, attempt)} {precise_timestamp(NOW - dt.timedelta(seconds=seconds_ago))}"


@pytest.mark.parametrize("conds", [(), (("Accepted", "True", "A"),)], ids=["queued", "accepted, not answered"])
def test_a_request_the_autoscaler_has_not_answered_waits_past_the_timeout(conds: tuple[Any, ...]) -> None:
    # The autoscaler takes one request per loop, in no set order: a request older than the timeout may just
    # not have had its turn, and a new one would join the same queue after a backoff.
    w = provisioning()
    pr = request(w, 1, *conds, age=10_000)
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert (plan.outcome, plan.actions, plan.requeue_after) == ("waiting", [], 300)


def test_the_timeout_counts_from_the_autoscalers_first_answer_recorded_with_it() -> None:
    w = provisioning()
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "False", "CapacityIsNotFound"), age=10_000)
    first = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert kinds(first) == ["patch hold", "event WaitingForCapacity"] and first.requeue_after == 300
    assert applied(w, first)["metadata"]["annotations"][keys.NOT_PROVISIONED_SINCE_ANNOTATION] == since(w, 1, 0)
    later = provisioning(**{keys.NOT_PROVISIONED_SINCE_ANNOTATION: since(w, 1, 100)})
    waiting = decide(later, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert waiting.outcome == "waiting" and waiting.requeue_after == 200
    expired = provisioning(**{keys.NOT_PROVISIONED_SINCE_ANNOTATION: since(w, 1, 301)})
    retry = decide(expired, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert retry.outcome == "retry"
    after = applied(expired, retry)["metadata"]["annotations"]
    assert "not Provisioned within 300s of the autoscaler's first answer" in after[keys.REASON_ANNOTATION]
    assert keys.NOT_PROVISIONED_SINCE_ANNOTATION not in after


def test_a_first_answer_recorded_for_an_earlier_request_does_not_count() -> None:
    w = provisioning(2, **{keys.NOT_PROVISIONED_SINCE_ANNOTATION: since(job(), 1, 10_000)})
    pr = request(w, 2, ("Accepted", "True", "A"), ("Provisioned", "False", "CapacityIsNotFound"))
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert plan.outcome == "waiting" and plan.requeue_after == 300
    assert applied(w, plan)["metadata"]["annotations"][keys.NOT_PROVISIONED_SINCE_ANNOTATION] == since(w, 2, 0)


def test_an_unchanged_answer_with_its_clock_missing_records_only_the_clock() -> None:
    # A job held before the clock was recorded (an older raygate): the clock starts now, without a second Event.
    w = provisioning()
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "False", "CapacityIsNotFound"))
    reason = applied(w, decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW))[
        "metadata"]["annotations"][keys.REASON_ANNOTATION]
    held = provisioning(**{keys.REASON_ANNOTATION: reason})
    plan = decide(held, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert kinds(plan) == ["patch hold"]
    assert applied(held, plan)["metadata"]["annotations"][keys.NOT_PROVISIONED_SINCE_ANNOTATION] == since(w, 1, 0)


def test_admission_drops_the_clock_of_the_request_it_admits_on() -> None:
    w = provisioning(**{keys.NOT_PROVISIONED_SINCE_ANNOTATION: since(job(), 1, 60)})
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert plan.outcome == "admitted"
    assert keys.NOT_PROVISIONED_SINCE_ANNOTATION not in applied(w, plan)["metadata"]["annotations"]


def test_capacity_not_found_is_reported_once() -> None:
    w = provisioning()
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "False", "CapacityNotFound"))
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert kinds(plan) == ["patch hold", "event WaitingForCapacity"]
    again = job("Provisioning", annotations=applied(w, plan)["metadata"]["annotations"])
    assert decide(again, Observed(requests=(pr,), templates=templates(w)), policy(), NOW).actions == []


def test_stale_requests_of_older_attempts_are_deleted() -> None:
    w = provisioning(2)
    obs = Observed(requests=(request(w, 1), request(w, 2)), templates=templates(w))
    assert f"delete ProvisioningRequest {rname(w, 1)}" in kinds(decide(w, obs, policy(), NOW))


@pytest.mark.parametrize("status", [{"jobDeploymentStatus": "Complete"}, {"jobDeploymentStatus": "Failed"}])
def test_finished_job_frees_its_booking(status: dict[str, str]) -> None:
    w = job("Admitted", suspend=False, status=status,
            annotations={keys.REQUEST_ANNOTATION: rname(job(), 1)})
    obs = Observed(requests=(request(w, 1),), templates=templates(w))
    assert sorted(kinds(decide(w, obs, policy(), NOW))) == [
        f"delete PodTemplate {tname(w, 'gpu')}",
        f"delete ProvisioningRequest {rname(w, 1)}"]


def admitted_with_revoked() -> tuple[Workload, Observed]:
    w = job("Admitted", suspend=False, annotations={keys.ATTEMPT_ANNOTATION: "1",
                                                    keys.REQUEST_ANNOTATION: rname(job(), 1)})
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"), ("CapacityRevoked", "True", "R"))
    return w, Observed(requests=(pr,), templates=templates(w))


def test_capacity_revoked_report_only_records_it() -> None:
    w, obs = admitted_with_revoked()
    plan = decide(w, obs, policy(provisioning={"capacityRevoked": "Report"}), NOW)
    assert kinds(plan) == ["patch hold", "event CapacityRevoked"]
    assert applied(w, plan)["spec"]["suspend"] is False


def test_capacity_revoked_requeue_suspends_and_asks_again() -> None:
    w, obs = admitted_with_revoked()
    plan = decide(w, obs, policy(provisioning={"capacityRevoked": "Requeue"}), NOW)
    assert kinds(plan) == ["patch requeue", "event CapacityRevoked",
                           f"delete ProvisioningRequest {rname(w, 1)}"]
    after = applied(w, plan)
    assert after["spec"]["suspend"] is True and after["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
    requeued = Workload(after)
    nxt = decide(requeued, Observed(templates=obs.templates), policy(), NOW)
    assert nxt.actions[0].obj["metadata"]["name"] == rname(w, 2)  # type: ignore[union-attr]


def volcano_job(queue_open: bool | None, provision: bool = False) -> tuple[Workload, Observed, NamespacePolicy]:
    spec = {"minMember": 3, "minTaskMember": {"headgroup": 1, "gpu": 2}, "queue": "team-a"}
    w = job(annotations={keys.MODE_ANNOTATION: "volcano", keys.POD_GROUP_ANNOTATION: json.dumps(spec)})
    pol = policy(mode="volcano", provisioning={"enabled": provision})
    return w, Observed(prerequisite=queue(queue_open)), pol


def queue(is_open: bool | None) -> dict[str, Any] | None:
    """A Volcano Queue as read (None: it does not exist)."""
    return None if is_open is None else {"status": {"state": "Open" if is_open else "Closed"}}


@pytest.mark.parametrize(("queue_open", "words"), [(False, "is Closed"), (None, "does not exist")])
def test_volcano_job_is_held_while_its_queue_is_not_open(queue_open: bool | None, words: str) -> None:
    w, obs, pol = volcano_job(queue_open)
    needed = prerequisite_to_check(w, for_object(pol, w.annotations), Observed())
    assert needed is not None and (needed.resource.plural, needed.name) == ("queues", "team-a")
    plan = decide(w, obs, pol, NOW)
    assert kinds(plan) == ["patch hold", "event QueueNotOpen"]
    assert words in applied(w, plan)["metadata"]["annotations"][keys.REASON_ANNOTATION]
    assert plan.requeue_after is not None


def test_volcano_job_gets_its_pod_group_then_admitted() -> None:
    w, obs, pol = volcano_job(True)
    plan = decide(w, obs, pol, NOW)
    assert kinds(plan) == ["create PodGroup", "patch admit", "event Admitted"]
    pg = plan.actions[0].obj  # type: ignore[union-attr]
    assert pg["metadata"]["name"] == "ray-train-pg" and pg["spec"]["queue"] == "team-a"
    after = applied(w, plan)
    assert after["metadata"]["annotations"][keys.REASON_ANNOTATION] == (
        "admitted: PodGroup ray-train-pg in Volcano queue team-a gang-schedules the pods")


def _group_names(obj: dict[str, Any]) -> dict[str, Any]:
    w = Workload(obj)
    return {task: (((obj_get(obj, path) or {}).get("metadata") or {}).get("annotations") or {}).get(
        keys.VOLCANO_GROUP_NAME_ANNOTATION) for task, path in w.template_paths()}


def obj_get(obj: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def generated_volcano_job() -> Workload:
    """A job created with generateName in volcano mode, as stored: the webhook could not name its group."""
    w, _, _ = volcano_job(True)
    obj = json.loads(json.dumps(w.obj))
    obj["metadata"]["name"] = "train-x7k2p"
    obj["spec"]["submitterPodTemplate"] = {"spec": {"containers": [{"name": "s", "image": "ray"}]}}
    return Workload(obj)


@pytest.mark.parametrize("provision", [False, True], ids=["volcano", "volcano-with-provisioning"])
def test_volcano_admit_names_the_pod_group_on_every_template_in_the_patch_that_unsuspends(provision: bool) -> None:
    w = generated_volcano_job()
    assert set(_group_names(w.obj).values()) == {None}
    pol = policy(mode="volcano", provisioning={"enabled": provision})
    obs = Observed(prerequisite=queue(True))
    if provision:  # Provisioned: the request raygate made for it
        plan = decide(w, obs, pol, NOW)
        w = Workload(applied(w, plan))
        pg = next(a.obj for a in plan.actions if isinstance(a, Create) and a.kind == "PodGroup")
        name = w.annotations[keys.REQUEST_ANNOTATION]
        gang = needs_of(w, pol)
        pr = children.provisioning_request(w, list(gang.managed), pol, 1, "v1", gang.fingerprint)
        pr["metadata"]["creationTimestamp"] = "2030-01-01T11:59:59Z"
        pr["status"] = {"conditions": [{"type": t, "status": "True"} for t in ("Accepted", "Provisioned")]}
        assert pr["metadata"]["name"] == name
        obs = Observed(requests=(pr,), groups=(pg,))
    plan = decide(w, obs, pol, NOW)
    admits = [a for a in plan.actions if isinstance(a, PatchJob) and a.step == "admit"]
    assert len(admits) == 1
    unsuspends = [op for a in plan.actions if isinstance(a, PatchJob) for op in a.ops
                  if op["path"] == "/spec/suspend" and op.get("value") is False]
    assert len(unsuspends) == 1 and unsuspends[0] in admits[0].ops
    after = applied(w, plan)
    assert after["spec"]["suspend"] is False
    assert _group_names(after) == {"headgroup": "ray-train-x7k2p-pg", "gpu": "ray-train-x7k2p-pg",
                                   "submittergroup": "ray-train-x7k2p-pg"}


def test_volcano_admit_of_a_named_job_adds_nothing_to_the_group_names_the_webhook_wrote() -> None:
    w = generated_volcano_job()
    named = json.loads(json.dumps(w.obj))
    for _, path in w.template_paths():
        obj_get(named, path).setdefault("metadata", {}).setdefault("annotations", {})[
            keys.VOLCANO_GROUP_NAME_ANNOTATION] = "ray-train-x7k2p-pg"
    plan = decide(Workload(named), Observed(prerequisite=queue(True)), policy(mode="volcano"), NOW)
    admit = next(a for a in plan.actions if isinstance(a, PatchJob) and a.step == "admit")
    assert not [op for op in admit.ops if keys.VOLCANO_GROUP_NAME_ANNOTATION.replace("/", "~1") in op["path"]]


RECORDED = {"minMember": 3, "minTaskMember": {"headgroup": 1, "gpu": 2}, "queue": "team-a",
            "minResources": {"cpu": "3", "memory": "6Gi", "nvidia.com/gpu": "2"}}


@pytest.mark.parametrize(("actual", "changed"), [
    (RECORDED, []),
    ({**RECORDED, "minResources": {"cpu": "3000m", "memory": "6144Mi", "nvidia.com/gpu": "2"}}, []),
    ({**RECORDED, "minMember": 2}, ["minMember 3 -> 2"]),
    ({**RECORDED, "minMember": 0, "minResources": {}}, ["minMember 3 -> 0", "minResources"]),
    ({**RECORDED, "minResources": {"cpu": "2", "memory": "6Gi", "nvidia.com/gpu": "2"}}, ["minResources"]),
    ({**RECORDED, "queue": "default"}, ["queue team-a -> default"]),
    ({**RECORDED, "minTaskMember": {}}, ["minTaskMember"]),
], ids=["same", "same-spelled-otherwise", "min-member", "reset-on-suspend", "min-resources", "queue",
        "min-task-member"])
def test_pod_group_drift(actual: dict[str, Any], changed: list[str]) -> None:
    found = volcano.RULES.drift(GroupSpec("ray-train-pg", RECORDED), {"spec": actual})
    assert len(found) == len(changed)
    for words, line in zip(changed, found, strict=True):
        assert line.startswith(words)


def admitted_volcano_job() -> Workload:
    return job("Admitted", suspend=False, annotations={keys.MODE_ANNOTATION: "volcano",
                                                        keys.POD_GROUP_ANNOTATION: json.dumps(RECORDED)})


def test_admitted_volcano_job_is_stopped_when_its_pod_group_was_rewritten() -> None:
    w = admitted_volcano_job()
    [(_, ours)] = volcano.RULES.group_objects(w, volcano.RULES.recorded(w), OFFLINE)
    plan = decide(w, Observed(groups=(ours,)), policy(mode="volcano"), NOW)
    assert (kinds(plan), plan.outcome) == ([], "admitted")  # its own group, as made: nothing to do
    rewritten = json.loads(json.dumps(ours))
    rewritten["spec"].update(minMember=2, minResources={"cpu": "2", "memory": "6Gi", "nvidia.com/gpu": "2"})
    plan = decide(w, Observed(groups=(rewritten,)), policy(mode="volcano"), NOW)
    assert kinds(plan) == ["patch fail", "event PodGroupRewritten", "delete PodGroup ray-train-pg"]
    after = applied(w, plan)
    assert after["spec"]["suspend"] is True and after["metadata"]["labels"][keys.STATE_LABEL] == "Failed"
    reason = after["metadata"]["annotations"][keys.REASON_ANNOTATION]
    assert "minMember 3 -> 2" in reason and "--batch-scheduler=volcano" in reason


def test_volcano_with_provisioning_creates_pod_group_and_request() -> None:
    w, obs, pol = volcano_job(True, provision=True)
    assert kinds(decide(w, obs, pol, NOW))[:3] == [
        "create PodGroup", "create PodTemplate", "create ProvisioningRequest"]


@pytest.mark.parametrize(("annotations", "words"), [
    ({keys.MODE_ANNOTATION: "volcano", keys.POD_GROUP_ANNOTATION: "{broken"}, "not valid JSON"),
    ({keys.MODE_ANNOTATION: "volcano"}, "needs the PodGroup spec"),
])
def test_bad_input_fails_the_job_with_a_reason(annotations: dict[str, str], words: str) -> None:
    w = job(annotations=annotations)
    plan = decide(w, Observed(), policy(mode="volcano"), NOW)
    assert kinds(plan) == ["patch fail", "event InvalidJob"]
    assert words in applied(w, plan)["metadata"]["annotations"][keys.REASON_ANNOTATION]


def test_too_many_gpu_pod_sets_fail_the_job() -> None:
    w = job()
    groups = w.obj["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    many = [{**groups[0], "groupName": f"g{i}"} for i in range(33)]
    big = Workload({**w.obj, "spec": {**w.obj["spec"], "rayClusterSpec": {
        **w.obj["spec"]["rayClusterSpec"], "workerGroupSpecs": many}}})
    plan = decide(big, Observed(), policy(), NOW)
    assert "at most 32" in applied(big, plan)["metadata"]["annotations"][keys.REASON_ANNOTATION]


def test_kueue_mode_is_left_to_kueue() -> None:
    w = job(annotations={keys.MODE_ANNOTATION: "kueue"})
    assert decide(w, Observed(), policy(), NOW).actions == []


# --- the gate holds: the booking matches what will run -------------------------------------------

def grown(w: Workload, workers: int) -> Workload:
    """`w` with its GPU group resized, as a user's edit while it is held would leave it."""
    obj = json.loads(json.dumps(w.obj))
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = workers
    return Workload(obj)


def test_pod_sets_changed_while_provisioning_replace_the_request_in_the_same_attempt() -> None:
    w = provisioning(2)
    old_request, old_templates = request(w, 2), templates(w)
    bigger = grown(w, 5)
    plan = decide(bigger, Observed(requests=(old_request,), templates=old_templates), policy(), NOW)
    assert plan.outcome == "replaced"
    assert kinds(plan) == ["delete ProvisioningRequest " + rname(w, 2), "create ProvisioningRequest",
                           "patch provisioning", "event PodSetsChanged"]
    new_request = next(a.obj for a in plan.actions if isinstance(a, Create) and a.kind == "ProvisioningRequest")
    assert new_request["spec"]["podSets"][0]["count"] == 5
    ann = applied(bigger, plan)["metadata"]["annotations"]
    assert (ann[keys.ATTEMPT_ANNOTATION], ann[keys.REQUEST_ANNOTATION]) == ("2", rname(bigger, 2))


def test_template_changed_while_provisioning_replaces_the_template_too() -> None:
    w = provisioning()
    obj = json.loads(json.dumps(w.obj))
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {"gpu": "h100"}
    edited = Workload(obj)
    plan = decide(edited, Observed(requests=(request(w, 1),), templates=templates(w)), policy(), NOW)
    assert kinds(plan)[:4] == ["delete ProvisioningRequest " + rname(w, 1), "create PodTemplate",
                               "delete PodTemplate " + tname(w, "gpu"), "create ProvisioningRequest"]
    created = next(a.obj for a in plan.actions if isinstance(a, Create) and a.kind == "PodTemplate")
    assert created["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}


def test_a_provisioned_request_for_other_pod_sets_never_admits() -> None:
    w = provisioning()
    booked_for_two = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    bigger = grown(w, 8)  # grew after the request was made, before it was Provisioned
    plan = decide(bigger, Observed(requests=(booked_for_two,), templates=templates(w)), policy(), NOW)
    assert "patch admit" not in kinds(plan)
    assert applied(bigger, plan)["spec"]["suspend"] is True


def test_request_recording_other_pod_sets_is_replaced_even_under_the_current_name() -> None:
    w = provisioning()
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    pr["metadata"]["annotations"][keys.POD_SETS_ANNOTATION] = "something-else"
    plan = decide(w, Observed(requests=(pr,), templates=templates(w)), policy(), NOW)
    assert "patch admit" not in kinds(plan) and plan.outcome != "admitted"


def test_autoscaling_books_the_replicas_kuberay_starts() -> None:
    obj = json.loads(json.dumps(job().obj))
    spec = obj["spec"]["rayClusterSpec"]
    spec["enableInTreeAutoscaling"] = True
    spec["workerGroupSpecs"][0].update({"minReplicas": 0, "replicas": 10, "maxReplicas": 20})
    plan = decide(Workload(obj), Observed(), policy(), NOW)
    pr = next(a.obj for a in plan.actions if isinstance(a, Create) and a.kind == "ProvisioningRequest")
    assert pr["spec"]["podSets"][0]["count"] == 10


def test_job_kuberay_refused_fails_for_good_and_frees_its_booking() -> None:
    w = job("Provisioning", status={"jobDeploymentStatus": "ValidationFailed", "message": "spec is invalid: x"},
            annotations={keys.ATTEMPT_ANNOTATION: "1", keys.REQUEST_ANNOTATION: rname(job(), 1)})
    plan = decide(w, Observed(requests=(request(w, 1),), templates=templates(w)), policy(), NOW)
    assert kinds(plan)[:2] == ["patch fail", "event RejectedByKubeRay"]
    assert f"delete ProvisioningRequest {rname(w, 1)}" in kinds(plan)
    after = applied(w, plan)
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Failed"
    assert "spec is invalid: x" in after["metadata"]["annotations"][keys.REASON_ANNOTATION]
    event = next(a for a in plan.actions if isinstance(a, Emit))
    assert "create it again" in event.message and "--overwrite" not in event.message
    again = decide(Workload(after), Observed(), policy(), NOW)
    assert again.actions == []  # failed once, and it stays so


def test_admitted_job_a_user_suspended_waits_for_capacity_again() -> None:
    w = job("Admitted", suspend=True,
            annotations={keys.ATTEMPT_ANNOTATION: "1", keys.REQUEST_ANNOTATION: rname(job(), 1)})
    plan = decide(w, Observed(requests=(request(w, 1),), templates=templates(w)), policy(), NOW)
    assert kinds(plan) == ["patch requeue", "event Requeued", f"delete ProvisioningRequest {rname(w, 1)}"]
    after = applied(w, plan)
    assert after["metadata"]["labels"][keys.STATE_LABEL] == "Pending" and after["spec"]["suspend"] is True
    nxt = decide(Workload(after), Observed(templates=templates(w)), policy(), NOW)
    assert [a.obj["metadata"]["name"] for a in nxt.actions if isinstance(a, Create)] == [rname(w, 2)]


@pytest.mark.parametrize("now_mode", [{"mode": "kueue"}, {"mode": "kueue", "provisioning": {"enabled": False}}])
def test_held_job_finishes_under_the_mode_it_was_held_with(now_mode: dict[str, Any]) -> None:
    w = job()  # held in provisioning mode; the namespace moved to kueue since
    plan = decide(w, Observed(), policy(**now_mode), NOW)
    assert kinds(plan) == ["create PodTemplate", "create ProvisioningRequest", "patch provisioning"]
    admitted = decide(provisioning(), Observed(requests=(request(w, 1, ("Accepted", "True", "A"),
                                                               ("Provisioned", "True", "P")),),
                                           templates=templates(w)), policy(**now_mode), NOW)
    assert admitted.outcome == "admitted"


# --- a booking lives as long as its pods ------------------------------------------------------------

def test_a_job_kuberay_refused_while_its_pods_run_keeps_its_booking_and_says_so() -> None:
    w = job("Admitted", suspend=False, status={"jobDeploymentStatus": "ValidationFailed", "message": "bad ttl"},
            annotations={keys.ATTEMPT_ANNOTATION: "1", keys.REQUEST_ANNOTATION: rname(job(), 1)})
    running = Observed(requests=(request(w, 1),), templates=templates(w), consumers={rname(w, 1): 2})
    plan = decide(w, running, policy(), NOW)
    assert kinds(plan) == ["patch fail", "event RejectedByKubeRay"]  # no delete while 2 pods still run
    after = applied(w, plan)
    reason = after["metadata"]["annotations"][keys.REASON_ANNOTATION]
    assert f"ProvisioningRequest {rname(w, 1)} stays while 2 of its pods still run" in reason
    event = next(a for a in plan.actions if isinstance(a, Emit))
    assert "The job stays suspended" not in event.message  # it was running: raygate does not pretend otherwise
    # The pods end: the next decision frees the booking and its templates.
    gone = Observed(requests=running.requests, templates=running.templates)
    assert sorted(kinds(decide(Workload(after), gone, policy(), NOW))) == [
        f"delete PodTemplate {tname(w, 'gpu')}", f"delete ProvisioningRequest {rname(w, 1)}"]


@pytest.mark.parametrize("status", [None, {"jobDeploymentStatus": "Complete"}], ids=["deleted", "finished"])
def test_a_deleted_or_finished_job_keeps_its_booking_until_its_pods_end(status: dict[str, str] | None) -> None:
    w = job("Admitted", suspend=False, status=status,
            annotations={keys.ATTEMPT_ANNOTATION: "1", keys.REQUEST_ANNOTATION: rname(job(), 1)})
    if status is None:  # deleted, kept by a user's finalizer
        obj = json.loads(json.dumps(w.obj))
        obj["metadata"]["deletionTimestamp"] = "2030-01-01T11:59:30Z"
        w = Workload(obj)
    stale = request(w, 1)
    stale["metadata"]["name"] = "train-old-a0"  # another request of the job that no pod consumes
    obs = Observed(requests=(request(w, 1), stale), templates=templates(w), consumers={rname(w, 1): 1})
    assert kinds(decide(w, obs, policy(), NOW)) == ["delete ProvisioningRequest train-old-a0"]


def test_a_job_gone_leaves_only_the_bookings_its_pods_still_use() -> None:
    w = job("Admitted", suspend=False)
    other = request(w, 2)
    obs = Observed(requests=(request(w, 1), other), templates=templates(w), consumers={rname(w, 1): 3})
    assert kinds(Plan(delete_all(obs))) == [f"delete ProvisioningRequest {rname(w, 2)}"]


def test_a_held_job_over_a_limit_is_failed_before_anything_is_asked_of_the_autoscaler() -> None:
    """Held before the limit was lowered (or past a webhook that was down): nothing goes to the autoscaler."""
    w = job(workers=5)
    plan = decide(w, Observed(), policy(limits={"maxRequestPods": 4}), NOW)
    assert kinds(plan) == ["patch fail", "event InvalidJob"]
    assert "would book 5 pods" in applied(w, plan)["metadata"]["annotations"][keys.REASON_ANNOTATION]


# --- the pod gate of an admitted job -----------------------------------------------------------------

def gated_pod(w: Workload, name: str, **spec: Any) -> dict[str, Any]:
    """A gated GPU pod of the job's cluster as the webhook stores it (the worker template's spec)."""
    template = w.obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": f"2030-01-01T12:00:0{name[-1]}Z",
                         "labels": {keys.RAY_GROUP_LABEL: "gpu", keys.POD_GATE_LABEL: keys.POD_GATED}},
            "spec": {**template["spec"], **spec, "schedulingGates": [{"name": keys.CAPACITY_GATE}]},
            "status": {"phase": "Pending"}}


def as_seen(pod: dict[str, Any]) -> gating.Pod:
    managed, _ = podgate.managed_request(pod, policy(), lambda ns, n: None, "ns")
    return gating.pod_of(pod, podgate.match_digest(pod["spec"], managed), podgate.pod_set_of(pod))


def admitted_with(*pods: dict[str, Any]) -> tuple[Workload, Observed]:
    w = job("Admitted", suspend=False, annotations={keys.ATTEMPT_ANNOTATION: "1",
                                                    keys.REQUEST_ANNOTATION: rname(job(), 1)})
    pr = request(w, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    return w, Observed(requests=(pr,), templates=templates(w), pods=tuple(as_seen(p) for p in pods))


def test_an_admitted_jobs_gated_pods_are_released_into_its_booking() -> None:
    w, _ = admitted_with()
    w, obs = admitted_with(gated_pod(w, "p1"), gated_pod(w, "p2"))
    plan = decide(w, obs, policy(), NOW)
    releases = [a for a in plan.actions if isinstance(a, ReleasePod)]
    assert [r.name for r in releases] == ["p1", "p2"]
    after = jsonpatch.apply_patch(gated_pod(w, "p1"), list(releases[0].ops))
    assert not podgate.gated(after) and after["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == rname(w, 1)


def test_an_admitted_jobs_first_pod_waits_for_its_group_and_goes_alone_when_the_rest_never_comes() -> None:
    w, _ = admitted_with()
    w, obs = admitted_with(gated_pod(w, "p1"))  # the spec asks for 2; KubeRay made 1 so far, at 12:00:01
    soon = decide(w, obs, policy(), NOW + dt.timedelta(seconds=2))
    assert not [a for a in soon.actions if isinstance(a, ReleasePod)]
    assert soon.requeue_after is not None and soon.requeue_after <= gating.GATHER_SECONDS - 1
    later = decide(w, obs, policy(), NOW + dt.timedelta(seconds=1 + gating.GATHER_SECONDS))
    assert [a.name for a in later.actions if isinstance(a, ReleasePod)] == ["p1"]


def test_where_pods_are_no_longer_gated_an_admitted_jobs_gated_pods_go_free_and_its_templates_lose_the_gate(
) -> None:
    """The namespace's config changed after admission (ProvisioningRequests turned off): nothing books its pods any
    more, so none may wait gated for a booking; new pods are not born gated either."""
    w, _ = admitted_with()
    tpl = ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template")
    b = PatchBuilder(w.obj)
    podgate.born_gated(b, get(w.obj, tpl), tpl, "RayCluster/train/c1/gpu")
    stamped = jsonpatch.apply_patch(w.obj, b.ops)
    w, obs = admitted_with(gated_pod(w, "p1"))
    w = Workload(stamped)
    plan = decide(w, obs, policy(provisioning={"enabled": False}), NOW)
    (release,) = [a for a in plan.actions if isinstance(a, ReleasePod)]
    after = jsonpatch.apply_patch(gated_pod(w, "p1"), list(release.ops))
    assert not podgate.gated(after) and keys.CONSUME_ANNOTATION not in after["metadata"].get("annotations", {})
    assert [a.step for a in plan.actions if isinstance(a, PatchJob)] == ["ungate"]
    template = get(applied(w, plan), tpl)
    assert not podgate.gated(template) and "schedulingGates" not in template["spec"]
    assert keys.POD_GATE_LABEL not in template["metadata"]["labels"]
    assert keys.RAY_OWNER_ANNOTATION not in template["metadata"]["annotations"]


def test_a_scale_up_is_booked_from_the_pods_and_its_wait_is_said_on_the_object() -> None:
    w, _ = admitted_with()
    pods = [gated_pod(w, f"p{i}") for i in range(1, 5)]  # the gang booked 2; 2 more are a scale-up
    w, obs = admitted_with(*pods)
    plan = decide(w, obs, policy(), NOW)
    assert [a.name for a in plan.actions if isinstance(a, ReleasePod)] == ["p1", "p2"]
    creates = [a for a in plan.actions if isinstance(a, Create)]
    assert [c.kind for c in creates] == ["PodTemplate", "ProvisioningRequest"]
    template, pr = creates[0].obj, creates[1].obj
    assert pr["spec"]["podSets"] == [{"podTemplateRef": {"name": template["metadata"]["name"]}, "count": 2}]
    assert pr["spec"]["provisioningClassName"] == keys.BEST_EFFORT_ATOMIC_CLASS
    assert pr["metadata"]["annotations"][keys.SCALE_UP_ANNOTATION] == "gpu"
    assert "schedulingGates" not in template["template"]["spec"]
    reason = applied(w, plan)["metadata"]["annotations"][keys.SCALE_UP_REASON_ANNOTATION]
    assert "2 pods of pod set gpu wait gated for a booking" in reason
    assert "event ScaleUpWaiting" in kinds(plan)


def test_a_scale_up_request_no_pod_needs_goes_with_its_pod_template() -> None:
    w, _ = admitted_with()
    pods = [gated_pod(w, f"p{i}") for i in range(1, 4)]  # the gang books 2: p3 is a scale-up
    w, obs = admitted_with(*pods)
    creates = [a.obj for a in decide(w, obs, policy(), NOW).actions if isinstance(a, Create)]
    template, up = creates
    up = {**up, "status": {"conditions": [{"type": "Accepted", "status": "True", "reason": "A"}]}}
    w, obs = admitted_with(*pods[:2])  # p3 went before its scale-up was Provisioned
    obs = replace(obs, scale_ups=(up,), templates=(*obs.templates, template))
    plan = decide(w, obs, policy(), NOW)
    deleted = [(a.kind, a.name) for a in plan.actions if isinstance(a, Delete)]
    assert deleted == [(ChildKind.PROVISIONING_REQUEST, up["metadata"]["name"]),
                       (ChildKind.POD_TEMPLATE, template["metadata"]["name"])]
