"""A running control plane as the scheduling tests drive it: create as a user would (`kubectl create`), read
raygate's state off a RayJob or RayCluster, wait for one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from waiting import wait

from raygate.core import keys
from raygate.core.api import RAYCLUSTERS, RAYJOBS
from raygate.core.objects import JSON
from raygate.devenv.controlplane import ControlPlane
from raygate.kube.client import Kube


def apply_config(cluster: ControlPlane, config: Mapping[str, Any]) -> None:
    """raygate-config in raygate-system (created if missing) holds `config`."""
    cluster.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
          "data": {keys.CONFIGMAP_KEY: yaml.safe_dump(dict(config))}}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(cm))


def delete_ray_objects(cluster: ControlPlane, namespaces: Iterable[str]) -> None:
    """Every RayJob and RayCluster of `namespaces`, gone (their children with them) before this returns. Between
    tests sharing a queue: a held job one test leaves behind would hold the front for the next test's jobs."""
    for ns in namespaces:
        cluster.kubectl("delete", "rayjobs,rayclusters", "--all", "-n", ns, "--wait=true", "--timeout=90s",
                        check=False)


@dataclass
class RayStack:
    cluster: ControlPlane
    kube: Kube

    def create(self, obj: JSON, ns: str | None = None) -> JSON:
        flags = ["-n", ns] if ns else []
        return dict(json.loads(self.cluster.kubectl("create", *flags, "-o", "json", "-f", "-",
                                                    input_text=json.dumps(obj))))

    def get(self, ns: str, kind: str, name: str) -> JSON:
        return self.kube.get(RAYJOBS if kind == keys.RAYJOB_KIND else RAYCLUSTERS, name, ns)

    def state(self, ns: str, kind: str, name: str) -> str:
        return str((self.get(ns, kind, name)["metadata"].get("labels") or {}).get(keys.STATE_LABEL))

    def reason(self, ns: str, kind: str, name: str) -> str:
        return str((self.get(ns, kind, name)["metadata"].get("annotations") or {}).get(keys.REASON_ANNOTATION, ""))

    def wait_state(self, ns: str, kind: str, name: str, want: str, timeout: float = 120) -> JSON:
        wait(lambda: self.state(ns, kind, name) == want, timeout, f"{kind} {ns}/{name} to be {want}", interval=0.5)
        return self.get(ns, kind, name)
