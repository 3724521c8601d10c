"""Leader election against the real API server: a stopped leader gives its Lease up even when a renewal was in
flight as it stopped (so the next leader takes over at once, not after a lease duration)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from waiting import wait

from raygate.core.api import LEASES
from raygate.devenv.controlplane import ControlPlane
from raygate.kube.client import ApiError, Kube
from raygate.reconciler.leader import LeaderElector, LeaseTiming

pytestmark = pytest.mark.integration

LEASE = "raygate-test-release"
NAMESPACE = "default"  # it exists on every stack; raygate-system may not yet


class RenewalMeetsRelease(Kube):
    """Orders the two writers of the Lease as they can meet: the leader's renewal in flight writes after the
    release has read the Lease, and before the release writes it. (Unless stop() waits for it: then the release
    cannot start, and the renewal writes when its wait runs out.)"""

    def __init__(self, real: Kube) -> None:
        self.__dict__.update(real.__dict__)
        self.renewals = threading.Event()  # renewals go through the gate below
        self.in_flight = threading.Event()
        self.release_read = threading.Event()
        self.renewed = threading.Event()

    def get(self, res: Any, name: str, namespace: str | None = None) -> Any:
        found = super().get(res, name, namespace)
        if threading.current_thread() is threading.main_thread() and self.renewals.is_set():
            self.release_read.set()
        return found

    def replace(self, res: Any, name: str, obj: Any, namespace: str | None = None) -> Any:
        if not self.renewals.is_set():
            return super().replace(res, name, obj, namespace)
        if threading.current_thread() is threading.main_thread():  # the release
            self.renewed.wait(5)
            return super().replace(res, name, obj, namespace)
        self.in_flight.set()
        self.release_read.wait(2)
        try:
            return super().replace(res, name, obj, namespace)
        finally:
            self.renewed.set()


def _holder(kube: Kube) -> str:
    try:
        return str(kube.get(LEASES, LEASE, NAMESPACE)["spec"].get("holderIdentity") or "")
    except ApiError:
        return ""


def test_a_stopped_leader_gives_its_lease_up_after_a_renewal_in_flight(cluster: ControlPlane) -> None:
    kube = RenewalMeetsRelease(Kube.connect(str(cluster.kubeconfig), user_agent="raygate-test"))
    elector = LeaderElector(kube, NAMESPACE, LEASE, "leader-a", LeaseTiming(4, 3, 0.2))
    runner = threading.Thread(target=elector.run, args=(lambda: None,), daemon=True)
    runner.start()
    try:
        wait(elector.leading.is_set, 20, "the elector to lead")
        kube.renewals.set()
        wait(kube.in_flight.is_set, 5, "a renewal in flight")
        elector.stop(3)
        elector.release()
        assert _holder(kube) == "", "the Lease was not given up: a new leader would wait out its duration"
    finally:
        elector.stop(3)
        kube.delete(LEASES, LEASE, NAMESPACE)
