"""kueue mode with the real Kueue controller and the real KubeRay operator: raygate labels, Kueue
suspends, queues and admits the whole gang, KubeRay starts it only then.

Kueue's webhook configurations are registered under the names its install uses, which the API
server calls before raygate's; the tests show what its reinvocationPolicy does to a job.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from builders import gpu_job
from waiting import wait

from raygate.core import keys
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.kueue_local import MUTATING, start_kueue, stop_kueue
from raygate.devenv.raygate_local import LocalWebhook, start_webhook, stop_webhook

pytestmark = [pytest.mark.integration, pytest.mark.kuberay, pytest.mark.kueue]

HOOK = "raygate-webhook-kueue"
LOCAL_QUEUE = "team-lq"
GPU = "nvidia.com/gpu"
QUOTA_GPUS = 4


def kubectl(cluster: ControlPlane, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.bundle.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), *args],
                          input=input_text, capture_output=True, text=True, check=False, timeout=60)


def create(cluster: ControlPlane, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kubectl(cluster, "create", "-o", "json", "-f", "-", input_text=json.dumps(obj))


def apply(cluster: ControlPlane, *objs: dict[str, Any]) -> None:
    proc = kubectl(cluster, "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                        "items": list(objs)}))
    assert proc.returncode == 0, proc.stderr


def get(cluster: ControlPlane, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    proc = kubectl(cluster, "get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def items(cluster: ControlPlane, kind: str, namespace: str) -> list[dict[str, Any]]:
    proc = kubectl(cluster, "get", kind, "-n", namespace, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["items"]  # type: ignore[no-any-return]


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def workload_of(cluster: ControlPlane, job: str, namespace: str) -> dict[str, Any] | None:
    return next((w for w in items(cluster, "workloads.kueue.x-k8s.io", namespace)
                 if any(r.get("name") == job for r in w["metadata"].get("ownerReferences") or [])), None)


def set_config(cluster: ControlPlane, text: str) -> None:
    apply(cluster, {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
                    "data": {keys.CONFIGMAP_KEY: text}})


KUEUE_CONFIG = f"defaults:\n  mode: kueue\n  queueName: {LOCAL_QUEUE}\n"


@pytest.fixture(scope="module")
def stack(cluster: ControlPlane) -> Iterator[LocalWebhook]:
    """raygate's webhook with every opted-in namespace in kueue mode, Kueue, and a ClusterQueue."""
    kubectl(cluster, "create", "namespace", keys.SYSTEM_NAMESPACE)  # AlreadyExists is fine
    set_config(cluster, KUEUE_CONFIG)
    hook = start_webhook(cluster, name=HOOK)
    start_kueue(cluster, reinvocation="IfNeeded")
    apply(
        cluster,
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "gpu-cq"},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu", "memory", GPU],
             "flavors": [{"name": "default-flavor", "resources": [
                 {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"},
                 {"name": GPU, "nominalQuota": str(QUOTA_GPUS)}]}]}]}},
    )
    try:
        yield hook
    finally:
        stop_kueue(cluster)
        stop_webhook(cluster, HOOK)
        for kind, name in (("clusterqueue", "gpu-cq"), ("resourceflavor", "default-flavor")):
            kubectl(cluster, "delete", kind, name, "--ignore-not-found", "--wait=false")
        kubectl(cluster, "delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")


@pytest.fixture
def team(stack: LocalWebhook, cluster: ControlPlane, make_namespace: Callable[..., str]) -> str:
    ns = make_namespace("kq", {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE})
    apply(cluster, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                    "metadata": {"name": LOCAL_QUEUE, "namespace": ns}, "spec": {"clusterQueue": "gpu-cq"}})
    return ns


def test_kueue_suspends_the_job_raygate_labelled_then_admits_the_whole_gang(cluster: ControlPlane, team: str) -> None:
    proc = create(cluster, gpu_job("fits", team).obj())
    assert proc.returncode == 0, proc.stderr
    created = json.loads(proc.stdout)
    # Both webhooks shaped what was stored: raygate's label, then Kueue (called again) suspended it.
    assert created["metadata"]["labels"][keys.KUEUE_QUEUE_LABEL] == LOCAL_QUEUE
    assert created["metadata"]["annotations"][keys.MODE_ANNOTATION] == "kueue"
    assert created["spec"]["suspend"] is True
    assert keys.STATE_LABEL not in created["metadata"]["labels"]  # Kueue, not raygate, holds it

    workload = wait(lambda: (w := workload_of(cluster, "fits", team)) and (c := condition(w, "Admitted"))
                    and c["status"] == "True" and w, 60, "Kueue admitting the job's Workload")
    assigned = {p["name"]: p.get("count") for p in workload["status"]["admission"]["podSetAssignments"]}
    assert assigned.get("gpu") == 2 and "head" in assigned, assigned  # the whole gang, in one admission
    wait(lambda: (j := get(cluster, "rayjob", "fits", team)) and not j["spec"].get("suspend"),
         30, "Kueue unsuspending the admitted job")
    wait(lambda: items(cluster, "rayclusters", team), 60, "KubeRay creating the admitted job's RayCluster")


