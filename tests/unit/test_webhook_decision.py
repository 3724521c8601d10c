"""The pure admission decision, table by table: what each mode writes, what is left alone, what is
refused and why, the gang rule, and the validating guard on UPDATE.

Every mutation case also checks that its patch applies with jsonpatch and that deciding again on
the patched object yields no patch (re-invocation changes nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import jsonpointer
import pytest
from builders import RayCluster, RayJob, config, container, gpu_job, pod_template, request

from raygate.core import keys
from raygate.core.keys import Mode
from raygate.core.patch import pointer
from raygate.core.policy import KUBERAY_OPERATOR_USER, NamespacePolicy, RaygateConfig
from raygate.core.workload import Workload
from raygate.webhook.decision import Decision, mutate, validate

OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}
DEFAULT = config()
TRUSTED = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
OPERATOR = KUBERAY_OPERATOR_USER
ABSENT = object()


def p(*parts: str | int) -> str:
    return pointer(parts)


def at(obj: dict[str, Any], ptr: str) -> Any:
    return jsonpointer.resolve_pointer(obj, ptr, ABSENT)


def decide(obj: dict[str, Any], cfg: RaygateConfig = DEFAULT, *, ns_labels: dict[str, str] | None = None,
           namespace: str | None = None) -> Decision:
    labels = OPTED_IN if ns_labels is None else ns_labels
    return mutate(request(obj, namespace=namespace), labels, cfg)


def applied(obj: dict[str, Any], d: Decision) -> dict[str, Any]:
    # A list, not a JsonPatch from a string: the exact operations the API server would apply.
    return jsonpatch.apply_patch(obj, d.patch)  # type: ignore[no-any-return]


# Pointers used in many cases.
STATE = p("metadata", "labels", keys.STATE_LABEL)
MODE = p("metadata", "annotations", keys.MODE_ANNOTATION)
SUSPEND = p("spec", "suspend")
KUEUE_Q = p("metadata", "labels", keys.KUEUE_QUEUE_LABEL)
KUEUE_PRIO = p("metadata", "labels", keys.KUEUE_PRIORITY_LABEL)
VOLCANO_Q = p("metadata", "labels", keys.VOLCANO_QUEUE_LABEL)
RAY_PRIO = p("metadata", "labels", keys.RAY_PRIORITY_CLASS_LABEL)
POD_GROUP = p("metadata", "annotations", keys.POD_GROUP_ANNOTATION)
JOB_HEAD = ("spec", "rayClusterSpec", "headGroupSpec", "template")
JOB_WORKER0 = ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template")
SUBMITTER = ("spec", "submitterPodTemplate")


def sched(template: tuple[str | int, ...]) -> str:
    return p(*template, "spec", "schedulerName")


def ann(template: tuple[str | int, ...], key: str) -> str:
    return p(*template, "metadata", "annotations", key)


def _gpu_groups(n: int) -> RayJob:
    job = RayJob()
    for i in range(n):
        job.worker(f"g{i}", limits={"nvidia.com/gpu": "1"})
    return job


def _groups(n: int) -> RayJob:
    job = RayJob()
    for i in range(n):
        job.worker(f"g{i}", replicas=1)
    return job


# --- mutation: what each mode writes ------------------------------------------------------------

@dataclass
class Mutation:
    name: str
    obj: dict[str, Any]
    cfg: RaygateConfig = DEFAULT
    expect: dict[str, Any] = field(default_factory=dict)  # pointer -> value in the patched object
    absent: tuple[str, ...] = ()  # pointers that must not exist in the patched object
    warning: str | None = None


MUTATIONS = [
    Mutation(
        "provisioning_rayjob_is_suspended_labelled_pending",
        gpu_job().obj(),
        expect={SUSPEND: True, STATE: "Pending", MODE: "provisioning"},
        # KubeRay owns rayClusterSpec.suspend; provisioning mode writes no queue or scheduler fields.
        absent=(p("spec", "rayClusterSpec", "suspend"), KUEUE_Q, VOLCANO_Q, POD_GROUP, sched(JOB_HEAD)),
    ),
    Mutation(
        "provisioning_raycluster_is_suspended_labelled_pending",
        RayCluster().worker("w", replicas=1).obj(),
        expect={SUSPEND: True, STATE: "Pending", MODE: "provisioning"},
    ),
    Mutation(
        "provisioning_job_already_suspended_still_gets_state_label",
        gpu_job().suspend(True).obj(),
        expect={SUSPEND: True, STATE: "Pending"},
    ),
    Mutation(
        "provisioning_user_set_mode_annotation_does_not_skip_the_hold",
        gpu_job().annotation(keys.MODE_ANNOTATION, "provisioning").label(keys.STATE_LABEL, "Admitted").obj(),
        expect={SUSPEND: True, STATE: "Pending"},
    ),
    Mutation(
        "fix_shutdown_after_job_finishes_sets_it_and_warns",
        gpu_job().shutdown_after_finish(False).obj(),
        config(fixShutdownAfterJobFinishes=True),
        expect={p("spec", "shutdownAfterJobFinishes"): True, SUSPEND: True},
        warning="shutdownAfterJobFinishes=true",
    ),
    Mutation(
        "fix_shutdown_after_job_finishes_sets_a_missing_field",
        gpu_job().shutdown_after_finish(None).obj(),
        config(fixShutdownAfterJobFinishes=True),
        expect={p("spec", "shutdownAfterJobFinishes"): True},
        warning="shutdownAfterJobFinishes=true",
    ),
    Mutation(
        "kueue_labels_only_and_never_suspends",
        gpu_job().obj(),
        config(mode="kueue", queueName="team-lq"),
        expect={KUEUE_Q: "team-lq", MODE: "kueue"},
        absent=(SUSPEND, STATE, VOLCANO_Q, POD_GROUP),
    ),
    Mutation(
        "kueue_leaves_a_user_suspend_false_alone",
        gpu_job().suspend(False).obj(),
        config(mode="kueue", queueName="team-lq"),
        expect={SUSPEND: False, KUEUE_Q: "team-lq"},
        absent=(STATE,),
    ),
    Mutation(
        "kueue_priority_class_from_config",
        gpu_job().obj(),
        config(mode="kueue", queueName="team-lq", priorityClass="high"),
        expect={KUEUE_Q: "team-lq", KUEUE_PRIO: "high"},
    ),
    Mutation(
        "kueue_user_queue_kept_when_config_allows",
        gpu_job().label(keys.KUEUE_QUEUE_LABEL, "mine").label(keys.KUEUE_PRIORITY_LABEL, "urgent").obj(),
        config(mode="kueue", queueName="team-lq", priorityClass="high", allowUserQueue=True),
        expect={KUEUE_Q: "mine", KUEUE_PRIO: "urgent"},
    ),
    Mutation(
        "kueue_user_queue_replaced_when_config_forbids",
        gpu_job().label(keys.KUEUE_QUEUE_LABEL, "mine").label(keys.KUEUE_PRIORITY_LABEL, "urgent").obj(),
        config(mode="kueue", queueName="team-lq", priorityClass="high"),
        expect={KUEUE_Q: "team-lq", KUEUE_PRIO: "high"},
    ),
    Mutation(
        "kueue_user_priority_removed_when_config_forbids_and_sets_none",
        gpu_job().label(keys.KUEUE_PRIORITY_LABEL, "urgent").obj(),
        config(mode="kueue", queueName="team-lq"),
        expect={KUEUE_Q: "team-lq"},
        absent=(KUEUE_PRIO,),
    ),
    Mutation(
        "kueue_user_queue_used_when_allowed_and_none_configured",
        gpu_job().label(keys.KUEUE_QUEUE_LABEL, "mine").obj(),
        config(mode="kueue", allowUserQueue=True),
        expect={KUEUE_Q: "mine"},
    ),
    Mutation(
        "kueue_autoscaling_allowed_with_elastic_annotation",
        gpu_job().autoscaling().set("spec", "rayClusterSpec", "workerGroupSpecs", 0, "maxReplicas", value=8)
        .annotation(keys.KUEUE_ELASTIC_ANNOTATION, "true").obj(),
        config(mode="kueue", queueName="team-lq"),
        expect={KUEUE_Q: "team-lq"},
    ),
    Mutation(
        "kueue_seventeen_worker_groups_allowed",
        _groups(17).obj(),
        config(mode="kueue", queueName="team-lq"),
        expect={KUEUE_Q: "team-lq"},
    ),
    Mutation(
        "volcano_metadata_on_head_workers_and_default_submitter",
        gpu_job().obj(),
        config(mode="volcano"),
        expect={
            SUSPEND: True, STATE: "Pending", MODE: "volcano", VOLCANO_Q: "default",
            sched(JOB_HEAD): "volcano", sched(JOB_WORKER0): "volcano", sched(SUBMITTER): "volcano",
            ann(JOB_HEAD, keys.VOLCANO_GROUP_NAME_ANNOTATION): "ray-job-pg",
            ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION): "ray-job-pg",
            ann(SUBMITTER, keys.VOLCANO_GROUP_NAME_ANNOTATION): "ray-job-pg",
            ann(JOB_HEAD, keys.VOLCANO_TASK_SPEC_ANNOTATION): "headgroup",
            ann(JOB_WORKER0, keys.VOLCANO_TASK_SPEC_ANNOTATION): "gpu",
            ann(SUBMITTER, keys.VOLCANO_TASK_SPEC_ANNOTATION): "submittergroup",
            # KubeRay's default submitter, written out so it can join the PodGroup.
            p(*SUBMITTER, "spec", "restartPolicy"): "Never",
            p(*SUBMITTER, "spec", "containers", 0, "image"): "rayproject/ray:2.52.0",
            p(*SUBMITTER, "spec", "containers", 0, "resources"): {
                "requests": {"cpu": "500m", "memory": "200Mi"}, "limits": {"cpu": "1", "memory": "1Gi"},
            },
        },
    ),
    Mutation(
        # The PodGroup's name follows the object's, which the API server picks after this webhook: the
        # reconciler writes the group name when it unsuspends, and no one else may (a user's is removed).
        "volcano_generate_name_admitted_without_a_group_name_until_the_reconciler_names_it",
        gpu_job().generate_name("job-").obj(),
        config(mode="volcano"),
        expect={
            SUSPEND: True, STATE: "Pending", MODE: "volcano", VOLCANO_Q: "default",
            sched(JOB_HEAD): "volcano", sched(JOB_WORKER0): "volcano", sched(SUBMITTER): "volcano",
            ann(JOB_WORKER0, keys.VOLCANO_TASK_SPEC_ANNOTATION): "gpu",
        },
        absent=(ann(JOB_HEAD, keys.VOLCANO_GROUP_NAME_ANNOTATION), ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION),
                ann(SUBMITTER, keys.VOLCANO_GROUP_NAME_ANNOTATION)),
    ),
    Mutation(
        "volcano_generate_name_group_name_a_user_wrote_is_removed",
        gpu_job().generate_name("job-").set(*JOB_WORKER0, "metadata", value={
            "annotations": {keys.VOLCANO_GROUP_NAME_ANNOTATION: "ray-someone-elses-pg"}}).obj(),
        config(mode="volcano"),
        expect={SUSPEND: True, sched(JOB_WORKER0): "volcano"},
        absent=(ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION),),
    ),
    Mutation(
        "volcano_generate_name_beside_a_name_still_left_to_the_reconciler",
        gpu_job().generate_name("job-").set("metadata", "name", value="job").obj(),
        config(mode="volcano"),
        expect={SUSPEND: True, sched(JOB_WORKER0): "volcano"},
        absent=(ann(JOB_HEAD, keys.VOLCANO_GROUP_NAME_ANNOTATION),
                ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION)),
    ),
    Mutation(
        "volcano_user_submitter_template_annotated_and_kept",
        gpu_job().submitter(pod_template(container("submit", requests={"cpu": "100m"}))).obj(),
        config(mode="volcano"),
        expect={
            sched(SUBMITTER): "volcano",
            ann(SUBMITTER, keys.VOLCANO_TASK_SPEC_ANNOTATION): "submittergroup",
            p(*SUBMITTER, "spec", "containers", 0, "name"): "submit",
            p(*SUBMITTER, "spec", "containers", 0, "resources", "requests", "cpu"): "100m",
        },
    ),
    Mutation(
        "volcano_sidecar_mode_writes_no_submitter_template",
        gpu_job().submission_mode("SidecarMode").obj(),
        config(mode="volcano"),
        expect={sched(JOB_HEAD): "volcano"},
        absent=(p(*SUBMITTER),),
    ),
    Mutation(
        "volcano_http_mode_writes_no_submitter_template",
        gpu_job().submission_mode("HTTPMode").obj(),
        config(mode="volcano"),
        absent=(p(*SUBMITTER),),
    ),
    Mutation(
        "volcano_raycluster_head_and_every_worker_group",
        RayCluster("rc").worker("a", replicas=1).worker("b", replicas=2).obj(),
        config(mode="volcano"),
        expect={
            SUSPEND: True,
            sched(("spec", "headGroupSpec", "template")): "volcano",
            sched(("spec", "workerGroupSpecs", 1, "template")): "volcano",
            ann(("spec", "workerGroupSpecs", 0, "template"), keys.VOLCANO_TASK_SPEC_ANNOTATION): "a",
            ann(("spec", "workerGroupSpecs", 1, "template"), keys.VOLCANO_TASK_SPEC_ANNOTATION): "b",
            ann(("spec", "workerGroupSpecs", 1, "template"), keys.VOLCANO_GROUP_NAME_ANNOTATION): "ray-rc-pg",
        },
    ),
    Mutation(
        "volcano_queue_and_priority_from_config",
        gpu_job().obj(),
        config(mode="volcano", queueName="gpu-q", priorityClass="high"),
        expect={VOLCANO_Q: "gpu-q", RAY_PRIO: "high"},
    ),
    Mutation(
        "volcano_user_queue_kept_when_config_allows",
        gpu_job().label(keys.VOLCANO_QUEUE_LABEL, "mine").obj(),
        config(mode="volcano", queueName="gpu-q", allowUserQueue=True),
        expect={VOLCANO_Q: "mine"},
    ),
    Mutation(
        "volcano_user_queue_replaced_by_default_queue_when_config_forbids",
        gpu_job().label(keys.VOLCANO_QUEUE_LABEL, "mine").label(keys.RAY_PRIORITY_CLASS_LABEL, "vip").obj(),
        config(mode="volcano"),
        expect={VOLCANO_Q: "default"},
        absent=(RAY_PRIO,),
    ),
    Mutation(
        "namespace_override_picks_the_mode",
        gpu_job().obj(),
        config(namespaces={"team": {"mode": "kueue", "queueName": "team-lq"}}),
        expect={KUEUE_Q: "team-lq", MODE: "kueue"},
        absent=(SUSPEND,),
    ),
    Mutation(
        "max_gang_within_limit_is_admitted",
        gpu_job().obj(),
        config(maxGang={"nvidia.com/gpu": "2"}),
        expect={SUSPEND: True},
    ),
]


@pytest.mark.parametrize("case", MUTATIONS, ids=lambda c: c.name)
def test_mutation(case: Mutation) -> None:
    d = decide(case.obj, case.cfg)
    assert d.allowed, d.message
    assert d.outcome == "mutated"
    out = applied(case.obj, d)
    for ptr, value in case.expect.items():
        assert at(out, ptr) == value, ptr
    for ptr in case.absent:
        assert at(out, ptr) is ABSENT, ptr
    if case.warning:
        assert any(case.warning in w for w in d.warnings)
        assert all(len(w) <= 120 for w in d.warnings)  # the API server may cut longer warnings
    else:
        assert d.warnings == []


@pytest.mark.parametrize("case", MUTATIONS, ids=lambda c: c.name)
def test_mutation_is_idempotent(case: Mutation) -> None:
    first = decide(case.obj, case.cfg)
    once = applied(case.obj, first)
    again = decide(once, case.cfg)
    assert again.allowed
    assert again.patch == []
    assert again.outcome == "unchanged"
    # And the validating webhook accepts what the mutating webhooks produced; in kueue mode that
    # includes Kueue's own, which suspends the job raygate labelled.
    if first.mode is Mode.KUEUE:
        once = _kueue_suspends(once)
    assert validate(request(once), OPTED_IN, case.cfg).allowed


def _kueue_suspends(obj: dict[str, Any]) -> dict[str, Any]:
    return jsonpatch.apply_patch(obj, [{"op": "add", "path": SUSPEND, "value": True}])  # type: ignore[no-any-return]


@pytest.mark.parametrize("obj", [gpu_job().obj(), gpu_job().suspend(False).obj(), RayCluster("c").obj()],
                         ids=["rayjob", "rayjob-suspend-false", "raycluster"])
def test_kueue_mode_refuses_a_create_that_nothing_suspended(obj: dict[str, Any]) -> None:
    """Kueue's webhook, called before raygate's, never saw the queue label: the job would run at once."""
    cfg = config(mode="kueue", queueName="q")
    labelled = applied(obj, decide(obj, cfg))
    d = validate(request(labelled), OPTED_IN, cfg)
    assert not d.allowed and d.code is not None and 400 <= d.code < 500
    assert d.message is not None
    for says in ("would start at once", "`spec.suspend: true`", "reinvocationPolicy: IfNeeded"):
        assert says in d.message, d.message
    assert validate(request(_kueue_suspends(labelled)), OPTED_IN, cfg).allowed


def test_kueue_mode_leaves_kuberays_cluster_of_a_kueue_job_alone_when_unsuspended() -> None:
    cfg = config(mode="kueue", queueName="q")
    owned = kuberay_child(keys.MODE_ANNOTATION, "kueue")
    assert validate(request(applied(owned, mutate(request(owned, user=OPERATOR), OPTED_IN, cfg)), user=OPERATOR),
                    OPTED_IN, cfg).allowed
    assert not validate(request(owned, user="alice"), OPTED_IN, cfg).allowed  # a user's claim is not enough


@pytest.mark.parametrize("case", MUTATIONS, ids=lambda c: c.name)
def test_patch_matches_a_diff_of_the_intended_object(case: Mutation) -> None:
    """Diffing is the oracle: the direct patch must reach exactly the object a diff would."""
    d = decide(case.obj, case.cfg)
    out = applied(case.obj, d)
    assert jsonpatch.apply_patch(case.obj, jsonpatch.make_patch(case.obj, out)) == out
    assert out != case.obj


def test_volcano_records_the_pod_group_spec() -> None:
    obj = (RayJob("train").head(requests={"cpu": "1", "memory": "2Gi"})
           .worker("gpu", replicas=2, requests={"cpu": "2", "memory": "8Gi"}, limits={"nvidia.com/gpu": "1"})
           .obj())
    out = applied(obj, decide(obj, config(mode="volcano", queueName="gpu-q", priorityClass="high")))
    spec = json.loads(at(out, POD_GROUP))
    assert spec == {
        "minMember": 3,  # head + 2 workers; the submitter waits for the cluster
        "minTaskMember": {"headgroup": 1, "gpu": 2},
        # the submitter counts in resources: 1 + 4 + 0.5 CPU, 2Gi + 16Gi + 200Mi
        "minResources": {"cpu": "5500m", "memory": "18632Mi", "nvidia.com/gpu": "2"},
        "queue": "gpu-q",
        "priorityClassName": "high",
    }


def test_patch_never_touches_the_rayjob_cluster_suspend() -> None:
    for mode in ("provisioning", "volcano", "kueue"):
        d = decide(gpu_job().obj(), config(mode=mode, queueName="q"))
        assert all("rayClusterSpec/suspend" not in op["path"] for op in d.patch), mode


def test_dry_run_decides_exactly_like_a_real_request() -> None:
    obj = gpu_job().obj()
    real = mutate(request(obj), OPTED_IN, config(mode="volcano"))
    dry = mutate(request(obj, dry_run=True), OPTED_IN, config(mode="volcano"))
    assert (dry.allowed, dry.patch, dry.message) == (real.allowed, real.patch, real.message)


# --- left alone: allowed, no patch ------------------------------------------------------------

@dataclass
class Skip:
    name: str
    req: dict[str, Any]
    outcome: str
    ns_labels: dict[str, str] | None = field(default_factory=lambda: dict(OPTED_IN))
    cfg: RaygateConfig = DEFAULT


def kuberay_child(key: str = keys.STATE_LABEL, value: str = "Admitted") -> dict[str, Any]:
    """The RayCluster KubeRay creates for a RayJob: the job's labels and annotations, a controller reference."""
    child = RayCluster("job-raycluster-x").owned_by_rayjob("job").label(keys.ORIGINATED_FROM_CRD_LABEL, "RayJob")
    if key == keys.STATE_LABEL:
        child.label(key, value).annotation(keys.MODE_ANNOTATION, "provisioning")
    else:
        child.annotation(key, value)
    return child.worker("gpu", replicas=2, limits={"nvidia.com/gpu": "1"}).obj()


