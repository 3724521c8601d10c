"""Volcano mode for real: the Volcano scheduler binds Ray pods onto KWOK nodes, all of a gang or none.

The stack is its own control plane: the capacity layer (kube-scheduler, KWOK, cluster-autoscaler with
its kwok provider, 2 CPU nodes of 16 CPU, a GPU node group of 0 to 3 nodes), Volcano's scheduler and
controller-manager (`raygate dev up --volcano`), KubeRay, raygate's webhook and reconciler. Nothing
in this module writes a PodGroup's or a request's status, nor binds a pod: Volcano, the autoscaler
and KWOK do.

Pods that must stay unbound are pinned to the CPU nodes (node selector): the autoscaler could
otherwise add a 32-CPU GPU node for them and let them run, which is right for a cluster but not what
these tests are about.

After every test `gang_rule_holds` checks Volcano's promise on what it bound: of each PodGroup, either
no pod that counts toward minMember is bound, or at least minMember are.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import builders
import pytest
import yaml
from procs import processes_mentioning
from raystack import RayStack
from waiting import consistently, wait

from raygate.core import keys
from raygate.core.api import NODES, PODGROUPS, PODS, RAYCLUSTERS, RAYJOBS, VOLCANO_QUEUES, provisioning_requests
from raygate.core.conditions import raw_conditions as conditions
from raygate.core.objects import JSON, get
from raygate.core.workload import Workload
from raygate.devenv.build import Bundle
from raygate.devenv.capacity import CPU_GROUP, GPU_GROUP, GPU_RESOURCE, NODE_GROUP_LABEL, Layout, start_capacity
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook
from raygate.devenv.volcano import queue_state, start_volcano
from raygate.kube.client import JSON_PATCH, ApiError, Kube

pytestmark = [pytest.mark.integration, pytest.mark.kuberay]

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"vc-{k}-{SUFFIX}" for k in ("guide", "partial", "submitter", "provision", "generate", "kuberay")}
GUIDE_QUEUE = f"ray-guide-{SUFFIX}"
GENERATE_QUEUE = f"ray-generate-{SUFFIX}"  # created by its test: jobs wait for it, held
# Volcano's KubeRay guide: a queue whose capability holds one Ray cluster (below: 3 CPU, 4Gi), not two.
GUIDE_CAPABILITY = {"cpu": "4", "memory": "6Gi"}
LAYOUT = Layout(gpu_nodes_max=3)
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PR = provisioning_requests("v1")

CONFIG = {
    "defaults": {"mode": "volcano", "provisioning": {"enabled": False},
                 "retry": {"limit": 3, "baseSeconds": 1, "maxSeconds": 2}},
    "namespaces": {
        NS["guide"]: {"mode": "volcano", "queueName": GUIDE_QUEUE},
        NS["generate"]: {"mode": "volcano", "queueName": GENERATE_QUEUE},
        NS["provision"]: {"mode": "volcano", "provisioning": {"enabled": True, "className": ATOMIC,
                                                              "provisionedTimeoutSeconds": 60}},
    },
}


class Stack(RayStack):
    def pod_group(self, ns: str, name: str) -> JSON | None:
        items = self.kube.list(PODGROUPS, ns).get("items") or []
        return next((g for g in items if g["metadata"]["name"] == name), None)

    def phase(self, ns: str, name: str) -> str:
        group = self.pod_group(ns, name)
        return str(((group or {}).get("status") or {}).get("phase") or "")

    def wait_phase(self, ns: str, name: str, want: str, timeout: float = 30) -> None:
        """Volcano reports a PodGroup's phase a cycle after it acts."""
        wait(lambda: self.phase(ns, name) == want, timeout, f"PodGroup {ns}/{name} to be {want}", interval=0.5)

    def pods_of(self, ns: str, group: str) -> list[JSON]:
        """The pods that joined PodGroup `group` (its group-name annotation)."""
        return [p for p in self.kube.list(PODS, ns).get("items") or []
                if (p["metadata"].get("annotations") or {}).get(keys.VOLCANO_GROUP_NAME_ANNOTATION) == group]

    def running(self, ns: str, group: str, count: int, timeout: float = 120) -> list[JSON]:
        """The pods of `group` once `count` of them are bound and Running."""
        def check() -> list[JSON] | None:
            pods = [p for p in self.pods_of(ns, group) if p["spec"].get("nodeName")
                    and (p.get("status") or {}).get("phase") == "Running"]
            return pods if len(pods) >= count else None
        result: list[JSON] = wait(check, timeout, f"{count} Running pods of PodGroup {ns}/{group}", interval=0.5)
        return result

    def nodes(self) -> dict[str, JSON]:
        return {n["metadata"]["name"]: n for n in self.kube.list(NODES).get("items") or []}

    def delete(self, ns: str, kind: str, name: str) -> None:
        """Delete the object and wait until its pods are gone, so the next step starts from free nodes."""
        self.kube.delete(RAYJOBS if kind == keys.RAYJOB_KIND else RAYCLUSTERS, name, ns)
        wait(lambda: not self.pods_of(ns, f"ray-{name}-pg"), 90, f"the pods of {kind} {ns}/{name} to go",
             interval=0.5)


