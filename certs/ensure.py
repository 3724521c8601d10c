"""Make the webhook's certificates exist, be valid and be trusted: the Secret, the caBundle in the
webhook configurations and, for local development, files on disk. Safe to run at any time, from
any number of replicas: a second run changes nothing, and concurrent writers converge on one."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from raygate.certs.inject import Injection, WebhookConfigs, inject_ca_bundle
from raygate.certs.rotation import (
    DEFAULT_CA_VALIDITY,
    DEFAULT_RENEW_BEFORE,
    DEFAULT_SERVING_VALIDITY,
    Action,
    Policy,
    Stored,
    decide,
    issue,
    service_sans,
)
from raygate.certs.store import SecretConflict, read_secret, write_files, write_secret
from raygate.core.errors import RaygateError
from raygate.core.keys import SYSTEM_NAMESPACE, TLS_SECRET, WEBHOOK_SERVICE
from raygate.core.pki import describe
from raygate.kube.client import Kube

log = logging.getLogger(__name__)

_CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class Spec:
    """What `ensure` maintains; the defaults are raygate's installation."""

    namespace: str = SYSTEM_NAMESPACE
    service: str = WEBHOOK_SERVICE
    secret: str = TLS_SECRET
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY
    serving_validity: dt.timedelta = DEFAULT_SERVING_VALIDITY
    extra_sans: tuple[str, ...] = ()  # e.g. 127.0.0.1 when the API server calls a local webhook by URL
    webhook_configs: WebhookConfigs = field(default_factory=WebhookConfigs)
    out_dir: Path | None = None  # also write ca.crt, tls.crt, tls.key here

    def __post_init__(self) -> None:
        # Bad durations or names fail here, before anything touches the cluster.
        _ = self.policy, self.sans

    @property
    def sans(self) -> list[str]:
        return service_sans(self.service, self.namespace, self.extra_sans)

    @property
    def policy(self) -> Policy:
        return Policy(self.renew_before, self.ca_validity, self.serving_validity)

    @property
    def secret_ref(self) -> str:
        return f"{self.namespace}/{self.secret}"


@dataclass(frozen=True)
class Result:
    action: Literal["created", "renewed", "unchanged"]
    reason: str
    secret: str  # namespace/name
    not_after: dt.datetime  # of the serving certificate
    ca_not_after: dt.datetime
    ca_rotated: bool
    sans: tuple[str, ...]
    injections: tuple[Injection, ...] = ()
    files_written: tuple[str, ...] = ()

    def summary(self, now: dt.datetime) -> str:
        """One line for the CLI and the logs."""
        left = (self.not_after - now).total_seconds() / 86400
        head = f"{self.action} Secret {self.secret}"
        if self.action != "unchanged":
            head += f" ({self.reason}{'; new CA' if self.ca_rotated else ''})"
        line = f"{head}: serving certificate valid until {self.not_after:%Y-%m-%dT%H:%M:%SZ} ({left:.0f} days left)"
        updated = [i.ref for i in self.injections if i.outcome == "updated"]
        missing = [i.ref for i in self.injections if i.outcome == "missing"]
        if updated:
            line += f"; caBundle written to {', '.join(updated)}"
        elif self.injections:
            line += "; caBundle up to date"
        if missing:
            line += f"; skipped missing {', '.join(missing)}"
        if self.files_written:
            line += f"; wrote {', '.join(self.files_written)}"
        return line


def _settle_secret(
    kube: Kube, spec: Spec, now: dt.datetime
) -> tuple[Stored, Action, str, bool]:
    """Read, decide, write; on a conflict read again, so concurrent runs adopt the winner's certs."""
    sans, policy = spec.sans, spec.policy
    for _ in range(_CONFLICT_RETRIES):
        loaded = read_secret(kube, spec.namespace, spec.secret)
        decision = decide(loaded.stored, sans, now, policy)
        material = issue(
            decision,
            loaded.stored,
            common_name=f"{spec.service}.{spec.namespace}.svc",
            ca_name=f"{spec.service}-ca",
            sans=sans,
            now=now,
            policy=policy,
        )
        if decision.action is Action.KEEP:
            return material, decision.action, decision.reason, loaded.stored.empty
        try:
            write_secret(kube, spec.namespace, spec.secret, material, loaded.resource_version)
        except SecretConflict as exc:
            log.info("certificate Secret changed concurrently, reading again", extra={"detail": str(exc)})
            continue
        return material, decision.action, decision.reason, loaded.stored.empty
    raise RaygateError(
        f"Secret {spec.secret_ref} kept changing while it was written ({_CONFLICT_RETRIES} conflicts): retry; "
        "if it persists, another controller rewrites it"
    )


def ensure(kube: Kube, spec: Spec | None = None, now: dt.datetime | None = None) -> Result:
    """Create or renew the certificates as needed, then make the webhooks trust the CA."""
    spec = spec or Spec()
    now = now or dt.datetime.now(dt.UTC)
    material, action, reason, was_empty = _settle_secret(kube, spec, now)
    # The Secret first: if injecting fails, the next run still finds the CA it must inject.
    injections = inject_ca_bundle(kube, material.ca_cert or b"", spec.webhook_configs)
    files = write_files(spec.out_dir, material) if spec.out_dir is not None else []
    serving, ca = describe(material.tls_cert), describe(material.ca_cert)
    if serving is None or ca is None:  # issue() only returns parseable material
        raise RuntimeError("the certificates just settled cannot be read back")
    result = Result(
        action="unchanged" if action is Action.KEEP else "created" if was_empty else "renewed",
        reason=reason,
        secret=spec.secret_ref,
        not_after=serving.not_after,
        ca_not_after=ca.not_after,
        ca_rotated=action is Action.REGENERATE and not was_empty,
        sans=serving.sans,
        injections=tuple(injections),
        files_written=tuple(files),
    )
    # Hourly "unchanged" runs would drown the log at info level.
    log.log(
        logging.DEBUG if result.action == "unchanged" else logging.INFO,
        "certificates ensured",
        extra={
            "action": result.action,
            "reason": reason,
            "secret": spec.secret_ref,
            "not_after": result.not_after.isoformat(),
            "ca_rotated": result.ca_rotated,
            "ca_bundle_updated": [i.ref for i in injections if i.outcome == "updated"],
        },
    )
    return result