SKIPS = [
    Skip("rayjob_with_only_cluster_selector",
         request(RayJob().without_cluster_spec().cluster_selector(**{"ray.io/cluster": "shared"}).obj()),
         "skipped-cluster-selector"),
    Skip("namespace_not_opted_in", request(gpu_job().obj()), "skipped-namespace", ns_labels={}),
    Skip("namespace_opted_out_by_value", request(gpu_job().obj()), "skipped-namespace",
         ns_labels={keys.OPT_IN_LABEL: "disabled"}),
    Skip("kube_system_even_when_labelled", request(RayJob(namespace="kube-system").obj()), "skipped-namespace"),
    Skip("raygate_system_even_when_labelled", request(RayJob(namespace="raygate-system").obj()), "skipped-namespace"),
    Skip("namespace_outside_a_custom_selector", request(gpu_job().obj()), "skipped-namespace",
         cfg=RaygateConfig.model_validate({"namespaceSelector": {"matchLabels": {"gpu": "yes"}}})),
    Skip("update_is_not_mutated", request(gpu_job().obj(), operation="UPDATE", old=gpu_job().obj()),
         "skipped-operation"),
    Skip("delete_is_not_mutated", request(None, operation="DELETE", old=gpu_job().obj()), "skipped-operation"),
    Skip("other_kinds_pass", request({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "p"}}),
         "skipped-kind"),
]