def bound(pods: list[JSON]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName"))


def task(pod: JSON) -> str:
    return str((pod["metadata"].get("annotations") or {}).get(keys.VOLCANO_TASK_SPEC_ANNOTATION, ""))


def on_cpu_nodes(obj: JSON) -> JSON:
    """Every pod template of the object pinned to the static CPU nodes, which no autoscaler adds to."""
    spec = obj["spec"].get("rayClusterSpec", obj["spec"])
    templates = [spec["headGroupSpec"]["template"], *(g["template"] for g in spec.get("workerGroupSpecs") or [])]
    for template in templates:
        template["spec"]["nodeSelector"] = {NODE_GROUP_LABEL: CPU_GROUP}
    return obj


def cpu_cluster(ns: str, name: str, *, workers: int = 2, cpu: str = "1", memory: str = "1Gi") -> JSON:
    """Head 1 CPU / 2Gi plus `workers` pods of `cpu` / `memory`, on the CPU nodes."""
    res = {"cpu": cpu, "memory": memory}
    return on_cpu_nodes(builders.RayCluster(name, ns).worker("cpu", replicas=workers, min_replicas=workers,
                                                             max_replicas=workers, requests=res, limits=res).obj())


@pytest.fixture(scope="module")
def stack(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cp = ControlPlane(tmp_path_factory.mktemp("volcano"), bundle)
    state = cp.up(kuberay=True, log=False)
    try:
        start_capacity(cp, state, LAYOUT)
        start_volcano(cp, state)
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-volcano-test")
        kube.create(VOLCANO_QUEUES, {"metadata": {"name": GUIDE_QUEUE},
                                     "spec": {"weight": 1, "capability": GUIDE_CAPABILITY}})
        wait(lambda: queue_state(cp, GUIDE_QUEUE) == "Open", 60, f"Volcano to open queue {GUIDE_QUEUE}")
        cp.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
        cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                   f"--from-literal={keys.CONFIGMAP_KEY}={yaml.safe_dump(CONFIG)}")
        for ns in NS.values():
            cp.kubectl("create", "namespace", ns)
            cp.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        start_webhook(cp)
        start_reconciler(cp)
        yield Stack(cp, kube)
    finally:
        cp.down(log=False)


@pytest.fixture(autouse=True)
def gang_rule_holds(stack: Stack) -> Iterator[None]:
    yield
    if stack.cluster.load_state() is not None:  # the last test stops the stack
        assert_gang_rule(stack)


def assert_gang_rule(stack: Stack) -> None:
    """Of every PodGroup, no pod that counts toward minMember is bound, or at least minMember are."""
    for ns in NS.values():
        for group in stack.kube.list(PODGROUPS, ns).get("items") or []:
            name, min_member = group["metadata"]["name"], int(group["spec"].get("minMember") or 0)
            members = [p for p in stack.pods_of(ns, name) if task(p) != keys.SUBMITTER_TASK]
            placed = bound(members)
            assert not placed or len(placed) >= min_member, (
                f"PodGroup {ns}/{name} (minMember {min_member}) has only {placed} bound")


# --- Volcano's KubeRay guide: a queue that holds one cluster -------------------------------------

def test_a_queue_that_fits_one_cluster_runs_the_first_and_holds_the_second_whole(stack: Stack) -> None:
    ns = NS["guide"]
    stack.create(cpu_cluster(ns, "first"))
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "first", "Admitted")
    first = stack.running(ns, "ray-first-pg", 3)
    assert {p["spec"]["schedulerName"] for p in first} == {keys.VOLCANO_SCHEDULER}
    stack.wait_phase(ns, "ray-first-pg", "Running")
    group = stack.pod_group(ns, "ray-first-pg")
    assert group is not None and group["spec"]["queue"] == GUIDE_QUEUE and group["spec"]["minMember"] == 3

    stack.create(cpu_cluster(ns, "second"))
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "second", "Admitted")  # raygate lets Volcano hold it
    wait(lambda: len(stack.pods_of(ns, "ray-second-pg")) == 3, 60, "KubeRay to create the second cluster's pods")
    wait(lambda: stack.phase(ns, "ray-second-pg") == "Pending", 30, "Volcano to report the second PodGroup Pending")

    def held_whole() -> bool:
        return stack.phase(ns, "ray-second-pg") == "Pending" and not bound(stack.pods_of(ns, "ray-second-pg"))

    consistently(held_whole, 5, "the second cluster held whole while the first runs",
                 explain=lambda: f"{stack.phase(ns, 'ray-second-pg')}, bound "
                                 f"{bound(stack.pods_of(ns, 'ray-second-pg'))}")
    said = [c.get("message", "") for c in (stack.pod_group(ns, "ray-second-pg") or {}).get("status", {})
            .get("conditions") or []]
    print(f"\nsecond PodGroup Pending: {said}")

    stack.delete(ns, keys.RAYCLUSTER_KIND, "first")
    second = stack.running(ns, "ray-second-pg", 3)
    stack.wait_phase(ns, "ray-second-pg", "Running")
    assert all(stack.nodes()[p["spec"]["nodeName"]]["metadata"]["labels"][NODE_GROUP_LABEL] == CPU_GROUP
               for p in second)
    stack.delete(ns, keys.RAYCLUSTER_KIND, "second")


