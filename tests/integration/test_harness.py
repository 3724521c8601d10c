"""The local control plane is real: the pinned CRDs validate and prune, the controller-manager collects
garbage, the KubeRay operator acts on RayClusters and leaves suspended RayJobs alone, and `raygate dev`
starts, restarts harmlessly, stops everything, and fails on bad input with one clear line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import builders
import pytest
import yaml
from procs import processes_mentioning
from waiting import consistently, wait

from raygate.devenv import controlplane
from raygate.devenv.build import Bundle
from raygate.devenv.controlplane import ControlPlane

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
RAYGATE = Path(sys.executable).parent / "raygate"


def sample(name: str) -> Obj:
    doc = yaml.safe_load((SAMPLES / name).read_text())
    assert isinstance(doc, dict)
    return doc


def kubectl_run(cluster: ControlPlane, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.bundle.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=input_text, capture_output=True, text=True, check=False, timeout=120,
    )


def create(cluster: ControlPlane, ns: str, obj: Obj) -> Obj:
    out = cluster.kubectl("create", "-n", ns, "-o", "json", "-f", "-", input_text=json.dumps(obj))
    created = json.loads(out)
    assert isinstance(created, dict)
    return created


def get_json(cluster: ControlPlane, *args: str) -> Obj:
    data = json.loads(cluster.kubectl("get", *args, "-o", "json"))
    assert isinstance(data, dict)
    return data


def missing_or_changed(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Paths of `sent` that `stored` lacks or holds differently (server defaults may add fields)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [path or "."]
        return [p for k, v in sent.items() for p in missing_or_changed(v, stored.get(k, _MISSING), f"{path}.{k}")]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [path]
        return [p for i, (a, b) in enumerate(zip(sent, stored, strict=True))
                for p in missing_or_changed(a, b, f"{path}[{i}]")]
    return [] if sent == stored else [path]


_MISSING = object()




# --- the real CRD schemas -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rayjob.sample.yaml", "raycluster.sample.yaml"])
def test_kuberay_samples_round_trip(cluster: ControlPlane, make_namespace: Callable[..., str], name: str) -> None:
    """Every field of the sample survives the API server: a field the pinned CRD schema did not
    know would be pruned silently, and this comparison would name it."""
    ns = make_namespace("rt")
    obj = sample(name)
    if obj["kind"] == "RayCluster":
        obj["spec"]["suspend"] = True  # the operator need not start pods for this test
    create(cluster, ns, obj)
    stored = get_json(cluster, f"{obj['kind'].lower()}.ray.io", obj["metadata"]["name"], "-n", ns)
    assert stored["apiVersion"] == "ray.io/v1"
    assert missing_or_changed(obj["spec"], stored["spec"]) == []
    # The proof that the schema is enforced: an unknown field is refused (strict field validation)
    # and, when validation is switched off, pruned rather than stored.
    bogus = json.loads(json.dumps(obj))
    bogus["metadata"]["name"] += "-extra"
    bogus["spec"]["notAKubeRayField"] = "x"
    proc = kubectl_run(cluster, "create", "-n", ns, "-f", "-", input_text=json.dumps(bogus))
    assert proc.returncode != 0 and 'unknown field "spec.notAKubeRayField"' in proc.stderr, proc.stderr
    out = cluster.kubectl("create", "--validate=false", "-n", ns, "-o", "json", "-f", "-",
                          input_text=json.dumps(bogus))
    assert "notAKubeRayField" not in json.loads(out)["spec"]


@pytest.mark.parametrize(
    ("name", "path", "value", "field", "expected_type"),
    [
        ("raycluster.sample.yaml", ("spec", "workerGroupSpecs", 0, "replicas"), "two",
         "spec.workerGroupSpecs[0].replicas", "integer"),
        ("rayjob.sample.yaml", ("spec", "shutdownAfterJobFinishes"), "yes", "spec.shutdownAfterJobFinishes",
         "boolean"),
        ("rayjob.sample.yaml", ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "maxReplicas"), "3",
         "spec.rayClusterSpec.workerGroupSpecs[0].maxReplicas", "integer"),
    ],
    ids=["raycluster-replicas-string", "rayjob-shutdown-string", "rayjob-maxreplicas-string"],
)
def test_wrong_field_type_is_rejected_by_the_server(
    cluster: ControlPlane, make_namespace: Callable[..., str], name: str, path: tuple[Any, ...], value: Any,
    field: str, expected_type: str,
) -> None:
    ns = make_namespace("bad")
    obj = sample(name)
    target: Any = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    proc = kubectl_run(cluster, "create", "-n", ns, "-f", "-", input_text=json.dumps(obj))
    assert proc.returncode != 0, proc.stdout
    assert "is invalid" in proc.stderr, proc.stderr
    assert field in proc.stderr and f"must be of type {expected_type}" in proc.stderr, proc.stderr
    assert not cluster.kubectl("get", f"{obj['kind'].lower()}.ray.io", "-n", ns, "-o", "name").strip()


GANG_OBJECTS: list[Obj] = [
    {
        "apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "gpu-workers"},
        "template": {"spec": {"containers": [{
            "name": "ray-worker", "image": "rayproject/ray:2.52.0",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}},
        }]}},
    },
    {
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest", "metadata": {"name": "gang"},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": [{"podTemplateRef": {"name": "gpu-workers"}, "count": 4}],
            "parameters": {"noRetry": "true"},
        },
    },
    {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "ray-gang-pg"},
        "spec": {
            "minMember": 3, "queue": "default",
            "minTaskMember": {"headgroup": 1, "small-group": 2},
            "minResources": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"},
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team-queue"},
        "spec": {"clusterQueue": "cluster-queue"},
    },
]


def test_gang_objects_can_be_created(cluster: ControlPlane, make_namespace: Callable[..., str]) -> None:
    ns = make_namespace("gang")
    for obj in GANG_OBJECTS:
        created = create(cluster, ns, obj)
        assert created["kind"] == obj["kind"]
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        assert missing_or_changed(body, created) == [], obj["kind"]
    resources = "podtemplates,provisioningrequests.autoscaling.x-k8s.io,podgroups.scheduling.volcano.sh," \
        "localqueues.kueue.x-k8s.io"
    names = cluster.kubectl("get", resources, "-n", ns, "-o", "name").split()
    assert len(names) == len(GANG_OBJECTS), names
    # The ProvisioningRequest's schema is enforced too: count must be at least 1.
    bad = json.loads(json.dumps(GANG_OBJECTS[1]))
    bad["metadata"]["name"] = "zero"
    bad["spec"]["podSets"][0]["count"] = 0
    proc = kubectl_run(cluster, "create", "-n", ns, "-f", "-", input_text=json.dumps(bad))
    assert proc.returncode != 0 and "spec.podSets[0].count" in proc.stderr, proc.stderr


# --- the controller-manager ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("owner", "dependent"),
    [
        ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}, "data": {"a": "b"}},
         GANG_OBJECTS[0]),
        (sample("rayjob.sample.yaml"), GANG_OBJECTS[1]),
    ],
    ids=["configmap-owns-podtemplate", "rayjob-owns-provisioningrequest"],
)
def test_deleting_the_owner_collects_the_dependent(
    cluster: ControlPlane, make_namespace: Callable[..., str], owner: Obj, dependent: Obj
) -> None:
    ns = make_namespace("gc")
    made = create(cluster, ns, owner)
    dep = json.loads(json.dumps(dependent))
    dep["metadata"]["ownerReferences"] = [{
        "apiVersion": made["apiVersion"], "kind": made["kind"], "name": made["metadata"]["name"],
        "uid": made["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
    }]
    create(cluster, ns, dep)
    res = {"PodTemplate": "podtemplates", "ProvisioningRequest": "provisioningrequests.autoscaling.x-k8s.io"}[
        dep["kind"]]
    # Alive while its owner exists (a GC that deleted everything would pass the second half alone).
    consistently(lambda: cluster.kubectl("get", res, dep["metadata"]["name"], "-n", ns, "--ignore-not-found",
                                         "-o", "name").strip(), 2, f"the {dep['kind']} to live while its owner does")
    cluster.kubectl("delete", made["kind"].lower() + ("" if made["kind"] == "ConfigMap" else ".ray.io"),
                    made["metadata"]["name"], "-n", ns, "--wait=false")

    def gone() -> bool:
        return not cluster.kubectl("get", res, dep["metadata"]["name"], "-n", ns, "--ignore-not-found",
                                   "-o", "name").strip()

    # The garbage collector picks up CRD kinds through a periodic discovery resync (30 s).
    wait(gone, 90, f"garbage collection of {dep['kind']} owned by {made['kind']}", interval=0.5)


def _bound_pod(name: str, node: str) -> Obj:
    """A pod bound at create (as the scheduler binds), so no scheduler is needed and no kubelet runs it."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "busybox"}]}}


