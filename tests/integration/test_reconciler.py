"""The reconciler against the real API server, with the webhook and the reconciler as real processes.

The tests play cluster-autoscaler by patching ProvisioningRequest status (as Kueue's integration
tests do): they script exact conditions (BookingExpired, CapacityRevoked, a request stuck Accepted)
that the real autoscaler gives only at its own pace. The real autoscaler answers requests in
test_capacity.py. kube-controller-manager collects garbage and the real KubeRay operator creates
clusters and pods after unsuspend.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from builders import RayJob, worker_group
from raystack import apply_config, delete_ray_objects
from waiting import consistently, wait

from raygate.core import keys, podgate_policy
from raygate.core.api import (
    EVENTS,
    LEASES,
    MUTATING_POLICIES,
    PODGROUPS,
    PODS,
    PODTEMPLATES,
    RAYCLUSTERS,
    RAYJOBS,
    RAYSERVICES,
    VOLCANO_QUEUES,
    Resource,
    provisioning_requests,
)
from raygate.core.objects import JSON
from raygate.core.policy import parse_fields
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import reconciler_metrics_port, start_reconciler, start_webhook, stop_webhook
from raygate.kube.client import JSON_PATCH, MERGE_PATCH, ApiError, Kube

pytestmark = pytest.mark.integration

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"rg-{k}-{SUFFIX}" for k in ("main", "retry", "timeout", "volcano", "revoke", "crash", "ray", "limits",
                                        "quota")}
QUEUE = f"rg-queue-{SUFFIX}"
PR = provisioning_requests("v1")
RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")
LEASE_ARGS = ("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5", "--resync-seconds", "30")

# Each namespace waits in a queue of its own: a job one test keeps held at the front of its queue (this module
# plays the autoscaler, and answers only what it scripts) holds no job of another namespace.
OWN = {
    NS["retry"]: {"retry": {"limit": 1, "baseSeconds": 1.5, "maxSeconds": 3}},
    NS["timeout"]: {"provisioning": {"provisionedTimeoutSeconds": 3}, "retry": {"limit": 0}},
    NS["volcano"]: {"mode": "volcano", "queueName": QUEUE, "provisioning": {"enabled": True},
                    "retry": {"baseSeconds": 0.5}},
    NS["revoke"]: {"provisioning": {"capacityRevoked": "Requeue"}},
}
CONFIG = {
    "queues": {"default": {}, **{ns: {} for ns in NS.values()}},
    "defaults": {
        "mode": "provisioning",
        "retry": {"limit": 3, "baseSeconds": 1, "maxSeconds": 2},
    },
    "namespaces": {ns: {"queue": ns, **OWN.get(ns, {})} for ns in NS.values()},
}


# --- the environment ----------------------------------------------------------------------------

@dataclass
class Reconcilers:
    cluster: ControlPlane
    running: dict[str, str] = field(default_factory=dict)  # identity -> process name

    def start(self, identity: str) -> None:
        name = f"rg-reconciler-{identity}"
        start_reconciler(self.cluster, "--identity", identity, *LEASE_ARGS, name=name)
        self.running[identity] = name

    def kill9(self, identity: str) -> None:
        name = self.running.pop(identity)
        state = self.cluster.load_state()
        assert state is not None
        pid = state.pids[name]
        os.killpg(pid, signal.SIGKILL)
        self.cluster.stop_process(name)

    def stop_all(self) -> None:
        for name in self.running.values():
            self.cluster.stop_process(name)
        self.running.clear()

    def metrics_port(self, identity: str) -> int:
        port = reconciler_metrics_port(self.cluster, self.running[identity])
        assert port is not None, f"reconciler {identity} logged no metrics port"
        return port

    def metrics(self, identity: str) -> dict[str, float]:
        """Each sample of the reconciler's /metrics, by its name and labels as written."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port(identity)}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def writes_by_method(self, identity: str) -> dict[str, int]:
        return {m: int(self.metrics(identity).get(f'raygate_reconciler_api_requests_total{{method="{m}"}}', 0))
                for m in ("POST", "PATCH", "DELETE")}

    def writes(self, identity: str) -> int:
        """POST + PATCH + DELETE the reconciler has made (PUT is only its Lease)."""
        return int(sum(self.metrics(identity).get(f'raygate_reconciler_api_requests_total{{method="{m}"}}', 0)
                       for m in ("POST", "PATCH", "DELETE")))


@dataclass
class Env:
    cluster: ControlPlane
    kube: Kube
    reconcilers: Reconcilers

    def leader(self) -> str:
        try:
            lease = self.kube.get(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)
        except ApiError:
            return ""
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def pod_gate_policy_synced(self) -> None:
        """Wait for the leader's housekeeping to write CONFIG into the pod gate's policy (which `start_webhook`
        installs unconfigured): a test that counts the reconciler's writes must not count that one."""
        wanted = podgate_policy.policy(parse_fields(yaml.safe_dump(CONFIG)))["spec"]["matchConditions"]
        wait(lambda: self.kube.get(MUTATING_POLICIES, podgate_policy.POLICY_NAME)["spec"]["matchConditions"] == wanted,
             40, "the reconciler to have written the config into the pod gate's policy")


@pytest.fixture(scope="module")
def env(cluster: ControlPlane) -> Iterator[Env]:
    kube = Kube.connect(str(cluster.kubeconfig), user_agent="raygate-test")
    apply_config(cluster, CONFIG)
    for ns in NS.values():
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    kube.create(VOLCANO_QUEUES, {"metadata": {"name": QUEUE}, "spec": {"weight": 1}})
    set_queue_state(kube, "Closed")
    kube.delete(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)  # a Lease left by another module's reconciler
    start_webhook(cluster, name="rg-reconciler-test-webhook")
    reconcilers = Reconcilers(cluster)
    e = Env(cluster, kube, reconcilers)
    reconcilers.start("r1")
    wait(lambda: e.leader() == "r1", 60, "reconciler r1 to lead")
    e.pod_gate_policy_synced()
    try:
        yield e
    finally:
        reconcilers.stop_all()
        stop_webhook(cluster, "rg-reconciler-test-webhook")
        cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
        for ns in NS.values():
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kube.delete(VOLCANO_QUEUES, QUEUE)


