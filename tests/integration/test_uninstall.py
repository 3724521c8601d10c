"""`helm uninstall` with jobs still held, then `raygate release`, on the real API server with the
real KubeRay operator.

raygate is installed with the chart (RBAC, ConfigMap, webhook registrations, Deployments), but its
two components run as local processes: no kubelet runs the Deployments' pods here, and the API
server cannot reach a Service (no endpoints can point at loopback). So the webhook process is
started and the chart's two registrations are pointed at its URL, and the reconciler runs under the
chart's ServiceAccount and RBAC (impersonated). `helm uninstall` then removes what it removes on a
cluster, and the processes are stopped as the Deployments' pods would be.

No autoscaler runs, so a GPU job stays Provisioning (its ProvisioningRequest is never answered): held.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from waiting import wait

from raygate.core import keys
from raygate.core.api import EVENTS, PODS, PODTEMPLATES, RAYCLUSTERS, RAYJOBS, provisioning_requests
from raygate.core.objects import JSON
from raygate.devenv.build import Bundle
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import LocalWebhook, start_reconciler, start_webhook, stop_webhook
from raygate.kube.client import ApiError, Kube

pytestmark = pytest.mark.integration

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"rg-uninstall-{k}-{SUFFIX}" for k in ("release", "delete", "kueue", "gated")}
PR = provisioning_requests("v1")
CONFIG = {
    "defaults": {"mode": "provisioning"},
    # A queue each, so that both held jobs have their request out at once (no autoscaler answers here).
    "queues": {"default": {}, "release": {}, "delete": {}},
    "namespaces": {NS["kueue"]: {"mode": "kueue", "queueName": "team-queue"},
                   NS["release"]: {"queue": "release"}, NS["delete"]: {"queue": "delete"}},
}
WEBHOOK = "uninstall-webhook"
RECONCILER = "uninstall-reconciler"
ROOT = Path(__file__).resolve().parents[2]
RELEASE = "raygate"


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
    bundle: Bundle
    helm_home: Path

    def helm(self, *args: str) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig),
               **{f"HELM_{d}_HOME": str(self.helm_home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}
        proc = subprocess.run([str(self.bundle.binary("helm")), *args], capture_output=True, text=True, env=env,
                              check=False)
        assert proc.returncode == 0, f"helm {' '.join(args)} failed: {proc.stderr}"
        return proc.stdout

    def point_registrations_at(self, hook: LocalWebhook) -> None:
        """The chart's registrations, sent to the local webhook process instead of the Service."""
        ca = base64.b64encode(hook.ca_file.read_bytes()).decode()
        for kind, name in (("mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG),
                           ("validatingwebhookconfiguration", keys.VALIDATING_WEBHOOK_CONFIG)):
            hooks = json.loads(self.cluster.kubectl("get", kind, name, "-o", "json"))["webhooks"]
            ops = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                    "value": {"url": hook.url + h["clientConfig"]["service"]["path"], "caBundle": ca}}
                   for i, h in enumerate(hooks)]
            self.cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(ops))

    def job(self, ns: str, name: str = "train") -> JSON:
        return self.kube.get(RAYJOBS, name, ns)

    def children(self, ns: str) -> list[str]:
        """raygate's ProvisioningRequests and PodTemplates in `ns`, as kind/name."""
        selector = keys.MANAGED_SELECTOR
        return [f"{res.kind}/{o['metadata']['name']}" for res in (PR, PODTEMPLATES)
                for o in self.kube.list(res, ns, labelSelector=selector).get("items") or []]

    def release(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raygate", "release", "--kubeconfig",
                               str(self.cluster.kubeconfig), *args], capture_output=True, text=True, check=False)


def gated_pods(env: Env, ns: str) -> list[str]:
    return [p["metadata"]["name"] for p in env.kube.list(PODS, ns).get("items") or []
            if any(g.get("name") == keys.CAPACITY_GATE for g in p["spec"].get("schedulingGates") or [])]


def raygate_keys(obj: JSON) -> list[str]:
    meta = obj["metadata"]
    return [k for k in [*(meta.get("labels") or {}), *(meta.get("annotations") or {})]
            if k.startswith(f"{keys.DOMAIN}/")]


def held(obj: JSON) -> bool:
    return bool(obj["spec"].get("suspend")) and (obj["metadata"].get("labels") or {}).get(keys.STATE_LABEL) in (
        keys.State.PENDING, keys.State.PROVISIONING)


def _namespace_absent(cluster: ControlPlane) -> bool:
    return not cluster.kubectl("get", "namespace", keys.SYSTEM_NAMESPACE, "--ignore-not-found", "-o", "name").strip()


