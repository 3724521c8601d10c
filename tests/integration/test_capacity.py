"""Real capacity: the real cluster-autoscaler (kwok provider) answers raygate's ProvisioningRequests,
kube-scheduler binds the pods, KWOK runs them on the nodes the autoscaler made.

Nothing in this module writes a request's status: every condition comes from cluster-autoscaler. The
stack is its own control plane (the shared one has no nodes, and its other tests play the autoscaler
by patching status, which a live autoscaler would fight). Layout: 2 CPU nodes, a GPU node group
`gpu-pool` of 0 to 3 nodes with 4 GPUs each, and in the check-capacity namespace a reserved GPU node
that only its jobs tolerate.

After every test `gang_rule_holds` checks the promise on real placements: every GPU pod that exists
consumes its job's Provisioned request and is bound to a node with GPUs.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import builders
import pytest
import yaml
from procs import processes_mentioning
from waiting import consistently, wait

from raygate.core import keys
from raygate.core.api import NODES, PODS, RAYCLUSTERS, RAYJOBS, provisioning_requests
from raygate.core.conditions import raw_conditions as conditions
from raygate.core.objects import JSON
from raygate.devenv.build import Bundle
from raygate.devenv.capacity import GPU_GROUP, GPU_RESOURCE, NODE_GROUP_LABEL, Layout, node, start_capacity
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook
from raygate.kube.client import ApiError, Kube

pytestmark = [pytest.mark.integration, pytest.mark.kuberay]

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"cap-{k}-{SUFFIX}" for k in ("auto", "big", "check", "elastic")}
PR = provisioning_requests("v1")
# One node more than the largest test needs at once: the pinned autoscaler may add a node twice for one
# request when its Provisioned write conflicts with its own Accepted write (fixed upstream, #9842).
LAYOUT = Layout(gpu_nodes_max=3)
RESERVED_GROUP = "gpu-reserved"
RESERVED_TAINT = {"key": "raygate.dev/reserved", "value": "check", "effect": "NoSchedule"}
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"

CONFIG = {
    "defaults": {"mode": "provisioning", "provisioning": {"className": ATOMIC, "provisionedTimeoutSeconds": 30},
                 "retry": {"limit": 3, "baseSeconds": 1, "maxSeconds": 2}},
    "namespaces": {
        # Too large for the node group: a short timeout and one retry, which a waiting job never spends.
        NS["big"]: {"provisioning": {"className": ATOMIC, "provisionedTimeoutSeconds": 8},
                    "retry": {"limit": 1, "baseSeconds": 1, "maxSeconds": 1}},
        NS["check"]: {"provisioning": {"className": keys.CHECK_CAPACITY_CLASS, "provisionedTimeoutSeconds": 6},
                      "retry": {"limit": 10, "baseSeconds": 1, "maxSeconds": 2}},
    },
}


@dataclass
class Stack:
    cluster: ControlPlane
    kube: Kube

    def create(self, obj: JSON) -> None:
        self.cluster.kubectl("create", "-f", "-", input_text=json.dumps(obj))

    def get(self, ns: str, kind: str, name: str) -> JSON:
        return self.kube.get(RAYJOBS if kind == keys.RAYJOB_KIND else RAYCLUSTERS, name, ns)

    def state(self, ns: str, kind: str, name: str) -> str:
        return str((self.get(ns, kind, name)["metadata"].get("labels") or {}).get(keys.STATE_LABEL))

    def reason(self, ns: str, kind: str, name: str) -> str:
        return str((self.get(ns, kind, name)["metadata"].get("annotations") or {}).get(keys.REASON_ANNOTATION, ""))

    def wait_state(self, ns: str, kind: str, name: str, want: str, timeout: float = 120) -> JSON:
        wait(lambda: self.state(ns, kind, name) == want, timeout, f"{kind} {ns}/{name} to be {want}", interval=0.5)
        return self.get(ns, kind, name)

    def request(self, ns: str, name: str) -> JSON:
        return self.kube.get(PR, name, ns)

    def pods(self, ns: str, cluster_name: str) -> list[JSON]:
        return list(self.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={cluster_name}")
                    .get("items") or [])

    def clusters_of(self, ns: str, kind: str, name: str) -> list[str]:
        if kind == keys.RAYCLUSTER_KIND:
            try:
                self.kube.get(RAYCLUSTERS, name, ns)
            except ApiError:
                return []
            return [name]
        items = self.kube.list(RAYCLUSTERS, ns, labelSelector=f"{keys.ORIGINATED_FROM_NAME_LABEL}={name}")
        return [c["metadata"]["name"] for c in items.get("items") or []]

    def running_pods(self, ns: str, kind: str, name: str, count: int, timeout: float = 120) -> list[JSON]:
        """The pods of the object's RayCluster, once `count` of them are bound and Running."""
        def check() -> list[JSON] | None:
            pods = [p for c in self.clusters_of(ns, kind, name) for p in self.pods(ns, c)]
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                       and p["spec"].get("nodeName")]
            return running if len(running) >= count else None
        result: list[JSON] = wait(check, timeout, f"{count} Running pods of {kind} {ns}/{name}", interval=0.5)
        return result

    def nodes(self) -> dict[str, JSON]:
        return {n["metadata"]["name"]: n for n in self.kube.list(NODES).get("items") or []}

    def group(self, name: str) -> set[str]:
        """The nodes of a node group."""
        return {n for n, o in self.nodes().items() if (o["metadata"].get("labels") or {}).get(NODE_GROUP_LABEL) == name}

    def delete(self, ns: str, *objects: tuple[str, str]) -> None:
        """Delete (kind, name) objects and wait until the namespace has no pods, so the next step starts
        from free nodes."""
        for kind, name in objects:
            self.kube.delete(RAYJOBS if kind == keys.RAYJOB_KIND else RAYCLUSTERS, name, ns)
        wait(lambda: not self.kube.list(PODS, ns).get("items"), 180, f"the pods in {ns} to go", interval=0.5)