# --- all or nothing --------------------------------------------------------------------------------

def test_a_gang_that_fits_only_partly_binds_nothing(stack: Stack) -> None:
    ns = NS["partial"]
    # Two CPU nodes of 16 CPU: the head (1 CPU) and two 12-CPU workers would fit, the third worker not.
    stack.create(cpu_cluster(ns, "toobig", workers=3, cpu="12"))
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "toobig", "Admitted")
    wait(lambda: len(stack.pods_of(ns, "ray-toobig-pg")) == 4, 60, "KubeRay to create the 4 pods")
    wait(lambda: stack.phase(ns, "ray-toobig-pg") in ("Pending", "Inqueue"), 30, "Volcano to see the PodGroup")
    consistently(lambda: not bound(stack.pods_of(ns, "ray-toobig-pg")), 8, "no pod of the gang bound",
                 explain=lambda: str(bound(stack.pods_of(ns, "ray-toobig-pg"))))
    group = stack.pod_group(ns, "ray-toobig-pg") or {}
    print(f"\npartly fitting gang: phase {stack.phase(ns, 'ray-toobig-pg')}, conditions "
          f"{[c.get('message') for c in (group.get('status') or {}).get('conditions') or []]}")
    assert stack.phase(ns, "ray-toobig-pg") != "Running"

    # The same shape one worker smaller fits the two nodes and runs: nodes and scheduler were able all along.
    stack.delete(ns, keys.RAYCLUSTER_KIND, "toobig")
    stack.create(cpu_cluster(ns, "fits", workers=2, cpu="12"))
    stack.wait_state(ns, keys.RAYCLUSTER_KIND, "fits", "Admitted")
    placed = stack.running(ns, "ray-fits-pg", 3)
    assert len({p["spec"]["nodeName"] for p in placed if task(p) == "cpu"}) == 2
    stack.delete(ns, keys.RAYCLUSTER_KIND, "fits")