@pytest.fixture(autouse=True)
def empty_queue(env: Env) -> Iterator[None]:
    """Every test starts with empty queues. A held job asks only once the jobs ahead of it in its queue were
    answered, and this module answers only the requests it scripts: a job one test leaves held would hold the
    front for the next test's jobs in that namespace."""
    yield
    delete_ray_objects(env.cluster, NS.values())


def set_queue_state(kube: Kube, state: str) -> None:
    kube.patch(VOLCANO_QUEUES, QUEUE, {"status": {"state": state}}, sub="status")


# --- objects ------------------------------------------------------------------------------------

def worker(name: str, replicas: int, resources: dict[str, Any]) -> dict[str, Any]:
    return worker_group(name, replicas=replicas, min_replicas=0, max_replicas=10,
                        requests=resources.get("requests"), limits=resources.get("limits"))


GPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}
CPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}


def rayjob(name: str, *, gpus: int = 2, groups: list[dict[str, Any]] | None = None) -> JSON:
    if groups is None:
        groups = [worker("gpu", gpus, GPU)] if gpus else [worker("cpu", 1, CPU)]
    return RayJob(name, None).head(requests=CPU["requests"], limits=CPU["limits"]).groups(*groups).obj()


def create(env: Env, ns: str, obj: JSON) -> JSON:
    return env.kube.create(RAYJOBS, obj, ns)


def job(env: Env, ns: str, name: str) -> JSON:
    return env.kube.get(RAYJOBS, name, ns)


def state(obj: JSON) -> str:
    return str(obj["metadata"].get("labels", {}).get(keys.STATE_LABEL, ""))


def ann(obj: JSON, key: str) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(key)


def requests_of(env: Env, ns: str) -> list[JSON]:
    return list(env.kube.list(PR, ns).get("items") or [])


def templates_of(env: Env, ns: str) -> list[JSON]:
    return list(env.kube.list(PODTEMPLATES, ns).get("items") or [])


def owned_by(obj: JSON, owner: JSON) -> bool:
    return any(r.get("uid") == owner["metadata"]["uid"] and r.get("controller")
               for r in obj["metadata"].get("ownerReferences") or [])


def set_conditions(env: Env, ns: str, name: str, *conds: tuple[str, str, str]) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"status": {"conditions": [
        {"type": t, "status": s, "reason": r, "message": f"test autoscaler: {r}", "lastTransitionTime": now}
        for t, s, r in conds]}}
    env.kube.patch(PR, name, body, ns, content_type=MERGE_PATCH, sub="status")


def wait_state(env: Env, ns: str, name: str, want: str, timeout: float = 20) -> JSON:
    result: JSON = wait(lambda: (lambda o: o if state(o) == want else None)(job(env, ns, name)), timeout,
                f"{ns}/{name} to be {want}")
    return result


def wait_request(env: Env, ns: str, name: str, attempt: int, timeout: float = 20) -> JSON:
    """The job's current request, once the job names attempt `attempt` and the request exists."""
    def check() -> JSON | None:
        o = job(env, ns, name)
        if ann(o, keys.ATTEMPT_ANNOTATION) != str(attempt) or state(o) != "Provisioning":
            return None
        return next((r for r in requests_of(env, ns) if r["metadata"]["name"] == ann(o, keys.REQUEST_ANNOTATION)),
                    None)
    result: JSON = wait(check, timeout, f"{ns}/{name} attempt {attempt} request")
    return result


def events_of(env: Env, ns: str, name: str) -> dict[str, str]:
    items = env.kube.list(EVENTS, ns, fieldSelector=f"involvedObject.name={name}").get("items") or []
    return {str(e["reason"]): str(e["message"]) for e in items}


def event(env: Env, ns: str, name: str, reason: str) -> str:
    """The message of the job's Event with `reason`; Events are sent off the reconcile path, so wait."""
    return str(wait(lambda: events_of(env, ns, name).get(reason), 20, f"a {reason} Event on {name}"))


PROVISIONED = (("Accepted", "True", "Accepted"), ("Provisioned", "True", "Provisioned"))


# --- the flows ----------------------------------------------------------------------------------

