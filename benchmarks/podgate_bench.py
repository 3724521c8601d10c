"""What the gate at the pod costs: the pod webhook's latency, a gang's Provisioned -> every pod bound with
the gate and without it, and a scale-up's pods from creation to bound on the real cluster-autoscaler.

1. Pod reviews served over TLS (the shipped webhook, one worker x 2 threads): a CREATE of a GPU worker pod
   as KubeRay makes it, which the webhook gates, at concurrency 1 and 8. Target p99 <= 5 ms at 8.
2. A RayCluster of 32 GPU workers on GPU nodes that exist (check-capacity books them), measured from
   the moment its request is Provisioned to every worker bound, in rotating rounds on three sides (GANG_SIDES):
   the pod gate as installed (raygate admits the cluster with its GPU pods born gated from its templates, so
   the API server calls no admission for them, and releases each against the booking); and the same cluster in
   a namespace raygate does not see, booked by the benchmark itself with the same request and unsuspended once
   it is Provisioned, its pods sent to a webhook in Go that only adds a label (benchmarks/noop_webhook: what
   any webhook costs) or to none (no gate at all). Target: the median with the gate within 20% of without.
   Then what an admission call costs the API server itself, for the pods that are not born gated (a RayJob's:
   its cluster did not exist when raygate admitted it): 40 GPU pods created one after another on the same
   stack once no Ray object is left, through the pod gate's MutatingAdmissionPolicy (Kubernetes 1.36), raygate's
   webhook, the no-op one, and none.
3. An admitted autoscaling RayCluster scaled up by 4 workers on an empty GPU node group: from the replicas
   patch and from the new pods' creation to all bound, with the real cluster-autoscaler adding the node for
   their scale-up request.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from benchmarks import common
from benchmarks.common import BenchError, Target, bound_workers, gpu_workers, request_provisioned, until
from benchmarks.samples import admission_review
from benchmarks.webhook_bench import drive
from raygate.core import keys
from raygate.core.api import PODTEMPLATES, RAYCLUSTERS, provisioning_requests
from raygate.core.objects import JSON
from raygate.kube.client import Kube
from raygate.webhook.cli import THREADS as WEBHOOK_THREADS
from raygate.webhook.cli import WORKERS as WEBHOOK_WORKERS

NAMESPACE = "bench-podgate"  # the scale-up: best-effort-atomic, the autoscaler adds its node
GANG_NAMESPACE = "bench-podgate-gang"  # the gang: check-capacity on GPU nodes that exist
NOOP_NAMESPACE = "bench-podgate-noop"  # not opted in; its pods go to the no-op webhook in Go
PLAIN_NAMESPACE = "bench-podgate-plain"  # not opted in: pod creates no webhook sees
NOOP_SOURCE = Path(__file__).parent / "noop_webhook"
ONE_BY_ONE_PODS = 40
STATIC_GROUP = "gpu-static"
GANG = 32
SCALE_UP = 4
P99_TARGET_MS = 5.0
OVERHEAD_TARGET = 1.2


def gpu_pod(i: int) -> JSON:
    """A GPU worker pod as KubeRay creates it for an admitted cluster."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"train-gpu-worker-{i:05d}", "namespace": NAMESPACE,
                         "labels": {keys.RAY_CLUSTER_LABEL: "train", keys.RAY_GROUP_LABEL: "gpu",
                                    keys.RAY_NODE_TYPE_LABEL: "worker"},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "train",
                                              "uid": "3f1c", "controller": True}]},
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu", "resources": {
                "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
                "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}}}],
                     "initContainers": [{"name": "wait-gcs-ready", "image": "rayproject/ray:2.46.0-gpu",
                                         "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}}]}}


def pod_review(pod: JSON) -> JSON:
    """The AdmissionReview the API server sends for a pod KubeRay creates."""
    review = admission_review(pod, uid=str(uuid.uuid4()))
    core = {"group": "", "version": "v1"}
    review["request"].update(kind={**core, "kind": "Pod"}, requestKind={**core, "kind": "Pod"},
                             resource={**core, "resource": "pods"}, requestResource={**core, "resource": "pods"},
                             userInfo={"username": "system:serviceaccount:ray-system:kuberay-operator"})
    return review


def served(warmup: float, duration: float, hog_cores: int, threads: int = WEBHOOK_THREADS) -> list[dict[str, Any]]:
    """The pod webhook (one worker of `threads` threads) at concurrency 1 and 8, idle, then beside a CPU hog of
    `hog_cores` cores (0: idle only)."""
    from raygate.devenv import raygate_local

    bodies = [orjson.dumps(pod_review(gpu_pod(i))) for i in range(256)]
    with common.control_plane() as cp:
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("label", "namespace", NAMESPACE, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        hook = raygate_local.start_webhook(cp, workers=WEBHOOK_WORKERS, threads=threads, register=False,
                                           name="podgate-webhook")
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        port = int(hook.url.rsplit(":", 1)[1])
        time.sleep(2)  # every worker ready
        runs = []
        for hog in sorted({0, hog_cores}):
            for c in (1, 8):
                with contextlib.ExitStack() as stack:
                    neighbour = stack.enter_context(common.CpuHog(hog)) if hog else None
                    r = drive(port, str(hook.ca_file), c, processes=1 if c == 1 else 2, warmup=warmup,
                              duration=duration, server_pid=state.pids["podgate-webhook"], bodies=bodies)
                r["hog_cores"] = hog
                r["hog_cpu_cores"] = round(neighbour.cpu_cores, 2) if neighbour else 0.0
                print(f"bench: pod webhook c={c}{_beside(hog)}: {r['reviews_per_s']:,.0f}/s p50 "
                      f"{r['latency_ms']['p50']:.2f} ms p99 {r['latency_ms']['p99']:.2f} ms", flush=True)
                runs.append(r)
    return runs


def _beside(hog: int) -> str:
    return f" beside a {hog}-core CPU hog" if hog else " idle"


def raycluster(name: str, namespace: str, workers: int, *, autoscaling: bool = False) -> JSON:
    worker = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name, "namespace": namespace},
            "spec": {"enableInTreeAutoscaling": autoscaling,
                     "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                         "name": "ray-head", "image": "rayproject/ray:2.46.0",
                         "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}},
                     "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": 0,
                                           "maxReplicas": 64, "rayStartParams": {},
                                           "template": {"spec": {"containers": [{
                                               "name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu",
                                               "resources": {"requests": worker, "limits": worker}}]}}}]}}


