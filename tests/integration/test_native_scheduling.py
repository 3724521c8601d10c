"""native mode for real: kube-scheduler's own gang scheduling (KEP-4671) binds a Ray gang whole, on capacity
raygate booked.

The stack is its own control plane with Kubernetes' gang scheduling on (`raygate dev up --gang-scheduling`:
GenericWorkload on kube-apiserver with scheduling.k8s.io/v1alpha2, on kube-controller-manager with its
podgroup-protection controller, GenericWorkload,GangScheduling on kube-scheduler), the capacity layer (2 CPU
nodes; a GPU node group of 0 to 2 nodes of 4 GPUs the real cluster-autoscaler grows), KubeRay, raygate's
webhook and reconciler. Nothing in this module writes a PodGroup's or a request's status, nor binds a pod:
kube-scheduler, the autoscaler and KWOK do. GPU nodes a test adds itself are static (a node group of their
own, which the autoscaler has no template for), and the pods meant for them are pinned there.

After every test `gang_rule_holds` checks the scheduler's promise on what it bound: of each PodGroup raygate
made, either none of the pods that name it is bound, or at least minCount are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import builders
import pytest
import yaml
from raystack import RayStack
from waiting import consistently, wait

from raygate.core import keys
from raygate.core.api import NODES, PODS, RAYCLUSTERS, RAYJOBS, gang_pod_groups, gang_workloads, provisioning_requests
from raygate.core.conditions import raw_conditions as conditions
from raygate.core.objects import JSON, get
from raygate.devenv.build import Bundle
from raygate.devenv.capacity import CPU_GROUP, GPU_RESOURCE, NODE_GROUP_LABEL, Layout, node, start_capacity
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook
from raygate.kube.client import JSON_PATCH, ApiError, Kube

pytestmark = [pytest.mark.integration, pytest.mark.kuberay]

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"nt-{k}-{SUFFIX}" for k in ("static", "booked", "compete", "contrast", "samples", "elastic", "plain")}
WORKLOADS, PODGROUPS = gang_workloads("v1alpha2"), gang_pod_groups("v1alpha2")
PR = provisioning_requests("v1")
LAYOUT = Layout(gpu_nodes_max=2)
ATOMIC = keys.BEST_EFFORT_ATOMIC_CLASS
SAMPLES = Path(__file__).resolve().parents[1] / "samples"

CONFIG = {
    "defaults": {"mode": "native", "provisioning": {"className": ATOMIC, "provisionedTimeoutSeconds": 60},
                 "retry": {"limit": 3, "baseSeconds": 1, "maxSeconds": 2}},
    "namespaces": {
        NS["static"]: {"provisioning": {"enabled": False}},  # a static GPU pool: nothing to book
        NS["compete"]: {"provisioning": {"className": keys.CHECK_CAPACITY_CLASS}},
        # The same booking without the PodGroup: what native mode adds is what this one lacks.
        NS["contrast"]: {"mode": "provisioning", "provisioning": {"className": keys.CHECK_CAPACITY_CLASS}},
    },
}


class Stack(RayStack):
    def groups(self, ns: str) -> list[JSON]:
        return list(self.kube.list(PODGROUPS, ns).get("items") or [])

    def gang_group(self, ns: str, owner: str) -> JSON:
        """The PodGroup raygate made for the object named `owner` (not a scale-up's)."""
        def found() -> JSON | None:
            return next((g for g in self.groups(ns) if not _increment(g)
                         and g["metadata"]["ownerReferences"][0]["name"] == owner), None)
        group: JSON = wait(found, 60, f"the PodGroup of {ns}/{owner}", interval=0.5)
        return group

    def verdict(self, ns: str, name: str) -> tuple[str, str] | None:
        """kube-scheduler's PodGroupScheduled condition on the PodGroup: (status, reason)."""
        try:
            group = self.kube.get(PODGROUPS, name, ns)
        except ApiError:
            return None
        cond = conditions(group).get(keys.GANG_SCHEDULED_CONDITION)
        return (cond["status"], cond.get("reason", "")) if cond else None

    def members(self, ns: str, group: str) -> list[JSON]:
        return [p for p in self.kube.list(PODS, ns).get("items") or [] if get(p, keys.POD_GROUP_NAME_PATH) == group]

    def ray_pods(self, ns: str, cluster_name: str | None = None) -> list[JSON]:
        selector = f"{keys.RAY_CLUSTER_LABEL}={cluster_name}" if cluster_name else keys.RAY_NODE_TYPE_LABEL
        return list(self.kube.list(PODS, ns, labelSelector=selector).get("items") or [])

    def nodes(self) -> dict[str, JSON]:
        return {n["metadata"]["name"]: n for n in self.kube.list(NODES).get("items") or []}

    def add_node(self, name: str, group: str, gpus: int) -> None:
        self.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(node(name, group, 16, 128, gpus=gpus)))
        wait(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                         (self.nodes().get(name, {}).get("status") or {}).get("conditions") or []),
             60, f"node {name} Ready", interval=0.5)

    def delete(self, ns: str, kind: str, name: str) -> None:
        """Delete the object; wait until its pods are gone, and with them its Workload and PodGroups (the
        PodGroup's protection finalizer keeps it until its pods have ended)."""
        self.kube.delete(RAYJOBS if kind == keys.RAYJOB_KIND else RAYCLUSTERS, name, ns)
        wait(lambda: not self.ray_pods(ns) and not self.groups(ns) and not self.kube.list(WORKLOADS, ns)["items"],
             120, f"the pods, Workload and PodGroups of {kind} {ns}/{name} to go", interval=0.5)


