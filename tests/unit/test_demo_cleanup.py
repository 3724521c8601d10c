"""The pure parts of `raygate demo`: which leftovers of an earlier run it force-deletes, which pods it
waits for, how it names them, and when a job counts as running."""

from __future__ import annotations

from typing import Any

import builders
import pytest

from raygate.core import keys
from raygate.devenv import demo

NODES = {"cpu-node-0", "gpu-pool-a"}
GPU = {"nvidia.com/gpu": "2"}


def pod(name: str, namespace: str = demo.DEMO_NAMESPACE, *, node: str | None = "gpu-pool-gone",
        terminating: bool = False, owned: bool = True, limits: dict[str, str] | None = None,
        requests: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
        finalizers: list[str] | None = None, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if owned:
        meta["ownerReferences"] = [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "c", "uid": "c1",
                                    "controller": True}]
    if finalizers:
        meta["finalizers"] = finalizers
    spec: dict[str, Any] = {"containers": [builders.container("ray-worker", requests=requests, limits=limits)]}
    if node:
        spec["nodeName"] = node
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods]


@pytest.mark.parametrize(("case", "forced"), [
    # The demo's own pod being deleted on a node the autoscaler removed: only a force-delete ends it.
    (pod("terminating-on-gone-node", terminating=True, limits=GPU), True),
    (pod("cpu-pod-terminating-on-gone-node", terminating=True), True),
    # No controller would replace it, and nothing else deletes it before pod GC.
    (pod("ownerless-on-gone-node", owned=False), True),
    # Its RayCluster still runs and would replace it: the garbage collector deletes it first.
    (pod("owned-running-on-gone-node", limits=GPU), False),
    # On a node that exists KWOK confirms the deletion.
    (pod("terminating-on-live-node", node="gpu-pool-a", terminating=True, limits=GPU), False),
    (pod("unbound-terminating", node=None, terminating=True), False),
    # Another namespace's pods are not the demo's to force: pod GC removes them.
    (pod("other-namespace", "team-a", terminating=True, limits=GPU), False),
], ids=lambda v: v["metadata"]["name"] if isinstance(v, dict) else "")
def test_only_the_demos_own_pods_on_missing_nodes_are_force_deleted(case: dict[str, Any], forced: bool) -> None:
    plan = demo.leftovers([case], NODES)
    assert names(plan.force_delete) == (names([case]) if forced else [])


def test_every_gpu_pod_is_waited_for_and_nothing_else() -> None:
    pods = [
        pod("limits", "team-a", node="gpu-pool-a", limits=GPU),
        pod("requests", node="gpu-pool-a", requests=GPU),
        pod("forced-but-not-gone-yet", terminating=True, limits=GPU, finalizers=["batch.kubernetes.io/job-tracking"]),
        pod("head", node="cpu-node-0"),
        # A node selector on the GPU product label asks for no GPU (a substring match would say it does).
        pod("selector-only", node="cpu-node-0", node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB"}),
    ]
    assert names(demo.leftovers(pods, NODES).waiting) == [
        "team-a/limits", "demo/requests", "demo/forced-but-not-gone-yet"]


@pytest.mark.parametrize(("case", "story"), [
    (pod("w", "team-a", terminating=True), "team-a/w (Terminating on node gpu-pool-gone, which no longer exists)"),
    (pod("w", node="gpu-pool-a"), "demo/w (Running on node gpu-pool-a)"),
    (pod("w", node=None, phase="Pending"), "demo/w (Pending, unbound)"),
    (pod("w", terminating=True, finalizers=["batch.kubernetes.io/job-tracking"]),
     "demo/w (Terminating on node gpu-pool-gone, which no longer exists; finalizers batch.kubernetes.io/job-tracking)"),
])
def test_a_pod_is_named_with_its_own_namespace_and_where_it_is(case: dict[str, Any], story: str) -> None:
    assert demo.pod_story(case, NODES) == story


def facts(**changes: Any) -> dict[str, Any]:
    base = {"exists": True, "state": keys.State.ADMITTED.value, "suspend": False, "pods": 4,
            "running": 1 + demo.WORKERS, "submitter": "Running", "placement": [], "rayclusters": 1}
    return {**base, **changes}


@pytest.mark.parametrize(("case", "running"), [
    (facts(), True),
    (facts(submitter="-"), False),  # K8sJobMode: the Job controller has not made the submitter pod
    (facts(submitter="Pending"), False),
    (facts(running=demo.WORKERS), False),
    (facts(state=keys.State.PROVISIONING.value), False),
    (facts(exists=False), False),
])
def test_a_job_runs_once_its_ray_pods_and_its_submitter_pod_run(case: dict[str, Any], running: bool) -> None:
    assert demo._running(case) is running