@pytest.mark.parametrize("case", SKIPS, ids=lambda c: c.name)
def test_left_alone(case: Skip) -> None:
    d = mutate(case.req, case.ns_labels, case.cfg)  # type: ignore[arg-type]
    assert (d.allowed, d.patch, d.outcome) == (True, [], case.outcome)


@pytest.mark.parametrize(("user", "cfg", "child"), [
    (OPERATOR, DEFAULT, kuberay_child()),
    ("system:serviceaccount:default:kuberay-operator",
     RaygateConfig.model_validate({"rayOperatorUsers": ["system:serviceaccount:default:kuberay-operator"]}),
     kuberay_child()),
    # Without a recorded mode the namespace's applies (raygate.core.modes.for_object): in kueue mode Kueue admits
    # the job, and its cluster is KubeRay's, not a workload of Kueue's own.
    (OPERATOR, config(mode="kueue", queueName="q"), kuberay_child("team", "ml")),
], ids=["kuberay_operator", "operator_identity_is_configurable",
        "kuberay_cluster_of_a_job_raygate_never_saw_in_a_kueue_namespace"])
def test_kuberays_cluster_of_an_admitted_rayjob_is_left_alone_but_for_the_record_of_its_parent(
        user: str, cfg: RaygateConfig, child: dict[str, Any]) -> None:
    """Whose cluster it is, is recorded when the operator makes it: the reconciler never reads it from the
    ownerReference, which anyone creating a RayCluster may write."""
    d = mutate(request(child, user=user), OPTED_IN, cfg)
    assert (d.allowed, d.outcome) == (True, "skipped-owned-by-rayjob")
    stored = applied(child, d)
    ref = child["metadata"]["ownerReferences"][0]
    assert stored["metadata"]["annotations"][keys.PARENT_ANNOTATION] == f"RayJob/{ref['name']}/{ref['uid']}"
    assert stored["spec"] == child["spec"]  # nothing else changes: it runs as KubeRay made it
    assert validate(request(stored, user=user), OPTED_IN, cfg).allowed
    assert not validate(request(child, user=user), OPTED_IN, cfg).allowed  # stored without the record