def test_pods_of_a_deleted_node_are_removed_by_pod_gc_and_by_the_demo(
    cluster: ControlPlane, make_namespace: Callable[..., str]
) -> None:
    """When the autoscaler deletes a node, no kubelet will ever confirm its pods' deletion: they stay
    Terminating unless pod GC (after its 40 s quarantine) or someone force-deletes them. The demo
    force-deletes its own at once, before pod GC gets to them; pod GC clears the rest."""
    from raygate.devenv.demo import clear_stranded_pods
    from raygate.kube.client import Kube

    others, own = make_namespace("podgc"), make_namespace("demo")
    node = f"gone-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    for ns in (others, own):
        wait(lambda ns=ns: cluster.kubectl("get", "serviceaccount", "default", "-n", ns, "--ignore-not-found",
                                           "-o", "name").strip(), 30, f"the default ServiceAccount of {ns}")
        create(cluster, ns, _bound_pod("left", node))
        cluster.kubectl("delete", "pod", "left", "-n", ns, "--wait=false")

    def terminating(ns: str) -> bool:
        pod = get_json(cluster, "pod", "left", "-n", ns)
        return bool(pod["metadata"].get("deletionTimestamp"))

    # While the node exists nothing removes them: only a kubelet that never comes would.
    consistently(lambda: terminating(others) and terminating(own), 3, "both pods to stay Terminating")
    cluster.kubectl("delete", "node", node)

    kube = Kube.connect(str(cluster.kubeconfig), user_agent="raygate-harness-test")
    cleared = clear_stranded_pods(kube, own)
    assert list(cleared.values()) == [f"{own}/left (Terminating on node {node}, which no longer exists)"]
    assert not cluster.kubectl("get", "pod", "left", "-n", own, "--ignore-not-found", "-o", "name").strip()
    assert terminating(others), "clear_stranded_pods touches only its own namespace"

    def collected() -> bool:
        return not cluster.kubectl("get", "pod", "left", "-n", others, "--ignore-not-found", "-o", "name").strip()

    # Pod GC checks every 20 s and deletes a missing node's pods after 40 s of quarantine.
    wait(collected, 150, f"pod GC to remove {others}/left, bound to the deleted node {node}", interval=1)


