"""native mode: Kubernetes' own Workload and PodGroup beside the booking, pure parts. One case per behaviour.

The scheduler's side (what kube-scheduler does with the objects) is in tests/integration/test_native_scheduling.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import jsonpatch
import pytest
from builders import RayJob, config
from builders import request as review_request
from plans import applied, decide, kinds

from raygate.core import keys
from raygate.core.api import OFFLINE, Served
from raygate.core.config import parse_config
from raygate.core.keys import ChildKind, Mode
from raygate.core.modes import GroupSpec, for_object, native
from raygate.core.patch import PatchBuilder
from raygate.core.policy import KUBERAY_OPERATOR_USER, ConfigError, NamespacePolicy, merge_override
from raygate.core.workload import Workload
from raygate.kube import discovery
from raygate.reconciler import gating
from raygate.reconciler.plan import Create, Observed
from raygate.webhook import decision as webhook

NOW = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
GPU = {"nvidia.com/gpu": "1"}
CPU = {"cpu": "1"}
SERVED = Served(gang_version="v1alpha2")
OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}
RULES = native.RULES


def request(obj: dict[str, Any] | None, user: str = KUBERAY_OPERATOR_USER, **kwargs: Any) -> Any:
    """A review from KubeRay's operator by default: it makes the Ray objects' pods."""
    return review_request(obj, user=user, **kwargs)


def job(state: str = "Pending", *, workers: int = 4, cpu_workers: int = 0, suspend: bool = True,
        submitter: bool = True, uid: str = "u1") -> Workload:
    b = (RayJob("train", "ns")
         .meta(uid=uid, resourceVersion="41", generation=3, creationTimestamp="2030-01-01T11:59:00Z")
         .label(keys.STATE_LABEL, state).annotation(keys.MODE_ANNOTATION, "native").suspend(suspend)
         .head(requests=CPU)
         .worker("gpu", replicas=workers, min_replicas=0, max_replicas=9, limits=GPU))
    if cpu_workers:
        b.worker("cpu", replicas=cpu_workers, min_replicas=0, max_replicas=9, requests=CPU)
    if not submitter:
        b.set("spec", "submissionMode", value="HTTPMode")
    return Workload(b.obj())


def policy(**override: Any) -> NamespacePolicy:
    return merge_override(NamespacePolicy(), {"mode": "native", **override})


def made(w: Workload, **meta: Any) -> tuple[dict[str, Any], ...]:
    """The job's Workload and PodGroup as the reconciler made them (as listed: kind set by the controller)."""
    objs = [o for _, o in RULES.group_objects(w, RULES.recorded(w), SERVED)]
    for o in objs:
        o["metadata"].update(meta)
    return tuple(objs)


# --- the mode, the config and the cluster --------------------------------------------------------------

def test_native_is_a_mode_that_holds_books_and_groups() -> None:
    rules = for_object(policy())
    assert rules.mode is Mode.NATIVE and rules.holds and rules.books and rules.gates_pods
    assert rules.group is RULES
    assert for_object(policy(provisioning={"enabled": False})).books is False  # static GPU pools


@pytest.mark.parametrize(("served", "refused"), [
    (Served(gang_version=None), True),  # neither v1beta1 nor v1alpha2 served
    (Served(gang_version="v1alpha2"), False),
    (Served(gang_version="v1beta1"), False),
    (OFFLINE, False),  # nobody asked the cluster (raygate explain without --kubeconfig)
])
def test_config_load_refuses_native_mode_where_the_cluster_serves_no_gang_api(served: Served, refused: bool) -> None:
    text = "namespaces:\n  ml:\n    mode: native\n"
    if not refused:
        assert parse_config(text, served).policy_for("ml").mode is Mode.NATIVE
        return
    with pytest.raises(ConfigError) as err:
        parse_config(text, served)
    (problem,) = err.value.problems
    assert problem.startswith("namespaces.ml.mode: native mode needs Kubernetes' gang scheduling")
    for flag in (*keys.GANG_APISERVER_FLAGS, *keys.GANG_SCHEDULER_FLAGS, "kube-controller-manager"):
        assert flag in problem
    assert "restart raygate" in problem


def test_config_load_names_defaults_when_the_default_mode_is_native() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("defaults:\n  mode: native\nnamespaces:\n  old:\n    mode: provisioning\n", Served())
    assert [p.split(":")[0] for p in err.value.problems] == ["defaults.mode"]


