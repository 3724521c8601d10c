"""Pinned upstream versions for the local control plane and the CRDs.

KubeRay is pinned to v1.6.2: the module proxy this project builds from refuses the v1.7.x zips
("module version is not available"). k8s.io/kubernetes v1.36.4 is the newest 1.36 release the
checksum database vouches for here.
"""

from __future__ import annotations

import os
from pathlib import Path

K8S_VERSION = "v1.36.4"
K8S_STAGING_VERSION = "v0.36.4"  # k8s.io/<staging module> tags that match K8S_VERSION
ETCD_VERSION = "v3.6.16"
KUBERAY_VERSION = "v1.6.2"
KUEUE_VERSION = "v0.19.2"
VOLCANO_VERSION = "v1.15.1"
# Volcano's go.mod points volcano.sh/apis at a directory inside its repository that the module zip
# leaves out, and the module proxy here refuses apis v1.14.1 and later ("not available"): the scheduler
# and controller-manager build against the newest apis it serves (their CRDs still come from v1.15.1).
VOLCANO_BUILD_APIS_VERSION = "v1.14.0"
HELM_VERSION = "v3.19.0"  # the helm CLI for the chart tests; not part of bundle_id (added to a cache in place)
# The ProvisioningRequest API module has no release tags; this is the commit Kueue v0.19.2 pins.
AUTOSCALER_APIS_VERSION = "v0.0.0-20240830133931-adfbe7e45277"
GO_MIN = (1, 26)
# cluster-autoscaler has no tags on the module proxy; this pseudo-version downloads, but the checksum
# database does not know it, so its hash is pinned here and checked after the download instead.
AUTOSCALER_VERSION = "v0.0.0-20250613073258-1959f5f61f6c"
AUTOSCALER_SUM = "h1:gGUthCoel/TlD1fh33foTFCs1n75w8sqmpD3qf2zqk4="
# Its go.mod points its apis module at ./apis (not in the download); this commit has the v1 listers it uses.
AUTOSCALER_BUILD_APIS_VERSION = "v0.0.0-20240830133931-adfbe7e45277"
KWOK_VERSION = "v0.8.0"

K8S_MODULE = "k8s.io/kubernetes"
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"
KUEUE_MODULE = "sigs.k8s.io/kueue"
VOLCANO_MODULE = "volcano.sh/volcano"
VOLCANO_APIS_MODULE = "volcano.sh/apis"
AUTOSCALER_APIS_MODULE = "k8s.io/autoscaler/cluster-autoscaler/apis"
AUTOSCALER_MODULE = "k8s.io/autoscaler/cluster-autoscaler"
KWOK_MODULE = "sigs.k8s.io/kwok"
HELM_MODULE = "helm.sh/helm/v3"


def bundle_id() -> str:
    return "-".join(
        [
            f"k8s{K8S_VERSION}",
            f"etcd{ETCD_VERSION}",
            f"kuberay{KUBERAY_VERSION}",
            f"kueue{KUEUE_VERSION}",
            f"volcano{VOLCANO_VERSION}",
            f"ca{AUTOSCALER_APIS_VERSION[-12:]}",
        ]
    )


def cache_root() -> Path:
    """Outside the repository, so fresh clones and CI on the same machine reuse the build."""
    explicit = os.environ.get("RAYGATE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "raygate"


def bundle_dir() -> Path:
    return cache_root() / bundle_id()
