"""The gate holds: tried as an untrusted data scientist would, no GPU Ray pod runs without booked capacity.

Two users, as clusters have them. Alice has a namespaced Role with every verb on RayJobs and RayClusters
(and read access to pods): edit rights on Ray objects and nothing else. Bob has the same Role plus
Kubernetes' built-in `edit` ClusterRole bound in the namespace, what most namespaces grant: he may create,
edit and delete pods and batch Jobs too. Each acts through `kubectl --as`, so the API server authorizes
them as their roles say and raygate sees their usernames. The webhook and reconciler run as real
processes; the real KubeRay operator (under its own ServiceAccount's name) creates clusters and pods.
The test plays cluster-autoscaler by patching ProvisioningRequest status, so exactly the capacity it
books is known; the real autoscaler answers requests in test_capacity.py.

After every attempt `assert_gate_holds` counts the GPU pods of each Ray object that carry no
scheduling gate (raygate's gate is lifted only against a booking) against the pods its Provisioned
requests book, and checks every other GPU pod carries the gate: the invariant docs/guarantees.md
states. (No scheduler runs here, so no pod binds; an ungated pod is one that could.)
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonpatch
import pytest
import yaml
from builders import RayCluster, RayJob, worker_group
from raystack import delete_ray_objects
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
    VOLCANO_QUEUES,
    Resource,
)
from raygate.core.api import provisioning_requests as _provisioning_requests
from raygate.core.objects import JSON
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import LocalWebhook, start_reconciler, start_webhook, stop_webhook
from raygate.kube.client import MERGE_PATCH, ApiError, Kube
from raygate.reconciler.pods import JOBS

pytestmark = pytest.mark.integration

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"gate-{k}-{SUFFIX}" for k in ("main", "failed", "switch", "vswitch", "before", "kueue")}
QUEUE = f"gate-queue-{SUFFIX}"
PR = _provisioning_requests("v1")
USER = "alice"
POD_EDITOR = "bob"  # the built-in `edit` ClusterRole: pods and batch Jobs too
OPERATOR = "system:serviceaccount:ray-system:kuberay-operator"
GPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}
CPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
PROVISIONED = {"Accepted": "True", "Provisioned": "True"}
STANDARD = "standard"  # the one PriorityClass the main namespace allows


def config(switched: bool = False) -> dict[str, Any]:
    """raygate-config; `switched`: the two namespaces that change mode mid-test have changed it."""
    return {
        "defaults": {"mode": "provisioning", "retry": {"limit": 2, "baseSeconds": 1, "maxSeconds": 2}},
        "namespaces": {
            NS["main"]: {"allowedPriorityClassNames": [STANDARD]},
            NS["failed"]: {"retry": {"limit": 0}},
            NS["switch"]: {"mode": "kueue", "queueName": "q"} if switched else {},
            NS["vswitch"]: {} if switched else {"mode": "volcano", "queueName": QUEUE},
            NS["kueue"]: {"mode": "kueue", "queueName": "q"},
        },
    }


ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: data-scientist, namespace: {ns}}}
rules:
- apiGroups: [ray.io]
  resources: [rayjobs, rayclusters]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [""]
  resources: [pods, events]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: data-scientist-alice, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: data-scientist}}
subjects: [{{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}},
           {{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: edit-bob, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}}]
"""


@dataclass
class Env:
    cluster: ControlPlane
    kube: Kube
    webhook: LocalWebhook

    def as_user(self, user: str, *args: str, input_obj: JSON | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl as `user` (KubeRay's operator with its ServiceAccount's groups); `check`: fail the test if the
        API server refuses."""
        groups = ["--as-group", "system:serviceaccounts", "--as-group", "system:authenticated"] \
            if user.startswith("system:serviceaccount:") else []
        proc = subprocess.run(
            [str(self.cluster.bundle.binary("kubectl")), "--kubeconfig", str(self.cluster.kubeconfig), "--as", user,
             *groups, *args], input=json.dumps(input_obj) if input_obj is not None else None, capture_output=True,
            text=True, timeout=60, check=False)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    def as_alice(self, *args: str, input_obj: JSON | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl as the untrusted user with edit rights on Ray objects only."""
        return self.as_user(USER, *args, input_obj=input_obj, check=check)

    def refused(self, *args: str, input_obj: JSON | None = None, says: str = "You may not", user: str = USER) -> str:
        """The user's kubectl call must be refused by raygate's webhooks, with a message saying `says`."""
        proc = self.as_user(user, *args, input_obj=input_obj, check=False)
        assert proc.returncode != 0, f"allowed: kubectl {' '.join(args)}"
        assert "raygate" in proc.stderr or "ou may not" in proc.stderr, proc.stderr
        assert says in proc.stderr, proc.stderr
        return proc.stderr

    def create(self, ns: str, obj: JSON, user: str = USER) -> JSON:
        self.as_user(user, "create", "-n", ns, "-f", "-", input_obj=obj)
        return self.get(ns, obj["kind"], obj["metadata"]["name"])

    def get(self, ns: str, kind: str, name: str) -> JSON:
        return self.kube.get(RAYJOBS if kind == "RayJob" else RAYCLUSTERS, name, ns)

    def apply_config(self, cfg: dict[str, Any]) -> None:
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": keys.CONFIGMAP_NAME, "namespace": keys.SYSTEM_NAMESPACE},
              "data": {keys.CONFIGMAP_KEY: yaml.safe_dump(cfg)}}
        self.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(cm))
        version = self.cluster.kubectl("get", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                                       "-o", "jsonpath={.metadata.resourceVersion}").strip()
        self.webhook.wait_config_version(version)


@pytest.fixture(scope="module")
def env(cluster: ControlPlane) -> Iterator[Env]:
    kube = Kube.connect(str(cluster.kubeconfig), user_agent="raygate-gate-test")
    cluster.kubectl("create", "namespace", keys.SYSTEM_NAMESPACE, check=False)
    for name, ns in NS.items():
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("apply", "-f", "-", input_text=ROLE.format(ns=ns))
        if name != "before":  # opts in during its test, after alice's objects exist
            cluster.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    kube.create(VOLCANO_QUEUES, {"metadata": {"name": QUEUE}, "spec": {"weight": 1}})
    kube.patch(VOLCANO_QUEUES, QUEUE, {"status": {"state": "Closed"}}, sub="status")
    kube.delete(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)  # a Lease left by another module's reconciler
    hook = start_webhook(cluster, name="gate-webhook")
    e = Env(cluster, kube, hook)
    e.apply_config(config())
    start_reconciler(cluster, "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5",
                     name="gate-reconciler")
    try:
        yield e
    finally:
        # Jobs go first, while this module's reconciler still runs to free their bookings: a later
        # module's reconciler must not find them (and its write counts with them).
        delete_ray_objects(cluster, NS.values())
        cluster.stop_process("gate-reconciler")
        stop_webhook(cluster, "gate-webhook")
        cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
        for ns in NS.values():
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kube.delete(VOLCANO_QUEUES, QUEUE)


@pytest.fixture(autouse=True)
def empty_queue(env: Env) -> Iterator[None]:
    """Every test starts with an empty queue. A held job asks only once the jobs ahead of it in its queue were
    answered, and this module plays the autoscaler only for the jobs it admits: a job one test leaves held would
    hold the front for the next test's jobs."""
    yield
    delete_ray_objects(env.cluster, NS.values())


# --- objects ------------------------------------------------------------------------------------

