"""What the gate at the pod costs: the pod webhook's latency, a gang's Provisioned -> every pod bound with
the gate and without it, and a scale-up's pods from creation to bound on the real cluster-autoscaler.

1. Pod reviews served over TLS (the shipped webhook, 2 workers x 8 threads): a CREATE of a GPU worker pod
   as KubeRay makes it, which the webhook gates, at concurrency 1 and 8. Target p99 <= 5 ms at 8.
2. A RayCluster of 32 GPU workers on GPU nodes that exist (check-capacity books them), measured from
   the moment its request is Provisioned to every worker bound, once with the pod gate and once without
   it (the pod rules taken out of raygate's webhook registrations, so pods are not gated: raygate as it
   was before the gate), in alternating rounds. Target: the median with the gate within 20% of without.
3. An admitted autoscaling RayCluster scaled up by 4 workers on an empty GPU node group: from the replicas
   patch and from the new pods' creation to all bound, with the real cluster-autoscaler adding the node for
   their scale-up request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import orjson

from benchmarks import common
from benchmarks.common import BenchError, Target, bound_workers, gpu_workers, request_provisioned, until
from benchmarks.samples import admission_review
from benchmarks.webhook_bench import drive
from raygate.core import keys
from raygate.core.api import RAYCLUSTERS
from raygate.core.objects import JSON
from raygate.kube.client import Kube

NAMESPACE = "bench-podgate"  # the scale-up: best-effort-atomic, the autoscaler adds its node
GANG_NAMESPACE = "bench-podgate-gang"  # the gang: check-capacity on GPU nodes that exist
STATIC_GROUP = "gpu-static"
GANG = 32
ROUNDS = 3  # per side, alternating: one round each was within the noise of a loaded 2-core machine
SCALE_UP = 4
P99_TARGET_MS = 5.0
OVERHEAD_TARGET = 1.2


def gpu_pod(i: int) -> JSON:
    """A GPU worker pod as KubeRay creates it for an admitted cluster."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"train-gpu-worker-{i:05d}", "namespace": NAMESPACE,
                         "labels": {keys.RAY_CLUSTER_LABEL: "train", keys.RAY_GROUP_LABEL: "gpu",
                                    keys.RAY_NODE_TYPE_LABEL: "worker"},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "train",
                                              "uid": "3f1c", "controller": True}]},
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu", "resources": {
                "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
                "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}}}],
                     "initContainers": [{"name": "wait-gcs-ready", "image": "rayproject/ray:2.46.0-gpu",
                                         "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}}]}}


def pod_review(pod: JSON) -> JSON:
    """The AdmissionReview the API server sends for a pod KubeRay creates."""
    review = admission_review(pod, uid=str(uuid.uuid4()))
    core = {"group": "", "version": "v1"}
    review["request"].update(kind={**core, "kind": "Pod"}, requestKind={**core, "kind": "Pod"},
                             resource={**core, "resource": "pods"}, requestResource={**core, "resource": "pods"},
                             userInfo={"username": "system:serviceaccount:ray-system:kuberay-operator"})
    return review


def served(warmup: float, duration: float) -> list[dict[str, Any]]:
    from raygate.devenv import raygate_local

    bodies = [orjson.dumps(pod_review(gpu_pod(i))) for i in range(256)]
    with common.control_plane() as cp:
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("label", "namespace", NAMESPACE, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        hook = raygate_local.start_webhook(cp, workers=2, threads=8, register=False, name="podgate-webhook")
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        port = int(hook.url.rsplit(":", 1)[1])
        time.sleep(2)  # both workers ready
        runs = []
        for c in (1, 8):
            r = drive(port, str(hook.ca_file), c, processes=1 if c == 1 else 2, warmup=warmup, duration=duration,
                      server_pid=state.pids["podgate-webhook"], bodies=bodies)
            print(f"bench: pod webhook c={c}: {r['reviews_per_s']:,.0f}/s p50 {r['latency_ms']['p50']:.2f} ms "
                  f"p99 {r['latency_ms']['p99']:.2f} ms", flush=True)
            runs.append(r)
    return runs


def raycluster(name: str, namespace: str, workers: int, *, autoscaling: bool = False) -> JSON:
    worker = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": namespace},
            "spec": {"enableInTreeAutoscaling": autoscaling,
                     "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                         "name": "ray-head", "image": "rayproject/ray:2.46.0",
                         "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}},
                     "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": 0,
                                           "maxReplicas": 64, "rayStartParams": {},
                                           "template": {"spec": {"containers": [{
                                               "name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu",
                                               "resources": {"requests": worker, "limits": worker}}]}}}]}}


def _pod_rules(cp: Any, on: bool) -> None:
    """With `on` False, raygate as it was before the gate: its webhook registrations without the rules for pods."""
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        name = keys.MUTATING_WEBHOOK_CONFIG if kind.startswith("mutating") else keys.VALIDATING_WEBHOOK_CONFIG
        obj = json.loads(cp.kubectl("get", kind, name, "-o", "json"))
        for hook in obj["webhooks"]:
            rules = [r for r in hook["rules"] if "pods" not in r["resources"]]
            if on:
                operations = ["CREATE"] if kind.startswith("mutating") else ["CREATE", "UPDATE"]
                rules.append({"apiGroups": [""], "apiVersions": ["v1"], "operations": operations,
                              "resources": ["pods"], "scope": "Namespaced"})
            hook["rules"] = rules
        cp.kubectl("replace", "-f", "-", input_text=json.dumps(obj))