def until(fetch: Callable[[], list[JSON]], ok: Callable[[list[JSON]], bool], timeout: float, what: str
          ) -> list[JSON]:
    """What `fetch` returns, once `ok` says it is what the test waits for."""
    def check() -> list[JSON] | None:
        found = fetch()
        return found if ok(found) else None
    result: list[JSON] = wait(check, timeout, what, interval=0.5)
    return result


def raygate(*args: str) -> str:
    proc = subprocess.run([str(Path(sys.executable).parent / "raygate"), *args], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def bound(pods: list[JSON]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName"))


def gpu(pod: JSON) -> bool:
    return any(GPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {}) for c in pod["spec"]["containers"])


def _increment(group: JSON) -> bool:
    return keys.SCALE_UP_ANNOTATION in (group["metadata"].get("annotations") or {})


def pinned(obj: JSON, gpu_group: str | None) -> JSON:
    """The head on the CPU nodes; the GPU workers on node group `gpu_group` (None: wherever they fit)."""
    spec = obj["spec"].get("rayClusterSpec", obj["spec"])
    spec["headGroupSpec"]["template"]["spec"]["nodeSelector"] = {NODE_GROUP_LABEL: CPU_GROUP}
    if gpu_group is not None:
        for g in spec["workerGroupSpecs"]:
            g["template"]["spec"]["nodeSelector"] = {NODE_GROUP_LABEL: gpu_group}
    return obj


def gpu_cluster(ns: str, name: str, workers: int, gpu_group: str | None, *, max_replicas: int | None = None
                ) -> JSON:
    res = {"cpu": "1", GPU_RESOURCE: "1"}
    return pinned(builders.RayCluster(name, ns).worker(
        "gpu", replicas=workers, min_replicas=workers, max_replicas=max_replicas or workers, requests=res,
        limits=res).obj(), gpu_group)


@pytest.fixture(scope="module")
def stack(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cp = ControlPlane(tmp_path_factory.mktemp("native"), bundle)
    state = cp.up(kuberay=True, log=False, gang=True)
    try:
        start_capacity(cp, state, LAYOUT)
        cp.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
        cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                   f"--from-literal={keys.CONFIGMAP_KEY}={yaml.safe_dump(CONFIG)}")
        for name, ns in NS.items():
            cp.kubectl("create", "namespace", ns)
            if name != "plain":
                cp.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        start_webhook(cp)
        start_reconciler(cp)
        yield Stack(cp, Kube.connect(str(cp.kubeconfig), user_agent="raygate-native-test"))
    finally:
        cp.down(log=False)


@pytest.fixture(autouse=True)
def gang_rule_holds(stack: Stack) -> Iterator[None]:
    yield
    assert_gang_rule(stack)


def assert_gang_rule(stack: Stack) -> None:
    """Of every PodGroup raygate made, no pod that names it is bound, or at least minCount are."""
    for ns in NS.values():
        for group in stack.groups(ns):
            name, least = group["metadata"]["name"], group["spec"]["schedulingPolicy"]["gang"]["minCount"]
            placed = bound(stack.members(ns, name))
            assert not placed or len(placed) >= least, f"PodGroup {ns}/{name} (minCount {least}) has only {placed}"


# --- all or nothing, on the real kube-scheduler ------------------------------------------------------------

def test_a_gang_of_which_only_three_pods_fit_binds_none_and_all_once_a_node_appears(stack: Stack) -> None:
    ns, pool = NS["static"], f"gpu-static-{SUFFIX}"
    stack.add_node(f"static-a-{SUFFIX}", pool, gpus=3)
    stack.create(gpu_cluster(ns, "four", 4, pool))
    admitted = stack.wait_state(ns, keys.RAYCLUSTER_KIND, "four", "Admitted")  # nothing to book: a static pool
    group = stack.gang_group(ns, "four")
    name = group["metadata"]["name"]
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 5}}  # head + 4 GPU workers
    workload = stack.kube.get(WORKLOADS, name, ns)
    assert workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": 5}}
    assert group["metadata"]["finalizers"] == [keys.GANG_PROTECTION_FINALIZER]
    assert "together or not at all" in admitted["metadata"]["annotations"][keys.REASON_ANNOTATION]

    pods = until(lambda: stack.ray_pods(ns, "four"), lambda found: len(found) == 5, 60, "KubeRay to create the 5 pods")
    assert {get(p, keys.POD_GROUP_NAME_PATH) for p in pods} == {name}, "every pod of the gang names its group"
    wait(lambda: stack.verdict(ns, name) == ("False", "Unschedulable"), 60,
         "kube-scheduler to find the PodGroup Unschedulable")
    consistently(lambda: not bound(stack.ray_pods(ns, "four")), 3, "no pod of the gang bound, head included",
                 explain=lambda: str(bound(stack.ray_pods(ns, "four"))))
    assert all((p.get("status") or {}).get("phase") == "Pending" for p in stack.ray_pods(ns, "four"))
    assert not [p for p in stack.kube.list(PODS).get("items") or []
                if p["spec"].get("nodeName") == f"static-a-{SUFFIX}"], "no GPU of the node bound"
    # What the on-call engineer sees: the admitted cluster, its PodGroup and the scheduler's verdict.
    (row,) = json.loads(raygate("status", "-n", ns, "-o", "json", "--kubeconfig", str(stack.cluster.kubeconfig))
                        )["items"]
    assert (row["name"], row["state"]) == ("four", "Admitted")
    assert [(g["name"], g["minCount"], g["scheduled"], g["reason"]) for g in row["podGroups"]] == [
        (name, 5, "False", "Unschedulable")]

    stack.add_node(f"static-b-{SUFFIX}", pool, gpus=1)
    placed = until(lambda: stack.ray_pods(ns, "four"), lambda found: len(bound(found)) == 5, 120,
                   "all 5 pods bound once the fourth GPU exists")
    wait(lambda: stack.verdict(ns, name) == ("True", "Scheduled"), 30, "the PodGroup Scheduled")
    on = sorted(p["spec"]["nodeName"] for p in placed if gpu(p))
    assert on == [f"static-a-{SUFFIX}"] * 3 + [f"static-b-{SUFFIX}"]
    print(f"\n3 of 4 fit: PodGroup Unschedulable, nothing bound; a node later: {on}")
    out = raygate("status", "-n", ns, "--kubeconfig", str(stack.cluster.kubeconfig))
    assert out.startswith("No held or failed"), out  # bound whole: nothing to say
    stack.delete(ns, keys.RAYCLUSTER_KIND, "four")  # and nothing of raygate's is left behind
    for n in ("a", "b"):
        stack.cluster.kubectl("delete", "node", f"static-{n}-{SUFFIX}")


