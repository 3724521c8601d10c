"""Write the CA bundle into every webhook of raygate's webhook configurations, so the API server
trusts the webhook's serving certificate. Writes only what differs; never touches other fields."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from raygate.certs.apierrors import api_errors
from raygate.core.api import MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, Resource
from raygate.core.errors import RaygateError
from raygate.core.keys import MUTATING_WEBHOOK_CONFIG, VALIDATING_WEBHOOK_CONFIG
from raygate.core.objects import meta_str
from raygate.kube.client import STRATEGIC_MERGE_PATCH, ApiError, Kube

log = logging.getLogger(__name__)

_CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class WebhookConfigs:
    """Which configurations get the CA bundle; None leaves that kind alone."""

    mutating: str | None = MUTATING_WEBHOOK_CONFIG
    validating: str | None = VALIDATING_WEBHOOK_CONFIG
    skip_missing: bool = False  # log and go on when a configuration does not exist (yet)


@dataclass(frozen=True)
class Injection:
    kind: str
    name: str
    outcome: Literal["updated", "unchanged", "missing"]
    webhooks: tuple[str, ...] = ()  # the webhooks whose caBundle was written

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


def _decoded(value: str | bytes | None) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def stale_webhooks(webhooks: Sequence[tuple[str, str | bytes | None]], ca_bundle: bytes) -> list[str]:
    """Names of the webhooks whose caBundle (base64, as served by the API) is not `ca_bundle`."""
    return [name for name, current in webhooks if _decoded(current) != ca_bundle]


def ca_bundle_patch(names: Sequence[str], ca_bundle: bytes, resource_version: str) -> dict[str, Any]:
    """A strategic merge patch: webhooks merge by name, so only their caBundle changes; the
    resourceVersion makes the server refuse (409) when the configuration changed since it was read."""
    encoded = base64.b64encode(ca_bundle).decode()
    return {
        "metadata": {"resourceVersion": resource_version},
        "webhooks": [{"name": n, "clientConfig": {"caBundle": encoded}} for n in names],
    }


def _inject_one(kube: Kube, kind: Resource, name: str, ca_bundle: bytes, skip_missing: bool) -> Injection:
    for _ in range(_CONFLICT_RETRIES):
        with api_errors("get", kind.plural, None, kube.host):
            try:
                obj = kube.get(kind, name)
            except ApiError as exc:
                if not exc.not_found:
                    raise
                if not skip_missing:
                    raise RaygateError(
                        f"{kind.kind} {name} does not exist: install raygate's webhook configurations "
                        "first (kubectl apply -k config/default), or pass --skip-missing-webhooks"
                    ) from None
                log.warning(
                    "webhook configuration missing, caBundle not injected",
                    extra={"kind": kind.kind, "object": name},
                )
                return Injection(kind.kind, name, "missing")
        current = [(str(w.get("name", "")), (w.get("clientConfig") or {}).get("caBundle"))
                   for w in obj.get("webhooks") or []]
        if not current:
            log.warning("webhook configuration has no webhooks", extra={"kind": kind.kind, "object": name})
        stale = stale_webhooks(current, ca_bundle)
        if not stale:
            return Injection(kind.kind, name, "unchanged")
        patch = ca_bundle_patch(stale, ca_bundle, meta_str(obj, "resourceVersion"))
        with api_errors("patch", kind.plural, None, kube.host):
            try:
                kube.patch(kind, name, patch, content_type=STRATEGIC_MERGE_PATCH)
            except ApiError as exc:
                if exc.status in (404, 409):
                    continue  # changed or deleted meanwhile: read again
                raise
        log.info(
            "caBundle injected", extra={"kind": kind.kind, "object": name, "webhooks": ",".join(stale)}
        )
        return Injection(kind.kind, name, "updated", tuple(stale))
    raise RaygateError(
        f"{kind.kind} {name} kept changing while the caBundle was written ({_CONFLICT_RETRIES} conflicts): "
        "retry; if it persists, another controller rewrites it"
    )


def inject_ca_bundle(kube: Kube, ca_bundle: bytes, configs: WebhookConfigs) -> list[Injection]:
    """Make every webhook in the chosen configurations trust `ca_bundle` (PEM)."""
    results = []
    for kind, name in ((MUTATING_WEBHOOKS, configs.mutating), (VALIDATING_WEBHOOKS, configs.validating)):
        if name:
            results.append(_inject_one(kube, kind, name, ca_bundle, configs.skip_missing))
    return results