def test_happy_path_accepted_holds_provisioned_admits(env: Env) -> None:
    ns = NS["main"]
    before = env.reconcilers.writes(env.leader())
    by_method = env.reconcilers.writes_by_method(env.leader())
    created = create(env, ns, rayjob("happy"))
    pr = wait_request(env, ns, "happy", 1)
    assert owned_by(pr, created)
    pts = templates_of(env, ns)
    assert [p["metadata"]["name"] for p in pts] == [pr["spec"]["podSets"][0]["podTemplateRef"]["name"]]
    assert pr["spec"]["podSets"][0]["count"] == 2 and owned_by(pts[0], created)
    assert pr["spec"]["provisioningClassName"] == keys.CHECK_CAPACITY_CLASS

    set_conditions(env, ns, pr["metadata"]["name"], ("Accepted", "True", "Accepted"))
    consistently(lambda: (lambda o: o["spec"]["suspend"] is True and state(o) == "Provisioning")(job(env, ns, "happy")),
                 1.5, "Accepted alone to keep it held")

    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    t0 = time.monotonic()
    admitted = wait(lambda: (lambda o: o if o["spec"].get("suspend") is False else None)(job(env, ns, "happy")),
                    15, "unsuspend after Provisioned", interval=0.02)
    print(f"\nProvisioned -> unsuspended: {time.monotonic() - t0:.3f}s (polled every 20 ms)")
    assert state(admitted) == "Admitted" and ann(admitted, keys.ADMITTED_AT_ANNOTATION)
    tpl = admitted["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    assert tpl["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == pr["metadata"]["name"]
    assert tpl["metadata"]["annotations"][keys.CLASS_ANNOTATION] == keys.CHECK_CAPACITY_CLASS
    assert keys.CONSUME_ANNOTATION not in (admitted["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
                                           .get("metadata", {}).get("annotations") or {})
    events = wait(lambda: (lambda e: e if "Admitted" in e and "FrontOfQueue" in e else None)(
        events_of(env, ns, "happy")), 10, "events")
    assert pr["metadata"]["name"] in events["Admitted"]
    assert f"at the front of queue {ns}" in events["FrontOfQueue"]  # its namespace's own queue
    # 7 for the job and its children (its template and request, two patches of the job, the FrontOfQueue and
    # Admitted Events, and one to spare: a patch refused on a stale view of the job, which KubeRay updates while
    # raygate holds it), and one per GPU pod: the patch that lifts its gate (KubeRay runs here).
    wait(lambda: all(not pod_gated(p) for p in wait_pods(env, ns, "happy", 3)), 20, "the GPU pods released")
    consistently(lambda: env.reconcilers.writes(env.leader()) - before <= 7 + 2, 1,
                 "no more than 7 API writes for one admitted job and 1 per GPU pod, nothing more after admission",
                 explain=lambda: f"writes by method {by_method} -> {env.reconcilers.writes_by_method(env.leader())}")
    writes = env.reconcilers.writes(env.leader()) - before
    print(f"API writes for one admitted job (one GPU pod set of 2 pods): {writes}")
    assert writes <= 7 + 2
    # Where the job's time went inside raygate is on /metrics: waits for a worker, answers of the API.
    seen = env.reconcilers.metrics(env.leader())
    assert seen["raygate_reconciler_queue_wait_seconds_count"] >= 2  # created, then Provisioned
    assert seen['raygate_reconciler_api_request_seconds_count{method="PATCH"}'] >= 2  # Provisioning, Admitted
    assert seen['raygate_reconciler_api_request_seconds_count{method="POST"}'] >= 2  # template, request
    assert "raygate_reconciler_queue_depth" in seen


def test_a_raycluster_is_held_and_admitted_the_same_way(env: Env) -> None:
    ns = NS["main"]
    spec = rayjob("x")["spec"]["rayClusterSpec"]
    created = env.kube.create(RAYCLUSTERS, {"metadata": {"name": "plain-cluster"}, "spec": spec}, ns)

    def current_request() -> JSON | None:
        o = env.kube.get(RAYCLUSTERS, "plain-cluster", ns)
        name = ann(o, keys.REQUEST_ANNOTATION)
        return next((r for r in requests_of(env, ns) if r["metadata"]["name"] == name), None)

    pr: JSON = wait(current_request, 20, "the RayCluster's request")
    assert owned_by(pr, created) and pr["spec"]["podSets"][0]["count"] == 2
    assert env.kube.get(RAYCLUSTERS, "plain-cluster", ns)["spec"]["suspend"] is True
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    admitted = wait(lambda: (lambda o: o if state(o) == "Admitted" else None)(
        env.kube.get(RAYCLUSTERS, "plain-cluster", ns)), 15, "the RayCluster to be admitted")
    assert not admitted["spec"].get("suspend")
    # Its GPU pods are born gated (a RayJob's templates name the booking instead: the happy path above).
    tpl = admitted["spec"]["workerGroupSpecs"][0]["template"]
    assert tpl["spec"]["schedulingGates"] == [{"name": keys.CAPACITY_GATE}]
    assert tpl["metadata"]["annotations"] == {
        keys.RAY_OWNER_ANNOTATION: f"RayCluster/plain-cluster/{created['metadata']['uid']}/gpu"}


def test_cpu_only_job_is_admitted_without_a_request(env: Env) -> None:
    ns = NS["main"]
    create(env, ns, rayjob("cpu-only", gpus=0))
    admitted = wait_state(env, ns, "cpu-only", "Admitted")
    assert not admitted["spec"].get("suspend")  # KubeRay's own updates drop a false suspend
    assert not [r for r in requests_of(env, ns) if r["metadata"]["name"].startswith("cpu-only")]
    assert "no capacity request was needed" in event(env, ns, "cpu-only", "Admitted")


def test_too_many_gpu_pod_sets_are_refused_at_create_with_a_reason(env: Env) -> None:
    ns = NS["main"]
    with pytest.raises(ApiError) as refused:
        create(env, ns, rayjob("too-many", groups=[worker(f"g{i}", 1, GPU) for i in range(33)]))
    assert "one ProvisioningRequest books at most 32: merge worker groups" in refused.value.message


def test_failed_retries_with_backoff_gives_up_and_restarts_on_relabel(env: Env) -> None:
    ns = NS["retry"]  # limit 1, base 1.5 s
    create(env, ns, rayjob("flaky"))
    first = wait_request(env, ns, "flaky", 1)
    set_conditions(env, ns, first["metadata"]["name"], ("Accepted", "True", "Accepted"),
                   ("Failed", "True", "OutOfQuota"))
    t_failed = time.monotonic()
    second = wait_request(env, ns, "flaky", 2)
    assert time.monotonic() - t_failed >= 1.2, "the retry must wait for the backoff"
    assert second["metadata"]["name"] != first["metadata"]["name"]
    wait(lambda: [r["metadata"]["name"] for r in requests_of(env, ns)] == [second["metadata"]["name"]], 10,
         "the failed request to be deleted")
    held = job(env, ns, "flaky")
    assert "OutOfQuota" in str(ann(held, keys.REASON_ANNOTATION)) and ann(held, keys.NEXT_ATTEMPT_ANNOTATION)

    set_conditions(env, ns, second["metadata"]["name"], ("Failed", "True", "OutOfQuota"))
    failed = wait_state(env, ns, "flaky", "Failed")
    assert failed["spec"]["suspend"] is True
    assert "test autoscaler: OutOfQuota" in str(ann(failed, keys.REASON_ANNOTATION))
    wait(lambda: not requests_of(env, ns) and not templates_of(env, ns), 10, "requests and templates deleted")
    assert "test autoscaler: OutOfQuota" in event(env, ns, "flaky", "ProvisioningFailed")

    # The documented restart: relabel Pending; it starts over at attempt 1.
    env.cluster.kubectl("label", "rayjob", "flaky", "-n", ns, f"{keys.STATE_LABEL}=Pending", "--overwrite")
    again = wait_request(env, ns, "flaky", 1)
    assert again["metadata"]["name"] == first["metadata"]["name"]


def test_booking_expired_before_admission_starts_a_new_attempt(env: Env) -> None:
    ns = NS["main"]
    create(env, ns, rayjob("expired"))
    first = wait_request(env, ns, "expired", 1)
    set_conditions(env, ns, first["metadata"]["name"], *PROVISIONED, ("BookingExpired", "True", "BookingExpired"))
    second = wait_request(env, ns, "expired", 2)
    assert second["metadata"]["name"].endswith("-a2")
    assert job(env, ns, "expired")["spec"]["suspend"] is True


def test_not_provisioned_past_the_timeout_asks_again_in_the_same_attempt_and_never_fails(env: Env) -> None:
    ns = NS["timeout"]  # provisionedTimeoutSeconds 3, no retry
    create(env, ns, rayjob("stuck"))
    first = wait_request(env, ns, "stuck", 1)
    name = first["metadata"]["name"]
    # Taken from the autoscaler's queue but not answered (it takes one request per loop; a write conflict sends
    # one round again): a new request would only join the same queue, so the job waits past the timeout.
    set_conditions(env, ns, name, ("Accepted", "True", "Accepted"))
    consistently(lambda: (lambda o: ann(o, keys.ATTEMPT_ANNOTATION) == "1" and ann(o, keys.REQUEST_ANNOTATION) == name
                          and state(o) == "Provisioning")(job(env, ns, "stuck"))
                 and [r["metadata"]["name"] for r in requests_of(env, ns)] == [name], 9,
                 "the queued request kept, no second request")

    # Answered "not now", and answered anew on every loop (as the pinned autoscaler does, each time with a fresh
    # lastTransitionTime): the job waits, and asks again once the first answer is 3 s old.
    not_now = (("Accepted", "True", "Accepted"), ("Provisioned", "False", "CapacityIsNotFound"))
    set_conditions(env, ns, name, *not_now)
    t_answered = time.monotonic()
    waiting = wait(lambda: (lambda o: o if "CapacityIsNotFound" in str(ann(o, keys.REASON_ANNOTATION)) else None)(
        job(env, ns, "stuck")), 10, "the autoscaler's answer in the job's reason")
    assert str(ann(waiting, keys.NOT_PROVISIONED_SINCE_ANNOTATION)).startswith(f"{name} ")

    def asked_again(old: str) -> JSON | None:
        o = job(env, ns, "stuck")
        if ann(o, keys.REQUEST_ANNOTATION) != old:
            return o
        with contextlib.suppress(ApiError):  # withdrawn meanwhile: the next poll sees the job's new request
            set_conditions(env, ns, old, *not_now)
        return None

    again: JSON = wait(lambda: asked_again(name), 20, "the job to ask again with a new request", interval=1)
    assert time.monotonic() - t_answered >= 2.9, "asked again before the first answer was 3 s old"
    second = wait_request(env, ns, "stuck", 1)
    assert second["metadata"]["name"] == ann(again, keys.REQUEST_ANNOTATION) == f"{name}r1"
    assert ann(again, keys.ROUND_ANNOTATION) == "1"
    wait(lambda: [r["metadata"]["name"] for r in requests_of(env, ns)] == [f"{name}r1"], 10,
         "the first request to be deleted")

    # Waiting is not failing: with retry.limit 0 a timeout used to fail the job; answered "not now" again, it
    # asks again once more, still in its first attempt, still held.
    set_conditions(env, ns, f"{name}r1", *not_now)
    wait(lambda: asked_again(f"{name}r1"), 20, "the job to ask again a second time", interval=1)
    third = wait_request(env, ns, "stuck", 1)
    held = job(env, ns, "stuck")
    assert third["metadata"]["name"] == f"{name}r2" and ann(held, keys.ROUND_ANNOTATION) == "2"
    assert held["spec"]["suspend"] is True and state(held) == "Provisioning"
    assert not {"ProvisioningRetry", "ProvisioningFailed"} & set(events_of(env, ns, "stuck"))


def test_capacity_revoked_after_admission_requeues(env: Env) -> None:
    ns = NS["revoke"]  # capacityRevoked: Requeue
    create(env, ns, rayjob("revoked"))
    first = wait_request(env, ns, "revoked", 1)
    set_conditions(env, ns, first["metadata"]["name"], *PROVISIONED)
    wait_state(env, ns, "revoked", "Admitted")
    set_conditions(env, ns, first["metadata"]["name"], *PROVISIONED, ("CapacityRevoked", "True", "NodeLost"))
    second = wait_request(env, ns, "revoked", 2)
    requeued = job(env, ns, "revoked")
    assert requeued["spec"]["suspend"] is True
    assert "NodeLost" in event(env, ns, "revoked", "CapacityRevoked")
    # The first booking goes with the last of the pods that used it (KubeRay deletes them once suspended).
    wait(lambda: [r["metadata"]["name"] for r in requests_of(env, ns)] == [second["metadata"]["name"]], 60,
         "only the second request to be left")


def test_deleting_or_finishing_a_job_frees_its_requests_and_templates(env: Env) -> None:
    ns = NS["main"]
    # In queue order: the job admitted first leaves the queue, and the one left held is at its front.
    finished = create(env, ns, rayjob("finished"))
    pr = wait_request(env, ns, "finished", 1)
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    wait_state(env, ns, "finished", "Admitted")
    gone = create(env, ns, rayjob("deleted"))
    wait_request(env, ns, "deleted", 1)

    env.kube.delete(RAYJOBS, "deleted", ns)
    env.kube.patch(RAYJOBS, "finished", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}},
                   ns, sub="status")

    def leftovers(*jobs: JSON) -> list[str]:
        return [o["metadata"]["name"] for o in requests_of(env, ns) + templates_of(env, ns)
                if any(owned_by(o, j) for j in jobs)]

    wait(lambda: not leftovers(gone), 15, "the request and template of the deleted job to go")
    # The finished job's pods may still run (KubeRay deletes its cluster in its own time): its booking goes
    # with the last of them.
    for cluster in env.kube.list(RAYCLUSTERS, ns, labelSelector=f"{keys.ORIGINATED_FROM_NAME_LABEL}=finished")["items"]:
        env.kube.delete(RAYCLUSTERS, cluster["metadata"]["name"], ns)
    wait(lambda: not leftovers(finished), 60, "the request and template of the finished job to go")