def gpu_pods(pods: list[JSON]) -> list[JSON]:
    return [p for p in pods if any(GPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {})
                                   for c in p["spec"]["containers"])]


@pytest.fixture(scope="module")
def stack(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cp = ControlPlane(tmp_path_factory.mktemp("capacity"), bundle)
    state = cp.up(kuberay=True, log=False)
    try:
        start_capacity(cp, state, LAYOUT)
        cp.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
        cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                   f"--from-literal={keys.CONFIGMAP_KEY}={yaml.safe_dump(CONFIG)}")
        for ns in NS.values():
            cp.kubectl("create", "namespace", ns)
            cp.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        start_webhook(cp)
        start_reconciler(cp)
        yield Stack(cp, Kube.connect(str(cp.kubeconfig), user_agent="raygate-capacity-test"))
    finally:
        cp.down(log=False)


@pytest.fixture(autouse=True)
def gang_rule_holds(stack: Stack) -> Iterator[None]:
    yield
    if stack.cluster.load_state() is not None:  # the last test stops the stack
        assert_gang_rule(stack)


def assert_gang_rule(stack: Stack) -> None:
    """Every GPU pod raygate released consumes the Provisioned request its job names, and sits on a node with GPUs;
    every other one is gated, and holds no GPU. (A gated pod names no booking: raygate writes that when it lifts
    the gate.)"""
    nodes = stack.nodes()
    for ns in NS.values():
        for pod in gpu_pods(stack.kube.list(PODS, ns).get("items") or []):
            name = pod["metadata"]["name"]
            if gated(pod):
                assert not pod["spec"].get("nodeName"), f"gated GPU pod {ns}/{name} is bound"
                continue
            consumed = (pod["metadata"].get("annotations") or {}).get(keys.CONSUME_ANNOTATION)
            assert consumed, f"GPU pod {ns}/{name} runs without a ProvisioningRequest"
            pr = stack.request(ns, consumed)
            assert (conditions(pr).get("Provisioned") or {}).get("status") == "True", f"{ns}/{name}: {consumed}"
            bound = pod["spec"].get("nodeName")
            if bound:
                gpus = (nodes[bound]["status"].get("allocatable") or {}).get(GPU_RESOURCE)
                assert gpus, f"GPU pod {ns}/{name} bound to {bound}, which has no GPUs"


