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
import re
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
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
# What the Helm chart's controller_manager_config sets that changes how the controller runs (its
# ports, certificates and framework list are about the install, not the controller's speed).
CHART_KEYS = ("clientConnection", "controller", "leaderElection")


@dataclass(frozen=True)
class LocalKueue:
    url: str  # https://127.0.0.1:<port> of its webhook server
    ca_file: Path
    config: dict[str, Any]  # the Configuration it was started with


def _module(work: Path) -> Path:
    return download_module(v.KUEUE_MODULE, v.KUEUE_VERSION, work)


def chart_settings(work: Path) -> dict[str, Any]:
    """The controller settings Kueue's own Helm chart ships (charts/kueue/values.yaml,
    managerConfig.controllerManagerConfigYaml in the pinned module): client QPS and burst, per-kind
    reconcile concurrency, leader election."""
    work.mkdir(parents=True, exist_ok=True)
    values = yaml.safe_load((_module(work) / "charts/kueue/values.yaml").read_text())
    shipped = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    return {k: shipped[k] for k in CHART_KEYS if k in shipped}


def client_defaults(work: Path) -> dict[str, float]:
    """Kueue's built-in client QPS and burst, used when the Configuration sets none."""
    text = (_module(work) / "apis/config/v1beta2/defaults.go").read_text()
    found = dict(re.findall(r"DefaultClientConnection(QPS|Burst)\s+\w+\s*=\s*([0-9.]+)", text))
    if set(found) != {"QPS", "Burst"}:
        raise RaygateError(f"Kueue {v.KUEUE_VERSION}: no client QPS/burst defaults in apis/config/v1beta2/defaults.go")
    return {"qps": float(found["QPS"]), "burst": float(found["Burst"])}


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


def start_kueue(cp: ControlPlane, *, reinvocation: str = "IfNeeded",
                settings: Mapping[str, Any] | None = None) -> LocalKueue:
    """Run Kueue with the RayJob and RayCluster integrations and register its Ray webhooks.

    `settings`: top-level Configuration fields to set on top (e.g. `chart_settings()`)."""
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
        **(settings or {}),
    }
    if config["leaderElection"].get("leaderElect"):
        # In a cluster the Lease goes to the pod's namespace; out of one it must be named.
        config["leaderElection"] = {"resourceNamespace": NAMESPACE, **config["leaderElection"]}
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
    manifests = _module(work) / "config/components/webhook/manifests.yaml"
    for source in yaml.safe_load_all(manifests.read_text()):
        if not source or source.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        mutating = source["kind"] == "MutatingWebhookConfiguration"
        obj = _ray_webhooks(source, url, ca_bundle, reinvocation if mutating else None)
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(obj))
    return LocalKueue(url, ca_file, config)


def stop_kueue(cp: ControlPlane) -> None:
    """Unregister first: a registered webhook with failurePolicy Fail and no server refuses every job."""
    cp.kubectl("delete", "mutatingwebhookconfiguration", MUTATING, "--ignore-not-found")
    cp.kubectl("delete", "validatingwebhookconfiguration", VALIDATING, "--ignore-not-found")
    cp.stop_process(PROCESS)
