"""The ConfigMap's failurePolicy reaches the real webhook configurations without anyone editing them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from raygate import keys
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook, stop_webhook

pytestmark = pytest.mark.integration


@pytest.fixture
def raygate(cluster: ControlPlane) -> Iterator[ControlPlane]:
    start_webhook(cluster, name="fp-webhook")
    start_reconciler(cluster, "--no-leader-elect", name="fp-reconciler")
    yield cluster
    cluster.stop_process("fp-reconciler")
    stop_webhook(cluster, "fp-webhook")
    cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")


def _policies(cluster: ControlPlane) -> list[str]:
    out = []
    for kind, name in (("mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG),
                       ("validatingwebhookconfiguration", keys.VALIDATING_WEBHOOK_CONFIG)):
        obj = json.loads(cluster.kubectl("get", kind, name, "-o", "json"))
        out += [h["failurePolicy"] for h in obj["webhooks"]]
    return out


def _set_config(cluster: ControlPlane, text: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
          "data": {keys.CONFIGMAP_KEY: text}}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(cm))


def _wait_for(cluster: ControlPlane, wanted: str, timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while (seen := _policies(cluster)) != [wanted, wanted] and time.monotonic() < deadline:
        time.sleep(0.3)
    return seen


def test_failure_policy_follows_the_config(raygate: ControlPlane) -> None:
    assert _policies(raygate) == ["Fail", "Fail"]
    _set_config(raygate, "failurePolicy: Ignore\n")
    assert _wait_for(raygate, "Ignore") == ["Ignore", "Ignore"]
    # And back, on the next config version.
    _set_config(raygate, "failurePolicy: Fail\n")
    assert _wait_for(raygate, "Fail") == ["Fail", "Fail"]