def ray_job(ns: str, name: str, *, workers: int = 2, gpus: int = 2, hosts: int | None = None) -> JSON:
    res = {"cpu": "1", GPU_RESOURCE: str(gpus)}
    return (builders.RayJob(name, ns)
            .worker("gpu", replicas=workers, min_replicas=workers, max_replicas=workers, hosts=hosts,
                    requests=res, limits=res)
            .obj())


def reserved(obj: JSON) -> JSON:
    """Pin the GPU workers to the reserved node (its group label, its taint tolerated)."""
    spec = obj["spec"].get("rayClusterSpec", obj["spec"])
    for group in spec["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        pod["nodeSelector"] = {NODE_GROUP_LABEL: RESERVED_GROUP}
        pod["tolerations"] = [{**RESERVED_TAINT, "operator": "Equal"}]
    return obj


# --- the autoscaler provisions, the scheduler places --------------------------------------------

def test_gpu_rayjob_runs_on_nodes_the_autoscaler_added_for_its_request(stack: Stack) -> None:
    ns = NS["auto"]
    before = set(stack.nodes())
    assert not stack.group(GPU_GROUP), "the GPU node group starts at zero"
    stack.create(ray_job(ns, "train"))
    held = stack.get(ns, keys.RAYJOB_KIND, "train")
    assert held["spec"]["suspend"] is True
    job = stack.wait_state(ns, keys.RAYJOB_KIND, "train", "Admitted")
    request = job["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
    cond = conditions(stack.request(ns, request))
    assert cond["Provisioned"]["status"] == "True" and cond["Accepted"]["status"] == "True"
    assert "test" not in cond["Provisioned"].get("message", ""), "provisioned by the autoscaler, not a test"

    pods = stack.running_pods(ns, keys.RAYJOB_KIND, "train", 3)  # head + 2 GPU workers
    added = {name: n for name, n in stack.nodes().items() if name not in before}
    workers = gpu_pods(pods)
    assert len(workers) == 2
    for pod in workers:
        assert pod["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == request
        bound = added.get(pod["spec"]["nodeName"])
        assert bound is not None, f"{pod['metadata']['name']} is on {pod['spec']['nodeName']}, an older node"
        assert bound["metadata"]["labels"][NODE_GROUP_LABEL] == GPU_GROUP
    print(f"\nautoscaler added {sorted(added)} for {request}; workers on "
          f"{sorted(p['spec']['nodeName'] for p in workers)}")
    stack.delete(ns, (keys.RAYJOB_KIND, "train"))


def test_a_raycluster_and_a_multi_host_job_are_provisioned_and_run_side_by_side(stack: Stack) -> None:
    ns = NS["auto"]
    res = {"cpu": "1", GPU_RESOURCE: "2"}
    cluster = builders.RayCluster("serve", ns).worker("gpu", replicas=2, min_replicas=2, max_replicas=2,
                                                     requests=res, limits=res).obj()
    stack.create(cluster)
    stack.create(ray_job(ns, "multihost", workers=1, gpus=2, hosts=2))  # 1 replica x 2 hosts = 2 pods
    for kind, name in ((keys.RAYCLUSTER_KIND, "serve"), (keys.RAYJOB_KIND, "multihost")):
        obj = stack.wait_state(ns, kind, name, "Admitted")
        request = stack.request(ns, obj["metadata"]["annotations"][keys.REQUEST_ANNOTATION])
        counts = [ps["count"] for ps in request["spec"]["podSets"]]
        assert counts == [2], f"{name} books {counts}"
        workers = gpu_pods(stack.running_pods(ns, kind, name, 3))
        assert len(workers) == 2
        for pod in workers:
            node_labels = stack.nodes()[pod["spec"]["nodeName"]]["metadata"]["labels"]
            assert node_labels[NODE_GROUP_LABEL] == GPU_GROUP
    # raygate noted when KubeRay took up the cluster's unsuspend (the write that wakes KubeRay's next pass).
    annotations = stack.get(ns, keys.RAYCLUSTER_KIND, "serve")["metadata"]["annotations"]
    assert annotations[keys.RESUMED_AT_ANNOTATION] >= annotations[keys.ADMITTED_AT_ANNOTATION]
    assert len(stack.group(GPU_GROUP)) <= LAYOUT.gpu_nodes_max
    stack.delete(ns, (keys.RAYCLUSTER_KIND, "serve"), (keys.RAYJOB_KIND, "multihost"))


def test_a_job_larger_than_the_node_group_waits_with_the_autoscalers_reason_and_never_fails(stack: Stack) -> None:
    """A gang one node larger than the group's maximum: the pinned autoscaler answers it as it answers a full group
    ("not now"), so it waits with that answer, asks again every provisionedTimeoutSeconds, and is never failed
    (docs/guarantees.md: where the autoscaler cannot tell "never" from "not now")."""
    ns = NS["big"]
    gpus = (LAYOUT.gpu_nodes_max + 1) * LAYOUT.gpus_per_node  # one node more than the group may have
    stack.create(ray_job(ns, "huge", workers=gpus // 4, gpus=4))

    def no_pods() -> bool:
        return not stack.clusters_of(ns, keys.RAYJOB_KIND, "huge") and not stack.kube.list(PODS, ns).get("items")

    def autoscaler_said_no() -> str | None:
        reason = stack.reason(ns, keys.RAYJOB_KIND, "huge")
        return reason if "is not Provisioned" in reason else None

    reason = wait(autoscaler_said_no, 60, "the autoscaler's answer on the job", interval=0.5)
    print(f"\nheld: {reason} (gpu-pool has {len(stack.group(GPU_GROUP))} nodes meanwhile)")
    job = stack.get(ns, keys.RAYJOB_KIND, "huge")
    assert job["spec"]["suspend"] is True and no_pods()
    first = job["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
    pr_conditions = conditions(stack.request(ns, first))
    said = [c for c in pr_conditions.values() if c.get("status") == "False" and c.get("reason")
            and c["type"] == "Provisioned"]
    assert said and any(c["reason"] in reason for c in said), (reason, pr_conditions)

    # provisionedTimeoutSeconds is 8 and retry.limit 1: before the queue this job was Failed by now.
    asked_again = wait(lambda: (stack.get(ns, keys.RAYJOB_KIND, "huge")["metadata"]["annotations"]
                                .get(keys.REQUEST_ANNOTATION) not in (None, first)) or None,
                       60, "a new request after provisionedTimeoutSeconds", interval=1)
    assert asked_again
    consistently(lambda: stack.state(ns, keys.RAYJOB_KIND, "huge") in keys.HELD_STATES and no_pods(), 10,
                 "held, no RayCluster and no pods, never Failed")
    assert len(stack.kube.list(PR, ns).get("items") or []) == 1, "one request outstanding: the old one withdrawn"
    stack.kube.delete(RAYJOBS, "huge", ns)
    wait(lambda: not stack.kube.list(PR, ns).get("items"), 60, "deleting the job deletes its request")


# --- the Ray autoscaler's scale-ups, booked as gangs of their own ------------------------------------

def kubectl_as(stack: Stack, user: str, *args: str) -> None:
    stack.cluster.kubectl("--as", user, *args)  # raises with kubectl's message when refused


def gated(pod: JSON) -> bool:
    return any(g.get("name") == keys.CAPACITY_GATE for g in pod["spec"].get("schedulingGates") or [])


def test_the_ray_autoscalers_scale_ups_are_booked_as_gangs_of_their_own(stack: Stack) -> None:
    ns = NS["elastic"]
    res = {"cpu": "1", GPU_RESOURCE: "2"}
    cluster = (builders.RayCluster("elastic", ns).autoscaling()
               .worker("gpu", replicas=2, min_replicas=0, max_replicas=8, requests=res, limits=res).obj())
    # Earlier tests leave empty GPU nodes until the autoscaler scales them down. Start without them, so the
    # first workers fill the node added for them and the scale-up needs a node of its own.
    wait(lambda: not stack.group(GPU_GROUP), 120, "the GPU nodes earlier tests left empty to be scaled down",
         interval=1)
    stack.create(cluster)
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "elastic", "Admitted")
    at_start = gpu_pods(stack.running_pods(ns, keys.RAYCLUSTER_KIND, "elastic", 3))
    first = {p["spec"]["nodeName"] for p in at_start}
    # The pinned autoscaler may add a second node for one request (see LAYOUT); wait for it to go too.
    nodes_before: set[str] = wait(lambda: (group := stack.group(GPU_GROUP)) <= first and group, 120,
                                  "only the first workers' nodes left in the GPU group", interval=1)
    # The Ray autoscaler asks for 2 more workers, as it does: a patch of replicas under the head pod's
    # ServiceAccount (KubeRay names it after the cluster and lets it patch the cluster).
    ray_autoscaler = f"system:serviceaccount:{ns}:elastic"
    wait(lambda: stack.cluster.kubectl("auth", "can-i", "patch", "rayclusters.ray.io/elastic", "-n", ns, "--as",
                                       ray_autoscaler, check=False).strip() == "yes", 30,
         "KubeRay to let the head's ServiceAccount patch the cluster")
    t0 = time.monotonic()
    kubectl_as(stack, ray_autoscaler, "patch", "raycluster", "elastic", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 4}]))
    # The new workers are born gated; they may be released before this test sees them (the autoscaler can answer
    # within a second), so what shows it is the booking made for them, and that they run on it alone.
    ups = wait(lambda: [r for r in stack.kube.list(PR, ns).get("items") or []
                        if keys.SCALE_UP_ANNOTATION in (r["metadata"].get("annotations") or {})], 60,
               "a request for the scale-up")
    assert [ps["count"] for ps in ups[0]["spec"]["podSets"]] == [2]  # exactly the increment, as one gang
    running = gpu_pods(stack.running_pods(ns, keys.RAYCLUSTER_KIND, "elastic", 5, timeout=180))
    print(f"\nscale-up of 2 workers: gated pods -> all Running in {time.monotonic() - t0:.1f}s")
    assert len(running) == 4 and not any(gated(p) for p in running)
    added_workers = [p for p in running if p["metadata"]["name"] not in {q["metadata"]["name"] for q in at_start}]
    assert {(p["metadata"].get("annotations") or {}).get(keys.CONSUME_ANNOTATION) for p in added_workers} == {
        ups[0]["metadata"]["name"]}, "the new workers were released into the booking made for them, and only that"
    added = stack.group(GPU_GROUP) - nodes_before
    print(f"first workers on {sorted(first)}; the autoscaler added {sorted(added)}; the new workers on "
          f"{sorted(p['spec']['nodeName'] for p in added_workers)}")
    assert {p["spec"]["nodeName"] for p in added_workers} - first <= added, "the new workers run on added nodes"
    assert_gang_rule(stack)

    # A second scale-up the node group cannot hold: its pods stay gated, with the autoscaler's word on the cluster.
    kubectl_as(stack, ray_autoscaler, "patch", "raycluster", "elastic", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 8}]))

    def said() -> str | None:
        reason = (stack.get(ns, keys.RAYCLUSTER_KIND, "elastic")["metadata"].get("annotations") or {}).get(
            keys.SCALE_UP_REASON_ANNOTATION, "")
        return reason if "Provisioned=False" in reason or "Failed=True" in reason else None
    reason = wait(said, 120, "the autoscaler's reason for the second scale-up on the RayCluster", interval=0.5)
    print(f"second scale-up held: {reason}")
    waiting = [p for p in stack.pods(ns, "elastic") if gated(p)]
    assert len(waiting) == 4 and not any(p["spec"].get("nodeName") for p in waiting)
    consistently(lambda: all(gated(p) and not p["spec"].get("nodeName") for p in stack.pods(ns, "elastic")
                             if p["metadata"]["name"] in {w["metadata"]["name"] for w in waiting}), 5,
                 "the pods nothing booked to stay gated and unbound")
    assert_gang_rule(stack)

    # The Ray autoscaler gives up on them (workersToDelete): the pending pods and their request go.
    kubectl_as(stack, ray_autoscaler, "patch", "raycluster", "elastic", "-n", ns, "--type", "json", "-p", json.dumps([
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 4},
        {"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy",
         "value": {"workersToDelete": [p["metadata"]["name"] for p in waiting]}}]))
    wait(lambda: not any(gated(p) for p in stack.pods(ns, "elastic")), 90, "the gated pods to be deleted")
    wait(lambda: len([r for r in stack.kube.list(PR, ns).get("items") or []
                      if keys.SCALE_UP_ANNOTATION in (r["metadata"].get("annotations") or {})]) <= 1, 60,
         "the request of the abandoned scale-up to be deleted")
    stack.delete(ns, (keys.RAYCLUSTER_KIND, "elastic"))


