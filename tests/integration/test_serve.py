"""`raygate serve`, the webhook and the reconciler in one process, against the real API server: one gunicorn
worker admits and reconciles; a lost Lease restarts the worker as a standby while admission goes on; a stop (SIGTERM
to the container's first process) gives the Lease up."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from builders import RayJob, worker_group
from raystack import apply_config, delete_ray_objects
from waiting import wait

from raygate.core import keys
from raygate.core.api import LEASES, RAYJOBS, provisioning_requests
from raygate.core.objects import JSON
from raygate.devenv.controlplane import ControlPlane, alive
from raygate.devenv.raygate_local import start_webhook, stop_webhook
from raygate.kube.client import MERGE_PATCH, ApiError, Kube

pytestmark = pytest.mark.integration

NS = f"rg-serve-{uuid.uuid4().hex[:5]}"
NAME = "rg-serve"
IDENTITY = "serve-1"
PR = provisioning_requests("v1")
CONFIG = {"queues": {"default": {}, NS: {}}, "defaults": {"mode": "provisioning"}, "namespaces": {NS: {"queue": NS}}}
GPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}


@dataclass
class Serve:
    cluster: ControlPlane
    kube: Kube

    @property
    def master(self) -> int:
        state = self.cluster.load_state()
        assert state is not None
        return state.pids[NAME]

    def workers(self) -> list[int]:
        return [int(p) for p in Path(f"/proc/{self.master}/task/{self.master}/children").read_text().split()]

    def holder(self) -> str:
        try:
            return str(self.kube.get(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)["spec"].get("holderIdentity")
                       or "")
        except ApiError:
            return ""

    def held_job(self, name: str) -> JSON:
        """A GPU RayJob created and suspended by the webhook, with its request from the reconciler."""
        job = RayJob(name, None).head(requests={"cpu": "1"}, limits={"cpu": "1"}).groups(
            worker_group("gpu", replicas=2, min_replicas=0, max_replicas=2, requests=GPU["requests"],
                         limits=GPU["limits"])).obj()
        created: JSON = self.kube.create(RAYJOBS, job, NS)
        assert created["spec"]["suspend"] is True, "the webhook did not hold the job"
        return created

    def request_of(self, name: str) -> JSON | None:
        job = self.kube.get(RAYJOBS, name, NS)
        wanted = (job["metadata"].get("annotations") or {}).get(keys.REQUEST_ANNOTATION)
        return next((r for r in self.kube.list(PR, NS).get("items") or [] if r["metadata"]["name"] == wanted), None)

    def provision(self, request: JSON) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [{"type": t, "status": "True", "reason": t, "message": "test autoscaler",
                       "lastTransitionTime": now} for t in ("Accepted", "Provisioned")]
        self.kube.patch(PR, request["metadata"]["name"], {"status": {"conditions": conditions}}, NS,
                        content_type=MERGE_PATCH, sub="status")


@pytest.fixture(scope="module")
def serve(cluster: ControlPlane) -> Iterator[Serve]:
    kube = Kube.connect(str(cluster.kubeconfig), user_agent="raygate-test")
    apply_config(cluster, CONFIG)
    cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("label", "namespace", NS, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    kube.delete(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)  # a Lease left by another module's reconciler
    start_webhook(cluster, name=NAME, threads=4, reconciler=[
        "--identity", IDENTITY, "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"])
    s = Serve(cluster, kube)
    try:
        yield s
    finally:
        delete_ray_objects(cluster, [NS])
        stop_webhook(cluster, NAME)
        cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)


def test_one_worker_admits_and_reconciles(serve: Serve) -> None:
    wait(lambda: serve.holder() == IDENTITY, 60, "raygate serve to lead")
    assert len(serve.workers()) == 1, "raygate serve runs one worker beside its master, and no other process"
    serve.held_job("one")
    request = wait(lambda: serve.request_of("one"), 30, "the in-process reconciler to ask for the job's capacity")
    assert request["spec"]["podSets"][0]["count"] == 2
    serve.provision(request)
    wait(lambda: serve.kube.get(RAYJOBS, "one", NS)["spec"]["suspend"] is False, 30, "the job to be unsuspended")


def test_a_lost_lease_restarts_the_worker_as_a_standby_and_admission_goes_on(serve: Serve) -> None:
    wait(lambda: serve.holder() == IDENTITY, 60, "raygate serve to lead")
    [before] = serve.workers()
    # Another replica takes the Lease (as after a partition): this one must stop acting, and it must not go on
    # reconciling under a Lease it no longer holds.
    # A merge patch carries no resourceVersion, so it lands even when the leader renews (every 0.5 s) in between;
    # the leader's next renewal, which does carry one, is the write that conflicts.
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    serve.kube.patch(LEASES, keys.LEADER_LEASE, {"spec": {
        "holderIdentity": "another-replica", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now,
    }}, keys.SYSTEM_NAMESPACE)
    wait(lambda: serve.workers() not in ([], [before]), 30, "the worker to be replaced")
    serve.held_job("standby")  # the new worker admits
    time.sleep(3)
    assert serve.request_of("standby") is None, "a standby reconciled"
    serve.kube.delete(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)  # the other replica is gone
    wait(lambda: serve.holder() == IDENTITY, 30, "raygate serve to lead again")
    wait(lambda: serve.request_of("standby"), 30, "the new leader to ask for the held job's capacity")


def test_sigterm_to_the_first_process_gives_the_lease_up(serve: Serve) -> None:
    wait(lambda: serve.holder() == IDENTITY, 60, "raygate serve to lead")
    master = serve.master
    os.kill(master, signal.SIGTERM)  # what the kubelet sends: the first process only
    wait(lambda: not alive(master), 30, "raygate serve to stop")
    assert serve.holder() == "", "the Lease was not given up: a new replica would wait out its duration"
