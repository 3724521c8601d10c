"""What one Ray object may ask of the shared cluster, and which GPUs raygate sees: limits at create and on
update, managedResources prefixes, and GPUs claimed through DRA."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from builders import RayCluster, RayJob, config, gpu_job, request

from raygate.core import dra, keys
from raygate.core.config import parse_config
from raygate.core.policy import ConfigError, NamespacePolicy
from raygate.core.workload import Workload
from raygate.webhook.decision import Decision, mutate, validate

OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}
HUGE = 2147483647
WORKER0 = ("spec", "rayClusterSpec", "workerGroupSpecs", 0)


def create(obj: dict[str, Any], **defaults: Any) -> Decision:
    return mutate(request(obj), OPTED_IN, config(**defaults))


def update(old: dict[str, Any], new: dict[str, Any], **defaults: Any) -> Decision:
    return validate(request(new, operation="UPDATE", old=old), OPTED_IN, config(**defaults))


def held(obj: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    """`obj` as raygate stores it after admission at create."""
    d = create(obj, **defaults)
    assert d.allowed, d.message
    return jsonpatch.apply_patch(obj, d.patch)  # type: ignore[no-any-return]


# --- limits ---------------------------------------------------------------------------------------

def test_a_group_of_two_billion_replicas_is_refused_with_the_numbers() -> None:
    obj = RayCluster().worker("gpu", replicas=HUGE, max_replicas=HUGE, limits={"nvidia.com/gpu": "1"}).obj()
    d = create(obj)
    assert not d.allowed and d.message is not None
    assert "can run up to 2,147,483,648 pods (gpu 2,147,483,647, headgroup 1)" in d.message
    assert "allows at most 4,096 per object (limits.maxPods in raygate-config)" in d.message
    assert "would book 2,147,483,647 pods" in d.message and "limits.maxRequestPods" in d.message


def test_an_autoscaling_group_starting_at_zero_counts_its_max_replicas() -> None:
    """The elastic case: nothing booked at start, but the Ray autoscaler may grow it to maxReplicas."""
    obj = (RayCluster().autoscaling()
           .worker("gpu", replicas=0, min_replicas=0, max_replicas=100_000, limits={"nvidia.com/gpu": "1"}).obj())
    d = create(obj)
    assert not d.allowed and d.message is not None and "up to 100,001 pods" in d.message
    unbounded = RayCluster().autoscaling().worker("gpu", replicas=0, limits={"nvidia.com/gpu": "1"}).obj()
    d = create(unbounded)
    assert not d.allowed and d.message is not None and "maxReplicas" in d.message  # KubeRay's default: 2**31-1


def test_limits_are_configurable_per_namespace() -> None:
    obj = gpu_job().worker("more", replicas=30, limits={"nvidia.com/gpu": "1"}).obj()
    assert create(obj).allowed
    d = create(obj, limits={"maxRequestPods": 16})
    assert not d.allowed and d.message is not None and "would book 32 pods" in d.message and "at most 16" in d.message
    d = create(obj, limits={"maxPods": 20})
    assert not d.allowed and d.message is not None and "up to 34 pods" in d.message
    # Where nothing is booked, the request limit does not apply; the object limit does.
    assert create(obj, mode="volcano", limits={"maxRequestPods": 16}).allowed
    assert not create(obj, mode="kueue", queueName="q", limits={"maxPods": 20}).allowed


@pytest.mark.parametrize(("field", "value"), [("replicas", HUGE), ("maxReplicas", HUGE)])
def test_an_update_over_the_limit_is_refused_in_any_state(field: str, value: int) -> None:
    old = held(RayCluster().autoscaling()
               .worker("gpu", replicas=1, min_replicas=0, max_replicas=4, limits={"nvidia.com/gpu": "1"}).obj())
    new = copy.deepcopy(old)
    new["spec"]["workerGroupSpecs"][0][field] = value
    new["spec"]["workerGroupSpecs"][0]["maxReplicas"] = HUGE
    for state in ("Pending", "Provisioning", "Admitted", "Failed"):
        old["metadata"]["labels"][keys.STATE_LABEL] = new["metadata"]["labels"][keys.STATE_LABEL] = state
        d = update(old, new)
        assert not d.allowed and d.message is not None, state
        assert "raygate refused this change" in d.message and "limits.maxPods" in d.message, state


def test_an_update_that_does_not_grow_an_object_already_over_a_lowered_limit_is_not_refused_for_it() -> None:
    old = held(gpu_job().worker("more", replicas=30, limits={"nvidia.com/gpu": "1"}).obj())
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["team"] = "vision"
    assert update(old, new, limits={"maxPods": 20}).allowed
    bigger = copy.deepcopy(new)
    bigger["spec"]["rayClusterSpec"]["workerGroupSpecs"][1]["replicas"] = 31
    assert not update(old, bigger, limits={"maxPods": 20}).allowed


@pytest.mark.parametrize(("text", "problem"), [
    ("defaults:\n  limits:\n    maxPods: 0\n", "defaults.limits.maxPods"),
    ("defaults:\n  limits:\n    maxRequestPods: lots\n", "defaults.limits.maxRequestPods"),
    ("defaults:\n  limits:\n    maxNodes: 3\n", "defaults.limits.maxNodes"),
    ("defaults:\n  managedResources: ['nvidia.com/*gpu']\n", "is not a resource name, or a prefix"),
    ("defaults:\n  managedResources: ['*']\n", "is not a resource name"),
])
def test_bad_limits_and_resource_patterns_are_named(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
        parse_config(text)


# --- every GPU kind -------------------------------------------------------------------------------

@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb",
                                      "amd.com/gpu"])
def test_the_default_books_nvidia_gpus_mig_slices_and_amd_gpus(resource: str) -> None:
    w = Workload(RayJob().worker("w", replicas=3, limits={resource: "1"}).obj())
    managed = w.gang().managed_pod_sets(NamespacePolicy().manages)
    assert [(p.name, p.count) for p in managed] == [("w", 3)]


def test_other_resources_are_not_booked_unless_configured() -> None:
    w = Workload(RayJob().worker("w", limits={"google.com/tpu": "4"}).obj())
    assert w.gang().managed_pod_sets(NamespacePolicy().manages) == []
    tpu = config(managedResources=["google.com/*"]).defaults
    assert [p.name for p in w.gang().managed_pod_sets(tpu.manages)] == ["w"]


# --- DRA --------------------------------------------------------------------------------------------

def claim_template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team"},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


TEMPLATES = {
    "two-gpus": claim_template("two-gpus", {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                      "count": 2}}),
    "one-gpu": claim_template("one-gpu", {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}),
    "any-gpu": claim_template("any-gpu", {"name": "g", "firstAvailable": [
        {"name": "small", "deviceClassName": "mig.nvidia.com", "count": 1},
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4}]}),
    "all-gpus": claim_template("all-gpus", {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                      "allocationMode": "All"}}),
    "a-nic": claim_template("a-nic", {"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}),
}


def lookup(namespace: str, name: str) -> dict[str, Any] | None:
    return TEMPLATES.get(name) if namespace == "team" else None


def claiming(*claims: dict[str, str], replicas: int = 2) -> dict[str, Any]:
    job = RayJob().worker("gpu", replicas=replicas, requests={"cpu": "1"})
    return job.set(*WORKER0, "template", "spec", "resourceClaims", value=list(claims)).obj()


@pytest.mark.parametrize(("claims", "devices", "uncounted"), [
    ([{"name": "g", "resourceClaimTemplateName": "two-gpus"}], {"gpu.nvidia.com": 2}, ""),
    ([{"name": "g", "resourceClaimTemplateName": "one-gpu"}, {"name": "h", "resourceClaimTemplateName": "two-gpus"}],
     {"gpu.nvidia.com": 3}, ""),
    ([{"name": "g", "resourceClaimTemplateName": "any-gpu"}], {"gpu.nvidia.com": 4, "mig.nvidia.com": 1}, ""),
    ([{"name": "g", "resourceClaimTemplateName": "all-gpus"}], {}, "allocationMode All"),
    ([{"name": "g", "resourceClaimTemplateName": "missing"}], {}, "has not seen: create it before the job"),
    ([{"name": "g", "resourceClaimName": "shared"}], {}, "shares ResourceClaim shared"),
    ([{"name": "n", "resourceClaimTemplateName": "a-nic"}], {"nic.example.com": 1}, ""),
], ids=["exact-count", "two-claims-add-up", "first-available-worst-case", "all", "unseen-template", "shared-claim",
        "another-class"])
def test_devices_a_pod_claims_are_counted_from_its_templates(
        claims: list[dict[str, str]], devices: dict[str, int], uncounted: str) -> None:
    gpu = Workload(claiming(*claims), lookup).gang().pod_sets[1]
    assert {r.removeprefix(keys.DRA_RESOURCE_PREFIX): int(v) for r, v in gpu.per_pod.items()
            if dra.is_device_resource(r)} == devices
    assert (uncounted in " ".join(gpu.uncounted)) if uncounted else gpu.uncounted == ()


def test_dra_gpus_are_refused_where_raygate_books_and_say_why() -> None:
    obj = claiming({"name": "g", "resourceClaimTemplateName": "two-gpus"})
    d = mutate(request(obj), OPTED_IN, config(), lookup)
    assert not d.allowed and d.message is not None
    assert "pod set gpu claims devices through DRA (2 gpu.nvidia.com per pod)" in d.message
    assert "kubernetes/autoscaler#10065" in d.message and "nvidia.com/gpu" in d.message
    # A claim raygate cannot count is refused too, never passed silently.
    missing = claiming({"name": "g", "resourceClaimTemplateName": "missing"})
    unseen = mutate(request(missing), OPTED_IN, config(), lookup)
    assert not unseen.allowed and unseen.message is not None and "create it before the job" in unseen.message


def test_dra_claims_of_other_classes_pass_and_dra_gpus_are_counted_where_nothing_is_booked() -> None:
    nic = claiming({"name": "n", "resourceClaimTemplateName": "a-nic"})
    assert mutate(request(nic), OPTED_IN, config(), lookup).allowed
    gpus = claiming({"name": "g", "resourceClaimTemplateName": "two-gpus"}, replicas=3)
    volcano = mutate(request(gpus), OPTED_IN, config(mode="volcano"), lookup)
    assert volcano.allowed and volcano.gang is not None
    assert volcano.gang.ceiling_resources[dra.device_resource("gpu.nvidia.com")] == 6
    # Volcano's minResources lists what nodes offer; DRA devices are not among them.
    assert not any(dra.is_device_resource(r) for r in volcano.gang.min_resources)
    limited = mutate(request(gpus), OPTED_IN, config(mode="volcano", maxGang={
        dra.device_resource("gpu.nvidia.com"): "4"}), lookup)
    assert not limited.allowed and limited.message is not None and "up to 6 resource.k8s.io/gpu.nvidia.com" in \
        limited.message


def test_claims_added_after_admission_are_growth_where_pods_are_not_gated() -> None:
    old = held(RayJob().worker("gpu", replicas=2, requests={"cpu": "1"}).obj(), mode="volcano")
    old["metadata"]["labels"][keys.STATE_LABEL] = "Admitted"
    new = copy.deepcopy(old)
    new["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["resourceClaims"] = [
        {"name": "g", "resourceClaimTemplateName": "two-gpus"}]
    d = validate(request(new, operation="UPDATE", old=old), OPTED_IN, config(mode="volcano"), lookup)
    assert not d.allowed and d.message is not None and "add pod set gpu" in d.message


# --- PriorityClasses a namespace allows -----------------------------------------------------------

def test_a_priority_class_the_namespace_does_not_allow_is_refused_at_create_and_on_update() -> None:
    """A user's own pick of priority would put the job ahead of everyone's, and preempt theirs."""
    allowed = {"allowedPriorityClassNames": ["batch"], "defaultPriorityClassName": "batch"}
    urgent = gpu_job().label(keys.RAY_PRIORITY_CLASS_LABEL, "urgent").obj()
    d = create(urgent, **allowed)
    assert not d.allowed and d.message is not None
    assert "PriorityClass urgent" in d.message and "allowedPriorityClassNames" in d.message
    in_template = gpu_job().set(*WORKER0, "template", "spec", "priorityClassName", value="urgent").obj()
    assert not create(in_template, **allowed).allowed  # a pod template's priorityClassName too
    assert create(gpu_job().obj(), **allowed).allowed  # none named: the namespace default
    assert create(urgent).allowed  # no list: any, as Kubernetes allows by itself

    old = held(gpu_job().obj(), **allowed)
    new = copy.deepcopy(old)
    new["metadata"]["labels"][keys.RAY_PRIORITY_CLASS_LABEL] = "urgent"
    d = update(old, new, **allowed)
    assert not d.allowed and d.code == 403 and d.message is not None and "PriorityClass urgent" in d.message


def test_the_classes_the_admin_names_must_be_ones_the_namespace_allows() -> None:
    with pytest.raises(ConfigError, match="defaultPriorityClassName 'batch' is not in allowedPriorityClassNames"):
        parse_config("defaults:\n  allowedPriorityClassNames: [gold]\n  defaultPriorityClassName: batch\n")
    # volcano mode writes priorityClass into every job's PriorityClass label, the one the list bounds
    with pytest.raises(ConfigError, match="priorityClass 'batch' is not in allowedPriorityClassNames"):
        parse_config("defaults:\n  mode: volcano\n  allowedPriorityClassNames: [gold]\n  priorityClass: batch\n")
    # kueue mode's priorityClass is a Kueue WorkloadPriorityClass, not one of the namespace's PriorityClasses
    parse_config("defaults:\n  mode: kueue\n  allowedPriorityClassNames: [gold]\n  priorityClass: batch\n")