def group(name: str, replicas: int, resources: JSON, **extra: Any) -> JSON:
    return {**worker_group(name, replicas=replicas, min_replicas=0, max_replicas=10,
                           requests=resources.get("requests"), limits=resources.get("limits")), **extra}


def raycluster(name: str, *groups: JSON, **meta: Any) -> JSON:
    return (RayCluster(name, None).meta(**meta).head(requests=CPU["requests"], limits=CPU["limits"])
            .groups(*(groups or [group("gpu", 2, GPU)])).obj())


def rayjob(name: str, *groups: JSON) -> JSON:
    return (RayJob(name, None).head(requests=CPU["requests"], limits=CPU["limits"])
            .groups(*(groups or [group("gpu", 2, GPU)])).obj())


def labels(obj: JSON) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def annotations(obj: JSON) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def state(obj: JSON) -> str:
    return labels(obj).get(keys.STATE_LABEL, "")


# --- the invariant ------------------------------------------------------------------------------

def _gpus(pod: JSON) -> int:
    n = 0
    for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
        res = c.get("resources") or {}
        n += int((res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get(
            "nvidia.com/gpu") or 0)
    return n


def _found(env: Env, res: Resource, name: str, ns: str) -> JSON | None:
    """The object, or None when the API server answers that it does not exist (any other error is raised)."""
    try:
        return env.kube.get(res, name, ns)
    except ApiError as err:
        if err.not_found:
            return None
        raise


def _root(env: Env, ns: str, cluster_name: str) -> JSON | None:
    """The object raygate books a RayCluster's pods for: its RayJob when KubeRay made it for one (the RayJob's
    uid is recorded on it by then), else itself."""
    rc = _found(env, RAYCLUSTERS, cluster_name, ns)
    if rc is None:
        return None
    parent = annotations(rc).get(keys.PARENT_ANNOTATION)
    if parent:
        _, name, uid = parent.split("/")
        job = _found(env, RAYJOBS, name, ns)
        if job is not None and job["metadata"]["uid"] == uid:
            return job
    return rc


def requests_of(env: Env, ns: str, obj: JSON, *, scale_ups: bool | None = None) -> list[JSON]:
    """The object's ProvisioningRequests (`scale_ups`: only those, or only its gang's; None: all)."""
    out = []
    for r in env.kube.list(PR, ns).get("items") or []:
        if not any(ref.get("uid") == obj["metadata"]["uid"] for ref in r["metadata"].get("ownerReferences") or []):
            continue
        is_scale_up = keys.SCALE_UP_ANNOTATION in (r["metadata"].get("annotations") or {})
        if scale_ups is None or is_scale_up is scale_ups:
            out.append(r)
    return out


def provisioned(pr: JSON) -> bool:
    conds = {c["type"]: c["status"] for c in (pr.get("status") or {}).get("conditions") or []}
    return all(conds.get(t) == s for t, s in PROVISIONED.items())


def _root_of_pod(env: Env, ns: str, pod: JSON) -> JSON | None:
    """The object raygate books a pod for: its cluster's (above), or for a pod of KubeRay's batch Job, the
    Job's RayJob."""
    if cluster := labels(pod).get(keys.RAY_CLUSTER_LABEL):
        return _root(env, ns, cluster)
    ref = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
    if ref is None or ref.get("kind") != "Job":
        return None
    job = _found(env, JOBS, ref["name"], ns)
    if job is None:
        return None
    owner = next((r for r in job["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
    if owner is None or owner.get("kind") != "RayJob":
        return None
    return _found(env, RAYJOBS, owner["name"], ns)


def booked(env: Env, ns: str, obj: JSON) -> int:
    """GPU pods the object's Provisioned ProvisioningRequests book, its gang's and its scale-ups' (in volcano
    mode without them, its PodGroup's minMember: Volcano binds none of them until all fit); 0 unless it is
    Admitted."""
    if state(obj) != "Admitted":
        return 0
    if not annotations(obj).get(keys.REQUEST_ANNOTATION) and annotations(obj).get(keys.MODE_ANNOTATION) == "volcano":
        pg = env.kube.get(PODGROUPS, f"ray-{obj['metadata']['name']}-pg", ns)
        return int(pg["spec"]["minMember"])
    return sum(int(ps["count"]) for pr in requests_of(env, ns, obj) if provisioned(pr) for ps in pr["spec"]["podSets"])


def gated(pod: JSON) -> bool:
    return any(g.get("name") == keys.CAPACITY_GATE for g in pod["spec"].get("schedulingGates") or [])


def gpu_pods(env: Env, ns: str) -> Counter[tuple[str, str]]:
    """Live GPU pods of the namespace without raygate's gate, by the (kind, name) of the object raygate books
    them for."""
    out: Counter[tuple[str, str]] = Counter()
    for pod in env.kube.list(PODS, ns).get("items") or []:
        if pod["metadata"].get("deletionTimestamp") or _gpus(pod) == 0 or gated(pod):
            continue
        root = _root_of_pod(env, ns, pod)
        key = (str(root["kind"]), str(root["metadata"]["name"])) if root else ("orphan", pod["metadata"]["name"])
        out[key] += 1
    return out


def gate_violations(env: Env, ns: str) -> list[str]:
    bad = []
    orphans: Counter[str] = Counter()  # pods whose Ray object is gone, by the booking each consumes
    for (kind, name), n in gpu_pods(env, ns).items():
        if kind == "orphan":
            pod = _found(env, PODS, name, ns)
            orphans[annotations(pod).get(keys.CONSUME_ANNOTATION, "") if pod else ""] += n
            continue
        have = booked(env, ns, env.get(ns, kind, name))
        if n > have:
            bad.append(f"{kind} {ns}/{name} has {n} ungated GPU pods but {have} booked")
    # A pod whose Ray object is gone (deleted with --cascade=orphan) runs on the booking it consumes, and that
    # booking stays while it runs.
    for request, n in orphans.items():
        pr = _found(env, PR, request, ns) if request else None
        have = sum(int(ps["count"]) for ps in pr["spec"]["podSets"]) if pr is not None and provisioned(pr) else 0
        if n > have:
            bad.append(f"{n} ungated GPU pods of no Ray object consume {request or 'no booking'}, which books {have}")
    return bad


def assert_gate_holds(env: Env, ns: str, seconds: float = 4) -> None:
    """No GPU pod beyond what is booked, and it stays so while KubeRay acts on the last change."""
    consistently(lambda: not gate_violations(env, ns), seconds, f"the gate to hold in {ns}",
                 explain=lambda: "; ".join(gate_violations(env, ns)))


# --- playing the autoscaler and waiting -----------------------------------------------------------

def current_request(env: Env, ns: str, kind: str, name: str) -> JSON:
    def check() -> JSON | None:
        o = env.get(ns, kind, name)
        want = annotations(o).get(keys.REQUEST_ANNOTATION)
        if state(o) != "Provisioning" or not want:
            return None
        return next((r for r in env.kube.list(PR, ns).get("items") or [] if r["metadata"]["name"] == want), None)
    result: JSON = wait(check, 30, f"{kind} {ns}/{name} to have its request")
    return result


def set_conditions(env: Env, ns: str, name: str, conds: dict[str, str], reason: str = "Test") -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"status": {"conditions": [{"type": t, "status": s, "reason": reason, "message": f"test autoscaler: {t}",
                                       "lastTransitionTime": now} for t, s in conds.items()]}}
    env.kube.patch(PR, name, body, ns, content_type=MERGE_PATCH, sub="status")


def admit(env: Env, ns: str, kind: str, name: str) -> tuple[JSON, JSON]:
    """Book the object's request (as the autoscaler would) and wait until raygate admits it."""
    pr = current_request(env, ns, kind, name)
    set_conditions(env, ns, pr["metadata"]["name"], PROVISIONED)
    obj: JSON = wait(lambda: (lambda o: o if state(o) == "Admitted" else None)(env.get(ns, kind, name)), 30,
                     f"{kind} {ns}/{name} to be admitted")
    return obj, pr


def pods_of(env: Env, ns: str, cluster_name: str, gpu_only: bool = True) -> list[JSON]:
    return [p for p in env.kube.list(PODS, ns, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={cluster_name}").get(
        "items") or [] if not p["metadata"].get("deletionTimestamp") and (_gpus(p) or not gpu_only)]


def kuberay_cluster_of(env: Env, ns: str, job_name: str) -> JSON:
    def find() -> JSON | None:
        items = env.kube.list(RAYCLUSTERS, ns, labelSelector=f"{keys.ORIGINATED_FROM_NAME_LABEL}={job_name}")
        return next(iter(items.get("items") or []), None)
    result: JSON = wait(find, 30, f"KubeRay's RayCluster for RayJob {job_name}")
    return result


def merge(obj: JSON) -> str:
    return json.dumps(obj)


# --- skips are decided by who asks ----------------------------------------------------------------

@pytest.mark.parametrize("user", [USER, POD_EDITOR])
def test_a_raycluster_that_claims_another_users_rayjob_as_parent_is_held_and_booked_as_its_own(
        env: Env, user: str) -> None:
    ns = NS["main"]
    parent = env.create(ns, rayjob(f"parent-{user}"))
    parent, _ = admit(env, ns, "RayJob", f"parent-{user}")  # the other user's job runs; the claim comes after
    claims = raycluster(f"claims-{user}", group("gpu", 1, GPU),
                        labels={keys.ORIGINATED_FROM_CRD_LABEL: "RayJob",
                                keys.ORIGINATED_FROM_NAME_LABEL: f"parent-{user}", keys.STATE_LABEL: "Admitted"},
                        annotations={keys.MODE_ANNOTATION: "provisioning",
                                     keys.PARENT_ANNOTATION: f"RayJob/parent-{user}/{parent['metadata']['uid']}"},
                        ownerReferences=[{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": f"parent-{user}",
                                          "uid": parent["metadata"]["uid"], "controller": True}])
    claims["spec"]["suspend"] = False
    stored = env.create(ns, claims, user=user)  # read back after the create: the reconciler may have moved it on
    assert stored["spec"]["suspend"] is True and state(stored) in keys.HELD_STATES
    assert keys.PARENT_ANNOTATION not in annotations(stored)  # raygate's record is raygate's to write
    obj, _ = admit(env, ns, "RayCluster", f"claims-{user}")  # held as a job of its own: its own booking
    wait_gated(env, ns, f"claims-{user}", 0, 1)
    env.as_user(user, "patch", "raycluster", f"claims-{user}", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]))
    wait(lambda: requests_of(env, ns, obj, scale_ups=True), 30, "its scale-up, booked in its own name")
    assert requests_of(env, ns, parent, scale_ups=True) == []  # nothing in the other user's name
    assert_gate_holds(env, ns)


def provision_scale_ups(env: Env, ns: str, obj: JSON) -> list[JSON]:
    """Book every scale-up request of the object (as the autoscaler would); return them."""
    ups = requests_of(env, ns, obj, scale_ups=True)
    for pr in ups:
        if not provisioned(pr):
            set_conditions(env, ns, pr["metadata"]["name"], PROVISIONED)
    return ups


def wait_gated(env: Env, ns: str, cluster_name: str, gated_n: int, released_n: int) -> None:
    def counts() -> tuple[int, int]:
        pods = pods_of(env, ns, cluster_name)
        return sum(1 for p in pods if gated(p)), sum(1 for p in pods if not gated(p))
    wait(lambda: counts() == (gated_n, released_n), 60,
         f"{gated_n} gated and {released_n} released GPU pods of {cluster_name} (now {counts()})")


def test_kuberays_own_cluster_of_an_admitted_rayjob_grows_only_by_a_booked_scale_up(env: Env) -> None:
    ns = NS["main"]
    env.create(ns, rayjob("trainer"))
    job, _ = admit(env, ns, "RayJob", "trainer")
    child = kuberay_cluster_of(env, ns, "trainer")
    assert child["spec"].get("suspend") is not True and state(child) == "Admitted"  # left alone: it is the job's
    name = child["metadata"]["name"]
    wait_gated(env, ns, name, 0, 2)  # KubeRay's 2 pods, born gated, released into the booking
    env.as_alice("patch", "raycluster", name, "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 4}]))
    wait_gated(env, ns, name, 2, 2)  # the 2 new pods wait gated...
    assert_gate_holds(env, ns)
    ups = wait(lambda: requests_of(env, ns, job, scale_ups=True), 30, "a scale-up request")
    assert [ps["count"] for pr in ups for ps in pr["spec"]["podSets"]] == [2]  # ...for a booking of exactly them
    provision_scale_ups(env, ns, job)
    wait_gated(env, ns, name, 0, 4)
    assert_gate_holds(env, ns)


def test_an_admitted_raycluster_grows_by_any_route_only_through_bookings(env: Env) -> None:
    ns = NS["main"]
    env.create(ns, raycluster("grower", group("gpu", 2, GPU), group("cpu", 1, CPU),
                              group("spare", 1, GPU, suspend=True)))
    obj, _ = admit(env, ns, "RayCluster", "grower")
    wait_gated(env, ns, "grower", 0, 2)
    rc = ("raycluster", "grower", "-n", ns)
    for ops in [
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3}],
        [{"op": "add", "path": "/spec/workerGroupSpecs/0/numOfHosts", "value": 2}],
        [{"op": "add", "path": "/spec/workerGroupSpecs/1/template/spec/containers/0/resources/limits/"
          "nvidia.com~1gpu", "value": "1"}],
        [{"op": "replace", "path": "/spec/workerGroupSpecs/2/suspend", "value": False}],
        [{"op": "add", "path": "/spec/workerGroupSpecs/-", "value": group("more", 2, GPU)}],
    ]:
        env.as_alice("patch", *rc, "--type", "json", "-p", json.dumps(ops))
        assert_gate_holds(env, ns, seconds=2)
    # A whole-object replace (PUT) and another served version of the API take the same gate.
    def replace() -> bool:  # KubeRay writes the status meanwhile: a stale resourceVersion conflicts, so read again
        current = env.get(ns, "RayCluster", "grower")
        current["spec"]["workerGroupSpecs"][0]["replicas"] = 4
        proc = env.as_alice("replace", "-n", ns, "-f", "-", input_obj=current, check=False)
        assert proc.returncode == 0 or "the object has been modified" in proc.stderr, proc.stderr
        return proc.returncode == 0
    wait(replace, 30, "alice's replace to land")
    env.as_alice("patch", "rayclusters.v1alpha1.ray.io", "grower", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/3/replicas", "value": 3}]))
    assert_gate_holds(env, ns)
    ups = wait(lambda: requests_of(env, ns, obj, scale_ups=True), 30, "scale-up requests")
    assert ups and all(not provisioned(pr) for pr in ups)
    consistently(lambda: not gate_violations(env, ns) and any(gated(p) for p in pods_of(env, ns, "grower")), 3,
                 "the new pods to wait gated while nothing books them")
    # Booked: every gated pod is released, and no more.
    wait(lambda: not provision_scale_ups(env, ns, obj) or all(
        not gated(p) for p in pods_of(env, ns, "grower")), 90, "every scale-up booked and its pods released")
    assert_gate_holds(env, ns)


def test_gpus_in_init_containers_sidecars_or_limits_alone_are_gated_and_booked_the_same(env: Env) -> None:
    ns = NS["main"]
    init = group("init", 1, CPU)
    init["template"]["spec"]["initContainers"] = [{"name": "warm", "image": "ray", "resources": {
        "limits": {"nvidia.com/gpu": "1"}}}]
    sidecar = group("sidecar", 1, CPU)
    sidecar["template"]["spec"]["initContainers"] = [{"name": "proxy", "image": "ray", "restartPolicy": "Always",
                                                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    limits_only = group("limits", 1, {"limits": {"nvidia.com/gpu": "1"}})
    obj = env.create(ns, raycluster("hidden", init, sidecar, limits_only))
    pr = current_request(env, ns, "RayCluster", "hidden")
    assert sorted(ps["count"] for ps in pr["spec"]["podSets"]) == [1, 1, 1]  # every one of them booked
    admit(env, ns, "RayCluster", "hidden")
    wait_gated(env, ns, "hidden", 0, 3)
    for i in range(3):
        env.as_alice("patch", "raycluster", "hidden", "-n", ns, "--type", "json", "-p", json.dumps(
            [{"op": "replace", "path": f"/spec/workerGroupSpecs/{i}/replicas", "value": 2}]))
    wait_gated(env, ns, "hidden", 3, 3)
    assert_gate_holds(env, ns)
    assert len(wait(lambda: (lambda u: u if len(u) == 3 else None)(requests_of(env, ns, obj, scale_ups=True)), 30,
                    "a scale-up per pod set")) == 3


def test_a_submitter_pod_that_asks_for_gpus_is_gated_and_booked(env: Env) -> None:
    """KubeRay's batch Job for a RayJob (K8sJobMode): its pods come from the Job controller, from a template the
    user wrote. Played here by creating the Job as KubeRay does (the submitter starts only once the Ray cluster
    is up, and nothing runs Ray here)."""
    ns = NS["main"]
    obj = rayjob("submits")
    obj["spec"]["submitterPodTemplate"] = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "submit", "image": "ray", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    env.create(ns, obj)
    pr = current_request(env, ns, "RayJob", "submits")
    assert sorted(ps["count"] for ps in pr["spec"]["podSets"]) == [1, 2]  # the submitter's GPU is booked too
    job, _ = admit(env, ns, "RayJob", "submits")

    def submitter_job(name: str) -> JSON:
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "labels": dict([keys.KUBERAY_CREATED_BY]), "ownerReferences": [
                    {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "submits", "uid": job["metadata"]["uid"],
                     "controller": True}]},
                "spec": {"backoffLimit": 0, "template": job["spec"]["submitterPodTemplate"]}}
    # Bob may create Jobs: one that claims the RayJob, to take its submitter's booking, is refused.
    env.refused("create", "-n", ns, "-f", "-", input_obj=submitter_job("forged"), user=POD_EDITOR,
                says="only KubeRay makes a Ray object's Jobs")
    for name in ("submits", "submits-again"):  # KubeRay's Job, and a second one nothing booked
        env.as_user(OPERATOR, "create", "-n", ns, "-f", "-", input_obj=submitter_job(name))

    def submitters() -> dict[str, JSON]:
        return {p["metadata"]["labels"]["batch.kubernetes.io/job-name"]: p for p in env.kube.list(
            PODS, ns, labelSelector="batch.kubernetes.io/job-name in (submits,submits-again)").get("items") or []}
    wait(lambda: {n: gated(p) for n, p in submitters().items()} == {"submits": False, "submits-again": True}, 60,
         "one submitter pod released into its booking, the other gated")
    assert annotations(submitters()["submits"])[keys.RAY_OWNER_ANNOTATION] == \
        f"RayJob/submits/{job['metadata']['uid']}/{keys.SUBMITTER_TASK}"
    assert_gate_holds(env, ns)


def test_an_elastic_cluster_booked_nothing_at_start_books_each_scale_up(env: Env) -> None:
    """The hole the pod gate closes: autoscaling, replicas 0, maxReplicas 100 is admitted with nothing booked;
    raising replicas used to give GPU pods raygate never booked."""
    ns = NS["main"]
    obj = raycluster("elastic", group("gpu", 0, GPU, minReplicas=0, maxReplicas=100))
    obj["spec"]["enableInTreeAutoscaling"] = True
    created = env.create(ns, obj)
    wait(lambda: state(env.get(ns, "RayCluster", "elastic")) == "Admitted", 30, "admitted with nothing to book")
    assert requests_of(env, ns, created) == []
    env.as_alice("patch", "raycluster", "elastic", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3}]))
    wait_gated(env, ns, "elastic", 3, 0)
    ups = wait(lambda: requests_of(env, ns, created, scale_ups=True), 30, "a scale-up request")
    assert [ps["count"] for ps in ups[0]["spec"]["podSets"]] == [3]
    assert ups[0]["spec"]["provisioningClassName"] == keys.BEST_EFFORT_ATOMIC_CLASS
    consistently(lambda: not gate_violations(env, ns) and sum(gated(p) for p in pods_of(env, ns, "elastic")) == 3, 3,
                 "the 3 pods to wait gated while nothing is Provisioned")