@pytest.mark.kuberay
def test_volcano_pod_group_held_while_queue_closed_then_pods_carry_metadata(env: Env) -> None:
    ns = NS["volcano"]  # mode volcano, queue QUEUE (Closed), provisioning enabled
    created = create(env, ns, rayjob("gang"))
    reason = wait(lambda: (lambda r: r if r and QUEUE in r else None)(
        ann(job(env, ns, "gang"), keys.REASON_ANNOTATION)), 15, "the job to say its queue is closed")
    assert "Closed" in reason
    assert QUEUE in event(env, ns, "gang", "QueueNotOpen")
    consistently(lambda: (lambda o: state(o) == "Pending" and o["spec"]["suspend"] is True)(job(env, ns, "gang"))
                 and not env.kube.list(PODGROUPS, ns).get("items"), 1.5,
                 "the job held, and no PodGroup, while its queue is closed")
    held = job(env, ns, "gang")

    set_queue_state(env.kube, "Open")
    try:
        pr = wait_request(env, ns, "gang", 1)
        pg = env.kube.get(PODGROUPS, "ray-gang-pg", ns)
        assert owned_by(pg, created)
        recorded = json.loads(str(ann(held, keys.POD_GROUP_ANNOTATION)))
        assert pg["spec"]["minMember"] == recorded["minMember"] == 3 and pg["spec"]["queue"] == QUEUE
        set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
        wait_state(env, ns, "gang", "Admitted")
        pods = wait_pods(env, ns, "gang", 3)
    finally:
        set_queue_state(env.kube, "Closed")
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"][keys.VOLCANO_GROUP_NAME_ANNOTATION] == "ray-gang-pg"
    def released_workers() -> list[JSON] | None:
        """The GPU workers once raygate lifted their gate: it writes the booking they consume then."""
        found = [p for p in wait_pods(env, ns, "gang", 3)
                 if p["metadata"]["annotations"].get(keys.VOLCANO_TASK_SPEC_ANNOTATION) == "gpu"]
        return found if found and not any(pod_gated(p) for p in found) else None
    workers = wait(released_workers, 60, "the GPU workers released", interval=0.5)
    assert len(workers) == 2
    for pod in workers:
        assert pod["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == pr["metadata"]["name"]


def wait_pods(env: Env, ns: str, job_name: str, count: int, timeout: float = 60) -> list[JSON]:
    """The pods KubeRay created for the RayJob's cluster, once there are `count` of them."""
    def check() -> list[JSON] | None:
        clusters = env.kube.list(RAYCLUSTERS, ns, labelSelector=f"{keys.ORIGINATED_FROM_NAME_LABEL}={job_name}")
        names = [c["metadata"]["name"] for c in clusters.get("items") or []]
        if not names:
            return None
        pods = env.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={names[0]}").get("items") or []
        return pods if len(pods) >= count else None
    result: list[JSON] = wait(check, timeout, f"{count} pods of {ns}/{job_name}", interval=0.5)
    return result


@pytest.mark.kuberay
def test_kuberay_pods_carry_the_consume_annotations(env: Env) -> None:
    ns = NS["ray"]
    create(env, ns, rayjob("with-pods"))
    pr = wait_request(env, ns, "with-pods", 1)
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    wait_state(env, ns, "with-pods", "Admitted")

    def released_gpu_pods() -> list[JSON] | None:
        """The GPU pods once raygate lifted their gate: it writes the booking they consume then."""
        gpu = [p for p in wait_pods(env, ns, "with-pods", 3) if p["metadata"]["labels"].get("ray.io/group") == "gpu"]
        return gpu if gpu and not any(pod_gated(p) for p in gpu) else None
    gpu_pods = wait(released_gpu_pods, 60, "the GPU pods released", interval=0.5)
    assert len(gpu_pods) == 2
    for pod in gpu_pods:
        assert pod["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == pr["metadata"]["name"]
        assert pod["metadata"]["annotations"][keys.CLASS_ANNOTATION] == keys.CHECK_CAPACITY_CLASS


# --- what one object may ask, and how long a booking lives ------------------------------------------

def admitted_with_pods(env: Env, ns: str, name: str, obj: JSON | None = None) -> tuple[JSON, list[JSON]]:
    """A job admitted on its request (the test plays the autoscaler), and its pods once raygate released
    them against it: until then no pod consumes the booking, and a job that ends then takes it along."""
    create(env, ns, obj or rayjob(name))
    pr = wait_request(env, ns, name, 1)
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    wait_state(env, ns, name, "Admitted")

    def released() -> list[JSON] | None:
        pods = wait_pods(env, ns, name, 3)
        return pods if not any(pod_gated(p) for p in pods) else None
    return pr, wait(released, 60, f"the pods of {ns}/{name} released", interval=0.5)


def pod_gated(pod: JSON) -> bool:
    return any(g.get("name") == keys.CAPACITY_GATE for g in pod["spec"].get("schedulingGates") or [])


def request_exists(env: Env, ns: str, name: str) -> bool:
    return any(r["metadata"]["name"] == name for r in requests_of(env, ns))


@pytest.mark.kuberay
def test_a_job_kuberay_refuses_while_it_runs_keeps_its_booking_until_its_pods_end(env: Env) -> None:
    ns = NS["ray"]
    pr, _ = admitted_with_pods(env, ns, "refused-later")
    name = pr["metadata"]["name"]
    # An edit KubeRay answers with ValidationFailed, for good; its cluster and pods keep running.
    env.kube.patch(RAYJOBS, "refused-later", {"spec": {"ttlSecondsAfterFinished": -1}}, ns, content_type=MERGE_PATCH)
    failed = wait_state(env, ns, "refused-later", "Failed")
    assert f"ProvisioningRequest {name} stays while 2 of its pods still run" in (ann(failed, keys.REASON_ANNOTATION)
                                                                               or "")
    consistently(lambda: request_exists(env, ns, name), 3, "the request to stay while its pods run")
    cluster = job(env, ns, "refused-later")["status"]["rayClusterName"]
    env.kube.delete(RAYCLUSTERS, cluster, ns)  # the pods go with their cluster
    wait(lambda: not request_exists(env, ns, name), 60, "the request to go with the last of its pods")


@pytest.mark.kuberay
def test_a_deleted_job_kept_by_a_finalizer_keeps_its_booking_while_its_pods_run(env: Env) -> None:
    ns = NS["ray"]
    obj = rayjob("kept")
    obj["metadata"]["finalizers"] = ["example.com/keep"]
    pr, _ = admitted_with_pods(env, ns, "kept", obj)
    name = pr["metadata"]["name"]
    env.kube.delete(RAYJOBS, "kept", ns)
    wait(lambda: job(env, ns, "kept")["metadata"].get("deletionTimestamp"), 20, "the job to be deleting")
    consistently(lambda: request_exists(env, ns, name), 3, "the request to stay while the deleting job's pods run")
    assert len(wait_pods(env, ns, "kept", 3)) == 3  # they did run all along
    env.kube.patch(RAYJOBS, "kept", {"metadata": {"finalizers": None}}, ns, content_type=MERGE_PATCH)
    wait(lambda: not request_exists(env, ns, name), 60, "the request to go with the job and its pods")


@pytest.mark.kuberay
def test_a_gang_kuberay_cannot_finish_runs_the_pods_it_has_after_the_wait(env: Env) -> None:
    ns = NS["quota"]
    # Room for the head and one of the two GPU workers: KubeRay's create of the other is refused, for good.
    # No quota controller runs here, so the test writes the status the quota admission plugin counts from.
    env.kube.create(RESOURCE_QUOTAS, {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}}}, ns)
    env.kube.request("PUT", RESOURCE_QUOTAS.path(ns, "two-pods", "status"), body={
        "metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}},
        "status": {"hard": {"pods": "2"}, "used": {"pods": "0"}}})
    create(env, ns, rayjob("short"))
    pr = wait_request(env, ns, "short", 1)
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    wait_state(env, ns, "short", "Admitted")

    def released_worker() -> JSON | None:
        gpu = [p for p in wait_pods(env, ns, "short", 2) if p["metadata"]["labels"].get("ray.io/group") == "gpu"]
        return gpu[0] if len(gpu) == 1 and not pod_gated(gpu[0]) else None
    worker = wait(released_worker, 30, "the one GPU worker there is released once its group stops coming",
                  interval=0.5)
    assert worker["metadata"]["annotations"][keys.CONSUME_ANNOTATION] == pr["metadata"]["name"]


