"""End to end on the same real stack: the same GPU RayJobs through raygate and through Kueue, from
`kubectl create` to every Ray pod Running.

Both sides run on the same local cluster: kube-apiserver, etcd, kube-controller-manager, kube-scheduler,
KWOK nodes, the real cluster-autoscaler (kwok provider, ProvisioningRequests on, a GPU node group that
starts at zero) and the KubeRay operator. One side adds raygate (`provisioning` mode, its webhook and
reconciler); the other Kueue with its ProvisioningRequest admission check. Both ask for the
best-effort-atomic class on the same node group, so the autoscaler adds the nodes for both. Each run is
one side on a fresh stack; the sides take turns, round after round.

Per job, from the benchmark's own watches (the same for both sides): create returned -> the
ProvisioningRequest that got it admitted exists -> Accepted -> Provisioned -> unsuspended -> its Ray pods
(head and 2 GPU workers) exist -> none gated -> all bound -> all Running. raygate's held jobs wait in its
queue and ask in turn (with room for everyone, the job behind the front once the front is Provisioned), so its
create -> request includes each job's wait for its turn; a job whose turn passed before the autoscaler
answered (one that sorts ahead of it arrived) withdraws its request and asks again later, which is counted
apart from a request replaced after an answer. Per run: first create -> last Running,
GPU nodes added against the nodes the jobs need, API writes by writer (the API server's audit log),
CPU and peak memory of each side's processes, and the cluster-autoscaler's own loop (from its log).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import logging
import math
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import baseline, common
from benchmarks.baseline import base_side
from benchmarks.common import BenchError, Target
from raygate.core import keys
from raygate.core.api import NODES, PODS, RAYCLUSTERS, RAYJOBS, Resource, provisioning_requests
from raygate.core.objects import JSON, metadata
from raygate.kube.client import Kube
from raygate.kube.informer import Informer

NAMESPACE = "bench-e2e"
SIDES = ("raygate", "kueue")
PR = provisioning_requests("v1")
WORKLOADS = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
GPU = "nvidia.com/gpu"
WORKERS = 2  # per job, 2 GPUs each: one 4-GPU node per job
GPUS_PER_WORKER = 2
PODS_PER_JOB = 1 + WORKERS  # the head and the workers (the submitter's pod follows them; not waited for)
# Milestones per job, in order; each the first moment the benchmark's watches saw it.
MILESTONES = ("created", "request", "accepted", "provisioned", "unsuspended", "pods_created", "ungated", "bound",
              "running")
# Where a job's time goes, phase by phase: (label, from, to, whose part it is).
PHASES = (
    ("create -> request exists", "created", "request", "the side: webhook, controller, raygate's queue"),
    ("request -> Accepted", "request", "accepted", "cluster-autoscaler: the request waits for a loop that picks it"),
    ("Accepted -> Provisioned", "accepted", "provisioned", "cluster-autoscaler: the scale-up of that loop"),
    ("Provisioned -> unsuspended", "provisioned", "unsuspended", "the side"),
    ("unsuspended -> pods exist", "unsuspended", "pods_created", "KubeRay"),
    ("pods exist -> none gated", "pods_created", "ungated", "the side (raygate's pod gate; Kueue has none)"),
    ("none gated -> all bound", "ungated", "bound", "kube-scheduler, waiting for the new node to be Ready"),
    ("all bound -> all Running", "bound", "running", "KWOK"),
)
# The CDFs drawn for both sides.
CDFS = (("create -> request exists", "created", "request"), ("Provisioned -> unsuspended", "provisioned",
                                                              "unsuspended"),
        ("create -> every Ray pod Running", "created", "running"))
P99_TARGET_S = {20: 60.0, 100: 240.0}  # create -> every pod Running, as the capacity benchmark
RAYGATE_CONFIG = f"""\
defaults:
  mode: provisioning
  provisioning:
    className: {keys.BEST_EFFORT_ATOMIC_CLASS}
"""


def raygate_config(provisioned_timeout: float | None) -> str:
    """raygate-config of the raygate side: its defaults but the class; `provisioned_timeout` sets
    provisionedTimeoutSeconds (to see its retries under a queue at the autoscaler longer than it)."""
    if provisioned_timeout is None:
        return RAYGATE_CONFIG
    return RAYGATE_CONFIG + f"    provisionedTimeoutSeconds: {provisioned_timeout:g}\n"
CONTROLLERS = {"raygate": ("raygate-webhook", "raygate-reconciler"), "kueue": ("kueue",)}  # by base side
TITLES = {"raygate": "raygate", baseline.RAYGATE_SERVE: "raygate, one process", "kueue": "Kueue"}
# Today's raygate against raygate@<ref> (issue: create -> every pod Running within 5 %, in one run).
BASELINE_RATIO_LIMIT = 1.05
FOOTPRINT_LIMIT = 0.8  # raygate as installed against Kueue's controller, by PSS (issue 32)
BASELINE_MEASURES = ("create -> every Ray pod Running p50", "create -> every Ray pod Running p99")


def title(side: str) -> str:
    """A side's name in tables: its title, or as given (raygate@1e155ff)."""
    return TITLES.get(side, side)


