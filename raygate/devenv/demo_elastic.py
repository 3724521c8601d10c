"""The demo's second act: the Ray autoscaler scales a running cluster up, and raygate books the increment.

A RayCluster with in-tree autoscaling starts with no GPU worker, so nothing is booked when it is
admitted (the case the pod gate exists for). The Ray autoscaler (played here with its own identity,
the head pod's ServiceAccount, and the patch it makes) asks for one worker: it is born gated, raygate
asks for exactly that increment, the cluster-autoscaler adds the GPU node, and the gate is lifted.
Then it asks for two more than the node group can hold: they wait gated, unbound, with the
autoscaler's reason on the RayCluster, and no node is added for them one by one.
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from typing import Any

from raygate.core import keys
from raygate.core.errors import RaygateError

CLUSTER = "elastic"
GPUS_PER_WORKER = 2


def raycluster(namespace: str) -> dict[str, Any]:
    """An autoscaling RayCluster as a data scientist writes it: no GPU worker to start, up to 3."""
    worker = {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": str(GPUS_PER_WORKER)}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": CLUSTER, "namespace": namespace},
        "spec": {
            "enableInTreeAutoscaling": True,
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray:2.46.0",
                "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}}]}}},
            "workerGroupSpecs": [{
                "groupName": "gpu", "replicas": 0, "minReplicas": 0, "maxReplicas": 3, "rayStartParams": {},
                "template": {"spec": {"containers": [{
                    "name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu",
                    "resources": {"requests": worker, "limits": worker}}]}},
            }],
        },
    }


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == keys.CAPACITY_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


class Watch:
    """Prints the cluster's GPU workers, its scale-up requests and its scale-up reason when they change.

    Pods are followed through a watch, not polled: every state a worker passes through is printed,
    so one born gated and released within a poll interval is still seen gated first.
    """

    def __init__(self, kube: Any, namespace: str, start: float) -> None:
        from raygate.core.api import PODS
        from raygate.kube.informer import Informer

        self.kube, self.namespace, self.start = kube, namespace, start
        self.seen: dict[str, str] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self._events: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
        self._informer = Informer(kube, PODS, namespace=namespace, label_selector=f"{keys.RAY_CLUSTER_LABEL}={CLUSTER}",
                                  handler=lambda kind, pod: self._events.put((kind, pod)), resync_seconds=3600)
        self._informer.start()
        if not self._informer.wait_synced(30):
            raise RaygateError(f"demo: could not list the pods of namespace {namespace} within 30s")

    def close(self) -> None:
        self._informer.stop()

    def say(self, subject: str, text: str) -> None:
        print(f"{time.monotonic() - self.start:7.1f}s  {subject:<32} {text}", flush=True)

    def _report(self, subject: str, text: str) -> None:
        if self.seen.get(subject) != text:
            self.seen[subject] = text
            self.say(subject, text)

    def _worker_changes(self) -> list[dict[str, Any]]:
        """The GPU workers' states since the last tick, in the order the API server made them."""
        changes: list[dict[str, Any]] = []
        while True:
            try:
                kind, pod = self._events.get_nowait()
            except queue.Empty:
                return changes
            if (pod["metadata"].get("labels") or {}).get(keys.RAY_GROUP_LABEL) != "gpu":
                continue
            name = pod["metadata"]["name"]
            if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
                changes.append(pod)

    def tick(self) -> list[dict[str, Any]]:
        from raygate.core import booking
        from raygate.core.api import RAYCLUSTERS, provisioning_requests
        from raygate.core.conditions import raw_conditions

        changes = self._worker_changes()
        # Cause before effect: the requests, then the pods they let run.
        for pr in self.kube.list(provisioning_requests("v1"), self.namespace)["items"]:
            if keys.SCALE_UP_ANNOTATION not in (pr["metadata"].get("annotations") or {}):
                continue
            count = sum(int(ps["count"]) for ps in pr["spec"]["podSets"])
            said = ", ".join(f"{t}={c.get('status')}" + (f" ({c['reason']})" if c.get("status") != "True" and
                                                          c.get("reason") else "")
                             for t, c in raw_conditions(pr).items()
                             if t in (booking.ACCEPTED, booking.PROVISIONED, booking.FAILED))
            self._report(f"provreq/{pr['metadata']['name']}", f"scale-up of {count} pod(s)  {said or 'asked'}")
        for p in changes:
            phase = (p.get("status") or {}).get("phase", "?")
            where = p["spec"].get("nodeName") or "unbound"
            self._report(f"pod/{p['metadata']['name']}", f"{'gated' if _gated(p) else 'released'}  {phase}  {where}")
        cluster = self.kube.get(RAYCLUSTERS, CLUSTER, self.namespace)
        reason = (cluster["metadata"].get("annotations") or {}).get(keys.SCALE_UP_REASON_ANNOTATION)
        if reason:
            self._report(f"raycluster/{CLUSTER}", f"{keys.SCALE_UP_REASON_ANNOTATION}: {reason[:140]}")
        return list(self.pods.values())

    def until(self, what: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float, hold: float = 0) -> None:
        deadline = time.monotonic() + timeout
        since: float | None = None
        while time.monotonic() < deadline:
            if done(self.tick()):
                since = since or time.monotonic()
                if time.monotonic() - since >= hold:
                    return
            else:
                since = None
            time.sleep(0.25)
        raise RaygateError(f"demo: timed out after {timeout:.0f}s waiting until {what}")