def test_a_huge_group_is_refused_at_create_and_on_update_and_nothing_is_requested(env: Env) -> None:
    ns = NS["limits"]
    huge = rayjob("huge", groups=[worker_group("gpu", replicas=2147483647, max_replicas=2147483647,
                                               limits=GPU["limits"], requests=GPU["requests"])])
    with pytest.raises(ApiError) as refused:
        create(env, ns, huge)
    assert "can run up to 2,147,483,649 pods" in refused.value.message
    assert "limits.maxPods in raygate-config" in refused.value.message
    create(env, ns, rayjob("grows"))
    wait_request(env, ns, "grows", 1)
    before = {r["metadata"]["name"] for r in requests_of(env, ns)}
    with pytest.raises(ApiError) as grown:  # held: an edit would replace the request with a huge one
        group = "/spec/rayClusterSpec/workerGroupSpecs/0"
        env.kube.patch(RAYJOBS, "grows", [{"op": "replace", "path": f"{group}/{field}", "value": 200000}
                                          for field in ("replicas", "maxReplicas")], ns, content_type=JSON_PATCH)
    assert "raygate refused this change of RayJob grows" in grown.value.message
    assert "would book 200,000 pods" in grown.value.message
    consistently(lambda: {r["metadata"]["name"] for r in requests_of(env, ns)} == before, 3,
                 "no new request for the refused size")