# --- the KubeRay operator -----------------------------------------------------------------------
def _pods(cluster: ControlPlane, ns: str, selector: str) -> list[Obj]:
    items = get_json(cluster, "pods", "-n", ns, "-l", selector)["items"]
    assert isinstance(items, list)
    return items


@pytest.mark.kuberay
def test_raycluster_gets_head_and_worker_pods_that_stay_pending(
    cluster: ControlPlane, make_namespace: Callable[..., str]
) -> None:
    ns = make_namespace("kr")
    obj = sample("raycluster.sample.yaml")
    obj["spec"]["suspend"] = False
    create(cluster, ns, obj)
    selector = f"ray.io/cluster={obj['metadata']['name']}"

    def all_pods() -> bool:
        return len(_pods(cluster, ns, selector)) == 3

    wait(all_pods, 60, "KubeRay creating 1 head and 2 worker pods", interval=0.5)
    consistently(lambda: all(not p["spec"].get("nodeName") for p in _pods(cluster, ns, selector)), 2,
                 "the pods to stay unbound (no node ever runs them)")
    pods = _pods(cluster, ns, selector)
    types = sorted(p["metadata"]["labels"].get("ray.io/node-type") for p in pods)
    assert types == ["head", "worker", "worker"]
    assert {p["status"].get("phase") for p in pods} == {"Pending"}
    assert all(not p["spec"].get("nodeName") for p in pods)
    workers = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
    assert {p["metadata"]["labels"].get("ray.io/group") for p in workers} == {"cpu-workers"}