def test_a_rayjob_on_an_existing_cluster_whose_submitter_asks_for_gpus_is_refused_saying_why() -> None:
    obj = RayJob().without_cluster_spec().cluster_selector(**{"ray.io/cluster": "shared"}).obj()
    obj["spec"]["submitterPodTemplate"] = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "submit", "image": "ray", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    d = mutate(request(obj), OPTED_IN, DEFAULT)
    assert not d.allowed and d.message is not None
    for says in ("submitter pod asks for nvidia.com/gpu", "clusterSelector", "remove the GPUs"):
        assert says in d.message, d.message
    cpu = json.loads(json.dumps(obj).replace('"nvidia.com/gpu"', '"cpu"'))
    assert mutate(request(cpu), OPTED_IN, DEFAULT).outcome == "skipped-cluster-selector"
    assert not validate(request(obj, operation="UPDATE", old=cpu), OPTED_IN, DEFAULT).allowed  # nor added later
    kueue = config(mode="kueue", queueName="q")  # Kueue is the gate there: raygate books nothing
    assert mutate(request(obj), OPTED_IN, kueue).allowed


# A RayCluster is KubeRay's cluster of an admitted RayJob only when the operator creates it: what the object
# claims (an ownerReference, KubeRay's labels, a copied raygate state) is anyone's to write.
CLAIMS = {
    "owner_reference_to_a_rayjob_written_by_a_user": (RayCluster().owned_by_rayjob().obj(), "alice"),
    "originated_from_rayjob_label_written_by_a_user":
        (RayCluster().label(keys.ORIGINATED_FROM_CRD_LABEL, "RayJob").obj(), "alice"),
    "every_claim_at_once_written_by_a_user": (kuberay_child(), "alice"),
    "owner_reference_of_another_api_group": (RayCluster().set("metadata", "ownerReferences", value=[{
        "apiVersion": "evil.example/v1", "kind": "RayJob", "name": "job", "uid": "u", "controller": True}])
        .label(keys.STATE_LABEL, "Admitted").obj(), OPERATOR),
    "owner_reference_that_is_not_the_controller": (RayCluster().set("metadata", "ownerReferences", value=[{
        "apiVersion": "ray.io/v1", "kind": "RayJob", "name": "job", "uid": "u"}])
        .label(keys.STATE_LABEL, "Admitted").obj(), OPERATOR),
    "operator_creates_a_cluster_for_a_job_raygate_never_admitted": (kuberay_child(keys.STATE_LABEL, "Pending"),
                                                                     OPERATOR),
    "operator_not_in_the_configured_identity": (kuberay_child(), "system:serviceaccount:default:kuberay-operator"),
}


@pytest.mark.parametrize("name", CLAIMS)
def test_a_claimed_rayjob_parent_is_held_like_any_raycluster(name: str) -> None:
    obj, user = CLAIMS[name]
    d = mutate(request(obj, user=user), OPTED_IN, DEFAULT)
    after = applied(obj, d)
    assert d.outcome == "mutated"
    assert at(after, SUSPEND) is True and at(after, STATE) == "Pending"


def test_a_user_cannot_create_an_object_in_a_state_raygate_did_not_give_it() -> None:
    obj = (gpu_job().suspend(False).label(keys.STATE_LABEL, "Admitted")
           .annotation(keys.REQUEST_ANNOTATION, "someone-elses-request").annotation(keys.ATTEMPT_ANNOTATION, "1")
           .annotation(keys.ADMITTED_AT_ANNOTATION, "2030-01-01T00:00:00Z").annotation("team", "ml").obj())
    after = applied(obj, decide(obj))
    assert at(after, STATE) == "Pending" and at(after, SUSPEND) is True
    assert {k for k in after["metadata"]["annotations"] if k.startswith("raygate.io/")} == {keys.MODE_ANNOTATION}
    assert after["metadata"]["annotations"]["team"] == "ml"


def test_consume_annotations_a_user_wrote_are_removed_at_create() -> None:
    stolen = {keys.CONSUME_ANNOTATION: "other-teams-request", keys.CLASS_ANNOTATION: keys.CHECK_CAPACITY_CLASS,
              "keep": "me"}
    obj = gpu_job().set(*JOB_WORKER0, "metadata", value={"annotations": dict(stolen)}).obj()
    obj = jsonpatch.apply_patch(obj, [{"op": "add", "path": p(*JOB_HEAD, "metadata"),
                                       "value": {"annotations": dict(stolen)}}])
    after = applied(obj, decide(obj))
    for template in (JOB_WORKER0, JOB_HEAD):
        assert at(after, p(*template, "metadata", "annotations")) == {"keep": "me"}


@pytest.mark.parametrize("cfg", [DEFAULT, config(mode="volcano"), config(mode="kueue", queueName="q")],
                         ids=["provisioning", "volcano", "kueue"])
def test_validation_refuses_a_create_stored_without_raygates_hold(cfg: RaygateConfig) -> None:
    obj = gpu_job().obj()
    held = applied(obj, mutate(request(obj), OPTED_IN, cfg))
    if cfg.defaults.mode is Mode.KUEUE:
        held["spec"]["suspend"] = True  # as Kueue's own webhook leaves it
    assert validate(request(held), OPTED_IN, cfg).allowed
    undone = json.loads(json.dumps(held))
    undone["spec"]["suspend"] = False  # a later mutating webhook, or raygate's mutating webhook bypassed
    d = validate(request(undone), OPTED_IN, cfg)
    assert not d.allowed and d.code == 422 and d.message is not None
    assert "/spec/suspend" in d.message or "would start at once" in d.message


def test_unknown_namespace_counts_as_opted_in_because_the_selector_chose_it() -> None:
    # The namespace cache may lag a just-created namespace; the API server's selector already matched.
    assert mutate(request(gpu_job().obj()), None, DEFAULT).outcome == "mutated"


def test_custom_selector_matches_opts_in() -> None:
    cfg = RaygateConfig.model_validate({"namespaceSelector": {"matchLabels": {"gpu": "yes"}}})
    assert mutate(request(gpu_job().obj()), {"gpu": "yes"}, cfg).outcome == "mutated"


# --- refused: allowed false, 4xx, a message saying what to change -------------------------------

@dataclass
class Refusal:
    name: str
    obj: dict[str, Any]
    says: str  # a fragment of the message that tells the user what to change
    cfg: RaygateConfig = DEFAULT