def test_a_mig_group_is_booked_by_default(env: Env) -> None:
    ns = NS["limits"]
    mig = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"}}
    create(env, ns, rayjob("mig", groups=[worker("slices", 3, mig)]))
    pr = wait_request(env, ns, "mig", 1)
    assert [s["count"] for s in pr["spec"]["podSets"]] == [3]
    template = next(t for t in templates_of(env, ns)
                    if t["metadata"]["name"] == pr["spec"]["podSets"][0]["podTemplateRef"]["name"])
    limits = template["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "1"


def test_gpus_claimed_through_dra_are_refused_where_raygate_books(env: Env) -> None:
    ns = NS["limits"]
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "two-gpus", "namespace": ns},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}}
    env.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(template))
    obj = rayjob("dra", groups=[worker("gpu", 2, CPU)])
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["resourceClaims"] = [
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]

    def refused() -> str | None:  # the webhook's cache sees the template within moments
        try:
            create(env, ns, obj)
        except ApiError as err:
            return err.message if "2 gpu.nvidia.com per pod" in err.message else None
        env.kube.delete(RAYJOBS, "dra", ns)
        raise AssertionError("a RayJob claiming GPUs through DRA was admitted in a namespace raygate books")
    message = str(wait(refused, 20, "the refusal to count the claimed GPUs"))
    assert "kubernetes/autoscaler#10065" in message