# --- the K8sJobMode submitter -----------------------------------------------------------------------

def test_the_k8sjobmode_submitter_is_scheduled_by_volcano_after_the_gang_without_deadlock(stack: Stack) -> None:
    ns = NS["submitter"]
    res = {"cpu": "1", "memory": "1Gi"}
    job = on_cpu_nodes(builders.RayJob("train", ns).worker("cpu", replicas=2, min_replicas=2, max_replicas=2,
                                                           requests=res, limits=res).obj())
    assert "submissionMode" not in job["spec"]  # KubeRay's default, K8sJobMode
    stack.create(job)
    stack.wait_state(ns, keys.RAYJOB_KIND, "train", "Admitted")
    group = stack.pod_group(ns, "ray-train-pg")
    assert group is not None
    assert group["spec"]["minMember"] == 3, "head + 2 workers; the submitter waits for them, so it is not counted"
    assert keys.SUBMITTER_TASK not in group["spec"].get("minTaskMember", {})

    def submitter() -> JSON | None:
        pods = [p for p in stack.pods_of(ns, "ray-train-pg") if task(p) == keys.SUBMITTER_TASK]
        return next((p for p in pods if p["spec"].get("nodeName")), None)

    pod = wait(submitter, 120, "the submitter pod to be bound")
    assert pod["spec"]["schedulerName"] == keys.VOLCANO_SCHEDULER
    members = [p for p in stack.running(ns, "ray-train-pg", 4) if task(p) != keys.SUBMITTER_TASK]
    assert len(members) == 3
    started = min(p["metadata"]["creationTimestamp"] for p in members)
    assert pod["metadata"]["creationTimestamp"] >= started, "KubeRay submits once the cluster is up"
    print(f"\nsubmitter {pod['metadata']['name']} bound to {pod['spec']['nodeName']} "
          f"in PodGroup {stack.phase(ns, 'ray-train-pg')}")
    stack.delete(ns, keys.RAYJOB_KIND, "train")


# --- volcano mode with provisioning ------------------------------------------------------------------

