"""Cluster-wide chores of a real install that belong to no single job.

- The config's `failurePolicy` is written into both webhook configurations (the manifests ship
  `Fail`; an admin who sets `Ignore` in the ConfigMap expects it to take effect without editing
  cluster-scoped objects by hand).
- The config's operators and gated resources are written into the pod gate's MutatingAdmissionPolicy
  (raygate/core/podgate_policy.py), where the cluster serves it and the install made it.
- The webhook certificate is renewed before it expires (`certs ensure` on a timer), unless
  cert-manager owns it (`--no-manage-certs`). The renewal loop is handed in by the `raygate`
  command: the reconciler and the certs component do not import each other.

All are idempotent and safe from every replica, so they need no leadership.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from raygate.core import keys, podgate_policy
from raygate.core.api import MUTATING_POLICIES, MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS
from raygate.core.objects import meta_str
from raygate.core.policy import RaygateConfig
from raygate.kube.client import JSON_PATCH, MERGE_PATCH, ApiError, Kube
from raygate.kube.configsource import ConfigSource

log = logging.getLogger("raygate.housekeeping")
RETRY_SECONDS = 5.0  # after an error other than 403, before the next try

RenewCertificates = Callable[[threading.Event], None]
"""Renews the webhook certificate until the event is set."""


def failure_policy_patch(config: dict[str, Any], wanted: str) -> list[dict[str, Any]]:
    """JSON patch setting every webhook's failurePolicy to `wanted` ([] when all already are).

    The resourceVersion test makes a concurrent writer (certs ensure, kubectl) a conflict, not a
    lost update.
    """
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": f"/webhooks/{i}/failurePolicy", "value": wanted}
        for i, hook in enumerate(config.get("webhooks") or [])
        if hook.get("failurePolicy") != wanted
    ]
    if not ops:
        return []
    rv = meta_str(config, "resourceVersion") or None
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *ops]


def sync_failure_policy(kube: Kube, wanted: str) -> list[str]:
    """Bring both webhook configurations to `wanted`; return the ones changed."""
    changed = []
    for res, name in ((MUTATING_WEBHOOKS, keys.MUTATING_WEBHOOK_CONFIG),
                      (VALIDATING_WEBHOOKS, keys.VALIDATING_WEBHOOK_CONFIG)):
        for _ in range(3):  # a conflict means someone else wrote it: read again
            try:
                patch = failure_policy_patch(kube.get(res, name), wanted)
                if patch:
                    kube.patch(res, name, patch, content_type=JSON_PATCH)
                    changed.append(name)
                break
            except ApiError as err:
                if err.not_found:
                    break  # not installed (e.g. a local run registered by URL under other names)
                if not (err.conflict or err.status == 422):
                    raise
    return changed


def sync_pod_gate_policy(kube: Kube, config: RaygateConfig) -> bool:
    """Write `config` into the pod gate's policy; True when it changed. Only its matchConditions depend on the
    config, so only they are written (a merge patch replaces the list whole). Not served (before Kubernetes
    1.36) or not installed: nothing to do, the webhook gates every pod."""
    wanted = podgate_policy.policy(config)["spec"]["matchConditions"]
    try:
        live = kube.get(MUTATING_POLICIES, podgate_policy.POLICY_NAME)
        if (live.get("spec") or {}).get("matchConditions") == wanted:
            return False
        kube.patch(MUTATING_POLICIES, podgate_policy.POLICY_NAME, {"spec": {"matchConditions": wanted}},
                   content_type=MERGE_PATCH)
    except ApiError as err:
        if err.not_found:
            return False
        raise
    return True


class Housekeeping:
    def __init__(self, kube: Kube, config: ConfigSource, *, renew_certificates: RenewCertificates | None,
                 period: float = 30.0) -> None:
        self.kube = kube
        self.config = config
        self.renew_certificates = renew_certificates
        self.period = period
        self.stop_event = threading.Event()

    def start(self) -> Housekeeping:
        threading.Thread(target=self._config_loop, name="config-sync", daemon=True).start()
        if self.renew_certificates is not None:
            threading.Thread(target=self.renew_certificates, args=(self.stop_event,), name="certs", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()

    def _config_loop(self) -> None:
        done: dict[str, tuple[int, float]] = {}  # what -> (config generation written, when to check it again)
        while not self.stop_event.wait(1.0):
            generation, config = self.config.generation, self.config.config
            for what, sync in (("webhook failurePolicy", self._sync_failure_policy),
                               ("pod gate policy", self._sync_policy)):
                # At once on every config change; otherwise every `period` seconds, to undo drift.
                written = done.get(what)
                if written is not None and written[0] == generation and time.monotonic() < written[1]:
                    continue
                try:
                    sync(config)
                except ApiError as err:
                    log.warning(f"could not sync the {what}", extra={"error": str(err)})
                    # Not granted (e.g. the cert-manager overlay): again on a config change only; else soon.
                    done[what] = (generation, float("inf") if err.status == 403 else time.monotonic() + RETRY_SECONDS)
                    continue
                done[what] = (generation, time.monotonic() + self.period)

    def _sync_failure_policy(self, config: RaygateConfig) -> None:
        if changed := sync_failure_policy(self.kube, config.failure_policy):
            log.info("webhook failurePolicy set from the config",
                     extra={"failure_policy": config.failure_policy, "configurations": changed})

    def _sync_policy(self, config: RaygateConfig) -> None:
        if sync_pod_gate_policy(self.kube, config):
            log.info("pod gate policy set from the config", extra={"policy": podgate_policy.POLICY_NAME})