# --- replicas and crashes ------------------------------------------------------------------------

def test_leader_failover_standby_finishes_the_flow(env: Env) -> None:
    ns = NS["main"]
    leader = env.leader()
    standby = "r2" if leader != "r2" else "r1"
    env.reconcilers.start(standby)
    try:
        # The standby's caches sync; it must not take the lease while the leader lives.
        consistently(lambda: env.leader() == leader, 2, f"{leader} to stay the leader while {standby} starts")
        create(env, ns, rayjob("failover"))
        pr = wait_request(env, ns, "failover", 1)
        assert env.reconcilers.writes(standby) == 0, "a standby must not write"
    except BaseException:
        env.reconcilers.kill9(standby)  # one reconciler, as the tests after this one expect
        raise
    env.reconcilers.kill9(leader)
    t0 = time.monotonic()
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    wait_state(env, ns, "failover", "Admitted", timeout=20)
    print(f"\nfailover: admitted {time.monotonic() - t0:.1f}s after the leader was killed (lease 4 s)")
    assert env.leader() == standby
    assert len([r for r in requests_of(env, ns) if r["metadata"]["name"].startswith("failover")]) == 1


def test_crash_safety_50_jobs_killed_at_random_points(env: Env) -> None:
    ns = NS["crash"]
    rng = random.Random(int(SUFFIX, 16))
    # Every request is provisioned as soon as it appears: this test is about what kill -9 leaves
    # behind, so the autoscaler's pace (and its limits) stay out of it.
    stop = threading.Event()
    provisioner = threading.Thread(target=provision_all, args=(env, ns, stop), daemon=True)
    provisioner.start()
    identity = env.leader()
    try:
        names = [f"crash-{i:02d}" for i in range(50)]
        for i, name in enumerate(names):
            create(env, ns, rayjob(name, gpus=1 + i % 2))
            if i in (10, 30):
                env.reconcilers.kill9(identity)  # mid-burst
                env.reconcilers.start(identity)  # same identity: it takes its own Lease back at once
        kills = 2
        for _ in range(4):
            time.sleep(rng.uniform(0.2, 2.5))
            env.reconcilers.kill9(identity)
            env.reconcilers.start(identity)
            kills += 1

        def admitted() -> bool:
            items = env.kube.list(RAYJOBS, ns).get("items") or []
            return len(items) == 50 and all(state(o) == "Admitted" for o in items)

        wait(admitted, 240, "all 50 jobs to be admitted", interval=1)
        consistently(admitted, 2, "all 50 jobs to stay admitted while late (wrong) writes could land")
        jobs = {o["metadata"]["uid"]: o for o in env.kube.list(RAYJOBS, ns).get("items") or []}
        requests = requests_of(env, ns)
        templates = templates_of(env, ns)
        for o in jobs.values():
            mine = [r for r in requests if owned_by(r, o)]
            attempt = int(str(ann(o, keys.ATTEMPT_ANNOTATION)))
            # A job that had asked withdraws its request when another one, created in the same second with a smaller
            # uid, comes in ahead of it, and asks again later: a new round of the same attempt.
            rounds = ann(o, keys.ROUND_ANNOTATION)
            assert [r["metadata"]["name"] for r in mine] == [ann(o, keys.REQUEST_ANNOTATION)], o["metadata"]["name"]
            assert mine[0]["metadata"]["name"].endswith(f"-a{attempt}" + (f"r{rounds}" if rounds else ""))
            assert len([t for t in templates if owned_by(t, o)]) == 1
            assert not o["spec"].get("suspend")
        owners = {r["uid"] for obj in requests + templates for r in obj["metadata"]["ownerReferences"]}
        assert owners <= set(jobs), "orphaned requests or templates"
        assert len(requests) == 50 and len(templates) == 50
        print(f"\ncrash test: {kills} kill -9 restarts; 50 jobs admitted, 50 requests, 50 templates, no orphans")
    finally:
        stop.set()
        provisioner.join()


def provision_all(env: Env, ns: str, stop: threading.Event) -> None:
    """Play an autoscaler with room for everything: mark each new request Accepted and Provisioned."""
    done: set[str] = set()
    while not stop.wait(0.3):
        for pr in requests_of(env, ns):
            name = pr["metadata"]["name"]
            if name not in done:
                try:
                    set_conditions(env, ns, name, *PROVISIONED)
                except ApiError:  # deleted or replaced meanwhile; the next pass sees its successor
                    continue
                done.add(name)


# --- RayService: KubeRay's controller makes and updates its clusters ------------------------------------

def rayservice(name: str, gpu_workers: int) -> JSON:
    cluster = rayjob(name)["spec"]["rayClusterSpec"]
    cluster["workerGroupSpecs"][0]["replicas"] = gpu_workers
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
            "spec": {"serveConfigV2": "applications: []\n", "rayClusterConfig": cluster}}