def test_discovery_reads_every_group_version_the_server_lists() -> None:
    listing = {"groups": [{"name": "scheduling.k8s.io", "versions": [{"groupVersion": "scheduling.k8s.io/v1"},
                                                                     {"groupVersion": "scheduling.k8s.io/v1alpha2"}]},
                          {"name": "ray.io", "versions": [{"groupVersion": "ray.io/v1"}]}]}
    assert discovery.group_versions(listing) == {"scheduling.k8s.io/v1", "scheduling.k8s.io/v1alpha2", "ray.io/v1"}


@pytest.mark.parametrize(("found", "version"), [
    ({}, None),
    ({"v1alpha2": {"resources": [{"name": "workloads"}, {"name": "podgroups"}, {"name": "podgroups/status"}]}},
     "v1alpha2"),
    ({"v1beta1": {"resources": [{"name": "workloads"}, {"name": "podgroups"}]},
      "v1alpha2": {"resources": [{"name": "workloads"}, {"name": "podgroups"}]}}, "v1beta1"),  # 1.37 first
    ({"v1beta1": {"resources": [{"name": "priorityclasses"}]}}, None),  # scheduling.k8s.io/v1beta1 of old
    ({"v1alpha2": {"resources": [{"name": "workloads"}]}}, None),  # both kinds, or none
])
def test_discovery_picks_the_version_that_serves_workloads_and_podgroups(found: dict[str, Any],
                                                                         version: str | None) -> None:
    assert discovery.gang_version(found) == version


# --- the group objects ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("w", "min_count"), [
    (job(), 5),  # head + 4 GPU workers; the K8sJobMode submitter waits for the cluster: not counted
    (job(cpu_workers=2), 7),  # every worker group, GPU or not
    (job(submitter=False), 5),
    (job(workers=0), 1),
])
def test_min_count_is_the_pods_kuberay_starts_for_the_gang(w: Workload, min_count: int) -> None:
    assert RULES.recorded(w).spec == {"minCount": min_count}


def test_the_workload_and_its_pod_group_as_v1alpha2_spells_them() -> None:
    w = job()
    spec = RULES.recorded(w)
    (k1, workload), (k2, group) = RULES.group_objects(w, spec, SERVED)
    assert (k1, k2) == (ChildKind.WORKLOAD, ChildKind.GANG_POD_GROUP)  # the Workload first: the API checks it
    assert workload["apiVersion"] == group["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert workload["spec"] == {"controllerRef": {"apiGroup": "ray.io", "kind": "RayJob", "name": "train"},
                                "podGroupTemplates": [{"name": "gang",
                                                       "schedulingPolicy": {"gang": {"minCount": 5}}}]}
    assert group["spec"] == {"podGroupTemplateRef": {"workload": {"workloadName": spec.name,
                                                                  "podGroupTemplateName": "gang"}},
                             "schedulingPolicy": {"gang": {"minCount": 5}}}
    for obj in (workload, group):
        assert obj["metadata"]["name"] == spec.name
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u1"
        assert obj["metadata"]["labels"] == {keys.MANAGED_BY_LABEL: keys.MANAGED_BY_VALUE}


def test_served_v1beta1_is_used_when_the_cluster_serves_it() -> None:
    w = job()
    objs = RULES.group_objects(w, RULES.recorded(w), Served(gang_version="v1beta1"))
    assert {o["apiVersion"] for _, o in objs} == {"scheduling.k8s.io/v1beta1"}


def test_the_group_name_changes_with_the_gang_and_the_job() -> None:
    names = {RULES.recorded(job()).name, RULES.recorded(job(workers=3)).name, RULES.recorded(job(uid="u2")).name}
    assert len(names) == 3
    assert RULES.recorded(job()).name == RULES.recorded(job()).name
    long = Workload(RayJob("x" * 63, "ns").meta(uid="u").head(requests=CPU).obj())
    assert len(native.increment_name(RULES.recorded(long).name, "g" * 63, 12345)) <= 63


# --- the reconciler: held, admitted, gone ----------------------------------------------------------

