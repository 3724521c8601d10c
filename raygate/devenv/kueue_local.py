"""The real Kueue controller on the local control plane, with its RayJob and RayCluster webhooks.

The webhooks are registered from Kueue's own manifests in the pinned module, under the names
Kueue's install gives them (`kueue-...-webhook-configuration`, which sort before raygate's), but
reached by URL on loopback instead of through a Service. `reinvocation` sets the one knob raygate
cares about: whether the API server calls Kueue's mutating webhook again after raygate's.
"""

from __future__ import annotations

import base64
import copy
import json
import urllib.request
from typing import Any

import yaml

from raygate.core.errors import RaygateError
from raygate.devenv import versions as v
from raygate.devenv.build import KUEUE_METRICS_CERT_DIR_ENV, download_module
from raygate.devenv.controlplane import ControlPlane, free_port
from raygate.devenv.raygate_local import write_tls

NAMESPACE = "kueue-system"
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
RAY_RESOURCES = frozenset({"rayjobs", "rayclusters"})
PROCESS = "kueue"


def _ray_webhooks(source: dict[str, Any], url: str, ca_bundle: str, reinvocation: str | None) -> dict[str, Any]:
    """Kueue's webhook configuration `source` cut down to its RayJob and RayCluster webhooks, by URL."""
    kind = source["kind"]
    hooks = []
    for hook in source["webhooks"]:
        if not {r for rule in hook["rules"] for r in rule["resources"]} & RAY_RESOURCES:
            continue
        h = copy.deepcopy(hook)
        h["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"], "caBundle": ca_bundle}
        if reinvocation:
            h["reinvocationPolicy"] = reinvocation
        hooks.append(h)
    if len(hooks) != len(RAY_RESOURCES):  # one per kind
        raise RaygateError(f"Kueue {v.KUEUE_VERSION}'s {kind} has no webhooks for {sorted(RAY_RESOURCES)}")
    name = MUTATING if kind == "MutatingWebhookConfiguration" else VALIDATING
    return {"apiVersion": source["apiVersion"], "kind": kind, "metadata": {"name": name}, "webhooks": hooks}


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def start_kueue(cp: ControlPlane, *, reinvocation: str = "IfNeeded") -> None:
    """Run Kueue with the RayJob and RayCluster integrations and register its Ray webhooks."""
    state = cp.load_state()
    if state is None:
        raise RaygateError("start the control plane before Kueue")
    if not cp.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        cp.kubectl("create", "namespace", NAMESPACE)
    work = cp.workdir / PROCESS
    ca_file, _, _ = write_tls(work)  # tls.crt and tls.key: the names Kueue's webhook server reads
    webhook_port, health_port = free_port(), free_port()
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(work)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["ray.io/rayjob", "ray.io/raycluster"]},
    }
    config_file = work / "config.yaml"
    config_file.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    cp.spawn(
        state, PROCESS,
        [str(cp.bundle.binary("kueue")), f"--config={config_file}", "--feature-gates=VisibilityOnDemand=false"],
        env={"KUBECONFIG": str(cp.kubeconfig), KUEUE_METRICS_CERT_DIR_ENV: str(work)},
    )
    cp.wait_for(state, PROCESS, lambda: _ready(health_port), 60)
    ca_bundle = base64.b64encode(ca_file.read_bytes()).decode()
    url = f"https://127.0.0.1:{webhook_port}"
    manifests = download_module(v.KUEUE_MODULE, v.KUEUE_VERSION, work) / "config/components/webhook/manifests.yaml"
    for source in yaml.safe_load_all(manifests.read_text()):
        if not source or source.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        mutating = source["kind"] == "MutatingWebhookConfiguration"
        obj = _ray_webhooks(source, url, ca_bundle, reinvocation if mutating else None)
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(obj))


def stop_kueue(cp: ControlPlane) -> None:
    """Unregister first: a registered webhook with failurePolicy Fail and no server refuses every job."""
    cp.kubectl("delete", "mutatingwebhookconfiguration", MUTATING, "--ignore-not-found")
    cp.kubectl("delete", "validatingwebhookconfiguration", VALIDATING, "--ignore-not-found")
    cp.stop_process(PROCESS)
