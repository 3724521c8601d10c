"""raygate itself on the local control plane: the webhook under gunicorn with a generated
certificate, registered by URL, and the reconciler, both as local processes that `down` stops."""

from __future__ import annotations

import datetime as dt
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raygate.core import keys, pki, podgate_policy
from raygate.core.errors import RaygateError
from raygate.devenv.controlplane import ControlPlane, alive, free_port
from raygate.devenv.registration import configurations, pod_gate_policy

DEMO_NAMESPACE = "demo"
# What the image sets for every raygate process (Dockerfile ENV), so the local stack runs as installed.
IMAGE_ENV = {"MALLOC_ARENA_MAX": "2"}


@dataclass
class LocalWebhook:
    url: str
    ca_file: Path

    def readyz(self) -> tuple[int, dict[str, str]]:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=2) as resp:
                return int(resp.status), dict(resp.headers)
        except urllib.error.HTTPError as err:
            return int(err.code), dict(err.headers)
        except (OSError, urllib.error.URLError):
            return 0, {}

    def wait_config_version(self, version: str, timeout: float = 20) -> None:
        """Wait until the webhook serves ConfigMap version `version` (its /readyz says which it has)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, headers = self.readyz()
            if status == 200 and headers.get("X-Raygate-Config-Version") == version:
                return
            time.sleep(0.1)
        raise RaygateError(f"the webhook did not load config version {version} within {timeout:.0f}s")


def write_tls(dir_: Path) -> tuple[Path, Path, Path]:
    dir_.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca("raygate-local-webhook-ca", dt.timedelta(days=30))
    leaf = pki.make_leaf(ca, "raygate-webhook", dt.timedelta(days=30), sans=["127.0.0.1", "localhost"])
    paths = (dir_ / "ca.crt", dir_ / "tls.crt", dir_ / "tls.key")
    for path, data in zip(paths, (ca.cert_pem, leaf.cert_pem, leaf.key_pem), strict=True):
        path.write_bytes(data)
        path.chmod(0o600)
    return paths


def ensure_system_namespace(cp: ControlPlane) -> None:
    if not cp.kubectl("get", "namespace", keys.SYSTEM_NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        cp.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE)


def process_env(source: Path | None) -> dict[str, str]:
    """What a raygate process gets besides os.environ: IMAGE_ENV, and with `source` (another checkout of raygate,
    its root) PYTHONPATH=<source> ahead of anything set, so that checkout's raygate is imported (its raygate/webhook,
    reconciler and certs are symlinks to its own top-level folders). The processes run in the control plane's
    workdir, so this checkout's folders are not on their path."""
    if source is None:
        return IMAGE_ENV
    return {**IMAGE_ENV, "PYTHONPATH": os.pathsep.join(p for p in (str(source), os.environ.get("PYTHONPATH")) if p)}


# Where a checkout keeps `configurations()`: raygate/devenv since issue 29, the webhook before.
_REGISTRATION_MODULES = ("raygate.devenv.registration", "raygate.webhook.registration")
_PRINT_REGISTRATION = """
import importlib, json, sys
url, ca, policy, modules = sys.argv[1], sys.argv[2].encode(), sys.argv[3], sys.argv[4:]
for module in modules:
    try:
        configurations = importlib.import_module(module).configurations
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        continue
    print(json.dumps(list(configurations(url, ca, policy))))
    break
else:
    sys.exit("no webhook registration module: " + ", ".join(modules))
"""


def registration(url: str, ca_pem: bytes, failure_policy: str, source: Path | None = None) -> list[dict[str, Any]]:
    """The webhook configurations to register for a webhook at `url`: this tree's, or with `source` that checkout's
    own (read in a process that imports it), which names only what its webhook serves."""
    if source is None:
        return list(configurations(url, ca_pem, failure_policy))
    out = subprocess.run([sys.executable, "-c", _PRINT_REGISTRATION, url, ca_pem.decode(), failure_policy,
                          *_REGISTRATION_MODULES], cwd=source, env={**os.environ, **process_env(source)},
                         capture_output=True, text=True, check=False, timeout=60)
    if out.returncode != 0:
        raise RaygateError(f"could not read the webhook registration of {source}: {out.stderr.strip()}")
    configs: list[dict[str, Any]] = json.loads(out.stdout)
    return configs