@pytest.mark.kuberay
def test_suspended_rayjob_gets_no_raycluster(cluster: ControlPlane, make_namespace: Callable[..., str]) -> None:
    ns = make_namespace("kr")
    held = sample("rayjob.sample.yaml")
    held["metadata"]["name"] = "held"
    control = sample("rayjob.sample.yaml")
    control["metadata"]["name"] = "control"
    control["spec"]["suspend"] = False
    create(cluster, ns, held)
    create(cluster, ns, control)

    def clusters_of(job: str) -> list[Obj]:
        items = get_json(cluster, "rayclusters.ray.io", "-n", ns, "-l",
                         f"ray.io/originated-from-cr-name={job}")["items"]
        assert isinstance(items, list)
        return items

    # The same operator, at the same time, does create a cluster for the unsuspended job: the held
    # job's silence is the suspend flag, not a stopped operator.
    wait(lambda: len(clusters_of("control")) == 1, 60, "KubeRay creating the control job's RayCluster", interval=0.5)
    consistently(lambda: clusters_of("held") == [], 10, "no RayCluster for the held job", interval=1)
    assert len(cluster.kubectl("get", "rayclusters.ray.io", "-n", ns, "-o", "name").split()) == 1
    status = get_json(cluster, "rayjob.ray.io", "held", "-n", ns).get("status", {})
    assert status.get("jobDeploymentStatus") in (None, "", "New", "Suspended"), status


# --- `raygate dev` --------------------------------------------------------------------------------
def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 180,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout,
                          env=env if env is not None else dict(os.environ), cwd=cwd)




@pytest.fixture
def dev_dir(tmp_path: Path, bundle: Bundle) -> Iterator[Path]:
    workdir = tmp_path / f"dev-{uuid.uuid4().hex[:6]}"
    yield workdir
    _run([str(RAYGATE), "dev", "--dir", str(workdir), "down"])


def test_dev_up_twice_then_down_leaves_nothing(dev_dir: Path, bundle: Bundle) -> None:
    dev = [str(RAYGATE), "dev", "--dir", str(dev_dir)]
    t0 = time.monotonic()
    up = _run([*dev, "up", "--kuberay"])
    took = time.monotonic() - t0
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip().splitlines()[-1] == f"export KUBECONFIG={dev_dir.resolve() / 'kubeconfig'}"
    # Reported, not asserted: the start-up target is measured by `make bench` (benchmarks/startup).
    print(f"warm `raygate dev up --kuberay`: {took:.1f}s")
    state = json.loads((dev_dir / "state.json").read_text())
    pids = state["pids"]
    assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kuberay-operator"}

    kubectl = [str(bundle.binary("kubectl")), "--kubeconfig", str(dev_dir / "kubeconfig")]
    crds = _run([*kubectl, "get", "crd", "-o", "name"])
    assert crds.returncode == 0, crds.stderr
    for name in ("rayjobs.ray.io", "rayclusters.ray.io", "provisioningrequests.autoscaling.x-k8s.io",
                 "podgroups.scheduling.volcano.sh", "workloads.kueue.x-k8s.io"):
        assert f"customresourcedefinition.apiextensions.k8s.io/{name}" in crds.stdout.split(), crds.stdout

    env = _run([*dev, "env"])
    assert env.returncode == 0 and env.stdout.strip().splitlines()[-1] == up.stdout.strip().splitlines()[-1]
    for name in pids:  # it says what runs
        assert any(line.startswith(f"# {name} ") and "running" in line for line in env.stdout.splitlines()), env.stdout

    again = _run([*dev, "up", "--kuberay"])
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    assert json.loads((dev_dir / "state.json").read_text())["pids"] == pids, "a second up must not restart"
    assert _run([*kubectl, "get", "crd", "rayjobs.ray.io"]).returncode == 0

    assert all(Path(f"/proc/{pid}").exists() for pid in pids.values())
    down = _run([*dev, "down"])
    assert down.returncode == 0, down.stderr
    for name, pid in pids.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        assert stat.rsplit(")", 1)[1].split()[0] == "Z", f"{name} (pid {pid}) survived `dev down`"
    assert processes_mentioning(str(dev_dir.resolve())) == []
    assert _run([*dev, "env"]).returncode != 0