def test_admitted_then_suspended_by_its_user_waits_for_capacity_again(env: Env) -> None:
    ns = NS["main"]
    env.create(ns, raycluster("pauser"))
    _, first = admit(env, ns, "RayCluster", "pauser")
    wait(lambda: len(pods_of(env, ns, "pauser")) == 2, 30, "the booked GPU pods")
    env.as_alice("patch", "raycluster", "pauser", "-n", ns, "--type", "merge", "-p", merge({"spec": {"suspend": True}}))
    wait(lambda: state(env.get(ns, "RayCluster", "pauser")) in ("Pending", "Provisioning"), 30,
         "the suspended cluster to be queued again")
    events = lambda: env.kube.list(EVENTS, ns, fieldSelector="involvedObject.name=pauser").get("items") or []  # noqa: E731
    said = wait(lambda: next((e["message"] for e in events() if e["reason"] == "Requeued"), None), 30,
                "a Requeued Event")
    assert "was suspended after admission" in said
    env.refused("patch", "raycluster", "pauser", "-n", ns, "--type", "merge", "-p",
                merge({"spec": {"suspend": False}}), says="unsuspend it")
    second = current_request(env, ns, "RayCluster", "pauser")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert_gate_holds(env, ns)


# --- a pod's Ray identity is decided when it is created --------------------------------------------------