def rayjob(name: str, side: str, namespace: str = NAMESPACE, *, workers: int = WORKERS,
           gpus_per_worker: int = GPUS_PER_WORKER) -> JSON:
    """The same RayJob for both sides; Kueue's carries its queue label, its documented opt-in (raygate's
    opt-in is a label on the namespace). One 4-GPU node's worth of GPU workers by default."""
    res = {"cpu": "1", "memory": "1Gi", GPU: str(gpus_per_worker)}
    head = {"cpu": "500m", "memory": "1Gi"}
    obj: JSON = {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {}},
        "spec": {
            "entrypoint": "python train.py", "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                    "name": "ray-head", "image": "rayproject/ray:2.46.0",
                    "resources": {"requests": head, "limits": head}}]}}},
                "workerGroupSpecs": [{
                    "groupName": "gpu", "replicas": workers, "minReplicas": workers, "maxReplicas": workers,
                    "rayStartParams": {}, "template": {"spec": {"containers": [{
                        "name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu",
                        "resources": {"requests": res, "limits": res}}]}}}],
            },
        },
    }
    if side == "kueue":
        obj["metadata"]["labels"][keys.KUEUE_QUEUE_LABEL] = LOCAL_QUEUE
    return obj


LOCAL_QUEUE = "gpu-lq"


# --- what the watches see ------------------------------------------------------------------------

@dataclass
class PodSeen:
    gated: bool
    node: str
    running: bool