def test_the_autoscaler_provisions_then_volcano_binds_the_gang_on_those_nodes(stack: Stack) -> None:
    ns = NS["provision"]
    before = set(stack.nodes())
    res = {"cpu": "1", GPU_RESOURCE: "2"}
    job = builders.RayJob("gpu", ns).worker("gpu", replicas=2, min_replicas=2, max_replicas=2,
                                             requests=res, limits=res).obj()
    stack.create(job)
    assert stack.get(ns, keys.RAYJOB_KIND, "gpu")["spec"]["suspend"] is True
    admitted = stack.wait_state(ns, keys.RAYJOB_KIND, "gpu", "Admitted", timeout=180)
    request = admitted["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
    cond = conditions(stack.kube.get(PR, request, ns))
    assert cond["Provisioned"]["status"] == "True", cond
    assert stack.pod_group(ns, "ray-gpu-pg") is not None

    pods = stack.running(ns, "ray-gpu-pg", 3, timeout=180)
    added = {n: o for n, o in stack.nodes().items() if n not in before}
    workers = [p for p in pods if task(p) == "gpu"]
    assert len(workers) == 2
    for pod in workers:
        assert pod["spec"]["schedulerName"] == keys.VOLCANO_SCHEDULER
        assert pod["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == request
        node = added.get(pod["spec"]["nodeName"])
        assert node is not None, f"{pod['metadata']['name']} is on {pod['spec']['nodeName']}, not a node added for it"
        assert node["metadata"]["labels"][NODE_GROUP_LABEL] == GPU_GROUP
    stack.wait_phase(ns, "ray-gpu-pg", "Running")
    print(f"\nautoscaler added {sorted(added)}; Volcano bound {sorted(p['spec']['nodeName'] for p in workers)}")
    stack.delete(ns, keys.RAYJOB_KIND, "gpu")


# --- generateName in volcano mode ------------------------------------------------------------------

class PodWatch:
    """Every version of every pod in a namespace, from a watch started before the test creates anything."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.seen: list[JSON] = []
        self._kube, self._ns = kube, ns
        self._rv = str(kube.list(PODS, ns)["metadata"]["resourceVersion"])
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for event in self._kube.watch(PODS, self._ns, timeout_seconds=600, resourceVersion=self._rv):
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self.seen.append(event["object"])
        except ApiError:
            pass  # the stack went down


def refused(stack: Stack, kind: str, ns: str, name: str, ops: list[JSON]) -> str:
    """The guard's answer to an admin's (untrusted) JSON patch; fails if the patch goes through."""
    try:
        stack.kube.patch(RAYJOBS if kind == keys.RAYJOB_KIND else RAYCLUSTERS, name, ops, ns,
                         content_type=JSON_PATCH)
    except ApiError as err:
        return err.message
    raise AssertionError(f"{kind} {ns}/{name} accepted {ops}")


def template_group_names(obj: JSON) -> list[str | None]:
    return [get(obj, (*path, "metadata", "annotations", keys.VOLCANO_GROUP_NAME_ANNOTATION))
            for _, path in Workload(obj).template_paths()]


def test_generate_name_manifests_are_admitted_and_no_pod_ever_lacks_the_group_name(stack: Stack) -> None:
    ns = NS["generate"]
    pods = PodWatch(stack.kube, ns)
    res = {"cpu": "1", "memory": "1Gi"}
    cluster = cpu_cluster(ns, "unused")
    cluster["metadata"] = {"generateName": "gen-", "namespace": ns}
    job = on_cpu_nodes(builders.RayJob(None, ns).generate_name("genjob-").worker(
        "cpu", replicas=1, min_replicas=1, max_replicas=1, requests=res, limits=res).obj())
    names = {keys.RAYCLUSTER_KIND: stack.create(cluster)["metadata"]["name"],
             keys.RAYJOB_KIND: stack.create(job)["metadata"]["name"]}
    assert names[keys.RAYCLUSTER_KIND].startswith("gen-") and names[keys.RAYJOB_KIND].startswith("genjob-")

    # Held (its queue does not exist yet), suspended, and without a group name on any pod template.
    for kind, name in names.items():
        held = stack.get(ns, kind, name)
        assert held["spec"]["suspend"] is True
        assert set(template_group_names(held)) == {None}, "the webhook cannot know the generated name"
        wait(lambda k=kind, n=name: GENERATE_QUEUE in stack.get(ns, k, n)["metadata"].get("annotations", {}).get(
            keys.REASON_ANNOTATION, ""), 30, f"{kind} {name} to wait for its queue")
        pointer = "/spec/rayClusterSpec" if kind == keys.RAYJOB_KIND else "/spec"
        says = refused(stack, kind, ns, name, [{"op": "replace", "path": "/spec/suspend", "value": False}])
        assert "unsuspend it" in says, says
        says = refused(stack, kind, ns, name, [{"op": "add", "path": f"{pointer}/headGroupSpec/template/metadata",
                                                "value": {"annotations": {keys.VOLCANO_GROUP_NAME_ANNOTATION:
                                                                          f"ray-{name}-pg"}}}])
        assert "scheduling metadata" in says, says
    assert not stack.kube.list(PODS, ns).get("items")

    stack.kube.create(VOLCANO_QUEUES, {"metadata": {"name": GENERATE_QUEUE}, "spec": {"weight": 1}})
    for kind, name in names.items():
        admitted = stack.wait_state(ns, kind, name, "Admitted", timeout=60)
        assert admitted["spec"].get("suspend") is not True
        assert set(template_group_names(admitted)) == {f"ray-{name}-pg"}
        group = stack.pod_group(ns, f"ray-{name}-pg")
        assert group is not None and group["spec"]["queue"] == GENERATE_QUEUE
    cluster_pods = stack.running(ns, f"ray-{names[keys.RAYCLUSTER_KIND]}-pg", 3)
    job_pods = stack.running(ns, f"ray-{names[keys.RAYJOB_KIND]}-pg", 3)  # head, worker, then the submitter
    assert {task(p) for p in job_pods} == {"headgroup", "cpu", keys.SUBMITTER_TASK}
    for kind, name in names.items():
        stack.wait_phase(ns, f"ray-{name}-pg", "Running")
        pointer = "/spec/rayClusterSpec" if kind == keys.RAYJOB_KIND else "/spec"
        key = keys.VOLCANO_GROUP_NAME_ANNOTATION.replace("/", "~1")
        path = f"{pointer}/headGroupSpec/template/metadata/annotations/{key}"
        says = refused(stack, kind, ns, name, [{"op": "remove", "path": path}])
        assert "scheduling metadata" in says, says

    want = {p["metadata"]["name"]: p["metadata"]["annotations"][keys.VOLCANO_GROUP_NAME_ANNOTATION]
            for p in cluster_pods + job_pods}
    assert {p["metadata"]["name"] for p in pods.seen} >= set(want), "the watch saw every pod"
    for pod in pods.seen:  # every version of every pod, from its creation on
        group = (pod["metadata"].get("annotations") or {}).get(keys.VOLCANO_GROUP_NAME_ANNOTATION)
        assert group in (f"ray-{n}-pg" for n in names.values()), f"{pod['metadata']['name']}: {group}"
    print(f"\n{names}: {len(pods.seen)} pod versions seen, each with its group name")
    for kind, name in names.items():
        stack.delete(ns, kind, name)


# --- KubeRay's own Volcano integration ---------------------------------------------------------------

def test_kuberays_batch_scheduler_rewriting_the_pod_group_stops_the_job(stack: Stack) -> None:
    """With `--batch-scheduler=volcano` KubeRay updates any PodGroup named ray-<name>-pg to its own counts.
    Where they agree nothing changes; where KubeRay's differ (it leaves init containers out of
    minResources) raygate stops the job."""
    ns, cp = NS["kuberay"], stack.cluster
    cp.stop_process("kuberay-operator")
    cp.start_kuberay(cp.load_state(), "--batch-scheduler=volcano")
    try:
        stack.create(cpu_cluster(ns, "agrees"))
        stack.wait_state(ns, keys.RAYCLUSTER_KIND, "agrees", "Admitted")
        stack.running(ns, "ray-agrees-pg", 3)

        init = cpu_cluster(ns, "init")  # the head's init container asks 4 CPU: raygate counts it, KubeRay not
        init["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"] = [
            builders.container("setup", requests={"cpu": "4", "memory": "1Gi"})]
        stack.create(init)
        failed = stack.wait_state(ns, keys.RAYCLUSTER_KIND, "init", keys.State.FAILED.value, timeout=60)
        reason = failed["metadata"]["annotations"][keys.REASON_ANNOTATION]
        print(f"\n{reason}")
        assert "minResources" in reason and "--batch-scheduler=volcano" in reason
        assert failed["spec"]["suspend"] is True
        wait(lambda: not stack.pods_of(ns, "ray-init-pg") and stack.pod_group(ns, "ray-init-pg") is None, 60,
             "the stopped cluster's pods and PodGroup to go")
        assert stack.state(ns, keys.RAYCLUSTER_KIND, "agrees") == "Admitted", "no rewrite where the counts agree"
        stack.delete(ns, keys.RAYCLUSTER_KIND, "agrees")
        stack.kube.delete(RAYCLUSTERS, "init", ns)
    finally:
        cp.stop_process("kuberay-operator")
        cp.start_kuberay(cp.load_state())


def test_down_stops_volcano_with_the_rest_of_the_stack(stack: Stack) -> None:
    state = stack.cluster.load_state()
    assert state is not None and {"vc-scheduler", "vc-controller-manager"} <= set(state.pids)
    stack.cluster.down(log=False)
    assert processes_mentioning(str(stack.cluster.workdir)) == []