def test_a_port_taken_before_its_process_binds_it_is_picked_again(dev_dir: Path, bundle: Bundle,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Another listener takes etcd's port between its pick and etcd's start: `up` starts again on other ports
    instead of failing with kube-apiserver's "context deadline exceeded" 20 s later."""
    real = controlplane.free_port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([real(), busy])  # kube-apiserver's port, then etcd's
        monkeypatch.setattr(controlplane, "free_port", lambda: next(picks, None) or real())
        cp = ControlPlane(dev_dir, bundle)
        state = cp.up(log=False)
    assert "address already in use" in (dev_dir / "logs" / "etcd.log").read_text()
    assert busy not in (state.apiserver_port, state.etcd_port, state.etcd_peer_port)
    assert cp.kubectl("get", "crd", "rayjobs.ray.io", "-o", "name").strip()


def _controller(obj: Obj) -> tuple[str, str] | None:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return (refs[0]["kind"], refs[0]["uid"]) if refs else None


@pytest.mark.kuberay
def test_a_k8sjobmode_rayjob_gets_its_submitter_pod_from_the_job_controller(dev_dir: Path, bundle: Bundle) -> None:
    """KubeRay submits a K8sJobMode RayJob (its default) through a batch Job of its own; the Job's pod
    is the Job controller's work, which `raygate dev up` runs, as a real cluster does."""
    up = _run([str(RAYGATE), "dev", "--dir", str(dev_dir), "up", "--kuberay", "--capacity"], timeout=300)
    assert up.returncode == 0, up.stderr
    cp = ControlPlane(dev_dir, bundle)
    ns = "k8sjob"
    cp.kubectl("create", "namespace", ns)
    wait(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", ns, "--ignore-not-found", "-o", "name").strip(),
         30, f"the default ServiceAccount of {ns}")
    res = {"cpu": "1", "memory": "1Gi"}
    job = builders.RayJob("train", ns).worker("cpu", replicas=1, min_replicas=1, max_replicas=1,
                                              requests=res, limits=res).obj()
    assert "submissionMode" not in job["spec"]  # KubeRay's default, K8sJobMode
    made = create(cp, ns, job)

    def running_submitter() -> Obj | None:
        pods = get_json(cp, "pods", "-n", ns, "-l", "batch.kubernetes.io/job-name=train")["items"]
        return next((p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")), None)

    pod = wait(running_submitter, 180, "the submitter pod of RayJob train Running on a node", interval=1)
    submitter_job = get_json(cp, "job.batch", "train", "-n", ns)
    assert _controller(submitter_job) == ("RayJob", made["metadata"]["uid"])  # KubeRay's Job
    assert _controller(pod) == ("Job", submitter_job["metadata"]["uid"])  # the Job controller's pod
    assert submitter_job["status"].get("active") == 1, submitter_job["status"]
    ray_pods = get_json(cp, "pods", "-n", ns, "-l", "ray.io/cluster")["items"]
    assert sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in ray_pods) == ["head", "worker"]
    assert all(pod["metadata"]["creationTimestamp"] >= p["metadata"]["creationTimestamp"] for p in ray_pods), \
        "KubeRay submits once the Ray cluster is up"


def test_down_removes_what_up_registered_and_fresh_starts_empty(dev_dir: Path, bundle: Bundle) -> None:
    """A plain `up` after an `up --raygate` must not find raygate's webhooks registered by the URL of a
    webhook that no longer runs (every create in an opted-in namespace would fail); `--fresh` empties."""
    dev = [str(RAYGATE), "dev", "--dir", str(dev_dir)]
    kubectl = [str(bundle.binary("kubectl")), "--kubeconfig", str(dev_dir / "kubeconfig")]
    hooks = ["get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name"]
    up = _run([*dev, "up", "--raygate"], timeout=300)
    assert up.returncode == 0, up.stderr
    env = _run([*dev, "env"]).stdout
    for name in ("raygate-webhook", "raygate-reconciler", "kube-scheduler", "kwok", "cluster-autoscaler"):
        assert f"# {name} " in env, env
    assert "# capacity: 2 CPU nodes" in env, env
    assert "raygate" in _run([*kubectl, *hooks]).stdout

    assert _run([*dev, "down"]).returncode == 0
    assert _run([*dev, "up"]).returncode == 0  # the cluster's data persists, raygate does not run
    assert "raygate" not in _run([*kubectl, *hooks]).stdout
    created = subprocess.run([*kubectl, "create", "-n", "demo", "-f", "-"], input=json.dumps({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "after-down"},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            {"name": "ray-head", "image": "rayproject/ray:2.46.0"}]}}}}}), capture_output=True, text=True, check=False)
    assert created.returncode == 0, created.stderr  # not "connection refused" from a stale registration

    fresh = _run([*dev, "up", "--fresh"])
    assert fresh.returncode == 0, fresh.stderr
    namespaces = _run([*kubectl, "get", "namespaces", "-o", "name"]).stdout.split()
    assert "namespace/demo" not in namespaces, namespaces
    assert _run([*dev, "down"]).returncode == 0
    assert processes_mentioning(str(dev_dir.resolve())) == []


