"""Shared fixtures. Integration tests get one real control plane per session (etcd, kube-apiserver,
kube-controller-manager, the KubeRay operator) with the pinned CRDs; it never silently skips."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raygate.devenv.build import Bundle, ensure_bundle
from raygate.devenv.controlplane import ControlPlane


@pytest.fixture(scope="session")
def bundle() -> Bundle:
    # Builds on first use (cached outside the repo); `make test` has already run `make cluster-bins`.
    return ensure_bundle(log=False)


@pytest.fixture(scope="session")
def cluster(bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane"), bundle)
    cp.up(kuberay=True, log=False)
    os.environ["RAYGATE_TEST_KUBECONFIG"] = str(cp.kubeconfig)
    try:
        yield cp
    finally:
        cp.down(log=False)


@pytest.fixture(scope="session")
def api(cluster: ControlPlane):  # type: ignore[no-untyped-def]
    """A kubernetes-client ApiClient authenticated as cluster admin."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture
def make_namespace(cluster: ControlPlane) -> Iterator[Callable[..., str]]:
    """Create uniquely named namespaces (optionally labelled); deleted after the test."""
    created: list[str] = []

    def make(prefix: str = "t", labels: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        label_args = [f"{k}={v}" for k, v in (labels or {}).items()]
        cluster.kubectl("create", "namespace", name)
        if label_args:
            cluster.kubectl("label", "namespace", name, *label_args)
        created.append(name)
        return name

    yield make
    for name in created:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    return Path(__file__).parent / "samples"