CONFIG = {"defaults": {"mode": "provisioning", "provisioning": {"className": keys.BEST_EFFORT_ATOMIC_CLASS}},
          "namespaces": {GANG_NAMESPACE: {"provisioning": {"className": keys.CHECK_CAPACITY_CLASS}}}}


# Where a gang round's time goes, from watch events: (label, from, to); "provisioned" is the bench's own poll.
GANG_PHASES = (("Provisioned -> unsuspended", "provisioned", "unsuspended"),
               ("unsuspended -> first worker created", "unsuspended", "first_created"),
               ("first -> last worker created (KubeRay)", "first_created", "last_created"),
               ("last created -> last released (raygate)", "last_created", "last_released"),
               ("last released -> last bound (kube-scheduler)", "last_released", "last_bound"))


class GangWatch:
    """First-seen moments of one namespace's RayClusters and workers, from watches (no poll interval in them)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        from raygate.core.api import PODS
        from raygate.kube.informer import Informer

        self.unsuspended: dict[str, float] = {}
        self.pods: dict[str, dict[str, dict[str, float]]] = {}  # cluster -> pod -> created / released / bound
        self.informers = [Informer(kube, RAYCLUSTERS, namespace=namespace, handler=self._cluster),
                          Informer(kube, PODS, namespace=namespace, handler=self._pod)]
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            informer.wait_synced(60)

    def _cluster(self, kind: str, obj: JSON) -> None:
        if kind != "DELETED" and (obj.get("spec") or {}).get("suspend") is not True:
            self.unsuspended.setdefault(obj["metadata"]["name"], time.monotonic())

    def _pod(self, kind: str, obj: JSON) -> None:
        labels = obj["metadata"].get("labels") or {}
        if kind == "DELETED" or labels.get(keys.RAY_GROUP_LABEL) != "gpu":
            return
        now = time.monotonic()
        seen = self.pods.setdefault(labels.get(keys.RAY_CLUSTER_LABEL, ""), {}).setdefault(obj["metadata"]["name"], {})
        seen.setdefault("created", now)
        if not any(g.get("name") == keys.CAPACITY_GATE for g in obj["spec"].get("schedulingGates") or []):
            seen.setdefault("released", now)
        if obj["spec"].get("nodeName"):
            seen.setdefault("bound", now)

    def phases(self, cluster: str, provisioned: float) -> dict[str, float]:
        """Seconds of each GANG_PHASES step of one round."""
        pods = self.pods.get(cluster, {}).values()
        at = {"provisioned": provisioned, "unsuspended": self.unsuspended.get(cluster, float("nan")),
              "first_created": min(p["created"] for p in pods), "last_created": max(p["created"] for p in pods),
              "last_released": max(p["released"] for p in pods), "last_bound": max(p["bound"] for p in pods)}
        return {label: round(at[b] - at[a], 3) for label, a, b in GANG_PHASES}

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()


# The API server's own view of a round (its /metrics, before and after): each webhook call as it timed it, by
# webhook and type, and whole pod creates (sums and counts of its histograms).
ADMISSION_SERIES = ("apiserver_admission_webhook_admission_duration_seconds",
                    "apiserver_admission_step_admission_duration_seconds", "apiserver_request_duration_seconds")


POD_WRITES = "pod writes"
POD_WRITE_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def apiserver_admission(cp: Any) -> dict[str, float]:
    """{"<series> <labels>:sum|count": value} for the webhook calls, the admission steps and pod POSTs; and
    {"pod writes <verb> <subresource>:count": value}."""
    import re
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
    ctx.load_cert_chain(str(cp.pki / "admin.crt"), str(cp.pki / "admin.key"))
    with urllib.request.urlopen(f"{cp.server}/metrics", context=ctx, timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    line_re = re.compile(r"^(\w+)_(sum|count)\{([^}]*)\} (\S+)$")
    writes_re = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$")
    for line in text.splitlines():
        if w := writes_re.match(line):  # every write to a pod, by verb and subresource (a counter: no time)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', w[1]))
            if labels.get("resource") == "pods" and labels.get("verb") in POD_WRITE_VERBS:
                key = f"{POD_WRITES} {labels['verb']} {labels.get('subresource') or '(the pod)'}:count"
                out[key] = out.get(key, 0.0) + float(w[2])
            continue
        m = line_re.match(line)
        if not m or m[1] not in ADMISSION_SERIES:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[3]))
        if m[1] == "apiserver_request_duration_seconds":
            if labels.get("resource") != "pods" or labels.get("verb") != "POST" or labels.get("subresource"):
                continue
            key = "pod creates"
        elif m[1] == "apiserver_admission_step_admission_duration_seconds":
            if labels.get("operation") != "CREATE":
                continue
            key = f"admission step {labels.get('type')}"
        else:
            key = f"webhook {labels.get('name')} {labels.get('type')} {labels.get('operation')}"
        out[f"{key}:{m[2]}"] = out.get(f"{key}:{m[2]}", 0.0) + float(m[4])
    return out


def process_cpu(cp: Any) -> dict[str, float]:
    """CPU seconds so far of each process of the stack (the API server, KubeRay, raygate's webhook, ...)."""
    state = cp.load_state()
    return {name: common.cpu_seconds(common.process_tree(pid)) for name, pid in (state.pids if state else {}).items()}


# The API server's CPU profile of each gang round (--apiserver-profile): seconds of samples under each of these
# frames, summed over the rounds of a side (`go tool pprof -top -cum`).
PROFILE_SECONDS = 6
PROFILE_FRAMES = {
    "every update (storage GuaranteedUpdate)": "storage/cacher.(*CacheDelegator).GuaranteedUpdate",
    "applying JSON patches": "handlers.(*jsonPatcher).applyPatchToCurrentObject",
    "applying strategic merge patches": "handlers.(*smpPatcher).applyPatchToCurrentObject",
    "mutating admission": "pkg/admission.chainAdmissionHandler.Admit",
    "validating admission": "pkg/admission.chainAdmissionHandler.Validate",
    "webhooks' matchConditions (CEL)": "matchconditions.(*matcher).Match",
    "serving watches": "handlers.(*WatchServer).HandleHTTP",
    "Go's garbage collector": "runtime.gcBgMarkWorker",
}


def apiserver_profile(cp: Any, path: Path) -> threading.Thread:
    """Start taking a PROFILE_SECONDS CPU profile of kube-apiserver into `path` (join the thread for it)."""
    import ssl
    import urllib.request

    def take() -> None:
        ctx = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
        ctx.load_cert_chain(str(cp.pki / "admin.crt"), str(cp.pki / "admin.key"))
        url = f"{cp.server}/debug/pprof/profile?seconds={PROFILE_SECONDS}"
        with urllib.request.urlopen(url, context=ctx, timeout=PROFILE_SECONDS + 30) as resp:
            path.write_bytes(resp.read())

    thread = threading.Thread(target=take, name="apiserver-profile")
    thread.start()
    return thread


def profile_seconds(paths: list[Path]) -> dict[str, float]:
    """Seconds of samples in all of `paths`, and under each of PROFILE_FRAMES; {} without Go's pprof."""
    import shutil
    import subprocess

    go = shutil.which("go")
    if go is None or not paths:
        return {}
    return frame_seconds(subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=100000", *map(str, paths)],
                                        capture_output=True, text=True, check=True).stdout)


