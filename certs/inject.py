"""Write the CA bundle into every webhook of raygate's webhook configurations, so the API server
trusts the webhook's serving certificate. Writes only what differs; never touches other fields."""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from raygate.certs.apierrors import api_errors
from raygate.core.errors import RaygateError
from raygate.core.keys import FIELD_MANAGER, MUTATING_WEBHOOK_CONFIG, VALIDATING_WEBHOOK_CONFIG

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


@dataclass(frozen=True)
class _Kind:
    kind: str
    resource: str
    read: Callable[[str], Any]
    patch: Callable[[str, dict[str, Any]], Any]


def _kinds(api_client: client.ApiClient) -> tuple[_Kind, _Kind]:
    api = client.AdmissionregistrationV1Api(api_client)
    strategic = "application/strategic-merge-patch+json"
    return (
        _Kind(
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            api.read_mutating_webhook_configuration,
            lambda name, body: api.patch_mutating_webhook_configuration(
                name, body, field_manager=FIELD_MANAGER, _content_type=strategic
            ),
        ),
        _Kind(
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            api.read_validating_webhook_configuration,
            lambda name, body: api.patch_validating_webhook_configuration(
                name, body, field_manager=FIELD_MANAGER, _content_type=strategic
            ),
        ),
    )


def _inject_one(kind: _Kind, name: str, ca_bundle: bytes, skip_missing: bool, host: str) -> Injection:
    for _ in range(_CONFLICT_RETRIES):
        with api_errors("get", kind.resource, None, host):
            try:
                obj = kind.read(name)
            except ApiException as exc:
                if exc.status != 404:
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
        current = [(w.name, w.client_config.ca_bundle if w.client_config else None) for w in obj.webhooks or []]
        if not current:
            log.warning("webhook configuration has no webhooks", extra={"kind": kind.kind, "object": name})
        stale = stale_webhooks(current, ca_bundle)
        if not stale:
            return Injection(kind.kind, name, "unchanged")
        patch = ca_bundle_patch(stale, ca_bundle, str(obj.metadata.resource_version))
        with api_errors("patch", kind.resource, None, host):
            try:
                kind.patch(name, patch)
            except ApiException as exc:
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


def inject_ca_bundle(api_client: client.ApiClient, ca_bundle: bytes, configs: WebhookConfigs) -> list[Injection]:
    """Make every webhook in the chosen configurations trust `ca_bundle` (PEM)."""
    host = api_client.configuration.host
    mutating, validating = _kinds(api_client)
    results = []
    for kind, name in ((mutating, configs.mutating), (validating, configs.validating)):
        if name:
            results.append(_inject_one(kind, name, ca_bundle, configs.skip_missing, host))
    return results
