"""The webhook configurations exist twice: as YAML in config/base (cluster install, reached through
the Service) and built by webhook/registration.py (local control plane, reached by URL). Apart from
how the server is reached, they must be the same registration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from raygate.core import keys
from raygate.core.policy import PROTECTED_NAMESPACES
from raygate.devenv.registration import configurations

MANIFEST = Path(__file__).resolve().parents[2] / "config" / "base" / "webhook-configurations.yaml"


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
