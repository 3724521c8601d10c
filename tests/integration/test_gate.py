"""The gate holds: tried as an untrusted data scientist would, no GPU Ray pod runs without booked capacity.

Alice has a namespaced Role with every verb on RayJobs and RayClusters (and read access to pods): edit
rights on Ray objects and nothing else. She acts through `kubectl --as alice`, so the API server
authorizes her as her Role says and raygate sees her username. The webhook and reconciler run as real
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
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from builders import RayCluster, RayJob, worker_group
from waiting import consistently, wait

from raygate.core import keys
from raygate.core.api import EVENTS, LEASES, PODGROUPS, PODS, RAYCLUSTERS, RAYJOBS, VOLCANO_QUEUES, Resource
from raygate.core.api import provisioning_requests as _provisioning_requests
from raygate.core.objects import JSON
from raygate.devenv.controlplane import ControlPlane
from raygate.devenv.raygate_local import LocalWebhook, start_reconciler, start_webhook, stop_webhook
from raygate.kube.client import MERGE_PATCH, ApiError, Kube
from raygate.reconciler.pods import JOBS

pytestmark = pytest.mark.integration

SUFFIX = uuid.uuid4().hex[:5]
NS = {k: f"gate-{k}-{SUFFIX}" for k in ("main", "failed", "switch", "vswitch", "before")}
QUEUE = f"gate-queue-{SUFFIX}"
PR = _provisioning_requests("v1")
USER = "alice"
GPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": "1"}}
CPU = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
PROVISIONED = {"Accepted": "True", "Provisioned": "True"}


def config(switched: bool = False) -> dict[str, Any]:
    """raygate-config; `switched`: the two namespaces that change mode mid-test have changed it."""
    return {
        "defaults": {"mode": "provisioning", "retry": {"limit": 2, "baseSeconds": 1, "maxSeconds": 2}},
        "namespaces": {
            NS["failed"]: {"retry": {"limit": 0}},
            NS["switch"]: {"mode": "kueue", "queueName": "q"} if switched else {},
            NS["vswitch"]: {} if switched else {"mode": "volcano", "queueName": QUEUE},
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
subjects: [{{kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}}]
"""


@dataclass
class Env:
    cluster: ControlPlane
    kube: Kube
    webhook: LocalWebhook

    def as_alice(self, *args: str, input_obj: JSON | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl as the untrusted user; `check`: fail the test if the API server refuses."""
        proc = subprocess.run(
            [str(self.cluster.bundle.binary("kubectl")), "--kubeconfig", str(self.cluster.kubeconfig), "--as", USER,
             *args], input=json.dumps(input_obj) if input_obj is not None else None, capture_output=True, text=True,
            timeout=60, check=False)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    def refused(self, *args: str, input_obj: JSON | None = None, says: str = "You may not") -> str:
        """Alice's kubectl call must be refused by raygate's guard, with a message saying `says`."""
        proc = self.as_alice(*args, input_obj=input_obj, check=False)
        assert proc.returncode != 0, f"allowed: kubectl {' '.join(args)}"
        assert "raygate" in proc.stderr or "You may not" in proc.stderr, proc.stderr
        assert says in proc.stderr, proc.stderr
        return proc.stderr

    def create(self, ns: str, obj: JSON) -> JSON:
        self.as_alice("create", "-n", ns, "-f", "-", input_obj=obj)
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
        for ns in NS.values():
            cluster.kubectl("delete", "rayjobs,rayclusters", "--all", "-n", ns, "--wait=true", "--timeout=90s",
                            check=False)
        cluster.stop_process("gate-reconciler")
        stop_webhook(cluster, "gate-webhook")
        cluster.kubectl("delete", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE, "--ignore-not-found")
        for ns in NS.values():
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kube.delete(VOLCANO_QUEUES, QUEUE)


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
    """The object raygate gates for a RayCluster: its RayJob when KubeRay made it for one, else itself."""
    rc = _found(env, RAYCLUSTERS, cluster_name, ns)
    if rc is None:
        return None
    for ref in rc["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "RayJob":
            job = _found(env, RAYJOBS, ref["name"], ns)
            if job is not None and job["metadata"]["uid"] == ref.get("uid"):
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
    for (kind, name), n in gpu_pods(env, ns).items():
        have = booked(env, ns, env.get(ns, kind, name)) if kind != "orphan" else 0
        if n > have:
            bad.append(f"{kind} {ns}/{name} has {n} ungated GPU pods but {have} booked")
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

def test_a_raycluster_that_claims_a_rayjob_parent_is_held(env: Env) -> None:
    ns = NS["main"]
    parent = env.create(ns, rayjob("parent"))
    claims = raycluster("claims-a-parent", labels={keys.ORIGINATED_FROM_CRD_LABEL: "RayJob",
                                                   keys.ORIGINATED_FROM_NAME_LABEL: "parent",
                                                   keys.STATE_LABEL: "Admitted"},
                        annotations={keys.MODE_ANNOTATION: "provisioning"},
                        ownerReferences=[{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "parent",
                                          "uid": parent["metadata"]["uid"], "controller": True}])
    claims["spec"]["suspend"] = False
    stored = env.create(ns, claims)
    assert stored["spec"]["suspend"] is True and state(stored) == "Pending"
    current_request(env, ns, "RayCluster", "claims-a-parent")  # held as a job of its own: it needs a booking
    assert pods_of(env, ns, "claims-a-parent", gpu_only=False) == []
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
    # Server-side apply and another served version of the API take the same gate.
    current = env.get(ns, "RayCluster", "grower")
    current["spec"]["workerGroupSpecs"][0]["replicas"] = 4
    env.as_alice("replace", "-n", ns, "-f", "-", input_obj=current)
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
    for name in ("submits", "submits-again"):  # KubeRay's Job, and a second one nothing booked
        env.kube.create(JOBS, {
            "metadata": {"name": name, "labels": dict([keys.KUBERAY_CREATED_BY]), "ownerReferences": [
                {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "submits", "uid": job["metadata"]["uid"],
                 "controller": True}]},
            "spec": {"backoffLimit": 0, "template": job["spec"]["submitterPodTemplate"]}}, ns)

    def submitters() -> list[JSON]:
        return [p for p in env.kube.list(PODS, ns, labelSelector="batch.kubernetes.io/job-name").get("items") or []
                if p["metadata"]["labels"].get("batch.kubernetes.io/job-name") in ("submits", "submits-again")]
    wait(lambda: sorted(gated(p) for p in submitters()) == [False, True], 60,
         "one submitter pod released into its booking, the other gated")
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
