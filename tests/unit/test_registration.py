"""The webhook configurations exist twice: as YAML in config/base (cluster install, reached through
the Service) and built by webhook/registration.py (local control plane, reached by URL). Apart from
how the server is reached, they must be the same registration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from raygate.core import identity, keys
from raygate.core.policy import PROTECTED_NAMESPACES
from raygate.devenv.registration import SKIP_GATED_POD_CREATE, configurations

MANIFEST = Path(__file__).resolve().parents[2] / "config" / "base" / "webhook-configurations.yaml"
POLICY_MANIFEST = MANIFEST.parents[1] / "pod-gate-policy" / "pod-gate-policy.yaml"


def _without_client_config(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in hook.items() if k != "clientConfig"} for hook in obj["webhooks"]]


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


@pytest.mark.parametrize("index", [0, 1], ids=["mutating", "validating"])
def test_local_registration_matches_the_cluster_manifest(manifests: dict[str, dict[str, Any]], index: int) -> None:
    built = configurations("https://127.0.0.1:9443", b"-----BEGIN CERTIFICATE-----\n")[index]
    manifest = manifests[built["kind"]]
    assert built["metadata"]["name"] == manifest["metadata"]["name"]
    assert _without_client_config(built) == _without_client_config(manifest)
    assert [h["clientConfig"]["service"]["path"] for h in manifest["webhooks"]] == [
        h["clientConfig"]["url"].removeprefix("https://127.0.0.1:9443") for h in built["webhooks"]
    ]


def test_registration_excludes_the_protected_namespaces() -> None:
    for obj in configurations("https://x", b""):
        for hook in obj["webhooks"]:
            exprs = hook["namespaceSelector"]["matchExpressions"]
            excluded = next(e for e in exprs if e["operator"] == "NotIn")
            assert set(excluded["values"]) == PROTECTED_NAMESPACES
            assert {"key": keys.OPT_IN_LABEL, "operator": "In", "values": [keys.OPT_IN_VALUE]} in exprs


def test_failure_policy_comes_from_the_argument() -> None:
    for obj in configurations("https://x", b"", failure_policy="Ignore"):
        assert all(h["failurePolicy"] == "Ignore" for h in obj["webhooks"])


def _skipped_by_the_api_server(pod: dict[str, Any]) -> bool:
    """SKIP_GATED_POD_CREATE, read in Python: a pod CREATE the API server does not send to /validate."""
    from raygate.core import podgate
    from raygate.core.objects import get

    annotations = pod["metadata"].get("annotations") or {}
    unnamed_group = keys.GANG_GROUP_ANNOTATION in annotations and not get(pod, keys.POD_GROUP_NAME_PATH)
    names_a_booking = keys.CONSUME_ANNOTATION in annotations or keys.CLASS_ANNOTATION in annotations
    return podgate.gated(pod) and not unnamed_group and not names_a_booking


def _pod(gated: bool, group: str | None = None, named: bool = False, consumes: str | None = None) -> dict[str, Any]:
    from builders import container

    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": "w", "namespace": "team", "annotations": {}},
                           "spec": {"containers": [container("w", limits={"nvidia.com/gpu": "1"})]}}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": keys.CAPACITY_GATE}]
        pod["metadata"]["labels"] = {keys.POD_GATE_LABEL: keys.POD_GATED}
    if group:
        pod["metadata"]["annotations"][keys.GANG_GROUP_ANNOTATION] = group
    if named:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    if consumes:
        pod["metadata"]["annotations"][keys.CONSUME_ANNOTATION] = consumes
    if gated:  # as raygate's mutation leaves it: whose booking it may use, recorded
        pod["metadata"]["annotations"][keys.RAY_OWNER_ANNOTATION] = identity.at_pod_create(pod, "alice", ()).record
    return pod


@pytest.mark.parametrize("mode", ["provisioning", "volcano", "native", "kueue"])
@pytest.mark.parametrize(("pod", "skipped"), [
    (_pod(gated=True), True),
    (_pod(gated=True, group="g", named=True), True),
    (_pod(gated=True, group="g"), False),  # names a gang but not its PodGroup: sent, and refused
    (_pod(gated=False), False),  # a GPU pod without the gate: sent, and refused where raygate gates
    (_pod(gated=True, consumes="someone-elses"), False),  # names a booking: sent, and refused
], ids=["gated", "gated-in-its-group", "gated-group-not-named", "not-gated", "gated-naming-a-booking"])
def test_a_pod_create_the_api_server_does_not_send_is_one_validate_allows(pod: dict[str, Any], skipped: bool,
                                                                         mode: str) -> None:
    from builders import config, request

    from raygate.webhook.decision import validate

    validating = configurations("https://x", b"")[1]["webhooks"][0]
    assert SKIP_GATED_POD_CREATE in validating["matchConditions"]
    assert _skipped_by_the_api_server(pod) is skipped
    if skipped:
        d = validate(request(pod), {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}, config(mode=mode))
        assert d.allowed, d.message


def test_the_pod_gate_policy_manifest_is_the_policy_as_installed() -> None:
    """config/pod-gate-policy ships the policy that matches no pod until the reconciler writes the config in."""
    from raygate.devenv.registration import pod_gate_policy

    shipped = [d for d in yaml.safe_load_all(POLICY_MANIFEST.read_text()) if d]
    assert shipped == list(pod_gate_policy())
    operators = next(c for c in shipped[0]["spec"]["matchConditions"] if c["name"] == "by-kuberay-operator")
    assert operators["expression"].endswith("in []")