@pytest.fixture(scope="module")
def env(cluster: ControlPlane, bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    def clean() -> None:  # other modules' local runs leave RBAC and the namespace, which Helm would not adopt
        cluster.kubectl("delete", "-k", str(ROOT / "config" / "default"), "--ignore-not-found", "--wait=false")
        wait(lambda: _namespace_absent(cluster), 120, f"namespace {keys.SYSTEM_NAMESPACE} to be deleted")

    clean()
    kube = Kube.connect(str(cluster.kubeconfig), user_agent="raygate-test")
    for ns in NS.values():
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    try:
        yield Env(cluster, kube, bundle, tmp_path_factory.mktemp("helm"))
    finally:
        cluster.stop_process(RECONCILER)
        stop_webhook(cluster, WEBHOOK)
        for ns in NS.values():
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        clean()


def test_held_jobs_survive_uninstall_suspended_and_release_frees_or_deletes_them(env: Env) -> None:
    # --- installed with the chart: two held jobs and one Kueue owns ------------------------------
    env.cluster.kubectl("apply", "-f", str(ROOT / "config" / "base" / "namespace.yaml"))
    env.helm("install", RELEASE, str(ROOT / "charts" / "raygate"), "--namespace", keys.SYSTEM_NAMESPACE,
             "--set-json", f"config={json.dumps(CONFIG)}")
    env.point_registrations_at(start_webhook(env.cluster, name=WEBHOOK, register=False))
    start_reconciler(env.cluster, name=RECONCILER)
    for key in ("release", "delete"):
        env.kube.create(RAYJOBS, rayjob("train"), NS[key])
    env.kube.create(RAYJOBS, rayjob("train", suspend=True), NS["kueue"])
    for key in ("release", "delete"):
        wait(lambda key=key: env.job(NS[key])["metadata"].get("labels", {}).get(keys.STATE_LABEL)  # type: ignore[misc]
             == keys.State.PROVISIONING and len(env.children(NS[key])) == 2, 60,
             f"the job in {NS[key]} held Provisioning with its request and template")
    # An admitted RayCluster scaled up: its new GPU pods wait gated (no autoscaler answers here).
    elastic = rayjob("elastic")["spec"]["rayClusterSpec"]
    elastic["workerGroupSpecs"][0]["replicas"] = 0
    env.kube.create(RAYCLUSTERS, {"metadata": {"name": "elastic"}, "spec": elastic}, NS["gated"])
    wait(lambda: env.kube.get(RAYCLUSTERS, "elastic", NS["gated"])["metadata"].get("labels", {}).get(
        keys.STATE_LABEL) == keys.State.ADMITTED, 60, "the RayCluster admitted with nothing to book")
    env.kube.patch(RAYCLUSTERS, "elastic", [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                             "value": 2}], NS["gated"], content_type="application/json-patch+json")
    wait(lambda: len(gated_pods(env, NS["gated"])) == 2, 60, "its 2 new GPU pods, born gated")
    kueue_job = env.job(NS["kueue"])
    assert kueue_job["metadata"]["annotations"][keys.MODE_ANNOTATION] == "kueue"
    assert kueue_job["spec"]["suspend"] is True

    refused = env.release("-n", NS["release"], "--yes")
    assert refused.returncode == 1
    assert "raygate is still installed" in refused.stderr
    assert f"MutatingWebhookConfiguration {keys.MUTATING_WEBHOOK_CONFIG} is registered" in refused.stderr
    assert held(env.job(NS["release"]))

    # --- helm uninstall: registrations, RBAC, ConfigMap and Deployments go; their pods stop --------
    env.helm("uninstall", RELEASE, "--namespace", keys.SYSTEM_NAMESPACE, "--wait")
    assert not env.cluster.kubectl("get", "mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG,
                                   "--ignore-not-found", "-o", "name").strip()
    # Its RBAC is gone, so the stopping reconciler cannot release its Lease, as on a cluster: release
    # says so, and goes ahead once the Lease has expired.
    env.cluster.stop_process(RECONCILER)
    env.cluster.stop_process(WEBHOOK)
    lingering = env.release("-n", NS["release"])
    if lingering.returncode:
        assert "holds Lease" in lingering.stderr and "run this again then" in lingering.stderr, lingering.stderr
    wait(lambda: env.release("-n", NS["release"]).returncode == 0, 60, "the reconciler's Lease to expire",
         interval=1)

    # As docs/install.md says: still suspended, raygate's label and annotations kept, the children kept,
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
    after_dry = env.job(NS["release"])
    assert held(after_dry) and after_dry["metadata"]["annotations"] == before["release"]["metadata"]["annotations"]
    assert len(env.children(NS["release"])) == 2

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

    # --- gated pods: the dry run lists them, --yes lifts raygate's gate --------------------------------
    waiting = gated_pods(env, NS["gated"])
    listed = env.release("-n", NS["gated"])
    assert listed.returncode == 0, listed.stderr
    assert all(f"pod/{name}: gated by raygate: lift the gate" in listed.stdout for name in waiting), listed.stdout
    assert sorted(gated_pods(env, NS["gated"])) == sorted(waiting)
    lifted = env.release("-n", NS["gated"], "--yes")
    assert lifted.returncode == 0, lifted.stdout + lifted.stderr
    assert gated_pods(env, NS["gated"]) == []
    assert all(f"lifted raygate's gate from pod/{name}" in lifted.stdout for name in waiting), lifted.stdout

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