def frame_seconds(top: str) -> dict[str, float]:
    """From `go tool pprof -top -cum`'s text: its total, and the cumulative seconds of each of PROFILE_FRAMES."""
    import re

    def seconds(text: str) -> float:
        return float(text[:-2]) / 1000 if text.endswith("ms") else float(text.rstrip("s"))

    total = re.search(r"Total samples = (\S+)", top)
    out = {"all samples": seconds(total[1])} if total else {}
    for line in top.splitlines():
        fields = line.split()  # flat flat% sum% cum cum% function
        if len(fields) == 6:
            for label, frame in PROFILE_FRAMES.items():
                if fields[5].endswith(frame):
                    out[label] = out.get(label, 0.0) + seconds(fields[3])
    return out


RECONCILER_SERIES = {"raygate_reconciler_queue_wait_seconds": "reconciles",
                     "raygate_reconciler_api_request_seconds": "API requests"}


def reconciler_counts(cp: Any) -> dict[str, float]:
    """Reconciles so far (keys handed to a worker) and API requests by method, from the reconciler's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from raygate.devenv.raygate_local import reconciler_metrics_port

    with urllib.request.urlopen(f"http://127.0.0.1:{reconciler_metrics_port(cp)}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_count") and (label := RECONCILER_SERIES.get(sample.name[:-6])) is not None:
                key = f"{label} {sample.labels['method']}" if "method" in sample.labels else label
                out[key] = out.get(key, 0.0) + sample.value
    return out


def admission_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per series of a round: calls and mean milliseconds."""
    out: dict[str, dict[str, float]] = {}
    for key in after:
        series, part = key.rsplit(":", 1)
        if part != "count" or after[key] - before.get(key, 0.0) <= 0:
            continue
        n = after[key] - before.get(key, 0.0)
        total = after.get(f"{series}:sum", 0.0) - before.get(f"{series}:sum", 0.0)
        out[series] = {"calls": n, "mean_ms": round(total / n * 1000, 2)}
    return out