def scaled_up(env: Env, name: str, booked_n: int, total: int, user: str = USER) -> JSON:
    """An admitted RayCluster of `booked_n` booked GPU workers raised to `total`: the rest wait gated."""
    ns = NS["main"]
    env.create(ns, raycluster(name, group("gpu", booked_n, GPU)), user=user)
    obj, _ = admit(env, ns, "RayCluster", name)
    wait_gated(env, ns, name, 0, booked_n)
    env.as_user(user, "patch", "raycluster", name, "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": total}]))
    wait_gated(env, ns, name, total - booked_n, booked_n)
    return obj


@pytest.mark.parametrize("user", [USER, POD_EDITOR])
def test_orphaning_a_raycluster_releases_none_of_its_pods_and_keeps_the_booking_its_pods_use(
        env: Env, user: str) -> None:
    ns, name = NS["main"], f"orphaned-{user}"
    obj = scaled_up(env, name, 1, 4, user)
    pods = {p["metadata"]["name"]: gated(p) for p in pods_of(env, ns, name)}
    gang = requests_of(env, ns, obj, scale_ups=False)[0]["metadata"]["name"]
    env.as_user(user, "delete", "raycluster", name, "-n", ns, "--cascade=orphan", "--wait=true", "--timeout=60s")
    wait(lambda: all(not p["metadata"].get("ownerReferences") for p in pods_of(env, ns, name)), 60,
         "the garbage collector to strip the pods' owners")
    # Its owner is gone, not its identity: the 3 gated pods stay gated, the booked one keeps its booking.
    consistently(lambda: {p["metadata"]["name"]: gated(p) for p in pods_of(env, ns, name)} == pods, 4,
                 "no pod released, and none gone")
    assert _found(env, PR, gang, ns) is not None
    assert_gate_holds(env, ns)
    events = wait(lambda: [e for e in env.kube.list(EVENTS, ns).get("items") or []
                           if e["reason"] == "RayObjectCannotBook" and e["involvedObject"]["name"] in pods], 30,
                  "a reason on the gated pods")
    assert "is gone" in events[0]["message"]
    # The booked pod ends: its booking (orphaned with it) goes, and nothing of the cluster is left behind.
    for pod in pods:
        env.kube.delete(PODS, pod, ns)  # unbound (no scheduler here): gone at once
    wait(lambda: _found(env, PR, gang, ns) is None, 60, "the orphaned booking to go with its pod")
    wait(lambda: not [o for kind in (PR, PODTEMPLATES) for o in env.kube.list(kind, ns).get("items") or []
                      if annotations(o).get(keys.RAY_OWNER_ANNOTATION, "").startswith(f"RayCluster/{name}/")], 60,
         "no orphaned child object")