CONFIG = {"defaults": {"mode": "provisioning", "provisioning": {"className": keys.BEST_EFFORT_ATOMIC_CLASS}},
          "namespaces": {GANG_NAMESPACE: {"provisioning": {"className": keys.CHECK_CAPACITY_CLASS}}}}


# Where a gang round's time goes, from watch events: (label, from, to); "provisioned" is the bench's own poll.
GANG_PHASES = (("Provisioned -> unsuspended", "provisioned", "unsuspended"),
               ("unsuspended -> first worker created", "unsuspended", "first_created"),
               ("first -> last worker created (KubeRay)", "first_created", "last_created"),
               ("last created -> last released (raygate)", "last_created", "last_released"),
               ("last released -> last bound (kube-scheduler)", "last_released", "last_bound"))


class GangWatch:
    """First-seen moments of one namespace's RayClusters and workers, from watches (no poll interval in them)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        from raygate.core.api import PODS
        from raygate.kube.informer import Informer

        self.unsuspended: dict[str, float] = {}
        self.pods: dict[str, dict[str, dict[str, float]]] = {}  # cluster -> pod -> created / released / bound
        self.informers = [Informer(kube, RAYCLUSTERS, namespace=namespace, handler=self._cluster),
                          Informer(kube, PODS, namespace=namespace, handler=self._pod)]
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            informer.wait_synced(60)

    def _cluster(self, kind: str, obj: JSON) -> None:
        if kind != "DELETED" and (obj.get("spec") or {}).get("suspend") is not True:
            self.unsuspended.setdefault(obj["metadata"]["name"], time.monotonic())

    def _pod(self, kind: str, obj: JSON) -> None:
        labels = obj["metadata"].get("labels") or {}
        if kind == "DELETED" or labels.get(keys.RAY_GROUP_LABEL) != "gpu":
            return
        now = time.monotonic()
        seen = self.pods.setdefault(labels.get(keys.RAY_CLUSTER_LABEL, ""), {}).setdefault(obj["metadata"]["name"], {})
        seen.setdefault("created", now)
        if not any(g.get("name") == keys.CAPACITY_GATE for g in obj["spec"].get("schedulingGates") or []):
            seen.setdefault("released", now)
        if obj["spec"].get("nodeName"):
            seen.setdefault("bound", now)

    def phases(self, cluster: str, provisioned: float) -> dict[str, float]:
        """Seconds of each GANG_PHASES step of one round."""
        pods = self.pods.get(cluster, {}).values()
        at = {"provisioned": provisioned, "unsuspended": self.unsuspended.get(cluster, float("nan")),
              "first_created": min(p["created"] for p in pods), "last_created": max(p["created"] for p in pods),
              "last_released": max(p["released"] for p in pods), "last_bound": max(p["bound"] for p in pods)}
        return {label: round(at[b] - at[a], 3) for label, a, b in GANG_PHASES}

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()


def on_capacity(timeout: float) -> dict[str, Any]:
    from raygate.devenv.capacity import Layout, start_capacity

    layout = Layout(cpu_nodes=4, cpu_node_cpu=64, gpu_nodes_max=SCALE_UP // 4 + 2)
    out: dict[str, Any] = {"layout": layout.describe()}
    with common.control_plane(kuberay=True) as cp:
        state = cp.load_state()
        assert state is not None
        start_capacity(cp, state, layout)
        common.start_raygate(cp, CONFIG, (NAMESPACE, GANG_NAMESPACE))
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=8)
        # (3) a scale-up on the real autoscaler: its GPU node group starts at zero.
        kube.create(RAYCLUSTERS, raycluster("elastic", NAMESPACE, 1, autoscaling=True), NAMESPACE)
        until(lambda: bound_workers(kube, "elastic", NAMESPACE) == 1, timeout,
              "the elastic cluster's first worker bound", 0.5)
        patched = time.monotonic()
        kube.patch(RAYCLUSTERS, "elastic", [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                             "value": 1 + SCALE_UP}], NAMESPACE,
                   content_type="application/json-patch+json")
        first = until(lambda: len(gpu_workers(kube, "elastic", NAMESPACE)) > 1, timeout,
                      "the first pod of the scale-up")
        bound = until(lambda: bound_workers(kube, "elastic", NAMESPACE) == 1 + SCALE_UP, timeout,
                      "the scale-up's pods bound", 0.2)
        out["scale_up"] = {"pods": SCALE_UP, "created_to_bound_s": round(bound - first, 2),
                           "patched_to_bound_s": round(bound - patched, 2)}
        print(f"bench: scale-up of {SCALE_UP} workers: replicas patched -> bound {bound - patched:.1f}s, "
              f"pods created -> bound {bound - first:.1f}s", flush=True)
        kube.delete(RAYCLUSTERS, "elastic", NAMESPACE)
        # (2) the gang, on GPU nodes that exist (the autoscaler's own come and go): check-capacity books them.
        common.add_static_gpu_nodes(cp, kube, STATIC_GROUP, GANG // layout.gpus_per_node, layout.gpus_per_node, timeout)
        rounds: dict[str, list[float]] = {"gated": [], "ungated": []}
        phases: dict[str, list[dict[str, float]]] = {"gated": [], "ungated": []}
        watch = GangWatch(kube, GANG_NAMESPACE)
        for i in range(ROUNDS * 2):
            gated = i % 2 == 0
            _pod_rules(cp, gated)
            side = "gated" if gated else "ungated"
            name = f"gang-{side}-{i // 2}"
            kube.create(RAYCLUSTERS, raycluster(name, GANG_NAMESPACE, GANG), GANG_NAMESPACE)
            provisioned = until(lambda n=name: request_provisioned(kube, n, GANG_NAMESPACE), timeout,
                                f"{name} Provisioned", 0.05)
            done = until(lambda n=name: bound_workers(kube, n, GANG_NAMESPACE) == GANG, timeout,
                         f"every worker of {name} bound", 0.1)
            rounds[side].append(round(done - provisioned, 2))
            until(lambda n=name: sum("bound" in p for p in watch.pods.get(n, {}).values()) >= GANG, timeout,
                  f"the watch to see every worker of {name} bound", 0.05)
            phases[side].append(watch.phases(name, provisioned))
            print(f"bench: {name}: Provisioned -> {GANG} workers bound {done - provisioned:.1f}s", flush=True)
            kube.delete(RAYCLUSTERS, name, GANG_NAMESPACE)
            until(lambda n=name: not gpu_workers(kube, n, GANG_NAMESPACE), timeout, f"{name}'s pods gone", 0.5)
        watch.stop()
        for side, seconds in rounds.items():
            out[f"gang-{side}"] = {"rounds_s": seconds, "provisioned_to_all_bound_s": statistics.median(seconds),
                                   "phases_s": {label: statistics.median(r[label] for r in phases[side])
                                                for label, _, _ in GANG_PHASES},
                                   "phases_by_round_s": phases[side]}
    return out


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    report: dict[str, Any] = {"benchmark": "podgate", "started": common.now_iso(), "machine": common.machine_info()}
    report["pod_webhook"] = served(args.warmup, args.duration)
    report["capacity"] = on_capacity(args.timeout)
    c8 = next(r for r in report["pod_webhook"] if r["concurrency"] == 8)
    cap = report["capacity"]
    ratio = cap["gang-gated"]["provisioned_to_all_bound_s"] / max(cap["gang-ungated"]["provisioned_to_all_bound_s"],
                                                                   1e-9)
    report["gang_gated_over_ungated"] = round(ratio, 2)
    targets = [Target("pod webhook p99 at concurrency 8", c8["latency_ms"]["p99"], "<=", P99_TARGET_MS, "ms"),
               Target(f"{GANG}-pod gang Provisioned -> bound, gated / ungated", ratio, "<=", OVERHEAD_TARGET, "x")]
    rows = [[f"pod webhook c={r['concurrency']}", f"{r['reviews_per_s']:,.0f}/s", f"{r['latency_ms']['p50']:.2f}",
             f"{r['latency_ms']['p99']:.2f}", f"{r['server_cpu_ms_per_review']:.2f}"] for r in report["pod_webhook"]]
    print(common.table(["", "reviews", "p50 ms", "p99 ms", "server CPU ms/review"], rows,
                       "The pod webhook (a GPU worker pod, gated), served over TLS, 2 workers x 8 threads"))
    def gang(side: str) -> list[Any]:
        return [", ".join(f"{s:.2f}" for s in cap[f"gang-{side}"]["rounds_s"]),
                cap[f"gang-{side}"]["provisioned_to_all_bound_s"]]

    print(common.table(["", "rounds (s)", "median / seconds"], [
        [f"{GANG}-pod gang, Provisioned -> every worker bound, with the pod gate", *gang("gated")],
        [f"{GANG}-pod gang, Provisioned -> every worker bound, without it", *gang("ungated")],
        [f"scale-up of {SCALE_UP} workers, replicas patched -> all bound (real autoscaler adds the node)", "",
         cap["scale_up"]["patched_to_bound_s"]],
        [f"scale-up of {SCALE_UP} workers, pods created -> all bound", "", cap["scale_up"]["created_to_bound_s"]],
    ], f"On real capacity ({cap['layout']})"))
    print(common.table(["", "with the pod gate", "without it"], [
        [label, cap["gang-gated"]["phases_s"][label], cap["gang-ungated"]["phases_s"][label]]
        for label, _, _ in GANG_PHASES], f"Where a {GANG}-pod gang's time goes (seconds, median of the rounds)"))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, common.write_report("podgate", report, targets, t0)))
    return 0