def test_a_held_gpu_job_gets_its_workload_and_pod_group_beside_the_request() -> None:
    w = job()
    plan = decide(w, Observed(served=SERVED), policy(), NOW)
    assert kinds(plan) == ["create Workload", "create PodGroup.scheduling.k8s.io", "create PodTemplate",
                           "create ProvisioningRequest", "patch provisioning"]


def test_without_provisioning_the_group_is_made_and_the_job_admitted_with_its_pod_templates_naming_it() -> None:
    w = job()
    plan = decide(w, Observed(served=SERVED), policy(provisioning={"enabled": False}), NOW)
    assert kinds(plan) == ["create Workload", "create PodGroup.scheduling.k8s.io", "patch admit", "event Admitted"]
    after = applied(w, plan)
    name = RULES.recorded(w).name
    spec = after["spec"]["rayClusterSpec"]
    head, worker = spec["headGroupSpec"]["template"], spec["workerGroupSpecs"][0]["template"]
    assert head["metadata"]["annotations"] == worker["metadata"]["annotations"] == {keys.GANG_GROUP_ANNOTATION: name}
    assert "kube-scheduler bind its 5 pods together" in after["metadata"]["annotations"][keys.REASON_ANNOTATION]


def test_a_provisioned_job_is_admitted_once_its_group_exists() -> None:
    from test_reconciler_decision import request as provreq
    from test_reconciler_decision import rname

    w0 = job()
    w = job("Provisioning")
    w.obj["metadata"]["annotations"].update({keys.ATTEMPT_ANNOTATION: "1", keys.REQUEST_ANNOTATION: rname(w0, 1)})
    pr = provreq(w0, 1, ("Accepted", "True", "A"), ("Provisioned", "True", "P"))
    plan = decide(w, Observed(requests=(pr,), groups=made(w), served=SERVED), policy(), NOW)
    assert kinds(plan) == ["patch admit", "event Admitted"]
    # Missing (deleted by hand, or a crash between the two creates): made again before the admission.
    plan = decide(w, Observed(requests=(pr,), groups=made(w)[:1], served=SERVED), policy(), NOW)
    assert kinds(plan) == ["create PodGroup.scheduling.k8s.io", "patch admit", "event Admitted"]


def test_a_gang_that_changes_while_held_gets_new_objects_and_the_old_go() -> None:
    before = job(workers=4)
    grown = job(workers=6)
    plan = decide(grown, Observed(groups=made(before), served=SERVED), policy(provisioning={
        "enabled": False}), NOW)
    old = RULES.recorded(before).name
    assert kinds(plan)[:4] == [f"delete Workload {old}", f"delete PodGroup.scheduling.k8s.io {old}",
                               "create Workload", "create PodGroup.scheduling.k8s.io"]
    assert [a.obj["spec"]["schedulingPolicy"]["gang"]["minCount"] for a in plan.actions  # type: ignore[union-attr]
            if isinstance(a, Create) and a.kind == ChildKind.GANG_POD_GROUP] == [7]


def test_a_group_of_the_same_name_still_being_deleted_holds_the_job_until_it_is_gone() -> None:
    w = job()
    going = made(w, deletionTimestamp="2030-01-01T11:59:59Z")
    plan = decide(w, Observed(groups=going, served=SERVED), policy(provisioning={"enabled": False}), NOW)
    assert kinds(plan) == ["patch hold", "event GroupDeleting"]
    assert plan.requeue_after is not None and plan.requeue_after <= 1
    assert "being deleted" in applied(w, plan)["metadata"]["annotations"][keys.REASON_ANNOTATION]


def test_a_cluster_that_no_longer_serves_the_api_fails_the_job_with_the_flags() -> None:
    w = job()
    plan = decide(w, Observed(served=Served()), policy(), NOW)
    assert plan.outcome == "failed"
    assert keys.GANG_SCHEDULER_FLAGS[0] in applied(w, plan)["metadata"]["annotations"][keys.REASON_ANNOTATION]