def start_webhook(cp: ControlPlane, *, workers: int = 1, threads: int = 8, register: bool = True,
                  failure_policy: str = "Fail", name: str = "raygate-webhook",
                  source: Path | None = None, reconciler: Sequence[str] | None = None) -> LocalWebhook:
    """raygate's webhook under gunicorn with a fresh certificate, registered by URL unless `register` is false.
    `source`: run another checkout of raygate (its root), registered as that checkout registers it. `reconciler`:
    run the reconciler in the same process with these arguments (`raygate serve`, one worker; see
    start_reconciler)."""
    state = cp.load_state()
    if state is None:
        raise RaygateError("start the control plane before the webhook")
    ensure_system_namespace(cp)
    ca_file, cert_file, key_file = write_tls(cp.workdir / name)
    port = free_port()
    serving = ["--bind", "127.0.0.1", "--port", str(port), "--tls-cert-file", str(cert_file),
               "--tls-key-file", str(key_file), "--kubeconfig", str(cp.kubeconfig), "--namespace",
               keys.SYSTEM_NAMESPACE, "--threads", str(threads), "--worker-tmp-dir", str(cp.workdir / name)]
    command = (["webhook", *serving, "--workers", str(workers)] if reconciler is None
               else ["serve", *serving, *_reconciler_args(cp, source), *reconciler])
    cp.spawn(state, name, [sys.executable, "-m", "raygate", *command], env=process_env(source))
    hook = LocalWebhook(f"https://127.0.0.1:{port}", ca_file)
    cp.wait_for(state, name, lambda: hook.readyz()[0] == 200, 30)
    if register:
        # This tree's pod gate also runs inside the API server (as config/pod-gate-policy installs it); another
        # checkout's webhook is registered as that checkout registers it, and gates every pod itself.
        policy = list(pod_gate_policy()) if source is None else []
        for obj in [*registration(hook.url, ca_file.read_bytes(), failure_policy, source), *policy]:
            cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(obj))
    return hook


RECONCILER_USER = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
RBAC_DIR = Path("config") / "base"
RECONCILER_RBAC = Path(__file__).resolve().parents[2] / RBAC_DIR / "rbac-reconciler.yaml"
CERTS_RBAC = RECONCILER_RBAC.with_name("rbac-certs.yaml")


def reconciler_rbac(source: Path | None = None) -> tuple[Path, Path]:
    """The install's grants for the reconciler (jobs, and the webhook configurations): this tree's, or those of
    the checkout `source`."""
    if source is None:
        return RECONCILER_RBAC, CERTS_RBAC
    return source / RBAC_DIR / RECONCILER_RBAC.name, source / RBAC_DIR / CERTS_RBAC.name


