"""What a review is decided against: the live config, the namespace labels, the DRA claim templates and
raygate's gang groups, kept current by watches so that answering a review never calls the API server."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from raygate.core import dra, keys
from raygate.core.api import CLAIM_TEMPLATES, NAMESPACES
from raygate.core.modes import NO_MEMBERS, Members
from raygate.core.objects import JSON, labels
from raygate.core.policy import RaygateConfig
from raygate.kube import discovery
from raygate.kube.client import Kube
from raygate.kube.configsource import ConfigSource
from raygate.kube.informer import Informer
from raygate.webhook import metrics
from raygate.webhook.gangs import GangGroups

log = logging.getLogger("raygate.webhook")


def namespace_view(obj: JSON) -> JSON:
    """A namespace as each worker keeps it: its name and labels, all a review reads (not its annotations,
    managedFields, spec and status: several times the size, times every namespace, times every worker)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}}}


@dataclass
class WebhookState:
    config_source: ConfigSource
    namespaces: Informer | None = None  # None: offline (tests, `raygate explain`): every namespace opted in
    claim_templates: Informer | None = None  # None: offline, or the cluster serves no DRA: none is seen
    gangs: GangGroups | None = None  # None: offline, or the cluster serves no gang scheduling: no group is known
    certificate_loaded: threading.Event = field(default_factory=threading.Event)

    @property
    def config(self) -> RaygateConfig:
        return self.config_source.config

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        if self.namespaces is None:
            return None
        obj = self.namespaces.get("", namespace)
        if obj is None:
            return None
        return labels(obj)

    def claim_template(self, namespace: str, name: str) -> JSON | None:
        return self.claim_templates.get(namespace, name) if self.claim_templates is not None else None

    @property
    def members(self) -> Members:
        return self.gangs if self.gangs is not None else NO_MEMBERS

    def not_ready(self) -> list[str]:
        """What is still missing before this worker may serve; empty when ready."""
        missing = []
        if not self.config_source.loaded.is_set():
            missing.append("config")
        if self.namespaces is not None and not self.namespaces.synced.is_set():
            missing.append("namespace cache")
        if self.claim_templates is not None and not self.claim_templates.synced.is_set():
            missing.append("ResourceClaimTemplate cache")
        if self.gangs is not None and not self.gangs.informer.synced.is_set():
            missing.append("PodGroup cache")
        if not self.certificate_loaded.is_set():
            missing.append("certificate")
        return missing

    @classmethod
    def connect(cls, kube: Kube, namespace: str) -> WebhookState:
        def result(problems: list[str]) -> None:
            metrics.CONFIG_VALID.set(0 if problems else 1)
            if problems:
                metrics.CONFIG_REJECTED.inc()

        metrics.CONFIG_VALID.set(1)  # the defaults serve until a ConfigMap says otherwise
        informer = Informer(kube, NAMESPACES, resync_seconds=600, transform=namespace_view).start()
        claims = (Informer(kube, CLAIM_TEMPLATES, resync_seconds=600, transform=dra.template_view).start()
                  if kube.served(keys.DRA_GROUP, keys.DRA_VERSION) else None)
        served = discovery.served(kube)  # a config whose mode this cluster cannot run is rejected
        gangs = GangGroups(kube, served).start() if served.gang_version is not None else None
        source = ConfigSource(kube, namespace, on_result=result, served=served).start()
        return cls(config_source=source, namespaces=informer, claim_templates=claims, gangs=gangs)