def test_a_gang_larger_than_the_quota_stays_suspended_with_no_raycluster(cluster: ControlPlane, team: str) -> None:
    proc = create(cluster, gpu_job("too-big", team, gpus_per_worker=QUOTA_GPUS).obj())
    assert proc.returncode == 0, proc.stderr
    workload = wait(lambda: (w := workload_of(cluster, "too-big", team)) and condition(w, "QuotaReserved") and w,
                    60, "Kueue deciding on the job's Workload")
    reserved = condition(workload, "QuotaReserved")
    assert reserved is not None and reserved["status"] == "False", reserved
    assert GPU in reserved["message"], reserved["message"]
    job = get(cluster, "rayjob", "too-big", team)
    assert job is not None and job["spec"]["suspend"] is True
    assert items(cluster, "rayclusters", team) == []
    assert items(cluster, "pods", team) == []


def test_without_reinvocation_raygate_refuses_the_job_kueue_never_suspended(
    cluster: ControlPlane, team: str,
) -> None:
    patch = json.dumps([{"op": "replace", "path": f"/webhooks/{i}/reinvocationPolicy", "value": "Never"}
                        for i in range(2)])
    proc = kubectl(cluster, "patch", "mutatingwebhookconfiguration", MUTATING, "--type=json", "-p", patch)
    assert proc.returncode == 0, proc.stderr
    try:
        proc = create(cluster, gpu_job("unheld", team).obj())
        assert proc.returncode != 0
        for says in ("would start at once", "reinvocationPolicy: IfNeeded"):
            assert says in proc.stderr, proc.stderr
        assert get(cluster, "rayjob", "unheld", team) is None
    finally:
        restore = patch.replace('"Never"', '"IfNeeded"')
        assert kubectl(cluster, "patch", "mutatingwebhookconfiguration", MUTATING, "--type=json",
                       "-p", restore).returncode == 0


def test_a_job_queued_in_kueue_is_still_admitted_by_kueue_after_the_namespace_leaves_kueue_mode(
    cluster: ControlPlane, team: str, stack: LocalWebhook,
) -> None:
    """A mode change strands no job: one Kueue queued stays Kueue's (its raygate.io/mode says kueue), and raygate
    lets Kueue unsuspend it; jobs created after the change are held by raygate."""
    # A queue of its own with room for one 2-GPU job, so other tests' jobs (deleted namespaces are
    # collected asynchronously) cannot take its quota.
    apply(cluster,
          {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"cq-{team}"},
           "spec": {"namespaceSelector": {}, "resourceGroups": [{
               "coveredResources": ["cpu", "memory", GPU], "flavors": [{"name": "default-flavor", "resources": [
                   {"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"},
                   {"name": GPU, "nominalQuota": "2"}]}]}]}},
          {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
           "metadata": {"name": "switch-lq", "namespace": team}, "spec": {"clusterQueue": f"cq-{team}"}})
    own_queue = KUEUE_CONFIG + f"namespaces:\n  {team}:\n    queueName: switch-lq\n"
    set_config(cluster, own_queue)
    stack.wait_config_version(config_version(cluster))
    try:
        assert create(cluster, gpu_job("blocker", team).obj()).returncode == 0
        wait(lambda: (j := get(cluster, "rayjob", "blocker", team)) and not j["spec"].get("suspend"), 60,
             "Kueue admitting the job that takes the whole quota")
        assert create(cluster, gpu_job("queued", team).obj()).returncode == 0
        wait(lambda: (w := workload_of(cluster, "queued", team)) and (c := condition(w, "QuotaReserved"))
             and c["status"] == "False", 60, "Kueue queueing the second job")
        set_config(cluster, own_queue + "    mode: provisioning\n")
        stack.wait_config_version(config_version(cluster))
        after = json.loads(create(cluster, gpu_job("after", team).obj()).stdout)
        assert after["metadata"]["labels"][keys.STATE_LABEL] == "Pending" and after["spec"]["suspend"] is True
        assert kubectl(cluster, "delete", "rayjob", "blocker", "-n", team).returncode == 0
        wait(lambda: (j := get(cluster, "rayjob", "queued", team)) and not j["spec"].get("suspend"), 60,
             "Kueue admitting the queued job after the namespace left kueue mode")
        child = wait(lambda: next((c for c in items(cluster, "rayclusters", team)
                                   if c["metadata"]["labels"].get(keys.ORIGINATED_FROM_NAME_LABEL) == "queued"), None),
                     60, "KubeRay creating the queued job's RayCluster")
        assert child["spec"].get("suspend") is not True  # KubeRay's own cluster of a Kueue job: left alone
    finally:
        set_config(cluster, KUEUE_CONFIG)
        kubectl(cluster, "delete", "clusterqueue", f"cq-{team}", "--ignore-not-found", "--wait=false")


def config_version(cluster: ControlPlane) -> str:
    return kubectl(cluster, "get", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "-o",
                   "jsonpath={.metadata.resourceVersion}").stdout.strip()