@pytest.mark.parametrize("status", [{"jobDeploymentStatus": "Complete"}, {"jobStatus": "FAILED"}])
def test_a_finished_job_deletes_its_workload_and_pod_groups(status: dict[str, Any]) -> None:
    w = job("Admitted", suspend=False)
    w.obj["status"] = status
    inc = RULES.increment_objects(w, "train-x-1", "gpu", 2, SERVED)[0][1]
    going = {**made(w)[1], "kind": "PodGroup"}
    going["metadata"] = {**going["metadata"], "name": "old", "deletionTimestamp": "2030-01-01T11:00:00Z"}
    plan = decide(w, Observed(groups=(*made(w), inc, going), served=SERVED), policy(), NOW)
    name = RULES.recorded(w).name
    assert kinds(plan) == [f"delete Workload {name}", f"delete PodGroup.scheduling.k8s.io {name}",
                           "delete PodGroup.scheduling.k8s.io train-x-1"]  # the one being deleted is left to go


# --- the pod webhook: every pod of the gang in its group ----------------------------------------------

class Members:
    def __init__(self, groups: set[str] | None = None, bound: dict[str, str] | None = None) -> None:
        self.groups, self.bound = (groups or set()) | set(bound or {}), bound or {}

    def exists(self, namespace: str, group: str) -> bool:
        return group in self.groups

    def bound_cluster(self, namespace: str, group: str) -> str | None:
        return self.bound.get(group)


def pod(group: str | None = "g", pod_set: str = "gpu", gpu: bool = True, name: str = "p",
        cluster: str = "c1") -> dict[str, Any]:
    annotations = {keys.GANG_GROUP_ANNOTATION: group} if group is not None else {}
    resources = {"limits": GPU} if gpu else {"requests": CPU}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations,
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster,
                                              "uid": f"{cluster}-uid", "controller": True}],
                         "labels": {keys.RAY_GROUP_LABEL: pod_set, keys.RAY_NODE_TYPE_LABEL: "worker",
                                    keys.RAY_CLUSTER_LABEL: cluster}},
            "spec": {"containers": [{"name": "c", "image": "ray", "resources": resources}]}}


def inc(n: int, pod_set: str = "gpu") -> str:
    return native.increment_name("g", pod_set, n)


@pytest.mark.parametrize(("case", "p", "gated", "members", "want"), [
    ("pods_of_a_gang_not_bound_yet_join_it", pod(), True, Members({"g"}), "g"),
    ("even_before_its_group_is_in_the_cache", pod(), True, Members(), "g"),
    ("once_its_clusters_gang_is_bound_a_gated_pod_opens_an_increment", pod(), True, Members(bound={"g": "c1"}),
     inc(1)),
    ("a_made_increment_is_closed", pod(), True, Members({inc(1)}, bound={"g": "c1"}), inc(2)),
    ("increments_per_pod_set", pod(pod_set="other"), True, Members({inc(1)}, bound={"g": "c1"}), inc(1, "other")),
    ("another_cluster_a_rayjob_retry_forms_the_gang_again", pod(cluster="c2"), True, Members(bound={"g": "c1"}), "g"),
    ("a_pod_not_gated_stays_in_the_gang_group", pod(gpu=False), False, Members(bound={"g": "c1"}), "g"),
    ("no_group_no_stamp", pod(group=None), True, Members(bound={"g": "c1"}), None),
])
def test_the_pod_webhook_names_the_group_a_pod_joins(case: str, p: dict[str, Any], gated: bool,
                                                     members: Members, want: str | None) -> None:
    b = PatchBuilder(p)
    RULES.pod_patch(b, p, "ns", gated, members)
    got = jsonpatch.apply_patch(p, b.ops)
    assert got["spec"].get("schedulingGroup") == ({"podGroupName": want} if want else None)


def native_config(**extra: Any) -> Any:
    return config(mode="native", **extra)


def test_a_gpu_pod_of_a_native_gang_is_gated_and_named_into_its_group() -> None:
    d = webhook.mutate(request(pod()), OPTED_IN, native_config())
    assert (d.allowed, d.outcome) == (True, "gated")
    stored = jsonpatch.apply_patch(pod(), d.patch)
    assert stored["spec"]["schedulingGroup"] == {"podGroupName": "g"}
    assert stored["spec"]["schedulingGates"] == [{"name": keys.CAPACITY_GATE}]
    assert webhook.validate(request(stored), OPTED_IN, native_config()).allowed