# --- check-capacity answers from the nodes that exist --------------------------------------------

def test_check_capacity_admits_what_fits_existing_nodes_and_holds_what_does_not(stack: Stack) -> None:
    ns = NS["check"]
    reserved_node = node("gpu-reserved-0", RESERVED_GROUP, 16, 128, gpus=LAYOUT.gpus_per_node)
    reserved_node["spec"]["taints"] = [RESERVED_TAINT]
    stack.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(reserved_node))
    wait(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                     for c in (stack.nodes()["gpu-reserved-0"].get("status") or {}).get("conditions") or []),
         60, "the reserved node to be Ready")
    gpu_pool_before = stack.group(GPU_GROUP)

    stack.create(reserved(ray_job(ns, "fits")))  # 2 x 2 GPUs: the reserved node exactly
    stack.wait_state(ns, keys.RAYJOB_KIND, "fits", "Admitted", timeout=60)
    for pod in gpu_pods(stack.running_pods(ns, keys.RAYJOB_KIND, "fits", 3)):
        assert pod["spec"]["nodeName"] == "gpu-reserved-0"

    stack.create(reserved(ray_job(ns, "waits")))  # the node is full now
    reason = wait(lambda: (lambda r: r if "is not Provisioned" in r else None)(
        stack.reason(ns, keys.RAYJOB_KIND, "waits")), 60, "check-capacity's answer on the second job", interval=0.5)
    print(f"\ncheck-capacity held: {reason}")
    consistently(lambda: not stack.clusters_of(ns, keys.RAYJOB_KIND, "waits"), 3,
                 "no RayCluster for the job that does not fit")
    assert stack.group(GPU_GROUP) <= gpu_pool_before, "check-capacity never adds nodes"

    stack.delete(ns, (keys.RAYJOB_KIND, "fits"))
    stack.wait_state(ns, keys.RAYJOB_KIND, "waits", "Admitted", timeout=90)  # a later attempt finds the room
    for pod in gpu_pods(stack.running_pods(ns, keys.RAYJOB_KIND, "waits", 3)):
        assert pod["spec"]["nodeName"] == "gpu-reserved-0"
    stack.delete(ns, (keys.RAYJOB_KIND, "waits"))


def test_down_stops_every_process_of_the_stack(stack: Stack) -> None:
    before = time.monotonic()
    stack.cluster.down(log=False)
    assert processes_mentioning(str(stack.cluster.workdir)) == []
    print(f"\ndown in {time.monotonic() - before:.1f}s")