def unregister_webhook(cp: ControlPlane) -> None:
    for kind, config in (("mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG),
                         ("validatingwebhookconfiguration", keys.VALIDATING_WEBHOOK_CONFIG),
                         ("mutatingadmissionpolicybinding", podgate_policy.POLICY_NAME),
                         ("mutatingadmissionpolicy", podgate_policy.POLICY_NAME)):
        cp.kubectl("delete", kind, config, "--ignore-not-found", check=False)


def stop_webhook(cp: ControlPlane, name: str = "raygate-webhook") -> None:
    """Unregister, then stop: with failurePolicy Fail a registered but stopped webhook would refuse
    every later RayJob in an opted-in namespace."""
    unregister_webhook(cp)
    cp.stop_process(name)


def start_reconciler(cp: ControlPlane, *extra: str, name: str = "raygate-reconciler", impersonate: bool = True,
                     source: Path | None = None) -> None:
    """The reconciler acts as its service account (impersonated, with the install's RBAC), so the
    webhook's guard trusts its writes to held jobs exactly as in a cluster install. `source`: run another
    checkout of raygate (its root), with that checkout's RBAC."""
    state = cp.load_state()
    if state is None:
        raise RaygateError("start the control plane before the reconciler")
    ensure_system_namespace(cp)
    cp.spawn(state, name, [
        sys.executable, "-m", "raygate", "reconciler", "--kubeconfig", str(cp.kubeconfig),
        "--namespace", keys.SYSTEM_NAMESPACE, *_reconciler_args(cp, source, impersonate), *extra,
    ], env=process_env(source))


def _reconciler_args(cp: ControlPlane, source: Path | None, impersonate: bool = True) -> list[str]:
    """The reconciler's flags on the local stack (the install's RBAC applied first when it impersonates)."""
    as_user: list[str] = []
    if impersonate:
        for rbac in reconciler_rbac(source):
            cp.kubectl("apply", "-f", str(rbac))
        as_user = ["--as", RECONCILER_USER]
    # The local webhook is registered by URL with its own certificate: nothing to renew here.
    return ["--metrics-port", "0", "--no-manage-certs", *as_user]


def reconciler_metrics_port(cp: ControlPlane, name: str | None = None) -> int | None:
    """The port a local reconciler serves /metrics on: it picks a free one and logs it at start. Without a `name`,
    raygate-reconciler's, else (`raygate serve`) raygate-webhook's."""
    for process in (name,) if name else ("raygate-reconciler", "raygate-webhook"):
        log = cp.logs / f"{process}.log"
        lines = [ln for ln in log.read_text().splitlines() if '"metrics_port"' in ln] if log.exists() else []
        if lines:
            return int(json.loads(lines[-1])["metrics_port"])
    return None


def _running(cp: ControlPlane, name: str) -> bool:
    state = cp.load_state()
    return state is not None and name in state.pids and alive(state.pids[name])


# The local cluster's GPU node group starts at zero, so its requests must be allowed to add nodes
# (check-capacity only answers from nodes that exist); retries are quick, to suit a demo.
DEV_CONFIG = """\
defaults:
  mode: provisioning
  provisioning:
    className: best-effort-atomic-scale-up.autoscaling.x-k8s.io
    provisionedTimeoutSeconds: 120
  retry: {limit: 10, baseSeconds: 5, maxSeconds: 30}
"""


def ensure_config(cp: ControlPlane) -> None:
    """raygate-config for the local cluster, unless one is there already (an admin's edits stay)."""
    ensure_system_namespace(cp)
    if cp.kubectl("get", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found",
                  "-o", "name").strip():
        return
    cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
               f"--from-literal={keys.CONFIGMAP_KEY}={DEV_CONFIG}")


def start_raygate(cp: ControlPlane) -> LocalWebhook:
    """`raygate dev up --raygate`: webhook + reconciler, and namespace `demo` opted in.

    Harmless when raygate already runs: a live component is kept, a dead one is started again.
    """
    ensure_config(cp)
    state = cp.load_state()
    if state is not None and _running(cp, "raygate-webhook") and "raygate-webhook-url" in state.extra:
        hook = LocalWebhook(state.extra["raygate-webhook-url"], cp.workdir / "raygate-webhook" / "ca.crt")
    else:
        hook = start_webhook(cp)
        state = cp.load_state()
        assert state is not None
        state.extra["raygate-webhook-url"] = hook.url
        cp.save_state(state)
    if not _running(cp, "raygate-reconciler"):
        start_reconciler(cp)
    if not cp.kubectl("get", "namespace", DEMO_NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        cp.kubectl("create", "namespace", DEMO_NAMESPACE)
    cp.kubectl("label", "namespace", DEMO_NAMESPACE, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}", "--overwrite")
    print(f"dev: raygate webhook at {hook.url}, reconciler running; namespace {DEMO_NAMESPACE} opted in")
    return hook