def test_the_head_is_named_into_its_group_without_a_gate_and_static_pools_gate_nothing() -> None:
    d = webhook.mutate(request(pod(gpu=False, pod_set="headgroup")), OPTED_IN, native_config())
    assert d.outcome == "grouped" and [op["path"] for op in d.patch] == [
        "/metadata/annotations/raygate.io~1ray-owner", "/spec/schedulingGroup"]
    static = native_config(provisioning={"enabled": False})
    d = webhook.mutate(request(pod()), OPTED_IN, static, members=Members(bound={"g": "c1"}))
    assert d.outcome == "grouped"  # not gated, so never a scale-up's: growth is refused where nothing is booked
    assert jsonpatch.apply_patch(pod(), d.patch)["spec"]["schedulingGroup"] == {"podGroupName": "g"}


def test_a_pod_of_a_native_gang_is_named_into_its_group_whatever_the_namespace_mode_is_now() -> None:
    d = webhook.mutate(request(pod(gpu=False)), OPTED_IN, config(mode="kueue"))
    assert d.outcome == "grouped"


def test_a_gang_pod_stored_without_its_group_is_refused_saying_why() -> None:
    stored = jsonpatch.apply_patch(pod(), webhook.mutate(request(pod()), OPTED_IN, native_config()).patch)
    del stored["spec"]["schedulingGroup"]  # dropped by an API server without the gate, or another webhook
    d = webhook.validate(request(stored), OPTED_IN, native_config())
    assert not d.allowed and keys.GANG_APISERVER_FLAGS[0] in (d.message or "")


def test_a_user_cannot_write_the_gang_annotations_on_pod_templates() -> None:
    w = RayJob("train", "ns").head(requests=CPU).worker("gpu", replicas=1, limits=GPU).shutdown_after_finish(True)
    obj = w.obj()
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"].setdefault("metadata", {})["annotations"] = {
        keys.GANG_GROUP_ANNOTATION: "someone-elses"}
    d = webhook.mutate(request(obj), OPTED_IN, native_config())
    stored = jsonpatch.apply_patch(obj, d.patch)
    template = stored["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    assert not (template.get("metadata") or {}).get("annotations")


def test_a_gang_whose_templates_name_different_schedulers_is_refused() -> None:
    obj = (RayJob("train", "ns").head(requests=CPU).worker("gpu", replicas=1, limits=GPU)
           .shutdown_after_finish(True).obj())
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["schedulerName"] = "volcano"
    d = webhook.mutate(request(obj), OPTED_IN, native_config())
    assert not d.allowed and "same one" in (d.message or "")


# --- the reconciler: scale-ups, each increment a PodGroup of its own -------------------------------------

def gp(name: str, group: str | None, *, gated: bool = True, runs: bool = True, consumes: str | None = None,
       digest: str = "d") -> gating.Pod:
    return gating.Pod(name, f"2030-01-01T11:00:0{name[-1]}Z", "gpu", gated, runs, consumes, digest, group=group)


def slot_request(name: str, count: int, *, provisioned: bool = True) -> dict[str, Any]:
    conds = [{"type": t, "status": "True" if provisioned else "False"} for t in ("Accepted", "Provisioned")]
    return {"metadata": {"name": name, "creationTimestamp": "2030-01-01T11:00:00Z",
                         "annotations": {keys.SCALE_UP_ANNOTATION: "gpu"}},
            "spec": {"podSets": [{"podTemplateRef": {"name": "t"}, "count": count}]},
            "status": {"conditions": conds}}


TEMPLATE = {"metadata": {"name": "t", "annotations": {keys.POD_SET_ANNOTATION: "gpu", keys.PLACEMENT_ANNOTATION: "d"}}}


@pytest.mark.parametrize(("case", "pods", "scale_ups", "made_", "closing", "released"), [
    ("an_increment_covered_whole_is_released_whole", [gp("a1", "k"), gp("a2", "k")], [slot_request("r", 2)],
     frozenset(), frozenset(), ["a1", "a2"]),
    ("an_increment_covered_in_part_waits_for_the_rest", [gp("a1", "k"), gp("a2", "k"), gp("a3", "k")],
     [slot_request("r", 2)], frozenset(), frozenset(), []),
    ("pods_of_a_made_group_go_one_by_one", [gp("a1", "g"), gp("a2", "g"), gp("a3", "g")], [slot_request("r", 2)],
     frozenset({"g"}), frozenset(), ["a1", "a2"]),
    ("no_pod_goes_into_a_group_being_deleted", [gp("a1", "k")], [slot_request("r", 1)], frozenset(),
     frozenset({"k"}), []),
    ("pods_in_no_group_are_unchanged", [gp("a1", None), gp("a2", None)], [slot_request("r", 1)], frozenset(),
     frozenset(), ["a1"]),
])
def test_gated_pods_of_a_group_still_to_make_are_released_together(
        case: str, pods: list[gating.Pod], scale_ups: list[dict[str, Any]], made_: frozenset[str],
        closing: frozenset[str], released: list[str]) -> None:
    g = gating.plan(pods, [], scale_ups, [TEMPLATE], room=100, most_per_request=100, made=made_, closing=closing)
    assert [p.name for p, _ in g.release] == released
    assert sum(g.waiting.values()) == len([p for p in pods if p.gated]) - len(released)
    # Held pods keep their slots: what is booked anew is exactly the pods no slot covers, never them twice.
    booked = sum(ps["count"] for r in scale_ups for ps in r["spec"]["podSets"])
    assert sum(n for _, n, _ in g.create) == max(len([p for p in pods if p.gated]) - booked, 0)


def admitted(**extra: Any) -> Workload:
    w = job("Admitted", suspend=False, workers=2)
    w.obj["metadata"]["annotations"][keys.REQUEST_ANNOTATION] = "main"
    return w


def live_pod(name: str, group: str, *, gated: bool) -> gating.Pod:
    obj = {"metadata": {"name": name, "labels": {keys.RAY_GROUP_LABEL: "gpu"}},
           "spec": {"schedulingGates": [{"name": keys.CAPACITY_GATE}] if gated else [],
                    "schedulingGroup": {"podGroupName": group}}}
    return gating.Pod(name, "2030-01-01T11:00:00Z", "gpu", gated, True, None if gated else "main", "d", obj, group)


def test_the_increment_group_is_made_before_its_pods_are_released_with_their_count() -> None:
    w = admitted()
    pods = (live_pod("w1", "gang", gated=False), live_pod("w2", "gang", gated=False),
            live_pod("s1", "k1", gated=True), live_pod("s2", "k1", gated=True))
    gang = {**made(w)[1], "metadata": {**made(w)[1]["metadata"], "name": "gang"}}
    plan = decide(w, Observed(pods=pods, scale_ups=(slot_request("r", 2),), templates=(TEMPLATE,),
                              groups=(gang,), served=SERVED), policy(), NOW)
    assert kinds(plan)[:3] == ["create PodGroup.scheduling.k8s.io", "release s1", "release s2"]
    group = plan.actions[0].obj  # type: ignore[union-attr]
    assert group["metadata"]["name"] == "k1"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}
    assert group["metadata"]["annotations"] == {keys.SCALE_UP_ANNOTATION: "gpu",
                                                keys.RAY_OWNER_ANNOTATION: "RayJob/train/u1"}  # its job, if orphaned


