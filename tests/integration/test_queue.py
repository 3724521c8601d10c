"""A queue, not a pool: held jobs run in order, by priority, and wait as long as capacity is busy.

The real stack: the real cluster-autoscaler (kwok provider) answers raygate's ProvisioningRequests, kube-scheduler
binds, KWOK runs the pods, KubeRay makes them; nothing here writes a request's status. One GPU node group of
4-GPU nodes; every job is a RayCluster whose one worker needs a whole node, deleted a few seconds after all its
pods Run (KWOK's pods never end by themselves). Two reconcilers run, one leading, as in a cluster install with
two replicas: the first part stops the leader midway, and the order holds across the change. The last part
preempts: a queue with `preemption: LowerPriority` suspends running jobs of lower priority for its front.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import builders
import pytest
import yaml
from raystack import RayStack
from waiting import consistently, wait

from raygate.core import keys
from raygate.core.api import EVENTS, LEASES, NODES, PODS, RAYCLUSTERS, RAYJOBS
from raygate.core.objects import JSON
from raygate.devenv.build import Bundle
from raygate.devenv.capacity import GPU_GROUP, GPU_RESOURCE, NODE_GROUP_LABEL, Layout, start_capacity
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook
from raygate.kube.client import Kube

pytestmark = [pytest.mark.integration, pytest.mark.kuberay]

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"queue-{k}-{SUFFIX}" for k in ("fifo", "strict", "best", "preempt")}
ATOMIC = keys.BEST_EFFORT_ATOMIC_CLASS
TIMEOUT = 5  # provisionedTimeoutSeconds: every job below waits far longer than TIMEOUT x (retries + 1)
CONFIG = {
    "queues": {"default": {"strategy": "BestEffortFIFO"}, "strict": {"strategy": "StrictFIFO"},
               "preempting": {"strategy": "StrictFIFO", "preemption": "LowerPriority", "minRunSeconds": 0}},
    "defaults": {"mode": "provisioning", "provisioning": {"className": ATOMIC, "provisionedTimeoutSeconds": TIMEOUT},
                 "retry": {"limit": 0, "baseSeconds": 1, "maxSeconds": 1}},
    "namespaces": {NS["strict"]: {"queue": "strict"}, NS["preempt"]: {"queue": "preempting"}},
}
RECONCILERS = ("queue-reconciler-a", "queue-reconciler-b")
URGENT = "raygate-test-urgent"


class Stack(RayStack):
    def group(self, name: str) -> set[str]:
        """The nodes of a node group."""
        return {n["metadata"]["name"] for n in self.kube.list(NODES).get("items") or []
                if (n["metadata"].get("labels") or {}).get(NODE_GROUP_LABEL) == name}


@pytest.fixture(scope="module")
def stack(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    cp = ControlPlane(tmp_path_factory.mktemp("queue"), bundle)
    state = cp.up(kuberay=True, log=False)
    try:
        start_capacity(cp, state, Layout(gpu_nodes_max=1))
        cp.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
        cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                   f"--from-literal={keys.CONFIGMAP_KEY}={yaml.safe_dump(CONFIG)}")
        cp.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": URGENT},
            "value": 1000}))
        for ns in NS.values():
            cp.kubectl("create", "namespace", ns)
            cp.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        start_webhook(cp)
        for name in RECONCILERS:
            start_reconciler(cp, "--identity", name, "--lease-duration", "4", "--renew-deadline", "3",
                             "--retry-period", "0.5", name=name)
        yield Stack(cp, Kube.connect(str(cp.kubeconfig), user_agent="raygate-queue-test"))
    finally:
        cp.down(log=False)


def one_node(name: str, nodes: int = 1, priority: str | None = None) -> JSON:
    """A RayCluster whose GPU workers need `nodes` whole 4-GPU nodes."""
    res = {"cpu": "1", GPU_RESOURCE: "4"}
    cluster = builders.RayCluster(name, None).worker("gpu", replicas=nodes, min_replicas=nodes, max_replicas=nodes,
                                                     requests=res, limits=res)
    if priority:
        cluster.label(keys.RAY_PRIORITY_CLASS_LABEL, priority)
    return cluster.obj()


def running(stack: Stack, ns: str) -> set[str]:
    """The RayClusters of `ns` every pod of which is bound and Running."""
    pods: dict[str, list[JSON]] = {}
    for p in stack.kube.list(PODS, ns).get("items") or []:
        cluster = (p["metadata"].get("labels") or {}).get(keys.RAY_CLUSTER_LABEL)
        if cluster and not p["metadata"].get("deletionTimestamp"):
            pods.setdefault(cluster, []).append(p)
    return {c for c, ps in pods.items() if len(ps) >= 2 and all(
        p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running" for p in ps)}


def states(stack: Stack, ns: str) -> dict[str, str]:
    return {o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(keys.STATE_LABEL, "")
            for o in stack.kube.list(RAYCLUSTERS, ns).get("items") or []}


def finish(stack: Stack, ns: str, name: str) -> None:
    """Delete a job that ran, and wait until its pods are gone (its node is free)."""
    stack.kube.delete(RAYCLUSTERS, name, ns)
    wait(lambda: not [p for p in stack.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={name}")
                      .get("items") or []], 90, f"the pods of {name} to go", interval=0.5)


def status(stack: Stack, ns: str) -> dict[str, JSON]:
    out = subprocess.run([sys.executable, "-m", "raygate", "status", "-n", ns, "-o", "json", "--kubeconfig",
                          str(stack.cluster.kubeconfig)], capture_output=True, text=True, check=True, timeout=60)
    return {i["name"]: i for i in json.loads(out.stdout)["items"]}


def leader(stack: Stack) -> str:
    """The reconciler holding the lease ("" while none does: a leader that stops releases it)."""
    return str(stack.kube.get(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)["spec"].get("holderIdentity") or "")


def run_in_turn(stack: Stack, ns: str, expected: int, *, during: dict[int, object] | None = None) -> list[str]:
    """Let the jobs of `ns` run one after another: each, once all its pods Run, is deleted 3 s later. Returns the
    order they ran in. `during[i]`: called (no arguments) once the i-th job runs, before it is deleted."""
    order: list[str] = []
    while len(order) < expected:
        now = wait(lambda: running(stack, ns) - set(order), 180,
                   f"job {len(order) + 1} of {expected} to run (ran: {order}; states: {states(stack, ns)})")
        assert len(now) == 1, f"{sorted(now)} run at once on one node"
        order.append(now.pop())
        if during and (act := during.get(len(order))) is not None:
            act()  # type: ignore[operator]
        time.sleep(3)
        finish(stack, ns, order[-1])
    return order


def test_jobs_run_in_creation_order_a_later_higher_priority_one_next_and_none_fails_for_waiting(
        stack: Stack) -> None:
    ns = NS["fifo"]
    names = [f"q{i:02d}" for i in range(1, 11)]
    for name in names:
        stack.create(one_node(name), ns)
        time.sleep(1)

    def urgent_arrives() -> None:
        stack.create(one_node("urgent", priority=URGENT), ns)
        places = wait(lambda: (lambda s: s if "urgent" in s and s["urgent"]["queue"] else None)(status(stack, ns)),
                      30, "kubectl raygate status to show the urgent job's place")
        assert places["urgent"]["queue"]["position"] == 1, places["urgent"]  # ahead of all who wait
        assert places["q02"]["queue"]["position"] == 2 and places["q02"]["queue"]["ahead"] == f"RayCluster {ns}/urgent"
        assert places["q10"]["queue"] == {"name": "default", "position": 10, "length": 10,
                                          "ahead": f"RayCluster {ns}/q09", "priority": 0}

    def leader_goes() -> None:
        lead = leader(stack)
        stack.cluster.stop_process(lead)  # the other replica takes the lease and the queue, as it is
        wait(lambda: leader(stack) not in ("", lead), 30, "the other reconciler to lead")

    order = run_in_turn(stack, ns, 11, during={1: urgent_arrives, 4: leader_goes})
    assert order == ["q01", "urgent", *names[1:]], order
    # Every one of them waited far longer than provisionedTimeoutSeconds x (retry.limit + 1): none failed.
    failed = [e["involvedObject"]["name"] for e in stack.kube.list(EVENTS, ns).get("items") or []
              if e["reason"] in ("ProvisioningFailed", "InvalidJob")]
    assert failed == []
    fronts = {e["involvedObject"]["name"] for e in stack.kube.list(EVENTS, ns).get("items") or []
              if e["reason"] == "FrontOfQueue"}
    assert fronts == {"urgent", *names}  # one Event each when it reached the front


def test_a_job_no_node_group_can_hold_says_so_within_a_minute_and_is_out_of_the_way(stack: Stack) -> None:
    ns = NS["strict"]  # StrictFIFO: a head that can never run would block everyone behind it
    # The autoscaler names the node groups' shapes only while a group has room: at its maximum it says just
    # "max node group size reached", of a job that could never fit as of one that could (docs/guarantees.md).
    # Two nodes at most from here on (the autoscaler restarts with the new layout, its nodes gone).
    start_capacity(stack.cluster, stack.cluster.load_state(), Layout(gpu_nodes_max=2))  # type: ignore[arg-type]
    wait(lambda: not stack.group(GPU_GROUP), 60, "the GPU node group to start from zero")
    res = {"cpu": "1", GPU_RESOURCE: "8"}  # the node group's nodes have 4
    stack.create(builders.RayCluster("toobig", None).worker("gpu", replicas=1, min_replicas=1, max_replicas=1,
                                                           requests=res, limits=res).obj(), ns)
    stack.create(one_node("behind"), ns)
    said = wait(lambda: (lambda r: r if "no node group" in r else None)(stack.reason(ns, keys.RAYCLUSTER_KIND,
                                                                                     "toobig")), 60,
                "the job to say no node group can hold it")
    assert "Insufficient nvidia.com/gpu" in said, said  # the autoscaler's own words
    assert run_in_turn(stack, ns, 1) == ["behind"]
    assert states(stack, ns)["toobig"] == "Provisioning"  # held (neverFits: Hold), not failed
    stack.kube.delete(RAYCLUSTERS, "toobig", ns)


def test_a_two_node_head_runs_before_one_node_jobs_in_strict_fifo_and_lets_them_use_a_free_node_in_best_effort(
        stack: Stack) -> None:
    for ns in (NS["strict"], NS["best"]):
        stack.create(one_node("first"), ns)
        wait(lambda ns=ns: "first" in running(stack, ns), 180, f"the first job of {ns} to run")  # type: ignore[misc]
        stack.create(one_node("pair", nodes=2), ns)  # the head: it needs both nodes
        time.sleep(1)
        stack.create(one_node("single"), ns)  # behind it: one node, and one is free
        if ns == NS["strict"]:
            # Nobody passes the head, although a node is free.
            consistently(lambda ns=ns: running(stack, ns) == {"first"}, 15, "the one-node job to wait behind the head")
        else:
            # Capacity the head cannot use does not sit idle: the one-node job runs beside the first.
            wait(lambda ns=ns: running(stack, ns) == {"first", "single"}, 120, "the one-node job to use the free node")
            finish(stack, ns, "single")
        finish(stack, ns, "first")
        # Both nodes free: the head runs.
        wait(lambda ns=ns: "pair" in running(stack, ns), 180, f"the two-node head of {ns} to run")
        assert "single" not in running(stack, ns)
        finish(stack, ns, "pair")
        if ns == NS["strict"]:
            wait(lambda ns=ns: "single" in running(stack, ns), 180, "the one-node job to run after the head")
            finish(stack, ns, "single")


# --- preemption (queues.preempting: LowerPriority) ----------------------------------------------------

def events(stack: Stack, ns: str, reason: str) -> dict[str, str]:
    """Events of `reason` in `ns`: the object each is on -> its message."""
    return {e["involvedObject"]["name"]: e.get("message", "") for e in stack.kube.list(EVENTS, ns).get("items") or []
            if e["reason"] == reason}


def test_a_higher_priority_raycluster_preempts_only_the_most_recently_admitted_of_two(stack: Stack) -> None:
    """Two nodes at most, two low jobs on them; a one-node urgent job suspends one of them, the one admitted last,
    and runs on its node; the other runs on. When the urgent job goes, the suspended one runs again."""
    ns = NS["preempt"]
    start_capacity(stack.cluster, stack.cluster.load_state(), Layout(gpu_nodes_max=2))  # type: ignore[arg-type]
    for name in ("low-a", "low-b"):
        stack.create(one_node(name), ns)
        wait(lambda name=name: name in running(stack, ns), 180, f"{name} to run")  # type: ignore[misc]
    stack.create(one_node("urgent", priority=URGENT), ns)
    wait(lambda: running(stack, ns) == {"low-a", "urgent"}, 180,
         f"urgent to run in low-b's place (states: {states(stack, ns)})")
    assert events(stack, ns, "Preempted").keys() == {"low-b"}, "one victim: one node was needed"
    assert f"RayCluster {ns}/urgent" in events(stack, ns, "Preempted")["low-b"]
    assert "low-b" in events(stack, ns, "Preempting")["urgent"]
    place = status(stack, ns)["low-b"]
    assert place["preemptedBy"]["job"] == f"RayCluster {ns}/urgent" and place["preemptedBy"]["at"], place
    finish(stack, ns, "urgent")
    wait(lambda: running(stack, ns) == {"low-a", "low-b"}, 180, "low-b to run again once urgent is gone")
    for name in ("low-a", "low-b"):
        finish(stack, ns, name)


def test_a_higher_priority_rayjob_preempts_a_running_low_one_on_a_one_node_group_equals_and_never_do_not(
        stack: Stack) -> None:
    ns = NS["preempt"]
    start_capacity(stack.cluster, stack.cluster.load_state(), Layout(gpu_nodes_max=1))  # type: ignore[arg-type]
    wait(lambda: len(stack.group(GPU_GROUP)) <= 1, 120, "the GPU node group to be at most one node")

    def job(name: str, priority: str | None = None) -> JSON:
        res = {"cpu": "1", GPU_RESOURCE: "4"}
        j = builders.RayJob(name, None).worker("gpu", replicas=1, min_replicas=1, max_replicas=1, requests=res,
                                                limits=res)
        if priority:
            j.label(keys.RAY_PRIORITY_CLASS_LABEL, priority)
        return j.obj()

    def runs(name: str) -> bool:
        return any(c.startswith(f"{name}-") for c in running(stack, ns))

    stack.create(job("low"), ns)
    wait(lambda: runs("low"), 180, "the low job to run")
    # Equal priority in the same queue, and a higher priority in a queue that never preempts: nobody is suspended.
    stack.create(job("peer"), ns)
    stack.create(job("elsewhere", priority=URGENT), NS["fifo"])
    consistently(lambda: runs("low"), 15, "the low job to keep running")
    assert "low" not in events(stack, ns, "Preempted")
    for where, name in ((ns, "peer"), (NS["fifo"], "elsewhere")):
        stack.kube.delete(RAYJOBS, name, where)

    stack.create(job("high", priority=URGENT), ns)
    wait(lambda: runs("high"), 240, f"the high job to run (states: {stack.state(ns, keys.RAYJOB_KIND, 'low')})")
    low = stack.get(ns, keys.RAYJOB_KIND, "low")
    assert low["spec"]["suspend"] is True and not runs("low")
    assert low["metadata"]["labels"][keys.STATE_LABEL] in keys.HELD_STATES
    assert f"RayJob {ns}/high" in events(stack, ns, "Preempted")["low"]
    assert "low" in events(stack, ns, "Preempting")["high"]
    stack.kube.delete(RAYJOBS, "high", ns)
    wait(lambda: runs("low"), 240, "the low job to run again once the high one is gone")
    assert stack.get(ns, keys.RAYJOB_KIND, "low")["metadata"]["labels"][keys.STATE_LABEL] == keys.State.ADMITTED
    stack.kube.delete(RAYJOBS, "low", ns)