def _true(obj: JSON, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


@dataclass
class Tracker:
    """Per job, the first moment (time.monotonic) each milestone was seen; GPU nodes as they come."""

    names: set[str]
    marks: dict[str, dict[str, float]] = field(default_factory=dict)
    requests_of: dict[str, set[str]] = field(default_factory=dict)
    # Per request: when it was first seen Accepted, Provisioned, answered (Provisioned either way) and seen at all.
    request_marks: dict[str, dict[str, float]] = field(default_factory=dict)
    owners: common.RequestOwners = field(init=False)
    job_of_cluster: dict[str, str] = field(default_factory=dict)
    pods: dict[str, dict[str, PodSeen]] = field(default_factory=dict)  # cluster -> pod -> state
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)  # GPU node -> added / ready / deleted
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.marks = {n: {} for n in self.names}
        self.owners = common.RequestOwners(self.names)

    def _mark(self, job: str, what: str, when: float) -> None:
        if job in self.marks and what not in self.marks[job]:
            self.marks[job][what] = when
            self.changed.notify_all()

    def created(self, job: str) -> None:
        with self.changed:
            self._mark(job, "created", time.monotonic())

    def on_job(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        # Both sides store the job suspended; unsuspending writes false (raygate) or drops the field (Kueue).
        if kind != "DELETED" and (obj.get("spec") or {}).get("suspend") is not True:
            with self.changed:
                self._mark(str(metadata(obj).get("name")), "unsuspended", now)

    def on_workload(self, kind: str, obj: JSON) -> None:
        with self.changed:
            for job, request, seen in self.owners.workload(obj):
                self._request(job, request, seen)

    def on_request(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        if kind == "DELETED":
            return
        with self.changed:
            job = self.owners.request(obj, obj, now)
            if job is not None:
                self._request(job, obj, now)

    def _request(self, job: str, obj: JSON, when: float) -> None:
        name = str(metadata(obj).get("name"))
        self.requests_of.setdefault(job, set()).add(name)
        seen = self.request_marks.setdefault(name, {})
        seen.setdefault("seen", when)
        conds = {c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []}
        if conds.get("Provisioned") in ("True", "False"):
            seen.setdefault("answered", when)
        if _true(obj, "Accepted") or _true(obj, "Provisioned"):
            seen.setdefault("accepted", when)
        if _true(obj, "Provisioned"):
            seen.setdefault("provisioned", when)
            # The request that got the job admitted: its milestones are the job's (one asked before it and
            # withdrawn, its turn passed, is not).
            self._mark(job, "request", seen["seen"])
            self._mark(job, "accepted", seen["accepted"])
            self._mark(job, "provisioned", when)
        self.changed.notify_all()

    def replaced(self, job: str) -> tuple[int, int]:
        """The job's requests before its last: (withdrawn before any answer, replaced after one)."""
        names = sorted(self.requests_of.get(job, ()), key=lambda r: self.request_marks[r]["seen"])[:-1]
        unanswered = sum(1 for r in names if "answered" not in self.request_marks[r])
        return unanswered, len(names) - unanswered

    def on_cluster(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        meta = metadata(obj)
        job = (meta.get("labels") or {}).get(keys.ORIGINATED_FROM_NAME_LABEL)
        if kind == "DELETED" or job not in self.names:
            return
        with self.changed:
            self.job_of_cluster[str(meta.get("name"))] = str(job)
            self._pods_of(str(meta.get("name")), now)

    def on_pod(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        meta = metadata(obj)
        labels = meta.get("labels") or {}
        cluster, name = labels.get(keys.RAY_CLUSTER_LABEL), str(meta.get("name"))
        if not cluster or keys.RAY_NODE_TYPE_LABEL not in labels:
            return
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        with self.changed:
            pods = self.pods.setdefault(str(cluster), {})
            if kind == "DELETED":
                pods.pop(name, None)
            else:
                gated = any(g.get("name") == keys.CAPACITY_GATE for g in spec.get("schedulingGates") or [])
                node = str(spec.get("nodeName") or "")
                pods[name] = PodSeen(gated, node, bool(node) and status.get("phase") == "Running")
            self._pods_of(str(cluster), now)

    def _pods_of(self, cluster: str, now: float) -> None:
        job = self.job_of_cluster.get(cluster)
        pods = list(self.pods.get(cluster, {}).values())
        if job is None or len(pods) < PODS_PER_JOB:
            return
        self._mark(job, "pods_created", now)
        if not any(p.gated for p in pods):
            self._mark(job, "ungated", now)
            if all(p.node for p in pods):
                self._mark(job, "bound", now)
                if all(p.running for p in pods):
                    self._mark(job, "running", now)

    def on_node(self, kind: str, obj: JSON) -> None:
        from raygate.devenv.capacity import GPU_GROUP, NODE_GROUP_LABEL

        now = time.monotonic()
        meta = metadata(obj)
        if (meta.get("labels") or {}).get(NODE_GROUP_LABEL) != GPU_GROUP:
            return
        with self.changed:
            seen = self.nodes.setdefault(str(meta.get("name")), {"added": now})
            if kind == "DELETED":  # scaled down (the scarce benchmark counts the node-seconds that were there)
                seen.setdefault("deleted", now)
            elif _true(obj, "Ready"):
                seen.setdefault("ready", now)

    def count(self, what: str) -> int:
        return sum(1 for m in self.marks.values() if what in m)

    def wait_running(self, timeout: float) -> bool:
        deadline, last = time.monotonic() + timeout, time.monotonic()
        with self.changed:
            while (done := self.count("running")) < len(self.names):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
                if time.monotonic() - last > 15:
                    last = time.monotonic()
                    print(f"bench:   {done}/{len(self.names)} Running; " + ", ".join(
                        f"{self.count(m)} {m}" for m in MILESTONES[1:-1]) + f"; {len(self.nodes)} GPU nodes",
                          flush=True)
        return True


# --- one side on one stack -----------------------------------------------------------------------------

def setup_side(cp: Any, side: str, *, config: str = RAYGATE_CONFIG, namespace: str = NAMESPACE,
               quota: dict[str, str] | None = None, strategy: str | None = None) -> dict[str, Any]:
    """Start the side's processes on the stack, for jobs in `namespace`; return the settings they run with.

    raygate runs with `config` as raygate-config; raygate@<ref> is raygate as of that git ref (benchmarks/baseline.py).
    Kueue's ClusterQueue (best-effort-atomic admission check on GPU pod sets) has `quota` (default: ample) and
    queueingStrategy `strategy` (default: Kueue's own)."""
    from benchmarks.peer_bench import QUOTA, RAYGATE_WEBHOOK, _wait_kueue_ready, kueue_objects
    from benchmarks.reconciler_bench import _kube, _wait_leader
    from raygate.devenv.kueue_local import client_defaults, start_kueue

    kube = _kube(str(cp.kubeconfig), 4)
    base, ref = baseline.split_side(side)
    if base_side(side) == "raygate":
        source = baseline.checkout(ref) if ref else None
        one_process = base == baseline.RAYGATE_SERVE
        common.start_raygate(cp, config, (namespace,), workers=RAYGATE_WEBHOOK["workers"],
                             threads=RAYGATE_WEBHOOK["threads"], source=source, one_process=one_process)
        _wait_leader(kube, cp.load_state().pids["raygate-webhook" if one_process else "raygate-reconciler"])
        return {"config": config, "webhook": RAYGATE_WEBHOOK,
                "reconciler": "defaults (64 workers, leader election on)"
                + (", in the webhook's worker process (raygate serve)" if one_process else ""), "pod_gate": True,
                "source": f"{source} (git {ref}; its own webhook registration and reconciler RBAC)" if source
                else "this checkout"}
    cp.kubectl("create", "namespace", namespace)
    local = start_kueue(cp)
    objs = kueue_objects(namespace, keys.BEST_EFFORT_ATOMIC_CLASS, quota or QUOTA, strategy)
    for obj in objs:
        if obj["kind"] == "LocalQueue":
            obj["metadata"]["name"] = LOCAL_QUEUE
    cp.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    _wait_kueue_ready(kube)
    return {"configuration": local.config, "queue_objects": objs,
            "effective_client_connection": {**client_defaults(cp.workdir / "kueue"),
                                            **(local.config.get("clientConnection") or {})}}


def start_watches(cp: Any, tracker: Tracker, side: str, namespace: str = NAMESPACE) -> list[Informer]:
    """The benchmark's own watches feeding `tracker` (jobs, requests, clusters and pods in `namespace`, GPU nodes,
    and Kueue's Workloads on its side), started and synced."""
    from benchmarks.reconciler_bench import _kube

    handlers = [(RAYJOBS, tracker.on_job, namespace), (PR, tracker.on_request, namespace),
                (RAYCLUSTERS, tracker.on_cluster, namespace), (PODS, tracker.on_pod, namespace),
                (NODES, tracker.on_node, None)]
    if side == "kueue":
        handlers.append((WORKLOADS, tracker.on_workload, namespace))
    watches = [Informer(_kube(str(cp.kubeconfig), 2), res, namespace=ns, handler=h, resync_seconds=3600)
               for res, h, ns in handlers]
    for w in watches:
        w.start()
    if not all(w.wait_synced(30) for w in watches):
        raise BenchError("the benchmark's own watches did not sync")
    return watches


def _cpu(cp: Any) -> dict[str, float]:
    state = cp.load_state()
    return {n: common.cpu_seconds(common.process_tree(p)) for n, p in (state.pids if state else {}).items()}


def _writer(agent: str) -> str:
    """Who wrote, from the user agent ("kube-scheduler/v1.36.4 (linux/amd64) ..." -> kube-scheduler)."""
    return agent.split("/", 1)[0].split(" ", 1)[0] or "unknown"


def audit_writes(path: Path, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
    """Writes in [since, until] from the API server's audit log, by writer and by what was written."""
    by_writer: Counter[str] = Counter()
    by_what: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    with contextlib.suppress(OSError), path.open() as f:
        for line in f:
            try:
                event = json.loads(line)
                when = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            except (ValueError, KeyError):
                continue
            if not since <= when <= until:
                continue
            writer = _writer(str(event.get("userAgent") or ""))
            ref = event.get("objectRef") or {}
            what = "/".join(x for x in (ref.get("apiGroup"), ref.get("resource"), ref.get("subresource")) if x)
            by_writer[writer] += 1
            by_what[f"{writer} {event.get('verb')} {what}"] += 1
            if int((event.get("responseStatus") or {}).get("code") or 0) >= 400:
                failed[writer] += 1
    return {"by_writer": dict(by_writer.most_common()), "by_what": dict(by_what.most_common()),
            "failed_by_writer": dict(failed)}


def autoscaler_metrics(address: str) -> dict[str, tuple[float, float]]:
    """The cluster-autoscaler's own loop timings from its /metrics: per function ("main" is one whole
    iteration, "scaleUp" its scale-up), (seconds spent in total, calls)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "cluster_autoscaler_function_duration_seconds":
            continue
        for sample in family.samples:
            fn = sample.labels.get("function", "")
            if sample.name.endswith("_sum"):
                out.setdefault(fn, [0.0, 0.0])[0] = sample.value
            elif sample.name.endswith("_count"):
                out.setdefault(fn, [0.0, 0.0])[1] = sample.value
    return {fn: (v[0], v[1]) for fn, v in out.items()}


def autoscaler_loop(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
                    seconds: float) -> dict[str, float]:
    """Iterations in the window, one iteration's mean run time, and the mean period between two (its
    scan interval's sleep plus the run: the pinned autoscaler runs its loops back to back only when told
    --frequent-loops-enabled)."""
    def delta(fn: str) -> tuple[float, float]:
        a, b = before.get(fn, (0.0, 0.0)), after.get(fn, (0.0, 0.0))
        return b[0] - a[0], b[1] - a[1]

    main_s, loops = delta("main")
    up_s, ups = delta("scaleUp")
    return {"loops": loops, "loop_run_mean_s": main_s / loops if loops else math.nan,
            "loop_period_mean_s": seconds / loops if loops else math.nan,
            "scale_up_calls": ups, "scale_up_mean_s": up_s / ups if ups else math.nan}


def _wait_autoscaler_loops(address: str, loops: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if autoscaler_metrics(address).get("main", (0.0, 0.0))[1] >= loops:
            return
        time.sleep(0.2)
    raise BenchError(f"the cluster-autoscaler ran no {loops} loops within {timeout:.0f}s (see its log)")


def run_one(side: str, n: int, timeout: float, provisioned_timeout: float | None = None) -> dict[str, Any]:
    from raygate.devenv.capacity import Layout, start_capacity

    # Headroom over one node per job: the pinned autoscaler sometimes adds a node twice for one request
    # (docs/benchmarks.md, "Where the autoscaler adds a node twice"); the nodes it added are counted.
    from raygate.devenv.controlplane import free_port

    layout = Layout(cpu_nodes=4, cpu_node_cpu=64, gpu_nodes_max=n + n // 2,
                    metrics_address=f"127.0.0.1:{free_port()}")
    with common.control_plane(kuberay=True, audit=True) as cp:
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        start_capacity(cp, state, layout)
        settings = setup_side(cp, side, config=raygate_config(provisioned_timeout))
        names = [f"train-{i:03d}" for i in range(n)]
        tracker = Tracker(set(names))
        watches = start_watches(cp, tracker, side)
        pids = cp.load_state().pids
        sampler = common.PeakSampler({name: pids[name] for name in CONTROLLERS[base_side(side)]
                                      if name in pids}).start()
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=16)
        manifests = {name: rayjob(name, side) for name in names}
        # The autoscaler must be past its start-up (caches filled, a first loop run) before the first create:
        # the raygate side is set up in a few seconds, while it may still be listing.
        _wait_autoscaler_loops(layout.metrics_address, 2, 120)
        cpu0, since = _cpu(cp), dt.datetime.now(dt.UTC)
        loop0 = autoscaler_metrics(layout.metrics_address)

        def create(name: str) -> None:
            kube.create(RAYJOBS, manifests[name], NAMESPACE)
            tracker.created(name)

        load_before = common.loadavg()
        _, t0, create_s = common.create_all(names, create)
        all_running = tracker.wait_running(timeout)
        last = max((m["running"] for m in tracker.marks.values() if "running" in m), default=math.nan)
        loop = autoscaler_loop(loop0, autoscaler_metrics(layout.metrics_address), time.monotonic() - t0)
        time.sleep(3)  # the last writes (Events, status) land
        until = dt.datetime.now(dt.UTC)
        cpu1 = _cpu(cp)
        sampler.stop()
        hwm = {name: common.tree_hwm_mb(pid) for name, pid in cp.load_state().pids.items()}
        for w in watches:
            w.stop()
        writes = audit_writes(cp.audit_log, since, until)
    with tracker.changed:
        marks = {name: {k: round(v - t0, 3) for k, v in m.items()} for name, m in tracker.marks.items()}
        nodes = {name: {k: round(v - t0, 3) for k, v in m.items()} for name, m in tracker.nodes.items()}
        requests = {name: sorted(r) for name, r in tracker.requests_of.items()}
        replaced = {name: tracker.replaced(name) for name in names}
    writes_total = sum(writes["by_writer"].values()) - writes["by_writer"].get("raygate-bench", 0)
    controller_writes = sum(writes["by_writer"].get(_writer_of(c), 0) for c in CONTROLLERS[base_side(side)])
    return {
        "side": side, "jobs": n, "settings": settings, "layout": asdict(layout),
        "autoscaler_args": layout.autoscaler_args(), "create_seconds": round(create_s, 2),
        "all_running": all_running, "running": sum(1 for m in marks.values() if "running" in m),
        "first_create_to_last_running_s": round(last - t0, 2) if not math.isnan(last) else math.nan,
        "marks": marks, "requests_per_job": requests, "gpu_nodes": nodes,
        "gpu_nodes_added": len(nodes), "gpu_nodes_needed": n,
        "jobs_with_more_than_one_request": sum(1 for r in requests.values() if len(r) > 1),
        # A request replaced after the autoscaler answered it (a retry, or a queue asking again after a "not now"),
        # and one withdrawn before any answer (raygate's queue: the job's turn passed while the burst arrived).
        "jobs_with_a_request_replaced_after_an_answer": sum(1 for _, after in replaced.values() if after),
        "jobs_that_withdrew_an_unanswered_request": sum(1 for before, _ in replaced.values() if before),
        "phases": {label: common.summary(_deltas(marks, a, b)) for label, a, b, _ in PHASES},
        "writes": writes, "writes_total": writes_total,
        "writes_per_job": writes_total / n, "controller_writes_per_job": controller_writes / n,
        "cpu_seconds_by_process": {k: round(cpu1.get(k, 0) - cpu0.get(k, 0), 2) for k in cpu1},
        "peak_rss_mb_by_process": {k: round(v, 1) for k, v in hwm.items()},
        "peak_pss_mb": {k: round(v, 1) for k, v in sampler.peak_pss_mb.items()},
        "autoscaler": loop, "loadavg_before": load_before, "loadavg_after": common.loadavg(),
    }


def _writer_of(process: str) -> str:
    """The user agent each side's process sends (the Kueue binary sends its own name)."""
    return process


def _deltas(marks: dict[str, dict[str, float]], a: str, b: str) -> list[float]:
    return [m[b] - m[a] for m in marks.values() if a in m and b in m]


# --- report ------------------------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.median(clean) if clean else math.nan


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per (side, jobs): the median over rounds of each run's figures."""
    out: dict[str, dict[str, float]] = {}
    for key in sorted({(r["jobs"], r["side"]) for r in runs}, key=lambda k: (k[0], SIDES.index(base_side(k[1])),
                                                                               k[1])):
        n, side = key
        mine = [r for r in runs if r["jobs"] == n and r["side"] == side]
        row: dict[str, float] = {"runs": float(len(mine))}
        for label, a, b in CDFS:
            for stat in ("p50", "p99"):
                row[f"{label} {stat}"] = _median([common.summary(_deltas(r["marks"], a, b))[stat] for r in mine])
        row["first create -> last Running"] = _median([r["first_create_to_last_running_s"] for r in mine])
        row["jobs Running"] = min(r["running"] for r in mine)
        row["GPU nodes added"] = _median([float(r["gpu_nodes_added"]) for r in mine])
        row["jobs that needed a second request"] = _median([float(r["jobs_with_a_request_replaced_after_an_answer"])
                                                            for r in mine])
        row["jobs whose turn passed before an answer"] = _median(
            [float(r["jobs_that_withdrew_an_unanswered_request"]) for r in mine])
        row["API writes per job, all writers"] = _median([r["writes_per_job"] for r in mine])
        row["API writes per job, the side's own"] = _median([r["controller_writes_per_job"] for r in mine])
        procs = CONTROLLERS[base_side(side)]
        row["CPU s, the side's processes"] = _median([sum(r["cpu_seconds_by_process"].get(p, 0) for p in procs)
                                                      for r in mine])
        row["peak RSS MB, the side's processes"] = _median([sum(r["peak_rss_mb_by_process"].get(p, 0) for p in procs)
                                                            for r in mine])
        row["peak PSS MB, the side's processes"] = _median([sum(r["peak_pss_mb"].get(p, 0) for p in procs)
                                                            for r in mine])
        out[f"{side} {n}"] = row
    return out


def _cell(key: str, value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if key.startswith(("Provisioned -> unsuspended",)):
        return f"{value * 1000:,.0f} ms"
    if "->" in key:
        return f"{value:.1f} s"
    if key.startswith(("jobs ", "GPU nodes", "runs")):
        return f"{value:.0f}"
    return common.fmt(value)


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    report: JSON = {"benchmark": "e2e", "started": common.now_iso(), "machine": common.machine_info()}
    logging.getLogger("raygate").setLevel(logging.ERROR)  # our watches complain when a stack stops
    sides = baseline.check_sides(args.e2e_sides, SIDES)
    for side in sides:  # exported before any stack starts: a ref that names no commit stops the run here
        if (ref := baseline.split_side(side)[1]) is not None:
            baseline.checkout(ref)
    print(f"bench: e2e: {', '.join(map(str, args.e2e_jobs))} GPU RayJobs, {args.e2e_rounds} rounds of "
          f"{', '.join(sides)}; load average {report['machine']['loadavg_at_start']}", flush=True)
    runs: list[dict[str, Any]] = []
    for rnd in range(args.e2e_rounds):
        for n in args.e2e_jobs:
            order = sides if rnd % 2 == 0 else list(reversed(sides))  # neither always has the quieter slot
            for side in order:
                print(f"bench: round {rnd + 1}: {title(side)}, {n} jobs", flush=True)
                r = run_one(side, n, args.timeout, args.e2e_provisioned_timeout)
                r["round"] = rnd + 1
                runs.append(r)
                c = common.summary(_deltas(r["marks"], "created", "running"))
                print(f"bench:   {r['running']}/{n} Running; create -> Running p50 {c['p50']:.1f}s p99 "
                      f"{c['p99']:.1f}s; last {r['first_create_to_last_running_s']}s; {r['gpu_nodes_added']} GPU "
                      f"nodes; load {r['loadavg_after']}", flush=True)
    agg = aggregate(runs)
    against = baseline_comparison(agg, args.e2e_jobs, sides)
    report.update({"runs": runs, "median": agg, "rounds": args.e2e_rounds, "jobs": args.e2e_jobs,
                   "differences": DIFFERENCES, "against_baseline": against})
    targets = [Target(f"{title(s)}: create -> every pod Running p99 ({n} jobs)",
                      agg[f"{s} {n}"]["create -> every Ray pod Running p99"], "<=", P99_TARGET_S.get(n, math.inf), "s")
               for n in args.e2e_jobs for s in sides if f"{s} {n}" in agg]
    targets += [Target(f"raygate / {c['baseline']}: {c['measure']} ({c['jobs']} jobs)", c["ratio"], "<=",
                       BASELINE_RATIO_LIMIT, "x") for c in against]
    targets += footprint_targets(agg, args.e2e_jobs, sides)
    from benchmarks import plots

    report["pictures"] = [str(p) for p in plots.e2e(runs, common.OUT_DIR)]
    path = common.write_report("e2e", report, targets, t0)
    print()
    print(summary_table(agg, args.e2e_jobs, sides))
    print()
    print(phases_table(runs, args.e2e_jobs, sides))
    print()
    if against:
        print(baseline_table(against))
        print()
    print(settings_text(runs))
    print()
    print("pictures: " + ", ".join(report["pictures"]))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0


SUMMARY_ROWS = ("create -> request exists p50", "create -> request exists p99", "Provisioned -> unsuspended p50",
                "Provisioned -> unsuspended p99", "create -> every Ray pod Running p50",
                "create -> every Ray pod Running p99", "first create -> last Running", "jobs Running",
                "GPU nodes added", "jobs that needed a second request", "jobs whose turn passed before an answer",
                "API writes per job, the side's own",
                "API writes per job, all writers", "CPU s, the side's processes", "peak RSS MB, the side's processes",
                "peak PSS MB, the side's processes")


def summary_table(agg: dict[str, dict[str, float]], jobs: list[int], sides: list[str]) -> str:
    cols = [f"{s} {n}" for n in jobs for s in sides if f"{s} {n}" in agg]
    headers = ["measure (median of rounds)", *[f"{title(c.split()[0])}, {c.split()[1]} jobs" for c in cols]]
    rows = [[label, *[_cell(label, agg[c][label]) for c in cols]] for label in SUMMARY_ROWS]
    rows.append(["GPU nodes needed", *[c.split()[1] for c in cols]])
    return common.table(headers, rows, "GPU RayJobs from create to every Ray pod Running: raygate and Kueue on the "
                                       "same stack (real cluster-autoscaler, KWOK nodes, kube-scheduler, KubeRay)")


def footprint_targets(agg: dict[str, dict[str, float]], jobs: list[int], sides: list[str]) -> list[Target]:
    """Each raygate side's processes against Kueue's controller by peak PSS (issue 32: at most FOOTPRINT_LIMIT)."""
    label = "peak PSS MB, the side's processes"
    return [Target(f"{title(s)} / Kueue: {label} ({n} jobs)", agg[f"{s} {n}"][label] / kueue[label], "<=",
                   FOOTPRINT_LIMIT, "x")
            for n in jobs if (kueue := agg.get(f"kueue {n}")) and kueue[label]
            for s in sides if base_side(s) == "raygate" and f"{s} {n}" in agg]


def baseline_comparison(agg: dict[str, dict[str, float]], jobs: list[int], sides: list[str]) -> list[dict[str, Any]]:
    """For each job count and each raygate@<ref> side: today's raygate against it, create -> every Ray pod Running
    p50 and p99 (medians of rounds), and today / then (below 1: today is faster)."""
    out: list[dict[str, Any]] = []
    for n in jobs:
        today = agg.get(f"raygate {n}")
        for side in sides:
            then = agg.get(f"{side} {n}")
            if today is None or then is None or baseline.split_side(side)[1] is None:
                continue
            for measure in BASELINE_MEASURES:
                ratio = today[measure] / then[measure] if then[measure] else math.nan
                out.append({"jobs": n, "baseline": side, "measure": measure, "raygate_s": today[measure],
                            "baseline_s": then[measure], "ratio": ratio})
    return out


def baseline_table(rows: list[dict[str, Any]]) -> str:
    return common.table(
        ["jobs", "measure (median of rounds)", "against", "raygate", "then", "raygate / then"],
        [[str(r["jobs"]), r["measure"], r["baseline"], _cell(r["measure"], r["raygate_s"]),
          _cell(r["measure"], r["baseline_s"]), "n/a" if math.isnan(r["ratio"]) else f"{r['ratio']:.3f}"]
         for r in rows],
        f"raygate against an earlier raygate on the same stack (within {BASELINE_RATIO_LIMIT - 1:.0%}: a ratio "
        f"<= {BASELINE_RATIO_LIMIT:g})")


def phases_table(runs: list[dict[str, Any]], jobs: list[int], sides: list[str]) -> str:
    """Where a job's time goes, per phase (p50 / max over every job of every round), and the autoscaler's loop."""
    n = max(jobs)
    headers = ["phase (whose part)", *[f"{title(s)} p50 / max s" for s in sides]]
    rows = []
    for label, a, b, whose in PHASES:
        row = [f"{label} ({whose})"]
        for s in sides:
            values = [v for r in runs if r["side"] == s and r["jobs"] == n for v in _deltas(r["marks"], a, b)]
            st = common.summary(values)
            row.append(f"{st['p50']:.2f} / {st['max']:.2f}" if values else "n/a")
        rows.append(row)
    for label, key in (("cluster-autoscaler: one iteration, mean (its metrics)", "loop_run_mean_s"),
                       ("cluster-autoscaler: start to start of two iterations, mean", "loop_period_mean_s")):
        cells = []
        for s in sides:
            values = [r["autoscaler"][key] for r in runs if r["side"] == s and r["jobs"] == n]
            cells.append(f"{_median(values):.2f}" if values else "n/a")
        rows.append([label, *cells])
    prov = []
    for s in sides:
        gaps = []
        for r in (r for r in runs if r["side"] == s and r["jobs"] == n):
            times = sorted(m["provisioned"] for m in r["marks"].values() if "provisioned" in m)
            gaps += [b - a for a, b in itertools.pairwise(times)]
        prov.append(f"{common.percentile(gaps, 50):.2f}" if gaps else "n/a")
    rows.append(["time between two requests Provisioned, p50", *prov])
    return common.table(headers, rows, f"Where the time goes, {n} jobs (every job of every round)")


# What differs between the sides besides being different programs, and why (printed and in the JSON).
DIFFERENCES = (
    "Opt-in: Kueue's jobs carry kueue.x-k8s.io/queue-name; raygate's namespace carries raygate.io/gang-admission="
    "enabled. Each side's documented way to manage a job; the RayJobs are otherwise identical.",
    "The ProvisioningRequest class is best-effort-atomic-scale-up on both sides (raygate-config className; Kueue's "
    "ProvisioningRequestConfig with managedResources nvidia.com/gpu): the GPU node group starts at zero, and "
    "check-capacity (raygate's default) never adds a node.",
    "raygate gates every GPU pod (scheduling gate raygate.io/capacity) until its reconciler lifts it against the "
    "booking; Kueue has no such gate: its pods go to the scheduler as KubeRay creates them.",
    "raygate's webhook is a process of its own (gunicorn: a master and one worker of 2 threads, as shipped) "
    "besides its reconciler (defaults: 64 workers, leader election on); raygate-serve (`raygate serve`) runs "
    "the same reconciler on threads of the webhook's worker, one process as Kueue's; Kueue serves its webhooks "
    "from its one controller process (its defaults, leader election off, as raygate's tests run it).",
    "Kueue reserves quota before it makes a request: its ClusterQueue has quota no run can use up, so the check "
    "always passes (raygate has no quota).",
    "raygate's held jobs wait in its queue (priority, then creation, then uid; BestEffortFIFO): only the front has "
    "a request out, and the jobs behind it ask one at a time only once the ones ahead were answered \"not now\"; "
    "with room for everyone, the job behind asks once the front is Provisioned. So raygate asks the autoscaler for one "
    "job at a time, and its create -> request includes each job's wait for its turn. Kueue's ClusterQueue (ample "
    "quota) admits every Workload at once and asks for all.",
    "Retries: raygate's defaults (a request Failed is retried, 3 times from 10 s; a request still not Provisioned "
    "1800 s after the autoscaler first answered it is withdrawn and asked again, the job never failed for it); "
    "Kueue's ProvisioningRequestConfig defaults (a Failed request retried 3 times from 60 s). The autoscaler "
    "answers both alike (it retries a request it could not provision after 2 s).",
    "Kueue's metrics endpoint is off (bindAddress 0: it needs certificates the local run does not make); raygate's "
    "reconciler serves /metrics on a free port. Nothing scrapes either during a run.",
)


def settings_text(runs: list[dict[str, Any]]) -> str:
    seen: dict[str, dict[str, Any]] = {}
    for r in runs:
        seen.setdefault(r["side"], r)
    lines = ["How each side ran (everything else is the same: the stack, the node group, the jobs, the watches):"]
    for side, r in seen.items():
        s = r["settings"]
        if base_side(side) == "raygate":
            lines.append(f"- {side}: webhook {s['webhook']['workers']} workers x {s['webhook']['threads']} threads; "
                         f"reconciler {s['reconciler']}; pod gate on; code: {s.get('source', 'this checkout')}; "
                         "raygate-config: " + " ".join(s["config"].split()))
        else:
            cc = s["effective_client_connection"]
            lines.append(f"- Kueue: client QPS {cc['qps']:g}, burst {cc['burst']:g}; leaderElect "
                         f"{(s['configuration'].get('leaderElection') or {}).get('leaderElect')}; admission check "
                         f"{keys.BEST_EFFORT_ATOMIC_CLASS} on {GPU} pod sets")
    any_run = runs[0] if runs else None
    if any_run:
        lines.append(f"- cluster-autoscaler (both): {' '.join(any_run['autoscaler_args'])}")
    lines.append("Differences and why:")
    lines += [f"- {d}" for d in DIFFERENCES]
    return "\n".join(lines)