def test_an_increment_none_of_whose_pods_is_left_goes() -> None:
    w = admitted()
    inc_ = RULES.increment_objects(w, "k1", "gpu", 2, SERVED)[0][1]
    gang = {**made(w)[1], "metadata": {**made(w)[1]["metadata"], "name": "gang"}}
    plan = decide(w, Observed(groups=(gang, inc_), served=SERVED), policy(), NOW)
    assert "delete PodGroup.scheduling.k8s.io k1" in kinds(plan)
    assert not any(k.endswith(" gang") for k in kinds(plan))  # the gang's own stays while the job runs
    kept = decide(w, Observed(groups=(gang, inc_), pods=(live_pod("s1", "k1", gated=False),),
                              served=SERVED), policy(), NOW)
    assert "delete PodGroup.scheduling.k8s.io k1" not in kinds(kept)


def test_the_recorded_group_spec_is_the_gang_now() -> None:
    assert RULES.recorded(job()) == GroupSpec(native.group_name(job(), 5), {"minCount": 5})


@pytest.mark.parametrize(("annotations", "bound"), [({}, None), ({keys.GANG_BOUND_ANNOTATION: "c1"}, "c1")])
def test_the_webhook_reads_from_a_pod_group_whose_gang_is_bound(annotations: dict[str, str],
                                                                 bound: str | None) -> None:
    from raygate.webhook.gangs import group_view

    view = group_view({"metadata": {"name": "g", "namespace": "ns", "uid": "x", "annotations": annotations},
                       "spec": {"minCount": 5}, "status": {"conditions": []}})
    assert view == {"metadata": {"name": "g", "namespace": "ns"}, "bound": bound}