REFUSALS = [
    Refusal("shutdown_after_job_finishes_false", gpu_job().shutdown_after_finish(False).obj(),
            "Add `shutdownAfterJobFinishes: true` to spec"),
    Refusal("shutdown_after_job_finishes_missing_defaults_to_false", gpu_job().shutdown_after_finish(None).obj(),
            "shutdownAfterJobFinishes must be true"),
    Refusal("shutdown_after_job_finishes_false_in_kueue_mode", gpu_job().shutdown_after_finish(False).obj(),
            "shutdownAfterJobFinishes must be true", config(mode="kueue", queueName="q")),
    Refusal("cluster_selector_with_ray_cluster_spec", gpu_job().cluster_selector(**{"ray.io/cluster": "x"}).obj(),
            "cannot be used together: remove clusterSelector"),
    Refusal("kueue_more_than_17_worker_groups", _groups(18).obj(), "at most 17 worker groups and this has 18",
            config(mode="kueue", queueName="q")),
    Refusal("kueue_worker_group_named_head", RayJob().worker("head").obj(), 'named "head"',
            config(mode="kueue", queueName="q")),
    Refusal("kueue_autoscaling_without_elastic_annotation", gpu_job().autoscaling().obj(),
            "set enableInTreeAutoscaling: false", config(mode="kueue", queueName="q")),
    Refusal("kueue_autoscaling_with_elastic_false", gpu_job().autoscaling().annotation(
            keys.KUEUE_ELASTIC_ANNOTATION, "false").obj(), "elastic", config(mode="kueue", queueName="q")),
    Refusal("kueue_without_any_queue", gpu_job().obj(), "set queueName", config(mode="kueue")),
    Refusal("kueue_without_any_queue_user_may_label", gpu_job().obj(), f"add label {keys.KUEUE_QUEUE_LABEL}",
            config(mode="kueue", allowUserQueue=True)),
    Refusal("kueue_user_queue_label_ignored_when_forbidden", gpu_job().label(keys.KUEUE_QUEUE_LABEL, "mine").obj(),
            "set queueName", config(mode="kueue")),
    Refusal("max_gang_gpu_exceeded", gpu_job().obj(), "up to 2 nvidia.com/gpu with every group at its most, but "
            "namespace team allows at most 1",
            config(maxGang={"nvidia.com/gpu": "1"})),
    Refusal("max_gang_memory_exceeded", gpu_job().obj(), "allows at most 4Gi",
            config(maxGang={"memory": "4Gi"})),
    Refusal("max_gang_counts_the_whole_gang_in_volcano_mode", gpu_job().obj(), "nvidia.com/gpu",
            config(mode="volcano", maxGang={"nvidia.com/gpu": "1"})),
    Refusal("deletion_rules_cannot_be_suspended_by_kuberay",
            gpu_job().set("spec", "deletionStrategy", value={"deletionRules": [
                {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}}]}).obj(),
            "Remove deletionRules and set `shutdownAfterJobFinishes: true`"),
    Refusal("deletion_rules_not_fixed_into_a_spec_kuberay_rejects",
            gpu_job().shutdown_after_finish(False).set("spec", "deletionStrategy", value={"deletionRules": [
                {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}]}).obj(),
            "KubeRay requires shutdownAfterJobFinishes: false with deletionRules",
            config(fixShutdownAfterJobFinishes=True)),
    Refusal("deletion_policy_delete_none",
            gpu_job().set("spec", "deletionStrategy", value={"onSuccess": {"policy": "DeleteNone"},
                                                             "onFailure": {"policy": "DeleteCluster"}}).obj(),
            "use DeleteCluster, DeleteWorkers or DeleteSelf"),
    Refusal("more_gpu_pod_sets_than_one_request_books", _gpu_groups(33).obj(),
            "33 pod sets request nvidia.com/gpu, but one ProvisioningRequest books at most 32"),
    Refusal("unreadable_replicas", RayJob().worker("w", replicas=None).set(
            "spec", "rayClusterSpec", "workerGroupSpecs", 0, "replicas", value="two").obj(),
            "workerGroupSpecs[0].replicas must be a non-negative integer"),
    Refusal("min_replicas_above_max_replicas", RayJob().worker("w", min_replicas=3, max_replicas=1).obj(),
            "minReplicas 3 is larger than maxReplicas 1"),
    Refusal("bad_quantity_names_its_full_path", RayJob().worker("w", requests={"cpu": "lots"}).obj(),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.requests.cpu: "
            "'lots' is not a quantity"),
    Refusal("quantity_that_overflows_names_its_field", RayJob().worker("w", limits={"nvidia.com/gpu": "1e+99999999999"})
            .obj(), "workerGroupSpecs[0].template.spec.containers[0].resources.limits.nvidia.com/gpu: "
            "'1e+99999999999' is out of range"),
    Refusal("quantity_with_absurd_digits", RayJob().worker("w", requests={"cpu": "9" * 5000}).obj(),
            "longer than 64 characters"),
    Refusal("negative_quantity", RayJob().worker("w", limits={"nvidia.com/gpu": "-4"}).obj(), "'-4' is negative"),
    Refusal("labels_that_are_not_an_object", RayJob().set("metadata", "labels", value=["a"]).obj(),
            "metadata.labels must be an object"),
    Refusal("annotations_that_are_not_an_object", RayJob().set("metadata", "annotations", value="x").obj(),
            "metadata.annotations must be an object"),
    Refusal("container_that_is_not_an_object", RayJob().worker("w").set(
            "spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "containers", value=["gpu"]).obj(),
            "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0] must be an object"),
    Refusal("bad_overhead_quantity", RayCluster().set("spec", "headGroupSpec", "template", "spec", "overhead",
            value={"cpu": "x"}).obj(), "spec.headGroupSpec.template.spec.overhead.cpu: 'x' is not a quantity"),
    Refusal("missing_head_template", RayCluster().set("spec", "headGroupSpec", value={}).obj(),
            "headGroupSpec.template is missing"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: c.name)
def test_refused(case: Refusal) -> None:
    d = decide(case.obj, case.cfg)
    assert not d.allowed
    assert d.code is not None and 400 <= d.code < 500
    assert d.message is not None and case.says in d.message, d.message
    assert d.patch == []
    # The validating webhook refuses the same manifest (should it ever bypass the mutating one).
    v = validate(request(case.obj), OPTED_IN, case.cfg)
    assert not v.allowed and v.message == d.message


def test_refusal_lists_every_problem_at_once() -> None:
    obj = _groups(18).worker("head").shutdown_after_finish(False).obj()
    d = decide(obj, config(mode="kueue", queueName="q"))
    assert d.message is not None
    for fragment in ("shutdownAfterJobFinishes", "worker groups", '"head"'):
        assert fragment in d.message


# --- the gang rule ------------------------------------------------------------------------------

def _anchor(kind: type[RayJob] | type[RayCluster] = RayCluster, hosts: int | None = None) -> Any:
    """KubeRay's unit-test anchor: head 256m/256Mi, one group (replicas 2, min 1, max 4) of 256m/256Mi
    with nvidia.com/gpu: 1 in limits only."""
    return (kind().head(requests={"cpu": "256m", "memory": "256Mi"})
            .worker("gpu", replicas=2, min_replicas=1, max_replicas=4, hosts=hosts,
                    requests={"cpu": "256m", "memory": "256Mi"}, limits={"nvidia.com/gpu": "1"}))


@dataclass
class GangCase:
    name: str
    obj: dict[str, Any]
    min_member: int
    min_resources: dict[str, str]
    pod_sets: dict[str, int] | None = None  # name -> pods
    per_pod: dict[str, dict[str, str]] | None = None  # name -> effective request of one pod


def _one(template: dict[str, Any]) -> dict[str, Any]:
    """A RayCluster whose head is `template` and that has no workers: the gang is that one pod."""
    return RayCluster().head(template).obj()


GANGS = [
    GangCase("kuberay_anchor", _anchor().obj(), 3,
             {"cpu": "768m", "memory": "768Mi", "nvidia.com/gpu": "2"}, {"headgroup": 1, "gpu": 2}),
    GangCase("kuberay_anchor_num_of_hosts_2", _anchor(hosts=2).obj(), 5,
             {"cpu": "1280m", "memory": "1280Mi", "nvidia.com/gpu": "4"}, {"headgroup": 1, "gpu": 4}),
    GangCase("kuberay_anchor_as_rayjob_http_mode", _anchor(RayJob).submission_mode("HTTPMode").obj(), 3,
             {"cpu": "768m", "memory": "768Mi", "nvidia.com/gpu": "2"}, {"headgroup": 1, "gpu": 2}),
    GangCase("k8s_job_mode_submitter_counts_in_resources_not_min_member", _anchor(RayJob).obj(), 3,
             {"cpu": "1268m", "memory": "968Mi", "nvidia.com/gpu": "2"},
             {"headgroup": 1, "gpu": 2, "submittergroup": 1}),
    GangCase("k8s_job_mode_custom_submitter_template",
             _anchor(RayJob).submitter(pod_template(container(requests={"cpu": "100m", "memory": "64Mi"}))).obj(),
             3, {"cpu": "868m", "memory": "832Mi", "nvidia.com/gpu": "2"}),
    GangCase("sidecar_mode_submitter_inside_the_head_pod", _anchor(RayJob).submission_mode("SidecarMode").obj(), 3,
             {"cpu": "1268m", "memory": "968Mi", "nvidia.com/gpu": "2"}, {"headgroup": 1, "gpu": 2},
             {"headgroup": {"cpu": "756m", "memory": "456Mi"}}),
    # Under autoscaling KubeRay still starts `replicas` (2 here): that is what is booked (count); Volcano's
    # minMember and minResources keep KubeRay's plugin's rule, minReplicas (1).
    GangCase("autoscaling_min_member_counts_min_replicas_and_the_autoscaler_sidecar", _anchor().autoscaling().obj(),
             2, {"cpu": "1012m", "memory": "1Gi", "nvidia.com/gpu": "1"}, {"headgroup": 1, "gpu": 2},
             {"headgroup": {"cpu": "756m", "memory": "768Mi"}}),
    GangCase("autoscaling_with_custom_autoscaler_resources",
             _anchor().autoscaling({"requests": {"cpu": "1", "memory": "1Gi"}}).obj(), 2,
             {"cpu": "1512m", "memory": "1536Mi", "nvidia.com/gpu": "1"}),
    GangCase("autoscaling_min_replicas_zero_still_starts_the_replicas",
             RayCluster().head(requests={"cpu": "1"}).autoscaling()
             .worker("gpu", replicas=4, min_replicas=0, limits={"nvidia.com/gpu": "1"}).obj(), 1,
             {"cpu": "1500m", "memory": "512Mi"}, {"headgroup": 1, "gpu": 4}),
    GangCase("replicas_above_max_are_clamped",
             RayCluster().head(requests={"cpu": "1"}).worker("w", replicas=9, max_replicas=3, requests={"cpu": "1"})
             .obj(), 4, {"cpu": "4"}, {"headgroup": 1, "w": 3}),
    GangCase("replicas_below_min_are_raised",
             RayCluster().head(requests={"cpu": "1"}).worker("w", replicas=1, min_replicas=3, requests={"cpu": "1"})
             .obj(), 4, {"cpu": "4"}),
    GangCase("missing_replicas_means_min_replicas",
             RayCluster().head(requests={"cpu": "1"}).worker("w", replicas=None, min_replicas=2,
                                                             requests={"cpu": "1"}).obj(), 3, {"cpu": "3"}),
    GangCase("missing_replicas_and_min_means_no_workers",
             RayCluster().head(requests={"cpu": "1"}).worker("w", replicas=None, requests={"cpu": "1"}).obj(),
             1, {"cpu": "1"}),
    GangCase("num_of_hosts_multiplies_pods_and_resources",
             RayCluster().head(requests={"cpu": "1"})
             .worker("tpu", replicas=2, hosts=4, requests={"cpu": "2"}, limits={"google.com/tpu": "4"}).obj(),
             9, {"cpu": "17", "google.com/tpu": "32"}, {"headgroup": 1, "tpu": 8}),
    GangCase("suspended_worker_group_is_skipped",
             RayCluster().head(requests={"cpu": "1"}).worker("w", replicas=2, requests={"cpu": "1"}, suspend=True)
             .obj(), 1, {"cpu": "1"}, {"headgroup": 1}),
    GangCase("several_groups_add_up",
             RayCluster().head(requests={"cpu": "1"}).worker("a", replicas=2, requests={"cpu": "1"})
             .worker("b", replicas=3, requests={"cpu": "2"}).obj(), 6, {"cpu": "9"}),
    GangCase("gpu_in_limits_only_counts_as_request",
             _one(pod_template(container(limits={"nvidia.com/gpu": "2", "cpu": "4"}))), 1,
             {"cpu": "4", "nvidia.com/gpu": "2"}),
    GangCase("request_wins_over_limit",
             _one(pod_template(container(requests={"cpu": "1"}, limits={"cpu": "4", "memory": "1Gi"}))), 1,
             {"cpu": "1", "memory": "1Gi"}),
    GangCase("init_container_larger_than_containers_sets_the_pod_request",
             _one(pod_template(container(requests={"cpu": "1", "memory": "1Gi"}),
                               init=[container("init", requests={"cpu": "3", "memory": "512Mi"})])), 1,
             {"cpu": "3", "memory": "1Gi"}),
    GangCase("init_containers_take_the_max_not_the_sum",
             _one(pod_template(container(requests={"cpu": "1"}),
                               init=[container("a", requests={"cpu": "2"}), container("b", requests={"cpu": "2"})])),
             1, {"cpu": "2"}),
    GangCase("native_sidecar_adds_to_the_containers",
             _one(pod_template(container(requests={"cpu": "1"}),
                               init=[container("proxy", requests={"cpu": "500m"}, restart_policy="Always")])),
             1, {"cpu": "1500m"}),
    GangCase("init_container_after_a_native_sidecar_runs_beside_it",
             _one(pod_template(container(requests={"cpu": "1"}),
                               init=[container("proxy", requests={"cpu": "500m"}, restart_policy="Always"),
                                     container("setup", requests={"cpu": "2"})])),
             1, {"cpu": "2500m"}),
    GangCase("init_container_before_a_native_sidecar_runs_alone",
             _one(pod_template(container(requests={"cpu": "1"}),
                               init=[container("setup", requests={"cpu": "2"}),
                                     container("proxy", requests={"cpu": "500m"}, restart_policy="Always")])),
             1, {"cpu": "2"}),
    GangCase("pod_overhead_comes_on_top",
             _one(pod_template(container(requests={"cpu": "1", "memory": "1Gi"}),
                               overhead={"cpu": "250m", "memory": "120Mi"})), 1,
             {"cpu": "1250m", "memory": "1144Mi"}),
    GangCase("several_containers_add_up",
             _one(pod_template(container("a", requests={"cpu": "1"}), container("b", limits={"nvidia.com/gpu": "1"}))),
             1, {"cpu": "1", "nvidia.com/gpu": "1"}),
]


@pytest.mark.parametrize("case", GANGS, ids=lambda c: c.name)
def test_gang(case: GangCase) -> None:
    gang = Workload(case.obj).gang().to_json()
    assert gang["minMember"] == case.min_member
    assert gang["minResources"] == case.min_resources
    if case.pod_sets is not None:
        assert {s["name"]: s["count"] for s in gang["podSets"]} == case.pod_sets
    for name, resources in (case.per_pod or {}).items():
        assert next(s for s in gang["podSets"] if s["name"] == name)["resources"] == resources


def test_autoscaling_gang_tells_booked_pods_from_volcanos_min_member_and_the_ceiling() -> None:
    obj = (RayCluster().head(requests={"cpu": "1"}).autoscaling()
           .worker("gpu", replicas=10, min_replicas=0, max_replicas=16, hosts=2, limits={"nvidia.com/gpu": "1"}).obj())
    gpu = next(s for s in Workload(obj).gang().to_json()["podSets"] if s["name"] == "gpu")
    assert (gpu["count"], gpu["minMemberCount"], gpu["maxCount"]) == (20, 0, 32)
    managed = Workload(obj).gang().managed_pod_sets(NamespacePolicy().manages)
    assert [(m.name, m.count) for m in managed] == [("gpu", 20)]  # a request for all 20: KubeRay starts them


@pytest.mark.parametrize("replicas", [10, 0], ids=["starts-at-the-top", "starts-at-zero"])
def test_max_gang_limits_the_most_an_autoscaling_object_can_run(replicas: int) -> None:
    """Not only the pods KubeRay starts: a group starting at 0 may be grown by the Ray autoscaler to maxReplicas."""
    obj = (RayJob().autoscaling()
           .worker("gpu", replicas=replicas, min_replicas=0, max_replicas=10, limits={"nvidia.com/gpu": "1"}).obj())
    d = decide(obj, config(maxGang={"nvidia.com/gpu": "4"}))
    assert not d.allowed and d.message is not None and "up to 10 nvidia.com/gpu" in d.message
    assert decide(obj, config(maxGang={"nvidia.com/gpu": "10"})).allowed


def test_webhook_decision_carries_the_gang_it_checked() -> None:
    d = decide(_anchor(RayJob).submission_mode("HTTPMode").obj())
    assert d.gang is not None and d.gang.min_member == 3


# --- the validating guard on UPDATE -------------------------------------------------------------

@dataclass
class Guard:
    name: str
    old: dict[str, Any]
    new: dict[str, Any]
    allowed: bool
    user: str = "alice"
    says: str | None = None
    cfg: RaygateConfig = DEFAULT


def _held_volcano() -> dict[str, Any]:
    obj = gpu_job().obj()
    return applied(obj, decide(obj, config(mode="volcano")))


def _held_generated() -> dict[str, Any]:
    """A volcano-mode job created with generateName, as stored: named by the API server, held, and
    without the group name the reconciler writes when it unsuspends."""
    obj = gpu_job().generate_name("job-").obj()
    out = applied(obj, decide(obj, config(mode="volcano")))
    out["metadata"]["name"] = "job-x7k2p"
    return out


def test_a_generate_name_job_validates_as_stored_once_the_api_server_named_it() -> None:
    stored = _held_generated()
    assert validate(request(stored), OPTED_IN, config(mode="volcano")).allowed
    named_by_someone = _edit(stored, ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION), "ray-other-pg")
    d = validate(request(named_by_someone), OPTED_IN, config(mode="volcano"))
    assert not d.allowed and "without raygate's hold" in (d.message or "")