# side -> (namespace, what it shows). On the "policy" side the pods are KubeRay's (its operator's name, a RayCluster
# controller): the pod gate's policy gates them, and the webhook is not called.
ONE_BY_ONE_SIDES = {"policy": (NAMESPACE, "the pod gate's policy"), "webhook": (NAMESPACE, "raygate's webhook"),
                    "noop": (NOOP_NAMESPACE, "a no-op webhook in Go"), "none": (PLAIN_NAMESPACE, "none")}
NOOP_CONFIG = "raygate-bench-noop"


class NoopWebhook:
    """benchmarks/noop_webhook, built and served on the control plane; `route` sends it the pods of namespaces."""

    def __init__(self, cp: Any) -> None:
        import os
        import subprocess

        from raygate.devenv.controlplane import free_port
        from raygate.devenv.raygate_local import write_tls

        self.cp = cp
        binary = cp.workdir / "noop-webhook"
        built = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=NOOP_SOURCE, capture_output=True,
                               text=True, env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
        if built.returncode != 0:
            raise BenchError(f"could not build {NOOP_SOURCE} (`go build`): {built.stderr.strip()[-500:]}")
        self.ca, crt, key = write_tls(cp.workdir / "noop-webhook-tls")
        self.port = free_port()
        self.proc = subprocess.Popen([str(binary), f"127.0.0.1:{self.port}", str(crt), str(key)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def route(self, *namespaces: str) -> None:
        """Its registration, for the pods created in `namespaces` (none: no registration)."""
        import base64

        if not namespaces:
            self.cp.kubectl("delete", "mutatingwebhookconfiguration", NOOP_CONFIG, "--ignore-not-found")
            return
        self.cp.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": NOOP_CONFIG}, "webhooks": [{
                "name": "noop.bench.raygate.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 5,
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/mutate",
                                 "caBundle": base64.b64encode(self.ca.read_bytes()).decode()},
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                            "values": list(namespaces)}]},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}]}]}))

    def stop(self) -> None:
        self.route()
        self.proc.kill()
        self.proc.wait()


def creates_one_by_one(cp: Any, kube: Kube, noop: NoopWebhook) -> dict[str, dict[str, dict[str, float]]]:
    """`ONE_BY_ONE_PODS` GPU pods created one after another on each of ONE_BY_ONE_SIDES, with the API server's own
    timings: what a webhook call, or the policy, costs it with no Ray object in the way. The pods are deleted after;
    no node matches their selector, so the autoscaler adds none for the ungated ones."""
    from raygate.core.api import PODS
    from raygate.core.policy import KUBERAY_OPERATOR_USER

    noop.route(NOOP_NAMESPACE)
    operator = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench-kuberay", pool_size=2)
    operator.impersonate = KUBERAY_OPERATOR_USER

    def create(side: str, name: str) -> None:
        ns = ONE_BY_ONE_SIDES[side][0]
        pod = gpu_pod(0)
        pod["metadata"] = {"name": f"{side}-{name}", "namespace": ns, "labels": {"app": "bench"}}
        pod["spec"]["nodeSelector"] = {"raygate.io/bench-node": "none"}
        if side == "policy":  # a worker of a RayCluster, as KubeRay's operator makes it
            pod["metadata"]["labels"][keys.RAY_GROUP_LABEL] = "gpu"
            pod["metadata"]["ownerReferences"] = [{"apiVersion": "ray.io/v1", "kind": keys.RAYCLUSTER_KIND,
                                                   "name": "bench", "uid": str(uuid.uuid4()), "controller": True}]
        (operator if side == "policy" else kube).create(PODS, pod, ns)

    for side in ONE_BY_ONE_SIDES:  # warm: each webhook's connection open, its first answers given
        for i in range(5):
            create(side, f"warm-{i}")
    out = {}
    for side in ONE_BY_ONE_SIDES:
        before = apiserver_admission(cp)
        for i in range(ONE_BY_ONE_PODS):
            create(side, f"pod-{i:03d}")
        out[side] = admission_delta(before, apiserver_admission(cp))
    noop.route()
    for ns in {ns for ns, _ in ONE_BY_ONE_SIDES.values()}:
        cp.kubectl("delete", "pods", "-l", "app=bench", "-n", ns, "--wait=false")
    return out


