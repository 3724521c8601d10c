"""Volcano mode end to end: N RayClusters from `kubectl create` to every pod Running through Volcano.

What a user of volcano mode waits for: the webhook holds the cluster and records its PodGroup, the
reconciler creates the PodGroup (after checking the queue is Open) and unsuspends, KubeRay creates the
pods, the Volcano scheduler enqueues the PodGroup and binds the whole gang, KWOK runs the pods. N
clusters are created at once on a fresh local cluster (capacity layer plus Volcano); per cluster the
times from its create to its unsuspend, to its PodGroup reported Running, and to every pod Running.

Each cluster: a head (500m CPU) and 2 workers (1 CPU each), in Volcano's `default` queue, on 4 CPU
nodes of 64 CPU: everything fits, so the figures are raygate + KubeRay + Volcano's cycle (1 s), not
waiting for room. Provisioning is off (the capacity benchmark measures the autoscaler).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import yaml

from benchmarks import common
from benchmarks.common import BenchError, Target
from raygate.core import keys
from raygate.core.api import PODGROUPS, PODS, RAYCLUSTERS
from raygate.core.objects import JSON
from raygate.kube.client import Kube
from raygate.webhook.cli import THREADS, WORKERS

NAMESPACE = "bench-volcano"
P99_TARGET_S = {20: 30.0}  # create -> every pod Running, with Volcano's 1 s scheduling cycle
PODS_PER_CLUSTER = 3
CONFIG = {"defaults": {"mode": "volcano", "provisioning": {"enabled": False}}}


def raycluster(name: str) -> JSON:
    def pod(cname: str, cpu: str) -> JSON:
        res = {"cpu": cpu, "memory": "1Gi"}
        return {"spec": {"containers": [{"name": cname, "image": "rayproject/ray:2.46.0",
                                         "resources": {"requests": res, "limits": res}}]}}

    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": pod("ray-head", "500m")},
            "workerGroupSpecs": [{"groupName": "cpu", "replicas": 2, "minReplicas": 2, "maxReplicas": 2,
                                  "rayStartParams": {}, "template": pod("ray-worker", "1")}],
        },
    }


def _observe(kube: Kube, created: dict[str, float], timeout: float) -> dict[str, dict[str, float]]:
    """Poll until every cluster's pods are all Running; per cluster the moment each milestone was
    first seen (monotonic). Polling every 0.5 s adds up to 0.5 s to each figure."""
    seen: dict[str, dict[str, float]] = {name: {} for name in created}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.monotonic()
        clusters = {c["metadata"]["name"]: c for c in kube.list(RAYCLUSTERS, NAMESPACE).get("items") or []}
        phases = {g["metadata"]["name"]: (g.get("status") or {}).get("phase")
                  for g in kube.list(PODGROUPS, NAMESPACE).get("items") or []}
        running: dict[str, int] = {}
        for pod in kube.list(PODS, NAMESPACE, labelSelector=keys.RAY_CLUSTER_LABEL).get("items") or []:
            cluster = (pod["metadata"].get("labels") or {}).get(keys.RAY_CLUSTER_LABEL, "")
            if ((pod.get("status") or {}).get("phase") == "Running" and pod["spec"].get("nodeName")
                    and pod["spec"].get("schedulerName") == keys.VOLCANO_SCHEDULER):
                running[cluster] = running.get(cluster, 0) + 1
        for name, marks in seen.items():
            cluster = clusters.get(name)
            if cluster is None:
                continue
            if cluster["spec"].get("suspend") is False:
                marks.setdefault("unsuspended", now)
            if phases.get(f"ray-{name}-pg") == "Running":
                marks.setdefault("pod_group_running", now)
            if running.get(name, 0) >= PODS_PER_CLUSTER:
                marks.setdefault("running", now)
        # Volcano reports a PodGroup Running a cycle after its pods run: wait for both.
        if all("running" in m and "pod_group_running" in m for m in seen.values()):
            return seen
        time.sleep(0.5)
    done = sum(1 for m in seen.values() if "running" in m)
    raise BenchError(f"only {done} of {len(created)} clusters had every pod Running after {timeout:.0f}s")


def run_one(n: int, timeout: float) -> dict[str, Any]:
    from raygate.devenv.capacity import Layout, start_capacity
    from raygate.devenv.raygate_local import start_reconciler, start_webhook
    from raygate.devenv.volcano import start_volcano

    layout = Layout(cpu_nodes=4, cpu_node_cpu=64, gpu_nodes_max=1)
    with common.control_plane(kuberay=True) as cp:
        state = cp.load_state()
        assert state is not None
        start_capacity(cp, state, layout)
        start_volcano(cp, state)
        cp.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE)
        cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                   f"--from-literal={keys.CONFIGMAP_KEY}={yaml.safe_dump(CONFIG)}")
        start_webhook(cp, workers=WORKERS, threads=THREADS)
        start_reconciler(cp)
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("label", "namespace", NAMESPACE, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=16)
        names = [f"ray-{i:03d}" for i in range(n)]
        created, t0, create_seconds = common.create_all(
            names, lambda name: kube.create(RAYCLUSTERS, raycluster(name), NAMESPACE))
        marks = _observe(kube, created, timeout)

    def stage(key: str) -> dict[str, float]:
        return common.summary([marks[name][key] - created[name] for name in names])

    return {
        "clusters": n, "create_seconds": round(create_seconds, 2),
        "create_to_unsuspended_s": stage("unsuspended"), "create_to_pod_group_running_s": stage("pod_group_running"),
        "create_to_all_pods_running_s": stage("running"),
        "first_create_to_last_running_s": round(max(m["running"] for m in marks.values()) - t0, 1),
    }


def main(args: argparse.Namespace) -> int:
    from raygate.devenv.volcano import describe

    t0 = time.monotonic()
    report: dict[str, Any] = {"benchmark": "volcano", "started": common.now_iso(), "machine": common.machine_info()}
    runs = [run_one(n, args.timeout) for n in args.volcano_clusters]
    report["runs"] = runs
    report["volcano"] = describe()
    targets = [Target(f"create -> every pod Running p99 ({r['clusters']} clusters)",
                      r["create_to_all_pods_running_s"]["p99"], "<=", P99_TARGET_S.get(r["clusters"], math.inf), "s")
               for r in runs]
    rows = []
    for r in runs:
        for label, key in (("create -> unsuspended", "create_to_unsuspended_s"),
                           ("create -> PodGroup Running", "create_to_pod_group_running_s"),
                           ("create -> every pod Running", "create_to_all_pods_running_s")):
            s = r[key]
            rows.append([f"{r['clusters']} clusters: {label}", s["p50"], s["p99"], s["max"]])
        rows.append([f"{r['clusters']} clusters: first create -> last pod Running", "", "",
                     r["first_create_to_last_running_s"]])
    print(common.table(["", "p50 s", "p99 s", "max s"], rows, "RayClusters gang-scheduled by Volcano (KWOK nodes)"))
    print(f"\n{describe()}")
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, common.write_report("volcano", report, targets, t0)))
    return 0