def _held() -> RayJob:
    return gpu_job().held()


def _edit(obj: dict[str, Any], ptr: str, value: Any = ABSENT) -> dict[str, Any]:
    op = {"op": "remove", "path": ptr} if value is ABSENT else {"op": "add", "path": ptr, "value": value}
    return jsonpatch.apply_patch(obj, [op])  # type: ignore[no-any-return]


def _state(state: keys.State | None, *, job_suspend: bool = True, **workers: Any) -> RayJob:
    """A GPU job in raygate state `state` (None: one raygate never held), with its GPU group as given."""
    job = RayJob().worker("gpu", **{"replicas": 2, "limits": {"nvidia.com/gpu": "1"}, **workers})
    if state is not None:
        job.held(state)
    return job.suspend(job_suspend)


def _admitted(**workers: Any) -> RayJob:
    return _state(keys.State.ADMITTED, job_suspend=False, **workers)


def _autoscaled(**workers: Any) -> RayJob:
    return _admitted(**{"min_replicas": 0, "max_replicas": 4, **workers}).autoscaling()


def _growth_where_pods_are_not_gated(case: Guard) -> Guard:
    """The same edit in volcano mode without ProvisioningRequests: the PodGroup is the guard there, and
    nothing would book the new pods."""
    def in_volcano_mode(obj: dict[str, Any]) -> dict[str, Any]:
        out = json.loads(json.dumps(obj))
        out["metadata"].setdefault("annotations", {})[keys.MODE_ANNOTATION] = "volcano"
        return out

    return Guard(case.name + "_where_pods_are_not_gated", in_volcano_mode(case.old), in_volcano_mode(case.new), False,
                 case.user, case.says, config(mode="volcano"))