def _running(workers: list[dict[str, Any]], n: int) -> bool:
    up = [p for p in workers if not _gated(p) and (p.get("status") or {}).get("phase") == "Running"]
    return len(up) >= n


def act(cp: Any, kube: Any, namespace: str, timeout: float) -> None:
    from raygate.core.api import RAYCLUSTERS

    print(f"\nSecond act: the Ray autoscaler scales {CLUSTER} up; raygate books each increment as a gang of its own.")
    watch = Watch(kube, namespace, time.monotonic())
    try:
        kube.create(RAYCLUSTERS, raycluster(namespace), namespace)
        watch.say("kubectl create", f"raycluster/{CLUSTER} (autoscaling, no GPU worker to start, up to 3)")
        watch.until(f"{CLUSTER} is admitted with nothing to book",
                    lambda w: (kube.get(RAYCLUSTERS, CLUSTER, namespace)["metadata"].get("labels") or {}).get(
                        keys.STATE_LABEL) == keys.State.ADMITTED, timeout)
        ray_autoscaler = f"system:serviceaccount:{namespace}:{CLUSTER}"  # the head pod's ServiceAccount
        watch.until("KubeRay lets the head's ServiceAccount patch the cluster (its Role for the Ray autoscaler)",
                    lambda w: cp.kubectl("auth", "can-i", "patch", f"rayclusters.ray.io/{CLUSTER}", "-n", namespace,
                                         "--as", ray_autoscaler, check=False).strip() == "yes", timeout)
        for replicas, words in ((1, "one worker: the increment is booked, the autoscaler adds its node"),
                                (3, "two more than the node group holds")):
            watch.say(f"Ray autoscaler ({CLUSTER} SA)", f"patch replicas={replicas}: {words}")
            cp.kubectl("--as", ray_autoscaler, "patch", "raycluster", CLUSTER, "-n", namespace, "--type", "json", "-p",
                       json.dumps([{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": replicas}]))
            if replicas == 1:
                watch.until("the worker is booked, released and runs", lambda w: _running(w, 1), timeout)
        watch.until("the two more wait gated and unbound, with the autoscaler's reason on the RayCluster",
                    lambda w: sum(_gated(p) and not p["spec"].get("nodeName") for p in w) == 2
                    and "Provisioned=False" in watch.seen.get(f"raycluster/{CLUSTER}", "") and _running(w, 1), timeout,
                    hold=5)
    finally:
        watch.close()
    print(f"\nDone: {CLUSTER}'s first scale-up was booked and runs; the second waits gated, holding no GPU.")
