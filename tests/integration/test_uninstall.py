"""Uninstalling raygate with jobs still held, then `raygate release`, on the real API server with the
real KubeRay operator.

raygate runs here as local processes (webhook registered by URL, reconciler under its service account),
as in the other integration tests: the chart's Deployments cannot run on this control plane (no
kubelet), and test_chart.py already shows that `helm uninstall` removes every object the chart
installed. What an uninstall takes away from a held job is the same either way, and is what this test
takes away: the two webhook registrations and the reconciler.

No autoscaler runs, so a GPU job stays Provisioning (its ProvisioningRequest is never answered): held.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from waiting import wait

from raygate import keys
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook, stop_webhook
from raygate.kube import EVENTS, JSON, LEASES, PODTEMPLATES, RAYCLUSTERS, RAYJOBS, ApiError, Kube, provisioning_requests

pytestmark = pytest.mark.integration

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"rg-uninstall-{k}-{SUFFIX}" for k in ("release", "delete", "kueue")}
PR = provisioning_requests("v1")
CONFIG = {
    "defaults": {"mode": "provisioning"},
    "namespaces": {NS["kueue"]: {"mode": "kueue", "queueName": "team-queue"}},
}
WEBHOOK = "uninstall-webhook"
RECONCILER = "uninstall-reconciler"


def rayjob(name: str, *, suspend: bool | None = None) -> JSON:
    cpu = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    gpu = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}
    spec: JSON = {
        "entrypoint": "python -c 'print(1)'",
        "shutdownAfterJobFinishes": True,
        "rayClusterSpec": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.9.0", "resources": cpu}]}}},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "minReplicas": 0, "maxReplicas": 4,
                                  "rayStartParams": {}, "template": {"spec": {"containers": [
                                      {"name": "ray-worker", "image": "rayproject/ray:2.9.0", "resources": gpu}]}}}],
        },
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name}, "spec": spec}


@dataclass
class Env:
    cluster: ControlPlane
    kube: Kube

    def job(self, ns: str, name: str = "train") -> JSON:
        return self.kube.get(RAYJOBS, name, ns)

    def children(self, ns: str) -> list[str]:
        """raygate's ProvisioningRequests and PodTemplates in `ns`, as kind/name."""
        selector = f"{keys.MANAGED_BY_LABEL}={keys.MANAGED_BY_VALUE}"
        return [f"{res.kind}/{o['metadata']['name']}" for res in (PR, PODTEMPLATES)
                for o in self.kube.list(res, ns, labelSelector=selector).get("items") or []]

    def release(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raygate", "release", "--kubeconfig",
                               str(self.cluster.kubeconfig), *args], capture_output=True, text=True, check=False)


def raygate_keys(obj: JSON) -> list[str]:
    meta = obj["metadata"]
    return [k for k in [*(meta.get("labels") or {}), *(meta.get("annotations") or {})]
            if k.startswith(f"{keys.DOMAIN}/")]


def held(obj: JSON) -> bool:
    return bool(obj["spec"].get("suspend")) and (obj["metadata"].get("labels") or {}).get(keys.STATE_LABEL) in (
        keys.State.PENDING, keys.State.PROVISIONING)