@pytest.mark.kuberay
def test_a_rayservice_cluster_is_held_booked_and_updated_by_the_operator_without_refusal(env: Env) -> None:
    ns = NS["ray"]
    env.cluster.kubectl("create", "-n", ns, "-f", "-", input_text=json.dumps(rayservice("serve", 2)))

    def cluster() -> JSON | None:
        items = env.kube.list(RAYCLUSTERS, ns, labelSelector=f"{keys.ORIGINATED_FROM_NAME_LABEL}=serve")["items"]
        return items[0] if items and state(items[0]) == "Provisioning" else None
    held = wait(cluster, 60, "the RayService's cluster to be held for its booking")
    name = held["metadata"]["name"]
    assert held["spec"]["suspend"] is True
    pr = next(r for r in requests_of(env, ns) if owned_by(r, held))
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)
    wait(lambda: state(env.kube.get(RAYCLUSTERS, name, ns)) == "Admitted", 30, "the cluster to be admitted")

    def gpu_workers() -> list[JSON]:
        return [p for p in env.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={name}")["items"]
                if p["metadata"]["labels"].get(keys.RAY_GROUP_LABEL) == "gpu"]
    wait(lambda: len(gpu_workers()) == 2 and not any(pod_gated(p) for p in gpu_workers()), 60,
         "its 2 GPU pods released into the booking")
    # A new worker group in the RayService: the operator updates its cluster wholesale (replacing its spec,
    # labels and annotations, as it also does on every reconcile while raygate held it), and raygate books
    # the new pod as a scale-up.
    more = {**worker("more", 1, GPU)}
    env.kube.patch(RAYSERVICES, "serve", [{"op": "add", "path": "/spec/rayClusterConfig/workerGroupSpecs/-",
                                           "value": more}], ns, content_type=JSON_PATCH)

    def more_pods() -> list[JSON]:
        return [p for p in env.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={name}")["items"]
                if p["metadata"]["labels"].get(keys.RAY_GROUP_LABEL) == "more"]
    wait(lambda: any(pod_gated(p) for p in more_pods()), 60, "the new group's GPU pod, born gated")
    assert state(env.kube.get(RAYCLUSTERS, name, ns)) == "Admitted"
    wait(lambda: [r for r in requests_of(env, ns) if owned_by(r, held)
                  and keys.SCALE_UP_ANNOTATION in (r["metadata"].get("annotations") or {})], 30, "its scale-up request")
    # (A write conflict, which KubeRay retries, is no refusal: raygate's webhooks refused none of its updates.)
    refused = [e for e in env.kube.list(EVENTS, ns, fieldSelector="involvedObject.name=serve").get("items") or []
               if e["reason"] in ("FailedToUpdateRayCluster", "FailedToCreateRayCluster")
               and "admission webhook" in e.get("message", "")]
    assert refused == [], [e["message"] for e in refused]
    env.kube.delete(RAYSERVICES, "serve", ns)


@pytest.mark.kuberay
def test_outages_let_no_gpu_pod_through_and_a_new_leader_releases_from_the_bookings_there_are(env: Env) -> None:
    """Webhook down (failurePolicy Fail): KubeRay's GPU pods are still created, born gated from the admitted
    RayCluster's templates (a RayJob's: gated by the pod gate's policy in the API server, Kubernetes 1.36), and
    none slips through ungated. Reconciler down: gated pods wait. The next
    leader releases them into the slots the pods that still run leave free, never one more."""
    ns = NS["ray"]
    cluster = RayJob("x", None).head(requests=CPU["requests"]).obj()["spec"]["rayClusterSpec"]
    cluster["workerGroupSpecs"] = [worker("gpu", 2, GPU)]
    env.kube.create(RAYCLUSTERS, {"metadata": {"name": "outage"}, "spec": cluster}, ns)
    pr = wait(lambda: next((r for r in requests_of(env, ns) if r["metadata"]["name"].startswith("outage-")), None),
              20, "the cluster's request")
    set_conditions(env, ns, pr["metadata"]["name"], *PROVISIONED)

    def gpu_pods() -> list[JSON]:
        return [p for p in env.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}=outage")["items"]
                if p["metadata"]["labels"].get(keys.RAY_GROUP_LABEL) == "gpu" and not p["metadata"].get(
                    "deletionTimestamp")]
    wait(lambda: len(gpu_pods()) == 2 and not any(pod_gated(p) for p in gpu_pods()), 60, "the 2 booked pods released")

    leader = env.leader()
    env.reconcilers.kill9(leader)
    env.cluster.stop_process("rg-reconciler-test-webhook")  # still registered: failurePolicy Fail
    env.kube.delete(PODS, gpu_pods()[0]["metadata"]["name"], ns)
    wait(lambda: len(gpu_pods()) == 2, 60, "KubeRay's re-create, born gated while the webhook is down")
    consistently(lambda: sum(pod_gated(p) for p in gpu_pods()) == 1, 3, "the new pod to wait gated, no reconciler")
    start_webhook(env.cluster, name="rg-reconciler-test-webhook")

    env.reconcilers.start("r2")
    wait(lambda: env.leader() == "r2", 60, "reconciler r2 to lead")
    wait(lambda: not any(pod_gated(p) for p in gpu_pods()), 30, "r2 to release it into the slot its predecessor freed")
    env.pod_gate_policy_synced()  # start_webhook put it back unconfigured
    cluster_obj = env.kube.get(RAYCLUSTERS, "outage", ns)
    assert not [r for r in requests_of(env, ns) if owned_by(r, cluster_obj)
                and keys.SCALE_UP_ANNOTATION in (r["metadata"].get("annotations") or {})], "no scale-up was needed"
    env.kube.delete(RAYCLUSTERS, "outage", ns)