def _growth_where_pods_are_gated(case: Guard) -> Guard:
    return Guard(case.name + "_where_pods_are_gated", case.old, case.new, True, case.user)


_GROWTH_EDITS = [
    Guard("user_scales_an_admitted_gpu_group_up", _admitted().obj(), _admitted(replicas=20).obj(), False,
          says="grow pod set gpu from 2 to 20 pods"),
    Guard("user_raises_num_of_hosts", _admitted().obj(), _admitted(hosts=2).obj(), False,
          says="grow pod set gpu from 2 to 4 pods"),
    Guard("user_adds_a_gpu_group_to_an_admitted_job", _admitted().obj(),
          _admitted().worker("more", replicas=1, limits={"nvidia.com/gpu": "8"}).obj(), False,
          says="add pod set more with 1 pod requesting 8 nvidia.com/gpu"),
    Guard("user_adds_gpus_to_a_cpu_group", _admitted().worker("cpu", requests={"cpu": "1"}).obj(),
          _admitted().worker("cpu", requests={"cpu": "1"}, limits={"nvidia.com/gpu": "1"}).obj(), False,
          says="add pod set cpu"),
    Guard("user_raises_gpus_per_pod", _admitted().obj(), _admitted(limits={"nvidia.com/gpu": "4"}).obj(), False,
          says="raise nvidia.com/gpu per pod of pod set gpu from 1 to 4"),
    Guard("user_resumes_a_suspended_gpu_group", _admitted(suspend=True).obj(), _admitted(suspend=False).obj(),
          False, says="add pod set gpu"),
    Guard("user_renames_a_gpu_group", _admitted().obj(),
          _admitted().set("spec", "rayClusterSpec", "workerGroupSpecs", 0, "groupName", value="other").obj(),
          False, says="add pod set other"),
    Guard("user_turns_on_autoscaling_with_a_higher_ceiling", _admitted(max_replicas=8).obj(),
          _admitted(max_replicas=8).autoscaling().obj(), False, says="grow pod set gpu from 2 to 8 pods"),
    Guard("user_raises_max_replicas_of_an_autoscaling_group", _autoscaled().obj(),
          _autoscaled(max_replicas=40).obj(), False, says="grow pod set gpu from 4 to 40 pods"),
    Guard("user_scales_kuberays_cluster_of_an_admitted_job", kuberay_child(),
          json.loads(json.dumps(kuberay_child()).replace('"replicas": 2', '"replicas": 20')), False,
          says="grow pod set gpu from 2 to 20 pods"),
    Guard("operator_scales_its_cluster_up_too", kuberay_child(),
          json.loads(json.dumps(kuberay_child()).replace('"replicas": 2', '"replicas": 20')), False, user=OPERATOR,
          says="grow pod set gpu"),
]
GROWTH = [*map(_growth_where_pods_are_gated, _GROWTH_EDITS), *map(_growth_where_pods_are_not_gated, _GROWTH_EDITS)]