def _one_clear_line(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("raygate: error: "), line
    for needle in needles:
        assert needle in line, line
    return line


def test_dev_up_on_a_busy_port_is_one_line(tmp_path: Path, bundle: Bundle) -> None:
    workdir = tmp_path / "busy"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = _run([str(RAYGATE), "dev", "--dir", str(workdir), "up", "--apiserver-port", str(port)])
    _one_clear_line(proc, f"port {port}", "already in use", "kube-apiserver")
    assert processes_mentioning(str(workdir.resolve())) == []


def _path_without_go() -> str:
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "go").exists()]
    return os.pathsep.join(keep)


def test_build_without_go_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_go(), "RAYGATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = _run([str(RAYGATE), "dev", "build"], env=env, timeout=60)
    _one_clear_line(proc, "Go toolchain is missing", "go")


def test_failed_module_download_is_one_line(tmp_path: Path) -> None:
    # An empty module cache and no proxy: the first pinned module cannot be downloaded.
    env = {
        **os.environ,
        "RAYGATE_CACHE_DIR": str(tmp_path / "cache"),
        "GOMODCACHE": str(tmp_path / "gomod"),
        "GOPROXY": "off",
    }
    proc = _run([str(RAYGATE), "dev", "build"], env=env, timeout=120)
    line = _one_clear_line(proc, "downloading Go module")
    assert "@v" in line and "GOPROXY=off" in line, line
    _run(["chmod", "-R", "u+w", str(tmp_path / "gomod")])  # the module cache is read-only


def test_dev_up_without_binaries_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_go(), "RAYGATE_CACHE_DIR": str(tmp_path / "cache")}
    proc = _run([str(RAYGATE), "dev", "--dir", str(tmp_path / "d"), "up"], env=env, timeout=60)
    _one_clear_line(proc, "Go toolchain is missing")