class Connections:
    """The API server's TCP connections to the webhook, from /proc/net/tcp every 20 ms: how many it opened."""

    def __init__(self, port: int) -> None:
        import threading

        self.port = f"{port:04X}"
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="connections", daemon=True)

    def established(self) -> set[str]:
        peers = set()
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1].endswith(f":{self.port}") and fields[3] == "01":  # ESTABLISHED, to the webhook
                    peers.add(fields[2])
        return peers

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.seen |= self.established()

    def __enter__(self) -> Connections:
        self.seen = self.established()
        self.before = set(self.seen)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    @property
    def opened(self) -> int:
        return len(self.seen - self.before)


# raygate's pod gate as installed; a no-op webhook in Go instead of raygate; neither (no gate at all).
GANG_SIDES = ("gated", "noop", "ungated")
SIDE_LABELS = {"gated": "the pod gate", "noop": "a no-op webhook in Go", "ungated": "neither"}
SIDE_NAMESPACES = {"gated": GANG_NAMESPACE, "noop": NOOP_NAMESPACE, "ungated": PLAIN_NAMESPACE}


def booked_and_started(kube: Kube, name: str, namespace: str, timeout: float) -> float:
    """Book a suspended RayCluster's workers as raygate would (a PodTemplate and a check-capacity request for all of
    them), and unsuspend it once the request is Provisioned; the moment it was seen Provisioned."""
    from raygate.core.conditions import conditions

    cluster = kube.get(RAYCLUSTERS, name, namespace)
    group = cluster["spec"]["workerGroupSpecs"][0]
    kube.create(PODTEMPLATES, {"metadata": {"name": name}, "template": group["template"]}, namespace)
    requests = provisioning_requests("v1")
    kube.create(requests, {"metadata": {"name": name}, "spec": {
        "provisioningClassName": keys.CHECK_CAPACITY_CLASS,
        "podSets": [{"podTemplateRef": {"name": name}, "count": group["replicas"]}]}}, namespace)

    def provisioned() -> bool:
        found = conditions(kube.get(requests, name, namespace)).get("Provisioned")
        return found is not None and found.true

    at = until(provisioned, timeout, f"{name}'s own request Provisioned", 0.05)
    kube.patch(RAYCLUSTERS, name, {"spec": {"suspend": False}}, namespace)
    return at


def on_capacity(timeout: float, rounds: int, batch: tuple[float | None, float | None], profile: bool,
                one_process: bool = False) -> dict[str, Any]:
    """`batch`: the reconciler's --pod-batch-seconds and --pod-batch-max-seconds (None: its default). `one_process`:
    raygate as `raygate serve` (the reconciler on threads of the webhook's worker)."""
    from raygate.devenv.capacity import Layout, start_capacity
    from raygate.reconciler.workqueue import BATCH_SECONDS

    layout = Layout(cpu_nodes=4, cpu_node_cpu=64, gpu_nodes_max=SCALE_UP // 4 + 2)
    quiet = BATCH_SECONDS if batch[0] is None else batch[0]
    most = batch[1]
    out: dict[str, Any] = {"layout": layout.describe(), "pod_batch_seconds": quiet, "pod_batch_max_seconds": most,
                           "one_process": one_process}
    with common.control_plane(kuberay=True, profiling=profile) as cp:
        state = cp.load_state()
        assert state is not None
        start_capacity(cp, state, layout)
        hook = common.start_raygate(cp, CONFIG, (NAMESPACE, GANG_NAMESPACE),
                                    reconciler=("--pod-batch-seconds", str(quiet),
                                                *(("--pod-batch-max-seconds", str(most)) if most is not None else ())),
                                    one_process=one_process)
        for ns in (NOOP_NAMESPACE, PLAIN_NAMESPACE):  # not opted in: raygate sees nothing of them
            cp.kubectl("create", "namespace", ns)
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=8)
        noop = NoopWebhook(cp)
        try:
            out["scale_up"] = scale_up(kube, timeout)
            # (2) the gang, on GPU nodes that exist (the autoscaler's own come and go): check-capacity books them.
            common.add_static_gpu_nodes(cp, kube, STATIC_GROUP, GANG // layout.gpus_per_node, layout.gpus_per_node,
                                        timeout)
            out.update(gangs(cp, kube, noop, int(hook.url.rsplit(":", 1)[1]), timeout, rounds,
                             common.OUT_DIR / "podgate-apiserver-profiles" if profile else None))
            # Last, when the stack has settled (the scale-up's node gone, nothing starting).
            out["one_by_one_creates"] = creates_one_by_one(cp, kube, noop)
        finally:
            noop.stop()
    return out


