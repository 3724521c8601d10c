"""The admission webhook on a real API server: served by gunicorn over TLS, registered through real
Mutating- and ValidatingWebhookConfigurations (url + caBundle), driven with kubectl as users do.

No reconciler runs here: these tests show what the webhook alone guarantees.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from builders import RayJob
from waiting import consistently, wait

from raygate.core import keys
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import LocalWebhook, start_webhook, stop_webhook

pytestmark = pytest.mark.integration

HOOK = "raygate-webhook-it"
OPT_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}
RECONCILER = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
BASE_CONFIG = "defaults:\n  mode: provisioning\n"


def kubectl(cluster: ControlPlane, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with stdout and stderr kept: refusals arrive on stderr."""
    return subprocess.run(
        [str(cluster.bundle.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=input_text, capture_output=True, text=True, check=False, timeout=60,
    )


def create(cluster: ControlPlane, obj: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
    return kubectl(cluster, "create", "-o", "json", *flags, "-f", "-", input_text=json.dumps(obj))


def get(cluster: ControlPlane, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    proc = kubectl(cluster, "get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


class Config:
    """ConfigMap raygate-config, applied and waited for: the webhook serves the version on /readyz."""

    def __init__(self, cluster: ControlPlane, hook: LocalWebhook | None = None) -> None:
        self.cluster, self.hook = cluster, hook

    def apply(self, text: str, *, wait: bool = True) -> str:
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
              "data": {keys.CONFIGMAP_KEY: text}}
        proc = kubectl(self.cluster, "apply", "-o", "json", "-f", "-", input_text=json.dumps(cm))
        assert proc.returncode == 0, proc.stderr
        version = str(json.loads(proc.stdout)["metadata"]["resourceVersion"])
        if wait and self.hook is not None:
            self.hook.wait_config_version(version)
        return version


@pytest.fixture(scope="module")
def hook(cluster: ControlPlane) -> Iterator[LocalWebhook]:
    kubectl(cluster, "create", "namespace", keys.SYSTEM_NAMESPACE)  # AlreadyExists is fine
    Config(cluster).apply(BASE_CONFIG, wait=False)
    webhook = start_webhook(cluster, name=HOOK)
    try:
        yield webhook
    finally:
        stop_webhook(cluster, HOOK)
        kubectl(cluster, "delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")


@pytest.fixture
def config(cluster: ControlPlane, hook: LocalWebhook) -> Iterator[Config]:
    """Change the policy in a test; the base policy is back (and served) afterwards."""
    cfg = Config(cluster, hook)
    yield cfg
    cfg.apply(BASE_CONFIG)


@pytest.fixture
def opted_in(hook: LocalWebhook, make_namespace: Callable[..., str]) -> str:
    return make_namespace("rg", OPT_IN)


def test_create_in_opted_in_namespace_comes_back_suspended_and_labelled(cluster: ControlPlane, opted_in: str) -> None:
    proc = create(cluster, RayJob("train", opted_in).obj())
    assert proc.returncode == 0, proc.stderr
    for obj in (json.loads(proc.stdout), get(cluster, "rayjob", "train", opted_in)):
        assert obj is not None
        assert obj["spec"]["suspend"] is True
        assert labels(obj)[keys.STATE_LABEL] == "Pending"
        assert obj["metadata"]["annotations"][keys.MODE_ANNOTATION] == "provisioning"
        assert "suspend" not in obj["spec"]["rayClusterSpec"]  # KubeRay's field, never raygate's


def test_create_in_another_namespace_is_untouched(
    cluster: ControlPlane, hook: LocalWebhook, make_namespace: Callable[..., str],
) -> None:
    ns = make_namespace("plain")
    proc = create(cluster, RayJob("train", ns).suspend(False).obj())
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["spec"]["suspend"] is False
    assert keys.STATE_LABEL not in labels(obj)
    assert keys.MODE_ANNOTATION not in (obj["metadata"].get("annotations") or {})


def test_refused_manifest_fails_kubectl_create_with_the_message(cluster: ControlPlane, opted_in: str) -> None:
    proc = create(cluster, RayJob("train", opted_in).shutdown_after_finish(False).obj())
    assert proc.returncode != 0
    assert 'admission webhook "mutate.raygate.io" denied the request' in proc.stderr
    assert "Add `shutdownAfterJobFinishes: true` to spec" in proc.stderr
    assert get(cluster, "rayjob", "train", opted_in) is None


def test_dry_run_server_returns_the_same_result_and_creates_nothing(cluster: ControlPlane, opted_in: str) -> None:
    dry = create(cluster, RayJob("train", opted_in).obj(), "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    obj = json.loads(dry.stdout)
    assert obj["spec"]["suspend"] is True and labels(obj)[keys.STATE_LABEL] == "Pending"
    assert get(cluster, "rayjob", "train", opted_in) is None

    refused = create(cluster, RayJob("bad", opted_in).shutdown_after_finish(False).obj(), "--dry-run=server")
    assert refused.returncode != 0 and "shutdownAfterJobFinishes must be true" in refused.stderr

    real = create(cluster, RayJob("train", opted_in).obj())
    assert real.returncode == 0, real.stderr
    stored = json.loads(real.stdout)
    assert (stored["spec"], labels(stored)) == (obj["spec"], labels(obj))


def _grant_rayjob_edit(cluster: ControlPlane, namespace: str) -> None:
    rbac = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "rayjob-editor", "namespace": namespace},
         "rules": [{"apiGroups": ["ray.io"], "resources": ["rayjobs"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "rayjob-editors", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rayjob-editor"},
         "subjects": [
             {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
             {"kind": "ServiceAccount", "name": keys.RECONCILER_SERVICE_ACCOUNT, "namespace": keys.SYSTEM_NAMESPACE},
         ]},
    ]
    proc = kubectl(cluster, "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                       "items": rbac}))
    assert proc.returncode == 0, proc.stderr


def test_update_guard_denies_a_user_unsuspending_a_held_job_and_allows_raygate(
    cluster: ControlPlane, opted_in: str,
) -> None:
    _grant_rayjob_edit(cluster, opted_in)
    assert create(cluster, RayJob("train", opted_in).obj()).returncode == 0

    def patch(user: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return kubectl(cluster, "--as", user, "patch", "rayjob", "train", "-n", opted_in, "--type", "merge",
                       "-p", json.dumps(body))

    unsuspend = patch("alice", {"spec": {"suspend": False}})
    assert unsuspend.returncode != 0
    assert 'admission webhook "validate.raygate.io" denied the request' in unsuspend.stderr
    assert "waits for capacity" in unsuspend.stderr and "unsuspend it" in unsuspend.stderr
    assert f"kubectl describe rayjob train -n {opted_in}" in unsuspend.stderr

    relabel = patch("alice", {"metadata": {"labels": {keys.STATE_LABEL: "Admitted"}}})
    assert relabel.returncode != 0 and f"change label {keys.STATE_LABEL}" in relabel.stderr

    # alice may still edit what raygate does not guard: RBAC, not the webhook, decides that.
    assert patch("alice", {"metadata": {"labels": {"team": "ml"}}}).returncode == 0
    held = get(cluster, "rayjob", "train", opted_in)
    assert held is not None and held["spec"]["suspend"] is True

    admit = patch(RECONCILER, {"spec": {"suspend": False}, "metadata": {"labels": {keys.STATE_LABEL: "Admitted"}}})
    assert admit.returncode == 0, admit.stderr
    admitted = get(cluster, "rayjob", "train", opted_in)
    assert admitted is not None and admitted["spec"]["suspend"] is False
    assert labels(admitted)[keys.STATE_LABEL] == "Admitted"


def _dry_run_labels(cluster: ControlPlane, namespace: str) -> dict[str, str]:
    # Created suspended, as Kueue's own webhook would leave it in kueue mode (see the test below).
    proc = create(cluster, RayJob("probe", namespace).suspend(True).obj(), "--dry-run=server")
    assert proc.returncode == 0, proc.stderr
    return labels(json.loads(proc.stdout))


def test_config_change_takes_effect_within_5s_without_restart(
    cluster: ControlPlane, config: Config, opted_in: str,
) -> None:
    assert keys.KUEUE_QUEUE_LABEL not in _dry_run_labels(cluster, opted_in)
    pid = cluster.load_state().pids[HOOK]  # type: ignore[union-attr]
    config.apply(f"namespaces:\n  {opted_in}:\n    mode: kueue\n    queueName: team-lq\n", wait=False)
    started = time.monotonic()
    got = wait(lambda: _dry_run_labels(cluster, opted_in).get(keys.KUEUE_QUEUE_LABEL), 5,
                     "the kueue policy from the new ConfigMap")
    elapsed = time.monotonic() - started
    assert got == "team-lq" and elapsed < 5
    assert keys.STATE_LABEL not in _dry_run_labels(cluster, opted_in)  # kueue mode: raygate only labels
    assert cluster.load_state().pids[HOOK] == pid  # type: ignore[union-attr] # same process: no restart


def test_broken_config_keeps_the_old_policy_and_records_an_event(
    cluster: ControlPlane, config: Config, opted_in: str,
) -> None:
    config.apply(f"namespaces:\n  {opted_in}:\n    mode: kueue\n    queueName: team-lq\n")
    broken = config.apply("defaults:\n  mode: bogus\n  queueName: [1]\nsurprise: true\n")  # served = handled
    assert _dry_run_labels(cluster, opted_in).get(keys.KUEUE_QUEUE_LABEL) == "team-lq"

    def invalid_config_events() -> list[dict[str, Any]]:
        proc = kubectl(cluster, "get", "events", "-n", keys.SYSTEM_NAMESPACE, "-o", "json",
                       "--field-selector", f"involvedObject.name={keys.CONFIGMAP_NAME},reason=InvalidConfig")
        assert proc.returncode == 0, proc.stderr
        items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
        return [e for e in items if e["involvedObject"].get("resourceVersion") == broken]

    event = wait(invalid_config_events, 10, "an InvalidConfig Event on the ConfigMap")[0]
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "ConfigMap"
    for field in ("defaults.mode", "defaults.queueName", "surprise"):
        assert field in event["message"], event["message"]


def test_native_mode_is_refused_at_config_load_on_a_cluster_without_gang_scheduling_and_the_last_config_stays(
    cluster: ControlPlane, config: Config, opted_in: str,
) -> None:
    """The shared control plane runs without Kubernetes' gang scheduling (test_native_scheduling.py runs one
    with it, where the same config is taken): the webhook found neither scheduling.k8s.io version at start."""
    config.apply(f"namespaces:\n  {opted_in}:\n    mode: kueue\n    queueName: team-lq\n")
    refused = config.apply(f"namespaces:\n  {opted_in}:\n    mode: native\n")  # served = handled
    assert _dry_run_labels(cluster, opted_in).get(keys.KUEUE_QUEUE_LABEL) == "team-lq", "the last good config"

    def events() -> list[dict[str, Any]]:
        proc = kubectl(cluster, "get", "events", "-n", keys.SYSTEM_NAMESPACE, "-o", "json",
                       "--field-selector", f"involvedObject.name={keys.CONFIGMAP_NAME},reason=InvalidConfig")
        assert proc.returncode == 0, proc.stderr
        return [e for e in json.loads(proc.stdout)["items"] if e["involvedObject"].get("resourceVersion") == refused]

    message = wait(events, 10, "an InvalidConfig Event on the ConfigMap")[0]["message"]
    print(f"\n{message}")
    assert f"namespaces.{opted_in}.mode: native mode needs Kubernetes' gang scheduling" in message
    for flag in (*keys.GANG_APISERVER_FLAGS, *keys.GANG_CONTROLLER_MANAGER_FLAGS, *keys.GANG_SCHEDULER_FLAGS):
        assert flag in message


def test_kueue_mode_refuses_a_job_nothing_suspended_and_admits_one_created_suspended(
    cluster: ControlPlane, config: Config, opted_in: str,
) -> None:
    """No Kueue runs here, just as if its webhook had run before raygate's without being re-invoked."""
    config.apply(f"namespaces:\n  {opted_in}:\n    mode: kueue\n    queueName: team-lq\n")
    proc = create(cluster, RayJob("unheld", opted_in).obj())
    assert proc.returncode != 0
    for says in ("would start at once", "spec.suspend: true", "reinvocationPolicy: IfNeeded"):
        assert says in proc.stderr, proc.stderr
    assert get(cluster, "rayjob", "unheld", opted_in) is None
    proc = create(cluster, RayJob("held", opted_in).suspend(True).obj())
    assert proc.returncode == 0, proc.stderr
    job = get(cluster, "rayjob", "held", opted_in)
    assert job is not None and job["spec"]["suspend"] is True
    assert labels(job).get(keys.KUEUE_QUEUE_LABEL) == "team-lq" and keys.STATE_LABEL not in labels(job)


@pytest.mark.kuberay
def test_held_rayjob_gets_no_raycluster_and_no_pods_from_kuberay(
    cluster: ControlPlane, opted_in: str, make_namespace: Callable[..., str],
) -> None:
    # The same manifest in a namespace raygate does not watch: KubeRay starts it at once. This shows
    # the operator is alive, so the absence below is the hold's doing.
    control = make_namespace("plain")
    assert create(cluster, RayJob("train", control).suspend(False).obj()).returncode == 0
    assert create(cluster, RayJob("train", opted_in).obj()).returncode == 0

    def items(kind: str, namespace: str) -> list[Any]:
        proc = kubectl(cluster, "get", kind, "-n", namespace, "-o", "json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["items"]  # type: ignore[no-any-return]

    wait(lambda: items("rayclusters", control) and items("pods", control), 60,
               "KubeRay creating the unheld job's cluster and pods")

    def deployment_status() -> str:
        obj = get(cluster, "rayjob", "train", opted_in)
        return str(((obj or {}).get("status") or {}).get("jobDeploymentStatus") or "")

    # KubeRay saw the held job and accepted it as suspended (not ValidationFailed) ...
    assert wait(deployment_status, 30, "KubeRay marking the held job") == "Suspended"
    # ... and creates nothing for it, however long we look.
    consistently(lambda: items("rayclusters", opted_in) == [] and items("pods", opted_in) == []
                 and deployment_status() == "Suspended", 5, "no RayCluster and no pod for the held job",
                 explain=lambda: f"rayclusters {items('rayclusters', opted_in)}, status {deployment_status()}")
