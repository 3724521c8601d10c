"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

A candidate takes the Lease when it is free or when its holder has not renewed it for a whole
lease duration, measured on the candidate's own clock from when it last saw the record change (so
clock skew between replicas does not matter). The leader renews every retry period; if it cannot
renew within the renew deadline it stops leading. On a clean shutdown it releases the Lease so a
standby takes over at once instead of after a full lease duration.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from raygate.core.api import LEASES
from raygate.core.objects import JSON
from raygate.kube.client import ApiError, Kube

log = logging.getLogger("raygate.leader")


@dataclass(frozen=True)
class LeaseTiming:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "need 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period}s, {self.renew_deadline}s, {self.lease_duration}s"
            )


def _micro_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, timing: LeaseTiming,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.clock = clock
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._ended = threading.Event()  # run() returned: no renewal is in flight
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0

    # --- one attempt ----------------------------------------------------------------------------
    def _record(self, lease: JSON | None, transitions: int) -> JSON:
        now = _micro_time(dt.datetime.now(dt.UTC))
        spec: JSON = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.lease_duration)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        old = (lease or {}).get("spec") or {}
        spec["acquireTime"] = old.get("acquireTime") if old.get("holderIdentity") == self.identity else now
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate holds the Lease afterwards."""
        try:
            lease = self.kube.get(LEASES, self.name, self.namespace)
        except ApiError as err:
            if not err.not_found:
                raise
            body = {"metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._record(None, 0)}
            try:
                self.kube.create(LEASES, body, self.namespace)
            except ApiError as create_err:
                if create_err.already_exists or create_err.conflict:
                    return False
                raise
            self._observe(self.identity, body["spec"]["renewTime"])
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        renew = str(spec.get("renewTime") or "")
        self._observe(holder, renew)
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if holder and holder != self.identity and self.clock() - self._observed_at < duration:
            return False  # someone else holds a lease that has not lapsed on our clock
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        body = {**lease, "spec": self._record(lease, transitions)}
        try:
            self.kube.replace(LEASES, self.name, body, self.namespace)  # resourceVersion makes this a CAS
        except ApiError as err:
            if err.conflict:
                return False
            raise
        self._observe(self.identity, body["spec"]["renewTime"])
        return True

    def _observe(self, holder: str, renew: str) -> None:
        if self._observed != (holder, renew):
            self._observed = (holder, renew)
            self._observed_at = self.clock()

    def release(self) -> None:
        """Give the Lease up (holder cleared, 1 s duration) so a standby need not wait it out."""
        if not self.leading.is_set():
            return
        try:
            lease = self.kube.get(LEASES, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = dict(lease.get("spec") or {})
            spec.update({"holderIdentity": None, "leaseDurationSeconds": 1,
                         "renewTime": _micro_time(dt.datetime.now(dt.UTC))})
            self.kube.replace(LEASES, self.name, {**lease, "spec": spec}, self.namespace)
            log.info("released the leader lease", extra={"identity": self.identity})
        except ApiError as err:
            log.warning("could not release the leader lease", extra={"error": str(err)})

    # --- the loop -----------------------------------------------------------------------------
    def run(self, on_started: Callable[[], None]) -> None:
        """Block until leading (calls on_started), then keep renewing until stop() or loss."""
        try:
            self._run(on_started)
        finally:
            self._ended.set()

    def _run(self, on_started: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    break
            except ApiError as err:
                log.warning("leader election attempt failed", extra={"error": str(err)})
            self._stop.wait(self.timing.retry_period)
        if self._stop.is_set():
            return
        log.info("became leader", extra={"identity": self.identity, "lease": f"{self.namespace}/{self.name}"})
        self.leading.set()
        on_started()
        last_renew = self.clock()
        while not self._stop.wait(self.timing.retry_period):
            try:
                if self.try_acquire_or_renew():
                    last_renew = self.clock()
                    continue
            except ApiError as err:
                log.warning("lease renewal failed", extra={"error": str(err)})
            taken = self._observed is not None and self._observed[0] not in ("", self.identity)
            if taken or self.clock() - last_renew > self.timing.renew_deadline:
                log.error("lost the leader lease", extra={"identity": self.identity})
                self.leading.clear()
                self.lost.set()
                return

    def stop(self, timeout: float = 0.0) -> None:
        """Stop renewing, and wait (at most `timeout` seconds) for a renewal in flight to end: a release that reads
        the Lease while that renewal still writes it is refused (409), and the Lease would then be waited out."""
        self._stop.set()
        self._ended.wait(timeout)
