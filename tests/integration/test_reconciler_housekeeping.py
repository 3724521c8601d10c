"""The reconciler's cluster-wide chores on the real API server: the ConfigMap's failurePolicy reaches the
webhook configurations, its operators and gated resources reach the pod gate's policy, and the webhook
certificate is issued and trusted without anyone running `raygate certs ensure` by hand."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
from cryptography import x509
from waiting import wait

from raygate.core import keys, podgate_policy
from raygate.core.policy import parse_fields
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import start_reconciler, start_webhook, stop_webhook
from raygate.devenv.registration import configurations

pytestmark = pytest.mark.integration

CONFIGS = (("mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG),
           ("validatingwebhookconfiguration", keys.VALIDATING_WEBHOOK_CONFIG))


@pytest.fixture
def raygate(cluster: ControlPlane) -> Iterator[ControlPlane]:
    start_webhook(cluster, name="fp-webhook")
    start_reconciler(cluster, "--no-leader-elect", name="fp-reconciler")
    yield cluster
    cluster.stop_process("fp-reconciler")
    stop_webhook(cluster, "fp-webhook")
    cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")


def _policies(cluster: ControlPlane) -> list[str]:
    return [h["failurePolicy"] for kind, name in CONFIGS
            for h in json.loads(cluster.kubectl("get", kind, name, "-o", "json"))["webhooks"]]


def _set_config(cluster: ControlPlane, text: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
          "data": {keys.CONFIGMAP_KEY: text}}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input_text=json.dumps(cm))


def test_failure_policy_follows_the_config(raygate: ControlPlane) -> None:
    assert _policies(raygate) == ["Fail", "Fail"]
    _set_config(raygate, "failurePolicy: Ignore\n")
    wait(lambda: _policies(raygate) == ["Ignore", "Ignore"], 20, "failurePolicy Ignore in both configurations")
    # And back, on the next config version.
    _set_config(raygate, "failurePolicy: Fail\n")
    wait(lambda: _policies(raygate) == ["Fail", "Fail"], 20, "failurePolicy Fail in both configurations")


def test_the_pod_gate_policy_follows_the_config(raygate: ControlPlane) -> None:
    """Installed, the policy matches no pod; the reconciler writes the config's operators and each namespace's
    gated resources into it, and writes them again when the config changes."""
    def conditions() -> list[dict[str, str]]:
        policy = json.loads(raygate.kubectl("get", "mutatingadmissionpolicy", podgate_policy.POLICY_NAME, "-o", "json"))
        return list(policy["spec"]["matchConditions"])

    for text in ("defaults: {mode: provisioning}\n",
                 "rayOperatorUsers: [system:serviceaccount:ops:my-kuberay]\n"
                 "namespaces: {team-b: {provisioning: {enabled: false}}}\n"):
        _set_config(raygate, text)
        wanted = podgate_policy.policy(parse_fields(text))["spec"]["matchConditions"]
        wait(lambda: conditions() == wanted, 20, f"the policy to match the config {text!r}")  # noqa: B023


def _clear_certs(cluster: ControlPlane) -> None:
    cluster.kubectl("delete", "secret", keys.TLS_SECRET, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
    for kind, name in CONFIGS:
        cluster.kubectl("delete", kind, name, "--ignore-not-found")


def test_reconciler_issues_the_webhook_certificate_and_injects_its_ca(cluster: ControlPlane) -> None:
    """A cluster install (`--manage-certs`, the default): the Secret appears and both configurations
    trust its CA, and the reconciler's own process never loads the X.509 library (a child does the work). The
    local runs elsewhere pass --no-manage-certs; the flag given last wins."""
    _clear_certs(cluster)
    for obj in configurations("https://127.0.0.1:1", b"", "Ignore"):  # gates nothing; no caBundle yet
        for hook in obj["webhooks"]:
            del hook["clientConfig"]["caBundle"]
        cluster.kubectl("create", "-f", "-", input_text=json.dumps(obj))
    start_reconciler(cluster, "--no-leader-elect", "--manage-certs", name="certs-reconciler")
    try:
        def secret() -> dict[str, bytes] | None:
            out = cluster.kubectl("get", "secret", keys.TLS_SECRET, "-n", keys.SYSTEM_NAMESPACE,
                                  "--ignore-not-found", "-o", "json")
            return {k: base64.b64decode(v) for k, v in json.loads(out)["data"].items()} if out.strip() else None

        data = wait(secret, 30, f"Secret {keys.TLS_SECRET}")

        def bundles() -> list[bytes]:
            return [base64.b64decode(h["clientConfig"].get("caBundle", ""))
                    for kind, name in CONFIGS
                    for h in json.loads(cluster.kubectl("get", kind, name, "-o", "json"))["webhooks"]]

        wait(lambda: bundles() == [data["ca.crt"], data["ca.crt"]], 30, "the caBundle in both configurations")
        serving = x509.load_pem_x509_certificates(data["tls.crt"])[0]
        names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{keys.WEBHOOK_SERVICE}.{keys.SYSTEM_NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
        # The X.509 work ran in a child process: the reconciler itself never holds `cryptography` in memory.
        state = cluster.load_state()
        assert state is not None
        with open(f"/proc/{state.pids['certs-reconciler']}/maps") as maps:
            assert "cryptography" not in maps.read()
    finally:
        cluster.stop_process("certs-reconciler")
        _clear_certs(cluster)