def scale_up(kube: Kube, timeout: float) -> dict[str, Any]:
    """(3) an admitted autoscaling RayCluster scaled up on the real autoscaler: its GPU node group starts at zero."""
    kube.create(RAYCLUSTERS, raycluster("elastic", NAMESPACE, 1, autoscaling=True), NAMESPACE)
    until(lambda: bound_workers(kube, "elastic", NAMESPACE) == 1, timeout,
          "the elastic cluster's first worker bound", 0.5)
    patched = time.monotonic()
    kube.patch(RAYCLUSTERS, "elastic", [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas",
                                         "value": 1 + SCALE_UP}], NAMESPACE,
               content_type="application/json-patch+json")
    first = until(lambda: len(gpu_workers(kube, "elastic", NAMESPACE)) > 1, timeout,
                  "the first pod of the scale-up")
    bound = until(lambda: bound_workers(kube, "elastic", NAMESPACE) == 1 + SCALE_UP, timeout,
                  "the scale-up's pods bound", 0.2)
    print(f"bench: scale-up of {SCALE_UP} workers: replicas patched -> bound {bound - patched:.1f}s, "
          f"pods created -> bound {bound - first:.1f}s", flush=True)
    kube.delete(RAYCLUSTERS, "elastic", NAMESPACE)
    until(lambda: not gpu_workers(kube, "elastic", NAMESPACE), timeout, "the elastic cluster's pods gone", 0.5)
    return {"pods": SCALE_UP, "created_to_bound_s": round(bound - first, 2),
            "patched_to_bound_s": round(bound - patched, 2)}


def gangs(cp: Any, kube: Kube, noop: NoopWebhook, webhook_port: int, timeout: float,
          rounds: int, profiles: Path | None = None) -> dict[str, Any]:
    """`rounds` rounds of a GANG-worker RayCluster, each one on every side of GANG_SIDES in turn. `profiles`: a
    directory for a CPU profile of the API server from the start of each round (<side>-<round>.pb.gz)."""
    bound_s: dict[str, list[float]] = {side: [] for side in GANG_SIDES}
    phases: dict[str, list[dict[str, float]]] = {side: [] for side in GANG_SIDES}
    seen_by_apiserver: dict[str, list[dict[str, Any]]] = {side: [] for side in GANG_SIDES}
    watches = {side: GangWatch(kube, ns) for side, ns in SIDE_NAMESPACES.items()}
    if profiles is not None:
        profiles.mkdir(parents=True, exist_ok=True)
    noop.route(NOOP_NAMESPACE)
    for i in range(rounds):
        for side in GANG_SIDES:
            name, ns = f"gang-{side}-{i}", SIDE_NAMESPACES[side]
            cluster = raycluster(name, ns, GANG)
            if side != "gated":
                cluster["spec"]["suspend"] = True
            kube.create(RAYCLUSTERS, cluster, ns)  # gated: raygate holds it, books it and admits it
            # Read before anything is booked: reading the API server's /metrics (megabytes) costs it and this
            # process CPU, which must not overlap one side's creates only (KubeRay starts them as soon as raygate
            # admits). The reconciler's own count and the profile are cheap to start, and start at Provisioned.
            before, cpu = apiserver_admission(cp), process_cpu(cp)
            if side == "gated":
                provisioned = until(lambda n=name, ns=ns: request_provisioned(kube, n, ns), timeout,
                                    f"{name} Provisioned", 0.05)
            counts = reconciler_counts(cp)
            profiling = apiserver_profile(cp, profiles / f"{side}-{i}.pb.gz") if profiles else None
            if side != "gated":
                provisioned = booked_and_started(kube, name, ns, timeout)
            with Connections(webhook_port) as conns:
                done = until(lambda n=name, ns=ns: bound_workers(kube, n, ns) == GANG, timeout,
                             f"every worker of {name} bound", 0.1)
            seen_by_apiserver[side].append({"admission": admission_delta(before, apiserver_admission(cp)),
                                            "cpu_s": {k: round(v - cpu.get(k, 0.0), 3)
                                                      for k, v in process_cpu(cp).items()},
                                            "reconciler": {k: v - counts.get(k, 0.0)
                                                           for k, v in reconciler_counts(cp).items()},
                                            "webhook_connections_opened": conns.opened,
                                            "webhook_connections_at_start": len(conns.before)})
            if profiling is not None:
                profiling.join()
            bound_s[side].append(round(done - provisioned, 2))
            watch = watches[side]
            until(lambda n=name, w=watch: sum("bound" in p for p in w.pods.get(n, {}).values()) >= GANG, timeout,
                  f"the watch to see every worker of {name} bound", 0.05)
            phases[side].append(watch.phases(name, provisioned))
            print(f"bench: {name}: Provisioned -> {GANG} workers bound {done - provisioned:.1f}s", flush=True)
            kube.delete(RAYCLUSTERS, name, ns)
            if side != "gated":  # what the benchmark booked itself
                kube.delete(provisioning_requests("v1"), name, ns)
                kube.delete(PODTEMPLATES, name, ns)
            until(lambda n=name, ns=ns: not gpu_workers(kube, n, ns), timeout, f"{name}'s pods gone", 0.5)
    noop.route()
    for watch in watches.values():
        watch.stop()
    return {f"gang-{side}": {"rounds_s": seconds, "provisioned_to_all_bound_s": statistics.median(seconds),
                             "phases_s": {label: statistics.median(r[label] for r in phases[side])
                                          for label, _, _ in GANG_PHASES},
                             "phases_by_round_s": phases[side], "apiserver_by_round": seen_by_apiserver[side],
                             "apiserver_profile_s": profile_seconds(
                                 [profiles / f"{side}-{i}.pb.gz" for i in range(rounds)] if profiles else [])}
            for side, seconds in bound_s.items()}


CREATES = "first -> last worker created (KubeRay)"