@pytest.fixture(scope="module")
def env(cluster: ControlPlane) -> Iterator[Env]:
    kube = Kube.connect(str(cluster.kubeconfig), user_agent="raygate-test")
    cluster.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
          "data": {keys.CONFIGMAP_KEY: yaml.safe_dump(CONFIG)}}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(cm))
    for ns in NS.values():
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    kube.delete(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)  # a Lease left by another module's reconciler
    try:
        yield Env(cluster, kube)
    finally:
        cluster.stop_process(RECONCILER)
        stop_webhook(cluster, WEBHOOK)
        cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
        for ns in NS.values():
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_held_jobs_survive_uninstall_suspended_and_release_frees_or_deletes_them(env: Env) -> None:
    # --- installed: two held jobs and one Kueue owns ---------------------------------------------
    start_webhook(env.cluster, name=WEBHOOK)
    start_reconciler(env.cluster, name=RECONCILER)
    for key in ("release", "delete"):
        env.kube.create(RAYJOBS, rayjob("train"), NS[key])
    env.kube.create(RAYJOBS, rayjob("train", suspend=True), NS["kueue"])
    for key in ("release", "delete"):
        wait(lambda key=key: env.job(NS[key])["metadata"].get("labels", {}).get(keys.STATE_LABEL)  # type: ignore[misc]
             == keys.State.PROVISIONING and len(env.children(NS[key])) == 2, 60,
             f"the job in {NS[key]} held Provisioning with its request and template")
    kueue_job = env.job(NS["kueue"])
    assert kueue_job["metadata"]["annotations"][keys.MODE_ANNOTATION] == "kueue"
    assert kueue_job["spec"]["suspend"] is True

    refused = env.release("-n", NS["release"], "--yes")
    assert refused.returncode == 1
    assert "raygate is still installed" in refused.stderr
    assert f"MutatingWebhookConfiguration {keys.MUTATING_WEBHOOK_CONFIG} is registered" in refused.stderr
    assert held(env.job(NS["release"]))

    # --- uninstalled: what helm uninstall takes away ---------------------------------------------
    env.cluster.stop_process(RECONCILER)  # a clean stop releases the leader Lease
    stop_webhook(env.cluster, WEBHOOK)

    # As the README says: still suspended, raygate's label and annotations kept, the children kept,
    # and KubeRay never made a cluster for it. Nothing is left to unsuspend it.
    before = {key: env.job(NS[key]) for key in ("release", "delete")}
    for key, obj in before.items():
        assert held(obj), obj["metadata"]
        assert keys.REQUEST_ANNOTATION in obj["metadata"]["annotations"]
        assert len(env.children(NS[key])) == 2
        assert not env.kube.list(RAYCLUSTERS, NS[key]).get("items")

    # --- the dry run changes nothing -------------------------------------------------------------
    dry = env.release("-n", NS["release"])
    assert dry.returncode == 0, dry.stderr
    assert f"rayjob/train   {keys.State.PROVISIONING}" in dry.stdout
    request = before["release"]["metadata"]["annotations"][keys.REQUEST_ANNOTATION]
    assert f"delete ProvisioningRequest/{request}" in dry.stdout
    assert "Dry run: nothing changed" in dry.stdout
    assert env.job(NS["release"])["metadata"]["resourceVersion"] == before["release"]["metadata"]["resourceVersion"]

    # --- release: unsuspended, raygate's marks and children gone, KubeRay starts it --------------
    done = env.release("-n", NS["release"], "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    released = env.job(NS["release"])
    assert released["spec"]["suspend"] is False
    assert raygate_keys(released) == []
    assert env.children(NS["release"]) == []
    reasons = [e["reason"] for e in env.kube.list(EVENTS, NS["release"]).get("items") or []
               if e["involvedObject"].get("uid") == released["metadata"]["uid"]]
    assert "Released" in reasons
    wait(lambda: env.kube.list(RAYCLUSTERS, NS["release"]).get("items"), 60,
         "KubeRay to create the released job's RayCluster")

    # --- delete: the job and its children are gone -----------------------------------------------
    deleted = env.release("-n", NS["delete"], "--delete", "--yes")
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    assert "deleted rayjob/train" in deleted.stdout
    with pytest.raises(ApiError) as gone:
        env.job(NS["delete"])
    assert gone.value.not_found
    assert env.children(NS["delete"]) == []

    # --- Kueue's job: never touched; nothing left anywhere for release to do ---------------------
    kueue_after = env.job(NS["kueue"])
    assert kueue_after["spec"]["suspend"] is True
    for field in ("labels", "annotations"):
        assert kueue_after["metadata"].get(field) == kueue_job["metadata"].get(field)
    for ns in NS.values():
        again = env.release("-n", ns, "--yes")
        assert again.returncode == 0, again.stderr
        assert "No RayJob or RayCluster held by raygate" in again.stdout, again.stdout