EDITS = {
    "relabel-group": ([{"op": "replace", "path": "/metadata/labels/ray.io~1group", "value": "other"}],
                      f"label {keys.RAY_GROUP_LABEL}"),
    "remove-node-type": ([{"op": "remove", "path": "/metadata/labels/ray.io~1node-type"}],
                         f"label {keys.RAY_NODE_TYPE_LABEL}"),
    "null-owners": ([{"op": "replace", "path": "/metadata/ownerReferences", "value": []}], "ownerReferences"),
    "drop-booking": ([{"op": "remove", "path": "/metadata/annotations/autoscaling.x-k8s.io~1consume-provisioning-"
                                              "request"}], f"annotation {keys.CONSUME_ANNOTATION}"),
    "rewrite-identity": ([{"op": "replace", "path": "/metadata/annotations/raygate.io~1ray-owner",
                           "value": "RayCluster/x/y/gpu"}], f"annotation {keys.RAY_OWNER_ANNOTATION}"),
}


def test_a_user_with_edit_on_pods_cannot_edit_a_ray_pods_identity_away(env: Env) -> None:
    ns, name = NS["main"], "identity"
    scaled_up(env, name, 1, 2, POD_EDITOR)
    released_pod = next(p["metadata"]["name"] for p in pods_of(env, ns, name) if not gated(p))
    gated_pod = next(p["metadata"]["name"] for p in pods_of(env, ns, name) if gated(p))
    for edit, (ops, says) in EDITS.items():
        for pod in (released_pod, gated_pod):
            if edit == "drop-booking" and pod == gated_pod:
                continue  # a gated pod consumes nothing yet
            env.refused("patch", "pod", pod, "-n", ns, "--type", "json", "-p", json.dumps(ops),
                        user=POD_EDITOR, says=says)
        assert_gate_holds(env, ns, seconds=1)
    # With edit rights on Ray objects only, pods are not Alice's to change at all (RBAC says so first).
    denied = env.as_alice("label", "pod", released_pod, "-n", ns, f"{keys.RAY_GROUP_LABEL}=other", "--overwrite",
                          check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    # What a user may do to a pod still works: delete it. KubeRay makes it again, and it takes the freed slot.
    env.as_user(POD_EDITOR, "delete", "pod", released_pod, "-n", ns, "--wait=true")
    wait_gated(env, ns, name, 1, 1)
    assert_gate_holds(env, ns)


@pytest.mark.parametrize("user", [USER, POD_EDITOR])
def test_a_user_who_rewrites_the_born_gated_template_gets_new_pods_gated_all_the_same(env: Env, user: str) -> None:
    """An admitted RayCluster's GPU template carries the gate and the record (born gated). Its user names another
    object in the record, or takes the gate out, and scales it up: the new pods are still gated, with their own
    record (the skip checks the record against each pod's real controller, so the policy or the webhook decides
    them), and wait for a booking of their own."""
    ns, name = NS["main"], f"restamp-{user}"
    obj = scaled_up(env, name, 1, 1, user)
    victim = env.create(ns, raycluster(f"victim-{user}", group("gpu", 1, GPU)))  # held: after it, in the queue
    path = "/spec/workerGroupSpecs/0/template"
    # Gate and label kept, the record naming the victim: were the skip to trust the template, the new pods would be
    # stored as the victim's, and released into its booking once it had one.
    env.as_user(user, "patch", "raycluster", name, "-n", ns, "--type", "json", "-p", json.dumps([
        {"op": "replace", "path": f"{path}/metadata/annotations/{keys.RAY_OWNER_ANNOTATION.replace('/', '~1')}",
         "value": f"RayCluster/{victim['metadata']['name']}/{victim['metadata']['uid']}/gpu"},
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]))
    wait_gated(env, ns, name, 1, 1)
    # Then without the gate: the next pod is gated all the same.
    env.as_user(user, "patch", "raycluster", name, "-n", ns, "--type", "json", "-p", json.dumps([
        {"op": "remove", "path": f"{path}/spec/schedulingGates"},
        {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3}]))
    wait_gated(env, ns, name, 2, 1)
    for pod in pods_of(env, ns, name):
        assert annotations(pod)[keys.RAY_OWNER_ANNOTATION] == f"RayCluster/{name}/{obj['metadata']['uid']}/gpu"
    assert_gate_holds(env, ns)


def _pod_reviews(env: Env) -> float:
    """Pod creates raygate's webhook has answered (its /metrics, every outcome)."""
    ctx = ssl.create_default_context(cafile=str(env.webhook.ca_file))
    with urllib.request.urlopen(f"{env.webhook.url}/metrics", context=ctx, timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("raygate_webhook_reviews_total{") and 'endpoint="mutate"' in line
               and 'kind="Pod"' in line)


MUTATIONS = len(podgate_policy.policy(None)["spec"]["mutations"])


def _policy_checks(env: Env) -> float:
    """The pod gate's MutatingAdmissionPolicy's mutations applied (the API server's /metrics): MUTATIONS a pod."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in env.cluster.kubectl("get", "--raw", "/metrics").splitlines()
               if line.startswith("apiserver_mutating_admission_policy_check_total{")
               and f'policy="{podgate_policy.POLICY_NAME}"' in line)


def test_kuberays_gpu_pods_are_gated_without_a_webhook_call(env: Env) -> None:
    """Kubernetes 1.36. An admitted RayCluster's GPU pods are born gated and recorded from its templates: the API
    server calls neither the pod gate's policy nor the webhook for them. A RayJob's (its RayCluster's, whose uid
    did not exist at admission) are gated and recorded by the policy.
    Where the namespace's mode does not gate pods, nothing is gated; gated pods are released against their booking
    like any."""
    ns, name = NS["main"], "in-the-api-server"
    wait(lambda: OPERATOR in json.dumps(env.kube.get(MUTATING_POLICIES, podgate_policy.POLICY_NAME)["spec"]), 30,
         "the reconciler to write the config into the pod gate's policy")
    before, checks = _pod_reviews(env), _policy_checks(env)
    obj = scaled_up(env, name, 1, 3)  # 1 worker booked and released, 2 more waiting gated for their own booking
    wait(lambda: len(pods_of(env, ns, name, gpu_only=False)) == 4, 30, "the head pod")
    for pod in pods_of(env, ns, name):
        assert annotations(pod)[keys.RAY_OWNER_ANNOTATION] == f"RayCluster/{name}/{obj['metadata']['uid']}/gpu"
    assert _pod_reviews(env) - before == 1, "only the head pod (no GPU) goes through the webhook"
    assert _policy_checks(env) == checks, "the policy changed none: they were created as it would leave them"
    wait(lambda: requests_of(env, ns, obj, scale_ups=True), 30, "the scale-up's request")
    provision_scale_ups(env, ns, obj)
    wait_gated(env, ns, name, 0, 3)

    checks = _policy_checks(env)
    env.create(ns, rayjob("policy-gated"))
    admit(env, ns, "RayJob", "policy-gated")
    child = kuberay_cluster_of(env, ns, "policy-gated")
    wait_gated(env, ns, child["metadata"]["name"], 0, 2)
    for pod in pods_of(env, ns, child["metadata"]["name"]):
        assert annotations(pod)[keys.RAY_OWNER_ANNOTATION] == (f"RayCluster/{child['metadata']['name']}/"
                                                               f"{child['metadata']['uid']}/gpu")
    assert _policy_checks(env) - checks == 2 * MUTATIONS, "the policy gated the RayJob's 2 GPU pods"
    # The same pod in a kueue-mode namespace (Kueue is the gate there) is not gated.
    pod = _kuberay_pod(NS["kueue"], {"name": "c", "image": "ray", "resources": GPU})
    made = json.loads(env.as_user(OPERATOR, "create", "-n", NS["kueue"], "--dry-run=server", "-o", "json", "-f", "-",
                                  input_obj=pod).stdout)
    assert not gated(made) and keys.RAY_OWNER_ANNOTATION not in annotations(made)
    assert_gate_holds(env, ns)


def _kuberay_pod(ns: str, *containers: JSON, group_label: str | None = "gpu", owner: str = "RayCluster",
                 **spec: Any) -> JSON:
    meta: JSON = {"name": "w", "namespace": ns, "ownerReferences": [
        {"apiVersion": "ray.io/v1", "kind": owner, "name": "c", "uid": "u1", "controller": True}]}
    if group_label is not None:
        meta["labels"] = {keys.RAY_GROUP_LABEL: group_label}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": list(containers), **spec}}


def _gate_view(pod: JSON) -> tuple[list[str], str | None, dict[str, str]]:
    """The gates, the gate label and raygate's and the autoscaler's annotations."""
    return ([g["name"] for g in pod["spec"].get("schedulingGates") or []], labels(pod).get(keys.POD_GATE_LABEL),
            {k: v for k, v in annotations(pod).items() if k.startswith((keys.DOMAIN, "autoscaling.x-k8s.io/"))})


def test_the_pod_gates_policy_decides_as_the_webhook_does(env: Env) -> None:
    """The same pods KubeRay's operator could create, through the real API server (the policy, then the webhook
    where the policy left them) and through the webhook's own decision in Python: gated, labelled and recorded
    alike, or left alike; and the pods the policy gated never reached the webhook."""
    from builders import container
    from builders import request as review_request

    from raygate.core.policy import parse_fields
    from raygate.webhook.decision import mutate

    main, kueue = NS["main"], NS["kueue"]
    wait(lambda: OPERATOR in json.dumps(env.kube.get(MUTATING_POLICIES, podgate_policy.POLICY_NAME)["spec"]), 30,
         "the reconciler to write the config into the pod gate's policy")
    gpu, cpu = {"nvidia.com/gpu": "1"}, {"cpu": "1"}
    pods = {
        "gpu-in-limits": _kuberay_pod(main, container("w", limits=gpu)),
        "gpu-in-requests": _kuberay_pod(main, container("w", requests=gpu, limits=gpu)),
        "gpu-in-an-init-container": _kuberay_pod(main, container("w", requests=cpu),
                                                 initContainers=[container("i", limits=gpu)]),
        "gpu-in-a-sidecar": _kuberay_pod(main, container("w", requests=cpu), initContainers=[
            container("s", limits=gpu, restart_policy="Always")]),
        "mig-slice": _kuberay_pod(main, container("w", limits={"nvidia.com/mig-1g.5gb": "1"})),
        "zero-gpus": _kuberay_pod(main, container("w", limits={"nvidia.com/gpu": "0"})),
        "cpu-only": _kuberay_pod(main, container("w", requests=cpu)),
        "head": _kuberay_pod(main, container("w", limits=gpu), group_label="headgroup"),
        "submitter": _kuberay_pod(main, container("w", limits=gpu), group_label=None, owner="RayJob"),
        "another-gate": _kuberay_pod(main, container("w", limits=gpu), schedulingGates=[{"name": "example.com/q"}]),
        "kueue-mode": _kuberay_pod(kueue, container("w", limits=gpu)),
    }
    # An admitted job's pod templates name its booking (raygate marks them so when it unsuspends the job): the
    # booking comes off at create, and is written when the gate is lifted.
    pods["names-its-booking"] = _kuberay_pod(main, container("w", limits=gpu))
    pods["names-its-booking"]["metadata"]["annotations"] = {keys.CONSUME_ANNOTATION: "c-1",
                                                            keys.CLASS_ANNOTATION: keys.CHECK_CAPACITY_CLASS}
    # An admitted RayCluster's templates say what the gate would write (podgate.born_gated): its pods arrive so.
    pods["born-gated"] = _kuberay_pod(main, container("w", limits=gpu), schedulingGates=[{"name": keys.CAPACITY_GATE}])
    pods["born-gated"]["metadata"]["labels"][keys.POD_GATE_LABEL] = keys.POD_GATED
    pods["born-gated"]["metadata"]["annotations"] = {keys.RAY_OWNER_ANNOTATION: "RayCluster/c/u1/gpu"}
    # The webhook is asked only of the pods the policy leaves to it (no GPU asked, or a namespace that gates none):
    # every other one was decided by the policy alone, but for the pod born gated, which neither is asked about.
    by_the_webhook = {"zero-gpus", "cpu-only", "kueue-mode"}
    by_neither = {"born-gated"}
    cfg = parse_fields(yaml.safe_dump(config()))
    for case, pod in pods.items():
        ns = pod["metadata"]["namespace"]
        before, checks = _pod_reviews(env), _policy_checks(env)
        stored = json.loads(env.as_user(OPERATOR, "create", "-n", ns, "--dry-run=server", "-o", "json", "-f", "-",
                                        input_obj=pod).stdout)
        assert (_pod_reviews(env) > before) == (case in by_the_webhook), case
        assert (_policy_checks(env) > checks) == (case not in by_the_webhook | by_neither), case
        decision = mutate(review_request(pod, user=OPERATOR, namespace=ns), {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE},
                          cfg)
        assert decision.allowed, (case, decision.message)
        decided = jsonpatch.apply_patch(pod, decision.patch)
        assert _gate_view(stored) == _gate_view(decided), case


@pytest.mark.parametrize("claim", ["owner-reference", "ray-labels", "unreadable-and-owned",
                                   "gated-as-kuberays"])
def test_a_pod_a_user_creates_to_claim_another_users_ray_object_is_refused(env: Env, claim: str) -> None:
    ns, victim = NS["main"], f"victim-{claim}"
    obj = env.create(ns, raycluster(victim, group("gpu", 1, GPU)))
    pod: JSON = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"claims-{claim}"},
                 "spec": {"containers": [{"name": "c", "image": "ray", "resources": GPU}]}}
    if claim in ("owner-reference", "unreadable-and-owned", "gated-as-kuberays"):
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": victim,
                                               "uid": obj["metadata"]["uid"], "controller": True}]
    if claim == "ray-labels":
        pod["metadata"]["labels"] = {keys.RAY_CLUSTER_LABEL: victim, keys.RAY_GROUP_LABEL: "gpu",
                                     keys.RAY_NODE_TYPE_LABEL: "worker"}
    if claim == "unreadable-and-owned":
        pod["spec"]["containers"][0]["resources"] = {"limits": {**GPU["limits"], "memory": "100E"}}
    if claim == "gated-as-kuberays":  # as the pod gate's policy leaves KubeRay's pods: the webhook still asks who
        pod["metadata"]["labels"] = {keys.POD_GATE_LABEL: keys.POD_GATED}
        pod["metadata"]["annotations"] = {keys.RAY_OWNER_ANNOTATION: f"RayCluster/{victim}/{obj['metadata']['uid']}/"
                                                                     f"{keys.SUBMITTER_TASK}"}
        pod["spec"]["schedulingGates"] = [{"name": keys.CAPACITY_GATE}]
    env.refused("create", "-n", ns, "-f", "-", input_obj=pod, user=POD_EDITOR,
                says="only KubeRay makes a Ray cluster's pods")
    admit(env, ns, "RayCluster", victim)
    wait_gated(env, ns, victim, 0, 1)  # the victim's own pod takes its own slot
    assert_gate_holds(env, ns)


def test_placement_the_api_server_rewrites_at_pod_creation_still_finds_its_booking(env: Env) -> None:
    """kube-apiserver merges matchLabelKeys into a new pod's topology spread selector (and pod affinity terms):
    the pods differ from their template there, and must still be released into the booking made from it."""
    ns = NS["main"]
    spread = group("gpu", 2, GPU)
    spread["template"]["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {keys.RAY_NODE_TYPE_LABEL: "worker"}}, "matchLabelKeys": ["ray.io/group"]}]
    spread["template"]["spec"]["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "matchLabelKeys": ["ray.io/cluster"],
                                          "labelSelector": {"matchLabels": {keys.RAY_NODE_TYPE_LABEL: "head"}}}}]}}
    env.create(ns, raycluster("spread", spread))
    admit(env, ns, "RayCluster", "spread")
    wait_gated(env, ns, "spread", 0, 2)
    merged = pods_of(env, ns, "spread")[0]["spec"]["topologySpreadConstraints"][0]["labelSelector"]
    assert merged.get("matchExpressions"), merged  # the API server did rewrite it
    assert_gate_holds(env, ns)


def test_placement_edits_in_a_row_book_only_the_pods_they_make(env: Env) -> None:
    ns = NS["main"]
    obj = scaled_up(env, "moving", 1, 1)
    for zone in range(6):
        env.as_alice("patch", "raycluster", "moving", "-n", ns, "--type", "json", "-p", json.dumps(
            [{"op": "add", "path": "/spec/workerGroupSpecs/0/template/spec/nodeSelector",
              "value": {"zone": f"z{zone}"}}]))
    consistently(lambda: requests_of(env, ns, obj, scale_ups=True) == [], 3,
                 "no scale-up: KubeRay keeps the pod it has, so the edits make no pod")
    env.as_alice("patch", "raycluster", "moving", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]))
    ups = wait(lambda: requests_of(env, ns, obj, scale_ups=True), 30, "a scale-up for the pod the raise makes")
    assert [ps["count"] for pr in ups for ps in pr["spec"]["podSets"]] == [1]
    templates = [t for t in env.kube.list(PODTEMPLATES, ns).get("items") or []
                 if annotations(t).get(keys.RAY_OWNER_ANNOTATION, "").startswith("RayCluster/moving/")]
    assert len(templates) == 2  # the gang's and the scale-up's: none left over from the edits
    assert_gate_holds(env, ns)


def test_a_rayjob_on_an_existing_cluster_with_a_gpu_submitter_is_refused_at_create(env: Env) -> None:
    obj = (RayJob("on-shared", None).without_cluster_spec().cluster_selector(**{keys.RAY_CLUSTER_LABEL: "shared"})
           .obj())
    obj["spec"]["submitterPodTemplate"] = {"spec": {"restartPolicy": "Never", "containers": [
        {"name": "submit", "image": "ray", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    env.refused("create", "-n", NS["main"], "-f", "-", input_obj=obj, says="remove the GPUs from "
                "spec.submitterPodTemplate")


def test_a_user_cannot_pick_a_priority_class_the_namespace_does_not_allow(env: Env) -> None:
    """A priority is a place in the queue, and where the queue preempts, the jobs it may suspend."""
    ns = NS["main"]
    for user in (USER, POD_EDITOR):
        jumper = raycluster("jumper", labels={keys.RAY_PRIORITY_CLASS_LABEL: "urgent"})
        env.refused("create", "-n", ns, "-f", "-", input_obj=jumper, user=user,
                    says=f"names PriorityClass urgent, but namespace {ns} allows only {STANDARD}")
    env.create(ns, raycluster("standard", labels={keys.RAY_PRIORITY_CLASS_LABEL: STANDARD}))
    env.refused("label", "raycluster", "standard", "-n", ns, f"{keys.RAY_PRIORITY_CLASS_LABEL}=urgent",
                "--overwrite", says="allowedPriorityClassNames")


# --- held and failed objects ----------------------------------------------------------------------

def test_a_held_job_that_grows_is_booked_for_its_new_size(env: Env) -> None:
    ns = NS["main"]
    env.create(ns, raycluster("growing"))
    small = current_request(env, ns, "RayCluster", "growing")
    assert small["spec"]["podSets"][0]["count"] == 2
    env.as_alice("patch", "raycluster", "growing", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 4}]))  # allowed while held
    try:  # a booking for the old size arrives late, if raygate has not deleted that request yet
        set_conditions(env, ns, small["metadata"]["name"], PROVISIONED)
    except ApiError as err:
        assert err.not_found, err

    def replaced() -> JSON | None:
        r = current_request(env, ns, "RayCluster", "growing")
        return r if r["metadata"]["name"] != small["metadata"]["name"] else None
    big = wait(replaced, 30, "a request for the grown cluster")
    assert big["spec"]["podSets"][0]["count"] == 4
    obj = env.get(ns, "RayCluster", "growing")
    assert obj["spec"]["suspend"] is True and state(obj) == "Provisioning"  # the late booking admitted nothing
    assert pods_of(env, ns, "growing", gpu_only=False) == []
    admit(env, ns, "RayCluster", "growing")
    wait(lambda: len(pods_of(env, ns, "growing")) == 4, 30, "the 4 booked GPU pods")
    assert_gate_holds(env, ns)


def test_a_failed_job_cannot_be_unsuspended_but_can_start_over(env: Env) -> None:
    ns = NS["failed"]  # retry limit 0: the first failed request fails the job
    env.create(ns, rayjob("doomed"))
    pr = current_request(env, ns, "RayJob", "doomed")
    set_conditions(env, ns, pr["metadata"]["name"], {"Accepted": "True", "Failed": "True"}, reason="NoCapacity")
    wait(lambda: state(env.get(ns, "RayJob", "doomed")) == "Failed", 30, "the job to fail")
    env.refused("patch", "rayjob", "doomed", "-n", ns, "--type", "merge", "-p", merge({"spec": {"suspend": False}}),
                says="unsuspend it")
    env.refused("label", "rayjob", "doomed", "-n", ns, f"{keys.STATE_LABEL}=Admitted", "--overwrite",
                says=f"change label {keys.STATE_LABEL}")
    env.as_alice("label", "rayjob", "doomed", "-n", ns, f"{keys.STATE_LABEL}=Pending", "--overwrite")
    again = current_request(env, ns, "RayJob", "doomed")  # attempt 1 again: a new request of the same name
    assert again["metadata"]["uid"] != pr["metadata"]["uid"] and not (again.get("status") or {}).get("conditions")
    assert_gate_holds(env, ns)


def test_a_user_cannot_create_an_object_already_admitted(env: Env) -> None:
    ns = NS["main"]
    forged = raycluster("forged", labels={keys.STATE_LABEL: "Admitted"},
                        annotations={keys.REQUEST_ANNOTATION: "someone-elses", keys.ATTEMPT_ANNOTATION: "1"})
    forged["spec"]["suspend"] = False
    forged["spec"]["workerGroupSpecs"][0]["template"]["metadata"] = {
        "annotations": {keys.CONSUME_ANNOTATION: "someone-elses-request"}}
    stored = env.create(ns, forged)  # read back after the create: the reconciler may have moved it on
    assert stored["spec"]["suspend"] is True and state(stored) in keys.HELD_STATES
    assert keys.CONSUME_ANNOTATION not in json.dumps(stored["spec"])
    assert_gate_holds(env, ns)


def test_autoscaling_books_the_replicas_kuberay_starts_and_each_scale_up(env: Env) -> None:
    ns = NS["main"]
    obj = raycluster("autoscaled", group("gpu", 3, GPU, minReplicas=0, maxReplicas=5))
    obj["spec"]["enableInTreeAutoscaling"] = True
    env.create(ns, obj)
    pr = current_request(env, ns, "RayCluster", "autoscaled")
    assert pr["spec"]["podSets"][0]["count"] == 3  # not minReplicas (0): KubeRay starts 3
    admit(env, ns, "RayCluster", "autoscaled")
    wait_gated(env, ns, "autoscaled", 0, 3)
    env.refused("patch", "raycluster", "autoscaled", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/maxReplicas", "value": 5000}]),
        says="limits.maxPods")  # the ceiling counts, within the namespace's limits
    env.as_alice("patch", "raycluster", "autoscaled", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 5}]))
    wait_gated(env, ns, "autoscaled", 2, 3)
    assert_gate_holds(env, ns)


# --- manifests KubeRay cannot hold ------------------------------------------------------------------

def test_deletion_rules_are_refused_at_create_with_the_truth(env: Env) -> None:
    obj = rayjob("rules")
    obj["spec"]["deletionStrategy"] = {"deletionRules": [
        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}}]}
    proc = env.as_alice("create", "-n", NS["main"], "-f", "-", input_obj=obj, check=False)
    assert proc.returncode != 0
    assert "KubeRay requires shutdownAfterJobFinishes: false with deletionRules" in proc.stderr, proc.stderr


def test_a_job_kuberay_refuses_is_failed_with_its_reason_and_its_request_deleted(env: Env) -> None:
    ns = NS["main"]
    name = "n" * 48  # KubeRay refuses RayJob names over 47 characters, for good
    env.create(ns, rayjob(name))
    failed = wait(lambda: (lambda o: o if state(o) == "Failed" else None)(env.get(ns, "RayJob", name)), 60,
                  "raygate to mark the job KubeRay refused Failed")
    assert "KubeRay refused this RayJob" in annotations(failed)[keys.REASON_ANNOTATION]
    wait(lambda: not [r for r in env.kube.list(PR, ns).get("items") or []
                      if r["metadata"]["ownerReferences"][0]["uid"] == failed["metadata"]["uid"]], 30,
         "its request to be deleted")


# --- objects raygate never held ----------------------------------------------------------------------

def test_objects_from_before_the_namespace_opted_in_cannot_start_or_grow(env: Env) -> None:
    ns = NS["before"]
    parked = raycluster("parked")
    parked["spec"]["suspend"] = True
    env.create(ns, parked)
    env.create(ns, raycluster("running", group("gpu", 1, GPU)))
    wait(lambda: len(pods_of(env, ns, "running")) == 1, 30, "the pod that ran before raygate")
    env.cluster.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    env.refused("patch", "raycluster", "parked", "-n", ns, "--type", "merge", "-p",
                merge({"spec": {"suspend": False}}), says="created before raygate gated namespace")
    env.refused("patch", "raycluster", "running", "-n", ns, "--type", "json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 8}]), says="grow pod set gpu")
    env.refused("label", "raycluster", "running", "-n", ns, f"{keys.STATE_LABEL}=Admitted",
                says=f"add label {keys.STATE_LABEL}")
    assert len(pods_of(env, ns, "running")) == 1
    assert pods_of(env, ns, "parked", gpu_only=False) == []


# --- a namespace that changes mode strands no job ------------------------------------------------------

def test_mode_changes_leave_no_held_job_stranded(env: Env) -> None:
    env.create(NS["switch"], rayjob("before-kueue"))
    pr = current_request(env, NS["switch"], "RayJob", "before-kueue")
    env.create(NS["vswitch"], raycluster("before-provisioning"))
    wait(lambda: "is Closed" in annotations(env.get(NS["vswitch"], "RayCluster", "before-provisioning")).get(
        keys.REASON_ANNOTATION, ""), 30, "the volcano job to wait for its queue")

    reconciler_log = env.cluster.logs / "gate-reconciler.log"
    loads = reconciler_log.read_text().count('"config loaded"')
    env.apply_config(config(switched=True))  # provisioning -> kueue, volcano -> provisioning
    wait(lambda: reconciler_log.read_text().count('"config loaded"') > loads, 30,
         "the reconciler to load the new config")

    # Held in provisioning mode, finished in provisioning mode: Provisioned admits it, Kueue never has to.
    set_conditions(env, NS["switch"], pr["metadata"]["name"], PROVISIONED)
    wait(lambda: state(env.get(NS["switch"], "RayJob", "before-kueue")) == "Admitted", 30,
         "the job held before the switch to kueue to be admitted")
    # Held in volcano mode: its PodGroup gates its pods once the queue opens, as before the switch.
    env.kube.patch(VOLCANO_QUEUES, QUEUE, {"status": {"state": "Open"}}, sub="status")
    wait(lambda: state(env.get(NS["vswitch"], "RayCluster", "before-provisioning")) == "Admitted", 60,
         "the job held in volcano mode to be admitted")
    assert env.kube.get(PODGROUPS, "ray-before-provisioning-pg", NS["vswitch"])["spec"]["queue"] == QUEUE
    for ns in (NS["switch"], NS["vswitch"]):
        assert_gate_holds(env, ns)