GUARDS = [
    # --- held (Pending, Provisioning) ---
    Guard("user_unsuspends_held_job", _held().obj(), _held().suspend(False).obj(), False, says="unsuspend it"),
    Guard("user_unsuspends_job_in_provisioning_state", gpu_job().held(keys.State.PROVISIONING).obj(),
          gpu_job().held(keys.State.PROVISIONING).suspend(False).obj(), False, says="state Provisioning"),
    Guard("user_removes_the_suspend_field_of_a_held_job", _held().obj(), _edit(_held().obj(), SUSPEND), False,
          says="unsuspend it"),
    Guard("trusted_service_account_unsuspends_held_job", _held().obj(), _held().suspend(False).obj(), True,
          user=TRUSTED),
    Guard("configured_trusted_user_unsuspends_held_job", _held().obj(), _held().suspend(False).obj(), True,
          user="ops", cfg=RaygateConfig.model_validate({"trustedUsers": ["ops"]})),
    Guard("default_trusted_account_not_trusted_when_config_replaces_it", _held().obj(), _held().suspend(False).obj(),
          False, user=TRUSTED, says="unsuspend it", cfg=RaygateConfig.model_validate({"trustedUsers": ["ops"]})),
    Guard("kuberay_operator_is_not_trusted_to_unsuspend", _held().obj(), _held().suspend(False).obj(), False,
          user=OPERATOR, says="unsuspend it"),
    Guard("user_changes_state_label", _held().obj(), _held().label(keys.STATE_LABEL, "Admitted").obj(), False,
          says=f"change label {keys.STATE_LABEL}"),
    Guard("user_removes_state_label", _held().obj(), _edit(_held().obj(), STATE), False,
          says=f"remove label {keys.STATE_LABEL}"),
    Guard("user_changes_queue_label", _held().label(keys.KUEUE_QUEUE_LABEL, "a").obj(),
          _held().label(keys.KUEUE_QUEUE_LABEL, "b").obj(), False, says=keys.KUEUE_QUEUE_LABEL),
    Guard("user_adds_a_raygate_annotation", _held().obj(), _held().annotation(keys.REASON_ANNOTATION, "x").obj(),
          False, says=f"add annotation {keys.REASON_ANNOTATION}"),
    Guard("user_changes_the_mode_annotation_to_kueue", _held().obj(),
          _held().annotation(keys.MODE_ANNOTATION, "kueue").obj(), False,
          says=f"change annotation {keys.MODE_ANNOTATION}"),
    Guard("user_removes_pod_group_annotation", _held_volcano(), _edit(_held_volcano(), POD_GROUP), False,
          says=f"remove annotation {keys.POD_GROUP_ANNOTATION}"),
    Guard("user_changes_template_group_name", _held_volcano(),
          _edit(_held_volcano(), ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION), "other"), False,
          says="scheduling metadata"),
    Guard("user_writes_the_group_name_of_a_generated_name_job_before_raygate", _held_generated(),
          _edit(_held_generated(), ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION), "ray-job-x7k2p-pg"), False,
          says="scheduling metadata"),
    Guard("user_unsuspends_a_generated_name_job_before_raygate_named_its_group", _held_generated(),
          _edit(_held_generated(), SUSPEND, False), False, says="unsuspend it"),
    Guard("reconciler_names_the_group_and_unsuspends_a_generated_name_job", _held_generated(),
          _edit(_edit(_edit(_held_generated(), ann(JOB_HEAD, keys.VOLCANO_GROUP_NAME_ANNOTATION), "ray-job-x7k2p-pg"),
                      ann(JOB_WORKER0, keys.VOLCANO_GROUP_NAME_ANNOTATION), "ray-job-x7k2p-pg"), SUSPEND, False),
          True, user=TRUSTED),
    Guard("user_changes_template_scheduler", _held_volcano(),
          _edit(_held_volcano(), sched(JOB_HEAD), "default-scheduler"), False, says="scheduling metadata"),
    Guard("user_adds_consume_annotation", _held().obj(),
          _edit(_held().obj(), p(*JOB_WORKER0, "metadata"), {"annotations": {keys.CONSUME_ANNOTATION: "pr"}}),
          False, says="scheduling metadata"),
    Guard("user_adds_a_gpu_group_to_a_held_volcano_job", _held_volcano(),
          _edit(_held_volcano(), p("spec", "rayClusterSpec", "workerGroupSpecs", 1), {
              "groupName": "more", "replicas": 4, "template": pod_template(container(limits={"nvidia.com/gpu": "1"}))}),
          False, says="change its pod sets in volcano mode"),
    Guard("user_edits_entrypoint_of_held_job", _held().obj(),
          _held().set("spec", "entrypoint", value="python other.py").obj(), True),
    Guard("user_adds_an_unrelated_label", _held().obj(), _held().label("team", "ml").obj(), True),
    # Provisioning mode replaces the request when the pod sets change, so a held job may still be edited.
    Guard("user_adds_worker_group_to_held_provisioning_job", _held().obj(), _held().worker("more").obj(), True),
    Guard("user_grows_a_held_provisioning_job", _state(keys.State.PROVISIONING).obj(),
          _state(keys.State.PROVISIONING, replicas=8).obj(), True),
    # --- admitted: where pods are gated (provisioning), growth is booked per scale-up; elsewhere refused ---
    *GROWTH,
    Guard("ray_autoscaler_scales_within_max_replicas", _autoscaled(replicas=1).obj(), _autoscaled(replicas=4).obj(),
          True),
    Guard("user_scales_an_admitted_job_down", _admitted().obj(), _admitted(replicas=1).obj(), True),
    Guard("user_grows_a_cpu_group_of_an_admitted_job", _admitted().worker("cpu", requests={"cpu": "1"}).obj(),
          _admitted().worker("cpu", replicas=9, requests={"cpu": "1"}).obj(), True),
    Guard("user_suspends_an_admitted_job", _admitted().obj(), _admitted().suspend(True).obj(), True),
    Guard("user_unsuspends_an_admitted_job_they_suspended", _state(keys.State.ADMITTED).obj(),
          _state(keys.State.ADMITTED, job_suspend=False).obj(), False, says="unsuspend it"),
    Guard("user_relabels_admitted_as_pending", _admitted().obj(), _admitted().label(keys.STATE_LABEL, "Pending").obj(),
          False, says=f"change label {keys.STATE_LABEL}"),
    # --- failed: only a restart, by relabelling ---
    Guard("user_unsuspends_a_failed_job", _state(keys.State.FAILED).obj(),
          _state(keys.State.FAILED, job_suspend=False).obj(), False, says="unsuspend it"),
    Guard("user_relabels_a_failed_job_pending_to_start_over", _state(keys.State.FAILED).obj(),
          _state(keys.State.FAILED).label(keys.STATE_LABEL, "Pending").obj(), True),
    Guard("user_relabels_failed_as_admitted", _state(keys.State.FAILED).obj(),
          _state(keys.State.FAILED).label(keys.STATE_LABEL, "Admitted").obj(), False,
          says=f"change label {keys.STATE_LABEL}"),
    Guard("user_relabels_pending_and_unsuspends_at_once", _state(keys.State.FAILED).obj(),
          _state(keys.State.FAILED, job_suspend=False).label(keys.STATE_LABEL, "Pending").obj(), False,
          says="unsuspend it"),
    # --- never held by raygate (created before the namespace opted in) ---
    Guard("user_unsuspends_job_raygate_never_held", _state(None).obj(), _state(None, job_suspend=False).obj(), False,
          says="unsuspend it"),
    Guard("user_labels_a_never_held_job_admitted", _state(None, job_suspend=False).obj(),
          _state(None, job_suspend=False).label(keys.STATE_LABEL, "Admitted").obj(), False,
          says=f"add label {keys.STATE_LABEL}"),
    Guard("user_scales_a_never_held_job_up", _state(None, job_suspend=False).obj(),
          _state(None, job_suspend=False, replicas=6).obj(), False, says="grow pod set gpu from 2 to 6 pods"),
    Guard("user_turns_a_cluster_selector_job_into_a_gang", RayJob().without_cluster_spec().cluster_selector(
          **{"ray.io/cluster": "x"}).obj(), gpu_job().obj(), False, says="add pod set gpu"),
    Guard("kueue_mode_is_kueues_to_guard", _state(None).annotation(keys.MODE_ANNOTATION, "kueue").obj(),
          _state(None, job_suspend=False).annotation(keys.MODE_ANNOTATION, "kueue").obj(), True),
]


@pytest.mark.parametrize("case", GUARDS, ids=lambda c: c.name)
def test_update_guard(case: Guard) -> None:
    d = validate(request(case.new, operation="UPDATE", old=case.old, user=case.user), OPTED_IN, case.cfg)
    assert d.allowed is case.allowed, d.message
    if not case.allowed:
        assert d.code == 403
        assert d.message is not None and "You may not" in d.message
        assert case.says is not None and case.says in d.message, d.message
    assert d.patch == []


@pytest.mark.parametrize(("old", "words"), [
    (_held().obj(), ["waits for capacity", "kubectl describe rayjob job -n team", "delete and re-create"]),
    (_admitted().obj(), ["booked for it", "delete it and create it again"]),
    (_state(keys.State.FAILED).obj(), ["gave up", "raygate.io/state=Pending --overwrite"]),
    (_state(None).obj(), ["created before raygate gated namespace team", "create it again"]),
])
def test_each_state_says_what_the_user_can_do(old: dict[str, Any], words: list[str]) -> None:
    new = json.loads(json.dumps(old))
    new["metadata"].setdefault("labels", {})["raygate.io/extra"] = "x"
    d = validate(request(new, operation="UPDATE", old=old), OPTED_IN, DEFAULT)
    assert not d.allowed and d.message is not None
    for w in words:
        assert w in d.message, d.message


def test_update_guard_quotes_the_reason_raygate_recorded() -> None:
    old = _held().annotation(keys.REASON_ANNOTATION, "ProvisioningRequest job-pr is not Provisioned yet").obj()
    new = jsonpatch.apply_patch(old, [{"op": "replace", "path": SUSPEND, "value": False}])
    d = validate(request(new, operation="UPDATE", old=old), OPTED_IN, DEFAULT)
    assert d.message is not None and "is not Provisioned yet" in d.message


def test_update_guard_off_outside_opted_in_namespaces() -> None:
    d = validate(request(_held().suspend(False).obj(), operation="UPDATE", old=_held().obj()), {}, DEFAULT)
    assert d.allowed


# --- the KubeRay operator's update of a RayService's cluster ---------------------------------------------

def test_the_operators_wholesale_update_of_a_held_cluster_keeps_raygates_hold_and_passes_the_guard() -> None:
    """KubeRay's RayService controller replaces its cluster's spec, labels and annotations with what it derives
    from the RayService: raygate keeps its hold and record on it, and the update is not refused."""
    created = RayCluster("svc-raycluster-abc").worker("gpu", replicas=2, limits={"nvidia.com/gpu": "1"}).obj()
    held = applied(created, mutate(request(created, user=OPERATOR), OPTED_IN, DEFAULT))
    goal = RayCluster("svc-raycluster-abc").worker("gpu", replicas=3, limits={"nvidia.com/gpu": "1"}).obj()
    goal["metadata"]["labels"] = {"ray.io/originated-from-crd": "RayService"}
    d = mutate(request(goal, operation="UPDATE", old=held, user=OPERATOR), OPTED_IN, DEFAULT)
    stored = applied(goal, d)
    assert stored["spec"]["suspend"] is True
    assert stored["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
    assert stored["spec"]["workerGroupSpecs"][0]["replicas"] == 3  # the operator's own change stays
    assert validate(request(stored, operation="UPDATE", old=held, user=OPERATOR), OPTED_IN, DEFAULT).allowed
    # The same wholesale update from a user is not patched, and the guard refuses it.
    user = mutate(request(goal, operation="UPDATE", old=held), OPTED_IN, DEFAULT)
    assert user.patch == []
    assert not validate(request(goal, operation="UPDATE", old=held), OPTED_IN, DEFAULT).allowed