def gang_group(w: Workload, bound: str | None = None) -> dict[str, Any]:
    group = {**made(w)[1], "kind": "PodGroup"}
    if bound is not None:
        group["metadata"] = {**group["metadata"], "annotations": {keys.GANG_BOUND_ANNOTATION: bound}}
    return group


@pytest.mark.parametrize(("case", "recorded", "bound", "want"), [
    ("not_bound_yet", None, {"c1": 3}, None),  # minCount 3 of 5: not the gang yet
    ("bound_minCount_of_one_cluster", None, {"c1": 5}, "c1"),
    ("already_recorded", "c1", {"c1": 5}, None),
    ("never_taken_back", "c1", {"c1": 1}, None),  # a restart: its pods go to increments, never the gang's
    ("a_retry_bound_in_another_cluster", "c1", {"c1": 0, "c2": 5}, "c2"),
])
def test_the_reconciler_records_the_cluster_whose_gang_is_bound(case: str, recorded: str | None,
                                                                bound: dict[str, int], want: str | None) -> None:
    w = job("Admitted", suspend=False)
    ops = RULES.marks(gang_group(w, recorded), bound)
    if want is None:
        assert ops == []
        return
    after = jsonpatch.apply_patch(gang_group(w, recorded), ops)
    assert after["metadata"]["annotations"][keys.GANG_BOUND_ANNOTATION] == want
    assert RULES.marks(made(w)[0], bound) == []  # the Workload carries no record
    inc_ = RULES.increment_objects(w, "k1", "gpu", 2, SERVED)[0][1]
    assert RULES.marks(inc_, {"c1": 9}) == []


def test_an_admitted_job_records_its_bound_gang_on_its_pod_group() -> None:
    w = admitted()
    group = gang_group(w)
    plan = decide(w, Observed(groups=(group,), bound={group["metadata"]["name"]: {"train-abc": 3}},
                              served=SERVED), policy(), NOW)
    # One patch, of the gang's PodGroup (none of the job: nothing else changed)
    assert [k for k in kinds(plan) if k.startswith("patch ")] == [
        f"patch {ChildKind.GANG_POD_GROUP} {group['metadata']['name']}"]


def test_each_attempt_has_a_group_of_its_own() -> None:
    first = RULES.recorded(job()).name
    requeued = job()
    requeued.obj["metadata"]["annotations"].update({keys.ATTEMPT_ANNOTATION: "2", keys.REQUEST_ANNOTATION: "r-a2"})
    assert RULES.recorded(requeued).name != first
    restarted = job()  # relabelled Pending after Failed: no request, back to attempt 1
    restarted.obj["metadata"]["annotations"][keys.ATTEMPT_ANNOTATION] = "4"
    assert RULES.recorded(restarted).name == first


def test_a_job_given_up_on_deletes_its_groups_so_a_new_start_makes_its_own() -> None:
    w = job("Admitted", suspend=False)
    w.obj["status"] = {"jobDeploymentStatus": "ValidationFailed", "message": "bad"}
    plan = decide(w, Observed(groups=made(w), served=SERVED), policy(), NOW)
    assert plan.outcome == "failed"
    assert [k for k in kinds(plan) if k.startswith("delete")] == [
        f"delete Workload {RULES.recorded(w).name}", f"delete PodGroup.scheduling.k8s.io {RULES.recorded(w).name}"]


def test_a_job_without_a_recorded_mode_is_stopped_under_the_mode_it_was_decided_under() -> None:
    """No recorded mode (the webhook never saw the job): the namespace's mode applies to all of it, so the groups
    made for it in native mode go when it fails, as a recorded native job's do."""
    w = job("Admitted", suspend=False)
    del w.obj["metadata"]["annotations"][keys.MODE_ANNOTATION]
    w.obj["status"] = {"jobDeploymentStatus": "ValidationFailed", "message": "bad"}
    plan = decide(w, Observed(groups=made(w), served=SERVED), policy(), NOW)
    assert [k for k in kinds(plan) if k.startswith("delete")] == [
        f"delete Workload {RULES.recorded(w).name}", f"delete PodGroup.scheduling.k8s.io {RULES.recorded(w).name}"]