def test_the_real_autoscaler_books_the_gang_then_the_scheduler_binds_it_whole(stack: Stack) -> None:
    ns = NS["booked"]
    before = set(stack.nodes())
    job = pinned(builders.RayJob("train", ns).worker("gpu", replicas=4, min_replicas=4, max_replicas=4,
                                                      limits={GPU_RESOURCE: "1"}).obj(), None)
    stack.create(job)
    held = stack.get(ns, keys.RAYJOB_KIND, "train")
    assert held["spec"]["suspend"] is True
    group = stack.gang_group(ns, "train")  # made while the job is held, beside the request
    admitted = stack.wait_state(ns, keys.RAYJOB_KIND, "train", "Admitted", timeout=180)
    request = admitted["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
    assert conditions(stack.kube.get(PR, request, ns))["Provisioned"]["status"] == "True"
    name = group["metadata"]["name"]
    assert group["metadata"]["creationTimestamp"] <= admitted["metadata"]["annotations"][keys.ADMITTED_AT_ANNOTATION]

    cluster = wait(lambda: stack.kube.list(RAYCLUSTERS, ns)["items"], 60, "KubeRay's cluster")[0]["metadata"]["name"]
    pods = until(lambda: stack.ray_pods(ns, cluster), lambda found: len(bound(found)) == 5, 180, "the gang bound")
    wait(lambda: stack.verdict(ns, name) == ("True", "Scheduled"), 30, "the PodGroup Scheduled")
    added = {n for n in stack.nodes() if n not in before}
    workers = [p for p in pods if gpu(p)]
    assert len(workers) == 4 and {p["spec"]["nodeName"] for p in workers} <= added
    assert {get(p, keys.POD_GROUP_NAME_PATH) for p in pods} == {name}
    assert all(p["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == request for p in workers)
    print(f"\nbooked ({request} Provisioned), the autoscaler added {sorted(added)}, PodGroup {name} bound whole")
    stack.delete(ns, keys.RAYJOB_KIND, "train")


# --- the booked room taken in part by another pod --------------------------------------------------------

@pytest.mark.parametrize("case", ["compete", "contrast"])
def test_a_plain_gpu_pod_that_takes_part_of_the_booked_room_never_leaves_the_gang_half_bound(
        stack: Stack, case: str) -> None:
    """The booking (check-capacity) holds no GPU: another pod can take one between Provisioned and the gang's
    binding. The reconciler is stopped across that moment, so the other pod takes its GPU for sure. In native
    mode the gang then binds none (and whole once the GPU is free again); in provisioning mode, the contrast,
    it binds three of four."""
    ns, pool, nodename = NS[case], f"gpu-{case}-{SUFFIX}", f"{case}-{SUFFIX}"
    # The pool's node comes once the gang is held (the autoscaler finds no room until then), so the reconciler
    # is stopped before the request can be Provisioned: it could admit within milliseconds of that.
    stack.create(gpu_cluster(ns, "gang", 4, pool))
    wait(lambda: stack.state(ns, keys.RAYCLUSTER_KIND, "gang") == "Provisioning", 60, "the gang held, booking")
    stack.cluster.stop_process("raygate-reconciler")
    try:
        stack.add_node(nodename, pool, gpus=4)
        request = stack.get(ns, keys.RAYCLUSTER_KIND, "gang")["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
        wait(lambda: (conditions(stack.kube.get(PR, request, ns)).get("Provisioned") or {}).get("status") == "True",
             60, f"{request} Provisioned: the autoscaler found the room")
        other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"other-{case}", "namespace": NS["plain"]},
                 "spec": {"nodeSelector": {NODE_GROUP_LABEL: pool},
                          "containers": [{"name": "c", "image": "x", "resources": {"limits": {GPU_RESOURCE: "1"}}}]}}
        stack.create(other)
        wait(lambda: stack.kube.get(PODS, f"other-{case}", NS["plain"])["spec"].get("nodeName"), 60,
             "the plain GPU pod bound to the booked node")
    finally:
        start_reconciler(stack.cluster)
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "gang", "Admitted")

    def workers() -> list[JSON]:
        return [p for p in stack.ray_pods(ns, "gang") if gpu(p)]

    wait(lambda: len(workers()) == 4 and not any(keys.CAPACITY_GATE in json.dumps(p["spec"].get(
        "schedulingGates") or []) for p in workers()), 60, "the 4 workers created and released by raygate")
    if case == "compete":  # native mode
        name = stack.gang_group(ns, "gang")["metadata"]["name"]
        wait(lambda: stack.verdict(ns, name) == ("False", "Unschedulable"), 60, "the PodGroup Unschedulable")
        consistently(lambda: not bound(stack.ray_pods(ns, "gang")), 3, "no pod of the gang bound",
                     explain=lambda: str(bound(stack.ray_pods(ns, "gang"))))
        stack.kube.delete(PODS, f"other-{case}", NS["plain"])
        wait(lambda: len(bound(workers())) == 4, 120, "the gang bound whole once the GPU is free")
        wait(lambda: stack.verdict(ns, name) == ("True", "Scheduled"), 30, "the PodGroup Scheduled")
        print("\nnative: another pod took 1 of 4 booked GPUs: the gang bound none, then whole")
    else:
        wait(lambda: len(bound(workers())) == 3, 60, "three workers bound")
        consistently(lambda: len(bound(workers())) == 3, 3, "the fourth left pending")
        print("\nprovisioning mode, same booking: 3 of 4 workers bound, the fourth waits (half a gang holding GPUs)")
        stack.kube.delete(PODS, f"other-{case}", NS["plain"])
    stack.delete(ns, keys.RAYCLUSTER_KIND, "gang")
    wait(lambda: not stack.kube.list(PODS, NS["plain"])["items"], 60, "the plain pod gone")
    stack.cluster.kubectl("delete", "node", nodename)


# --- KubeRay's samples, unchanged -------------------------------------------------------------------

@pytest.mark.parametrize(("sample", "kind", "min_count"), [
    ("raycluster.sample.yaml", keys.RAYCLUSTER_KIND, 3),  # head + 2 workers
    ("rayjob.sample.yaml", keys.RAYJOB_KIND, 2),  # head + 1 worker; the submitter binds after them
])
def test_kuberays_samples_run_unchanged_in_native_mode(stack: Stack, sample: str, kind: str, min_count: int) -> None:
    ns = NS["samples"]
    text = (SAMPLES / sample).read_text()
    obj = yaml.safe_load(text)
    name = obj["metadata"]["name"]
    explained = json.loads(raygate("explain", "-f", str(SAMPLES / sample), "--mode", "native", "-o", "json",
                                   "--kubeconfig", str(stack.cluster.kubeconfig)))
    assert "scheduling.k8s.io/v1alpha2, as this cluster serves it" in explained["groups"]["summary"]
    stack.cluster.kubectl("create", "-n", ns, "-f", str(SAMPLES / sample))
    stack.wait_state(ns, kind, name, "Admitted")  # CPU only: nothing to book
    group = stack.gang_group(ns, name)
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": min_count}}
    pods = until(lambda: stack.ray_pods(ns), lambda found: len(bound(found)) >= min_count, 120,
                 f"the {min_count} pods of the sample bound")
    assert {get(p, keys.POD_GROUP_NAME_PATH) for p in pods} == {group["metadata"]["name"]}
    wait(lambda: stack.verdict(ns, group["metadata"]["name"]) == ("True", "Scheduled"), 30, "the PodGroup Scheduled")
    if kind == keys.RAYJOB_KIND:  # K8sJobMode: KubeRay's submitter pod, not in the gang, runs once the cluster is up
        submitter = wait(lambda: [p for p in stack.kube.list(PODS, ns)["items"]
                                  if keys.RAY_NODE_TYPE_LABEL not in (p["metadata"].get("labels") or {})
                                  and p["spec"].get("nodeName")], 120, "the submitter pod bound")
        assert get(submitter[0], keys.POD_GROUP_NAME_PATH) is None
    stack.delete(ns, kind, name)


# --- a scale-up: its own PodGroup --------------------------------------------------------------------

def test_each_scale_up_increment_is_booked_and_bound_in_a_pod_group_of_its_own(stack: Stack) -> None:
    ns = NS["elastic"]
    stack.create(gpu_cluster(ns, "grows", 1, None, max_replicas=3))
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "grows", "Admitted", timeout=180)
    gang = stack.gang_group(ns, "grows")["metadata"]["name"]
    wait(lambda: len(bound(stack.ray_pods(ns, "grows"))) == 2, 180, "the gang (head and 1 worker) bound")
    wait(lambda: (stack.kube.get(PODGROUPS, gang, ns)["metadata"].get("annotations") or {}).get(
        keys.GANG_BOUND_ANNOTATION) == "grows", 60, "the reconciler to record the cluster whose gang is bound")
    stack.kube.patch(RAYCLUSTERS, "grows", [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                             "value": 3}], ns, content_type=JSON_PATCH)
    increment = wait(lambda: next((g for g in stack.groups(ns) if _increment(g)), None), 180,
                     "the increment's PodGroup, made when its booking is Provisioned")
    name = increment["metadata"]["name"]
    assert increment["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert increment["metadata"]["ownerReferences"][0]["name"] == "grows"
    new = until(lambda: stack.members(ns, name), lambda found: len(bound(found)) == 2, 180,
                "the increment's 2 workers bound")
    assert all(gpu(p) and p["metadata"]["annotations"].get(keys.CONSUME_ANNOTATION) for p in new)
    assert len(stack.members(ns, gang)) == 2, "the gang's own group keeps its own pods"
    print(f"\nscale-up of 2: PodGroup {name} (minCount 2) beside the gang's {gang}")
    stack.delete(ns, keys.RAYCLUSTER_KIND, "grows")


# --- a job suspended after admission starts its gang afresh ------------------------------------------------

def test_a_cluster_suspended_after_admission_is_admitted_again_with_a_gang_of_its_own(stack: Stack) -> None:
    ns = NS["static"]
    stack.create(pinned(builders.RayCluster("again", ns).worker("cpu", replicas=2, min_replicas=2, max_replicas=2,
                                                                requests={"cpu": "1"}).obj(), None))
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "again", "Admitted")
    first = stack.gang_group(ns, "again")["metadata"]["name"]
    until(lambda: stack.members(ns, first), lambda found: len(bound(found)) == 3, 120, "the first gang bound")
    stack.kube.patch(RAYCLUSTERS, "again", [{"op": "replace", "path": "/spec/suspend", "value": True}], ns,
                     content_type=JSON_PATCH)  # an admin may suspend it: raygate queues it again
    wait(lambda: stack.get(ns, keys.RAYCLUSTER_KIND, "again")["metadata"]["annotations"].get(
        keys.ATTEMPT_ANNOTATION) == "2", 60, "raygate to queue it again (attempt 2)")
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "again", "Admitted")
    second = wait(lambda: next((g["metadata"]["name"] for g in stack.groups(ns)
                                if g["metadata"]["name"] != first and not g["metadata"].get("deletionTimestamp")),
                               None), 60, "a PodGroup for the second attempt")
    pods = until(lambda: stack.members(ns, second), lambda found: len(bound(found)) == 3, 120,
                 "the second gang bound, in its own group")
    wait(lambda: all(g["metadata"]["name"] == second for g in stack.groups(ns)), 60, "the first attempt's group gone")
    print(f"\nsuspended and admitted again: {len(pods)} pods bound in {second}, {first} gone")
    stack.delete(ns, keys.RAYCLUSTER_KIND, "again")