def creates_by_round(cap: dict[str, Any]) -> list[dict[str, float]]:
    """KubeRay's 32 worker creates of each round on each side (`<side>_s`), and each side's ratio to neither's
    (`<side>_ratio`; `ratio`: the gate's)."""
    out = []
    for by_side in zip(*(cap[f"gang-{side}"]["phases_by_round_s"] for side in GANG_SIDES), strict=False):
        seconds = {side: phases[CREATES] for side, phases in zip(GANG_SIDES, by_side, strict=True)}
        row: dict[str, float] = {f"{side}_s": v for side, v in seconds.items()}
        row.update({f"{side}_ratio": round(seconds[side] / max(seconds["ungated"], 1e-9), 2)
                    for side in GANG_SIDES if side != "ungated"})
        row["ratio"] = row["gated_ratio"]
        out.append(row)
    return out


def _webhook_calls(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median over the rounds of each admission series the API server timed: calls and mean ms."""
    series = sorted({k for r in rounds for k in r["admission"]})
    return {k: {f: statistics.median(r["admission"].get(k, {}).get(f, 0.0) for r in rounds)
                for f in ("calls", "mean_ms")} for k in series}


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    report: dict[str, Any] = {"benchmark": "podgate", "started": common.now_iso(), "machine": common.machine_info()}
    report["pod_webhook"] = served(args.warmup, args.duration, args.hog_cores, args.podgate_threads)
    batch = (args.pod_batch_seconds, args.pod_batch_max_seconds)
    report["capacity"] = on_capacity(args.timeout, args.podgate_rounds, batch, args.apiserver_profile,
                                     args.podgate_one_process)
    cap = report["capacity"]
    ratio = cap["gang-gated"]["provisioned_to_all_bound_s"] / max(cap["gang-ungated"]["provisioned_to_all_bound_s"],
                                                                   1e-9)
    report["gang_gated_over_ungated"] = round(ratio, 2)
    report["creates_by_round"] = creates = creates_by_round(cap)
    within = sum(1 for r in creates if r["ratio"] <= OVERHEAD_TARGET)
    targets = [Target(f"pod webhook p99 at concurrency 8,{_beside(r['hog_cores'])}", r["latency_ms"]["p99"], "<=",
                      P99_TARGET_MS, "ms") for r in report["pod_webhook"] if r["concurrency"] == 8]
    targets += [Target(f"rounds whose {GANG} worker creates took <= {OVERHEAD_TARGET}x with the gate", within, ">=",
                       len(creates), f"of {len(creates)}"),
                Target(f"{GANG}-pod gang Provisioned -> bound, gated / ungated (medians)", ratio, "<=", OVERHEAD_TARGET,
                       "x")]
    rows = [[f"pod webhook c={r['concurrency']},{_beside(r['hog_cores'])}", f"{r['reviews_per_s']:,.0f}/s",
             f"{r['latency_ms']['p50']:.2f}", f"{r['latency_ms']['p99']:.2f}", f"{r['server_cpu_ms_per_review']:.2f}",
             f"{r['hog_cpu_cores']:.2f}" if r["hog_cores"] else ""] for r in report["pod_webhook"]]
    print(common.table(["", "reviews", "p50 ms", "p99 ms", "server CPU ms/review", "the hog's CPU (cores)"], rows,
                       f"The pod webhook (a GPU worker pod, gated), served over TLS, {WEBHOOK_WORKERS} worker(s) x "
                       f"{args.podgate_threads} threads"))

    def gang(side: str) -> list[Any]:
        return [", ".join(f"{s:.2f}" for s in cap[f"gang-{side}"]["rounds_s"]),
                cap[f"gang-{side}"]["provisioned_to_all_bound_s"]]

    def over_ungated(side: str) -> float:
        return float(cap[f"gang-{side}"]["provisioned_to_all_bound_s"]) / max(
            float(cap["gang-ungated"]["provisioned_to_all_bound_s"]), 1e-9)

    print(common.table(["", "rounds (s)", "median / seconds"], [
        *([f"{GANG}-pod gang, Provisioned -> every worker bound, {SIDE_LABELS[side]}", *gang(side)]
          for side in GANG_SIDES),
        *([f"the gang ratio, {SIDE_LABELS[side]} / neither (medians)", "", f"{over_ungated(side):.2f}x"]
          for side in GANG_SIDES if side != "ungated"),
        [f"scale-up of {SCALE_UP} workers, replicas patched -> all bound (real autoscaler adds the node)", "",
         cap["scale_up"]["patched_to_bound_s"]],
        [f"scale-up of {SCALE_UP} workers, pods created -> all bound", "", cap["scale_up"]["created_to_bound_s"]],
    ], f"On real capacity ({cap['layout']})"))
    gated_sides = [side for side in GANG_SIDES if side != "ungated"]
    print(common.table(["round", *(f"{SIDE_LABELS[side]} (s)" for side in GANG_SIDES),
                        *(f"{side} / neither" for side in gated_sides)], [
        [str(i + 1), *(r[f"{side}_s"] for side in GANG_SIDES), *(f"{r[f'{side}_ratio']:.2f}x" for side in gated_sides)]
        for i, r in enumerate(creates)], f"KubeRay's {GANG} worker creates (first -> last created), each round"))
    print(common.table(["", *(SIDE_LABELS[side] for side in GANG_SIDES)], [
        [label, *(cap[f"gang-{side}"]["phases_s"][label] for side in GANG_SIDES)]
        for label, _, _ in GANG_PHASES], f"Where a {GANG}-pod gang's time goes (seconds, median of the rounds)"))
    calls = {side: _webhook_calls(cap[f"gang-{side}"]["apiserver_by_round"]) for side in GANG_SIDES}
    conns = {side: statistics.median(r["webhook_connections_opened"] for r in cap[f"gang-{side}"]["apiserver_by_round"])
             for side in GANG_SIDES}
    timed = sorted({k for side in GANG_SIDES for k in calls[side] if not k.startswith(POD_WRITES)})
    rows = [[k, *[f"{calls[side].get(k, {}).get('calls', 0):.0f} x {calls[side].get(k, {}).get('mean_ms', 0):.2f}"
                  for side in GANG_SIDES]] for k in timed]
    rows.append(["connections the API server opened to raygate's webhook",
                 *(f"{conns[side]:.0f}" for side in GANG_SIDES)])
    print(common.table(["", *(f"{SIDE_LABELS[side]}: calls x mean ms" for side in GANG_SIDES)], rows,
                       "What the API server timed during a round, created -> every worker bound (its /metrics; median "
                       "of the rounds)"))
    writes = sorted({k for side in GANG_SIDES for k in calls[side] if k.startswith(POD_WRITES)})
    print(common.table(["", *(SIDE_LABELS[side] for side in GANG_SIDES)], [
        [k.removeprefix(POD_WRITES).strip(), *(f"{calls[side].get(k, {}).get('calls', 0):.0f}" for side in GANG_SIDES)]
        for k in writes], "Writes to pods during a round, by verb and subresource (the API server's "
                          "apiserver_request_total; median of the rounds)"))
    cpu = {side: [r["cpu_s"] for r in cap[f"gang-{side}"]["apiserver_by_round"]] for side in GANG_SIDES}
    busiest = sorted({k for side in GANG_SIDES for r in cpu[side] for k, v in r.items() if v >= 0.05})
    print(common.table(["", *(SIDE_LABELS[side] for side in GANG_SIDES)], [
        [k, *(f"{statistics.median(r.get(k, 0.0) for r in cpu[side]):.2f}" for side in GANG_SIDES)] for k in busiest],
        "CPU seconds each process used during a round, created -> every worker bound (median of the rounds)"))
    if profiled := {side: cap[f"gang-{side}"]["apiserver_profile_s"] for side in GANG_SIDES
                    if cap[f"gang-{side}"]["apiserver_profile_s"]}:
        print(common.table(["", *(SIDE_LABELS[side] for side in profiled)], [
            [label, *(f"{by_frame.get(label, 0.0):.2f}" for by_frame in profiled.values())]
            for label in ("all samples", *PROFILE_FRAMES)],
            f"kube-apiserver's CPU by what it did, seconds summed over the rounds ({PROFILE_SECONDS} s profiles "
            f"from each round's start, `go tool pprof -top -cum`; {common.OUT_DIR / 'podgate-apiserver-profiles'})"))
    work = {side: [r["reconciler"] for r in cap[f"gang-{side}"]["apiserver_by_round"]] for side in GANG_SIDES}
    batching = f"--pod-batch-seconds {cap['pod_batch_seconds']}"
    if cap["pod_batch_max_seconds"] is not None:
        batching += f", --pod-batch-max-seconds {cap['pod_batch_max_seconds']}"
    if cap["one_process"]:
        batching += "; in the webhook's process, raygate serve"
    print(common.table(["", *(SIDE_LABELS[side] for side in GANG_SIDES)], [
        [k, *(f"{statistics.median(r.get(k, 0.0) for r in work[side]):.0f}" for side in GANG_SIDES)]
        for k in sorted({k for side in GANG_SIDES for r in work[side] for k in r})],
        f"raygate's reconciler during a round, Provisioned -> every worker bound (its /metrics; median of the "
        f"rounds; {batching})"))
    one_by_one = cap["one_by_one_creates"]
    series = sorted({k for side in ONE_BY_ONE_SIDES for k in one_by_one[side] if not k.startswith(POD_WRITES)})

    def cell(side: str, k: str) -> str:
        found = one_by_one[side].get(k)
        return f"{found['calls']:.0f} x {found['mean_ms']:.2f}" if found else ""

    print(common.table(["", *(f"{label}: calls x mean ms" for _, label in ONE_BY_ONE_SIDES.values())],
                       [[k, *(cell(side, k) for side in ONE_BY_ONE_SIDES)] for k in series],
                       f"{ONE_BY_ONE_PODS} GPU pods created one by one after the gangs (no Ray objects left; the "
                       "autoscaler, KubeRay and raygate running), as the API server timed them"))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, common.write_report("podgate", report, targets, t0)))
    return 0
