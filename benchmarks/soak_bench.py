"""Soak: the whole local stack under mixed traffic for N minutes while its processes are killed at random,
then what raygate promises, checked on what is left.

The stack is the one `raygate dev up --raygate` starts, on a fresh control plane: kube-scheduler, KWOK and
the real cluster-autoscaler (kwok provider, a GPU node group of 0 to 4 nodes with 4 GPUs each), the
KubeRay operator, raygate's webhook (as shipped) and reconciler. Three opted-in namespaces: one with the
defaults, one with maxGang 16 GPUs, one with small limits. Meanwhile, from one seeded random stream:

- traffic: GPU RayJobs and RayClusters of varied shapes created (some larger than the node group), held
  ones resized, admitted ones edited (a label) or grown (allowed where pods are gated: the new pods wait for
  a scale-up booking; refused beyond the namespace's limits), failed ones started over,
  autoscaling RayClusters scaled up (replicas, maxReplicas), objects deleted, and invalid objects
  created (replicas 2147483647, bad GPU quantities, DRA claims, ...); at most LIVE_CAP at a time;
- fuzz: damaged AdmissionReviews (benchmarks/fuzz.py's generator) sent straight to the webhook;
- chaos: every ~40 s one of cluster-autoscaler, kube-apiserver, raygate's webhook or reconciler is
  SIGKILLed (its whole process group) and restarted a few seconds later with the same command line;
  any other process that exits on its own is restarted too, and reported.

Then traffic and kills stop, the stack settles (nothing changes for QUIET_S, but for held jobs asking again:
under raygate's queue the job at its turn withdraws a request left unprovisioned and asks again with a new
one every provisionedTimeoutSeconds, for as long as it waits), and the invariants are counted: every Ray
object is Admitted, Failed with a reason, held with a reason (at its turn on a request that is not
Provisioned, or waiting in its queue behind another job with no request out), or gone; no child of raygate
(request, PodTemplate, PodGroup) outlives its owner, but for requests pods still consume; every GPU pod
bound to a node consumes a Provisioned request. The RSS of
raygate's processes, the autoscaler and the KubeRay operator is sampled throughout: flat means the end
of a process's longest life is within RSS_GROWTH of its value after warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import common
from benchmarks.common import BenchError, Target
from benchmarks.fuzz import _bases, _check, damage
from benchmarks.webhook_bench import _Conn, http_request
from raygate.core import keys
from raygate.core.api import CLAIM_TEMPLATES, PODGROUPS, PODS, PODTEMPLATES, RAYCLUSTERS, RAYJOBS, Resource
from raygate.core.api import provisioning_requests as pr_resource
from raygate.core.conditions import raw_conditions
from raygate.core.errors import RaygateError
from raygate.core.objects import JSON, controller_ref, get, meta_str
from raygate.kube.client import JSON_PATCH, MERGE_PATCH, ApiError, Kube

if TYPE_CHECKING:
    from raygate.devenv.controlplane import ControlPlane, State
    from raygate.devenv.raygate_local import LocalWebhook

NAMESPACES = ("soak-a", "soak-b", "soak-c")
ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CONFIG = {
    # Short waits: a request the node group cannot provision now is withdrawn and asked again every 30 s (a held
    # job waits in its queue and never fails for that), a failed one is retried twice within seconds.
    "defaults": {"mode": "provisioning", "provisioning": {"className": ATOMIC, "provisionedTimeoutSeconds": 30},
                 "retry": {"limit": 2, "baseSeconds": 2, "maxSeconds": 4}},
    "namespaces": {"soak-b": {"maxGang": {"nvidia.com/gpu": "16"}},
                   "soak-c": {"limits": {"maxPods": 8, "maxRequestPods": 4}}},
}
GPU = "nvidia.com/gpu"
GPU_NODES_MAX, GPUS_PER_NODE = 4, 4
IMAGE = "rayproject/ray:2.46.0-gpu"
CLAIM_TEMPLATE = "soak-gpu"  # a DRA ResourceClaimTemplate in each namespace, named by the DRA invalid objects
LIVE_CAP = 12  # Ray objects alive at once (the soak deletes one instead of creating a 13th)
PR = pr_resource("v1")
VICTIMS = ("cluster-autoscaler", "kube-apiserver", "raygate-webhook", "raygate-reconciler")
WATCHED = ("raygate-webhook", "raygate-reconciler", "cluster-autoscaler", "kuberay-operator")
SAMPLE_EVERY_S = 2.0
WARMUP_S = 120.0  # RSS after this long into a process's life is the baseline (a quarter of a shorter life)
RSS_GROWTH = 0.20
QUIET_S = 30.0
SETTLE_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 120.0
FUZZ_PAUSE_S = 0.05
# Actions whose "allowed" would be a hole: invalid objects. Growth of an admitted object is not one: every
# namespace here books, so its new GPU pods are born gated and bound only once a scale-up request is
# Provisioned, which the invariants check ("GPU pods bound without a booking").
MUST_BE_REFUSED = ("invalid: ",)


# --- the objects ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Group:
    replicas: int
    gpus: int  # per pod
    hosts: int = 1
    max_replicas: int | None = None  # autoscaling: the ceiling; else the group has a fixed size


@dataclass(frozen=True)
class Shape:
    kind: str
    groups: tuple[Group, ...]
    autoscaling: bool = False

    @property
    def gpus(self) -> int:
        return sum(g.replicas * g.hosts * g.gpus for g in self.groups)


def random_shape(rng: random.Random) -> Shape:
    """A GPU RayJob or RayCluster; one in five larger than the whole node group (16 GPUs)."""
    kind = rng.choice([keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND])
    if rng.random() < 0.2:
        groups: tuple[Group, ...] = (Group(rng.randint(5, 8), GPUS_PER_NODE),)
    else:
        groups = tuple(Group(rng.randint(1, 3), rng.choice([1, 2, 4]), rng.choice([1, 1, 1, 2]))
                       for _ in range(rng.choice([1, 1, 1, 2])))
    autoscaling = kind == keys.RAYCLUSTER_KIND and rng.random() < 0.4
    if autoscaling:
        groups = tuple(replace(g, max_replicas=g.replicas + rng.randint(1, 3)) for g in groups)
    return Shape(kind, groups, autoscaling)


def _container(name: str, cpu: str, gpus: int) -> JSON:
    res = {"cpu": cpu, "memory": "1Gi", **({GPU: str(gpus)} if gpus else {})}
    return {"name": name, "image": IMAGE, "resources": {"requests": dict(res), "limits": dict(res)}}


def _group(name: str, g: Group) -> JSON:
    out: JSON = {"groupName": name, "replicas": g.replicas, "minReplicas": g.replicas,
                 "maxReplicas": g.max_replicas or g.replicas, "rayStartParams": {},
                 "template": {"spec": {"containers": [_container("ray-worker", "1", g.gpus)]}}}
    if g.hosts > 1:
        out["numOfHosts"] = g.hosts
    return out


def ray_object(shape: Shape, name: str, namespace: str) -> JSON:
    cluster: JSON = {
        "rayVersion": "2.46.0",
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
            _container("ray-head", "500m", 0)]}}},
        "workerGroupSpecs": [_group(f"gpu-{i}", g) for i, g in enumerate(shape.groups)],
    }
    if shape.autoscaling:
        cluster["enableInTreeAutoscaling"] = True
    spec = cluster if shape.kind == keys.RAYCLUSTER_KIND else {
        "entrypoint": "python train.py", "shutdownAfterJobFinishes": True, "rayClusterSpec": cluster}
    return {"apiVersion": "ray.io/v1", "kind": shape.kind, "metadata": {"name": name, "namespace": namespace},
            "spec": spec}


def cluster_spec_path(kind: str) -> tuple[str, ...]:
    return ("spec",) if kind == keys.RAYCLUSTER_KIND else ("spec", "rayClusterSpec")


INVALID = ("replicas 2147483647", "maxReplicas 2147483647 (in-tree autoscaling)", "numOfHosts 100000",
           "GPU quantity 'lots'", "GPU quantity 1e+99999999999", "DRA claim", "RayJob without shutdownAfterJobFinishes")


def invalid_object(rng: random.Random, what: str, name: str, namespace: str) -> tuple[str, JSON]:
    """An object raygate (or the API server) must refuse (one of INVALID), and what is wrong with it."""
    kind = keys.RAYJOB_KIND if what.startswith("RayJob") else rng.choice([keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND])
    obj = ray_object(Shape(kind, (Group(1, 1),)), name, namespace)
    cluster = get(obj, cluster_spec_path(kind))
    group = cluster["workerGroupSpecs"][0]
    worker = group["template"]["spec"]["containers"][0]
    huge = keys.MAX_REPLICAS_DEFAULT
    if what == "replicas 2147483647":
        group.update(replicas=huge, minReplicas=huge, maxReplicas=huge)
    elif what.startswith("maxReplicas"):
        cluster["enableInTreeAutoscaling"] = True
        group["maxReplicas"] = huge
    elif what.startswith("numOfHosts"):
        group.update(replicas=100, minReplicas=100, maxReplicas=100, numOfHosts=100_000)
    elif what.startswith("GPU quantity"):
        bad = "lots" if "lots" in what else "1e+99999999999"
        worker["resources"] = {"requests": {"cpu": "1", GPU: bad}, "limits": {"cpu": "1", GPU: bad}}
    elif what == "DRA claim":
        worker["resources"] = {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}
        group["template"]["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": CLAIM_TEMPLATE}]
    else:
        obj["spec"]["shutdownAfterJobFinishes"] = False
    return what, obj


def claim_template(namespace: str) -> JSON:
    return {"metadata": {"name": CLAIM_TEMPLATE, "namespace": namespace}, "spec": {"spec": {"devices": {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}}}


def result_of(err: ApiError | None) -> str:
    """What came of a request, as the traffic table counts it."""
    if err is None:
        return "allowed"
    if err.status == 0 or err.status == 503:
        return "API server unavailable"
    if "failed calling webhook" in err.message:
        return "webhook unavailable"
    if "admission webhook" in err.message and "denied the request" in err.message:
        return "refused by raygate"
    if err.not_found:
        return "gone"
    if err.status == 409:
        return "conflict"
    return f"refused by the API server ({err.status})" if err.status < 500 else f"server error ({err.status})"


# --- the stack -----------------------------------------------------------------------------------------

@dataclass
class Stack:
    cp: ControlPlane
    state: State
    kube: Kube
    hook: LocalWebhook
    commands: dict[str, tuple[list[str], dict[str, str]]]  # how each process was started: restarts reuse it
    group_resources: list[Resource]  # the child kinds served here


def command_of(pid: int) -> tuple[list[str], dict[str, str]]:
    """A running process's command line and environment, from /proc."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    env = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
    return ([a.decode() for a in argv],
            dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e))


def start_stack(cp: ControlPlane) -> Stack:
    from raygate.devenv.capacity import Layout, start_capacity

    state = cp.load_state()
    if state is None:
        raise BenchError("the control plane lost its state file")
    start_capacity(cp, state, Layout(cpu_nodes=2, cpu_node_cpu=32, gpu_nodes_max=GPU_NODES_MAX,
                                     gpus_per_node=GPUS_PER_NODE))
    hook = common.start_raygate(cp, CONFIG, NAMESPACES)
    kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-soak", pool_size=8)
    if kube.served(keys.DRA_GROUP, keys.DRA_VERSION):
        for ns in NAMESPACES:
            kube.create(CLAIM_TEMPLATES, claim_template(ns), ns)
    state = cp.load_state()
    assert state is not None
    groups = [PR, PODTEMPLATES] + ([PODGROUPS] if kube.served(keys.VOLCANO_GROUP, keys.VOLCANO_VERSION) else [])
    return Stack(cp, state, kube, hook, {name: command_of(pid) for name, pid in state.pids.items()}, groups)


def _ready(kube: Kube) -> bool:
    try:
        kube.request("GET", "/readyz", timeout=5)
    except ApiError:
        return False
    return True


# --- chaos: kill and restart -----------------------------------------------------------------------------

class Chaos:
    """Kills one victim at a time (SIGKILL to its process group, as when a container dies), restarts it a
    few seconds later with the same command line, and restarts any process that exited on its own."""

    def __init__(self, stack: Stack, rng: random.Random, interval_s: float, t0: float) -> None:
        self.stack, self.rng, self.interval_s, self.t0 = stack, rng, interval_s, t0
        self.kills: Counter[str] = Counter()
        self.back_after_s: dict[str, list[float]] = {name: [] for name in VICTIMS}  # kill -> ready again
        self.unexpected_exits: list[dict[str, Any]] = []

    def run(self, stop: threading.Event) -> None:
        order: list[str] = []
        due = time.monotonic() + self._interval()
        while not stop.wait(1.0):
            self.revive_dead()
            if time.monotonic() >= due:
                order = order or self.rng.sample(VICTIMS, len(VICTIMS))  # each victim once per round
                self.kill_and_restart(order.pop())
                due = time.monotonic() + self._interval()

    def _interval(self) -> float:
        return self.interval_s * self.rng.uniform(0.5, 1.5)

    def kill_and_restart(self, name: str) -> None:
        t0 = time.monotonic()
        kill_group(self.stack.state.pids[name])
        self.kills[name] += 1
        time.sleep(self.rng.uniform(1.0, 5.0))
        self.restart(name)
        self.back_after_s[name].append(round(time.monotonic() - t0, 1))

    def revive_dead(self) -> None:
        for name, pid in list(self.stack.state.pids.items()):
            if not common.alive(pid):
                log = self.stack.cp.logs / f"{name}.log"
                self.unexpected_exits.append({"process": name, "at_s": round(time.monotonic() - self.t0),
                                              "log_tail": _tail(log)})
                print(f"bench: soak: {name} exited on its own; restarting it ({_tail(log)[-200:]})", flush=True)
                self.restart(name)

    def restart(self, name: str) -> None:
        argv, env = self.stack.commands[name]
        last: Exception | None = None
        for _ in range(3):
            self.stack.cp.spawn(self.stack.state, name, argv, env)
            started = time.monotonic()
            try:
                self.stack.cp.wait_for(self.stack.state, name, functools.partial(self._ready, name, started),
                                       READY_TIMEOUT_S)
                return
            except RaygateError as err:
                last = err
                kill_group(self.stack.state.pids[name])
                time.sleep(3)
        raise BenchError(f"{name} did not come back after a restart: {last}")


    def _ready(self, name: str, started: float) -> bool:
        if name == "kube-apiserver":
            return _ready(self.stack.kube)
        if name == "raygate-webhook":
            return self.stack.hook.readyz()[0] == 200
        return time.monotonic() - started > 2  # still up after 2 s


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while common.alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it (the control plane's Popen objects are long gone)
        time.sleep(0.05)


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:400] if lines else ""


# --- traffic ---------------------------------------------------------------------------------------------

@dataclass
class Tracked:
    kind: str
    namespace: str
    name: str
    autoscaling: bool

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.namespace, self.name

    @property
    def resource(self) -> Resource:
        return RAYJOBS if self.kind == keys.RAYJOB_KIND else RAYCLUSTERS


@dataclass
class Traffic:
    kube: Kube
    rng: random.Random
    results: Counter[tuple[str, str]] = field(default_factory=Counter)  # (action, result) -> count
    messages: dict[tuple[str, str], str] = field(default_factory=dict)  # the first refusal of each
    live: dict[tuple[str, str, str], Tracked] = field(default_factory=dict)
    created: set[tuple[str, str, str]] = field(default_factory=set)
    deleted: set[tuple[str, str, str]] = field(default_factory=set)
    serial: int = 0
    invalids: int = 0  # each kind of invalid object in turn

    def run(self, stop: threading.Event) -> None:
        actions: list[Callable[[], None]] = [self.create, self.delete, self.edit, self.scale_up, self.invalid]
        while not stop.wait(self.rng.uniform(0.5, 2.5)):
            self.rng.choices(actions, weights=[30, 12, 25, 10, 15])[0]()

    def seed(self, n: int) -> None:
        """The first objects all at once (common.create_all), so the node group fills from the start."""
        made = {t.name: (t, obj) for t, obj in (self._new(random_shape(self.rng)) for _ in range(n))}
        common.create_all(list(made), lambda name: self._create_one(made[name], "create (first wave)"))

    def _new(self, shape: Shape, prefix: str | None = None) -> tuple[Tracked, JSON]:
        self.serial += 1
        name = f"{prefix or ('job' if shape.kind == keys.RAYJOB_KIND else 'rc')}-{self.serial:05d}"
        ns = self.rng.choice(NAMESPACES)
        return Tracked(shape.kind, ns, name, shape.autoscaling), ray_object(shape, name, ns)

    def _call(self, action: str, fn: Callable[[], object]) -> str:
        try:
            fn()
            result = result_of(None)
        except ApiError as err:
            result = result_of(err)
            self.messages.setdefault((action, result), err.message[:500])
        self.results[(action, result)] += 1
        return result

    def _create_one(self, made: tuple[Tracked, JSON], action: str) -> None:
        t, obj = made
        if self._call(action, lambda: self.kube.create(t.resource, obj, t.namespace)) == "allowed":
            self.live[t.key] = t
            self.created.add(t.key)

    def create(self) -> None:
        if len(self.live) >= LIVE_CAP:
            self.delete()
            return
        shape = random_shape(self.rng)
        big = " (larger than the node group)" if shape.gpus > GPU_NODES_MAX * GPUS_PER_NODE else ""
        self._create_one(self._new(shape), f"create {shape.kind}{big}")

    def _pick(self, want: Callable[[Tracked], bool] = lambda t: True) -> tuple[Tracked, JSON, str] | None:
        """A live object and its state, read now (None when there is none or it cannot be read)."""
        candidates = [t for t in self.live.values() if want(t)]
        if not candidates:
            return None
        t = self.rng.choice(candidates)
        try:
            obj = self.kube.get(t.resource, t.name, t.namespace)
        except ApiError as err:
            self.results[("read before an edit", result_of(err))] += 1
            return None
        return t, obj, str(get(obj, ("metadata", "labels", keys.STATE_LABEL)) or "no state")

    def delete(self) -> None:
        if (picked := self._pick()) is None:
            return
        t, _, state = picked
        if self._call(f"delete ({state})", lambda: self.kube.delete(t.resource, t.name, t.namespace)) == "allowed":
            self.live.pop(t.key, None)
            self.deleted.add(t.key)

    def _patch_group(self, t: Tracked, obj: JSON, action: str, **fields: int) -> None:
        base = "/" + "/".join(cluster_spec_path(t.kind)) + "/workerGroupSpecs/0/"
        ops = [{"op": "add", "path": base + k, "value": v} for k, v in fields.items()]
        self._call(action, lambda: self.kube.patch(t.resource, t.name, ops, t.namespace, content_type=JSON_PATCH))

    def edit(self) -> None:
        """Held: resize. Admitted: a label or growth (both allowed; growth is booked as a scale-up). Failed: start
        over."""
        if (picked := self._pick()) is None:
            return
        t, obj, state = picked
        group = get(obj, (*cluster_spec_path(t.kind), "workerGroupSpecs", 0)) or {}
        replicas, most = int(group.get("replicas", 1)), int(group.get("maxReplicas", 1))
        if state in keys.HELD_STATES:
            n = self.rng.randint(1, 4)
            self._patch_group(t, obj, f"resize ({state})", replicas=n, minReplicas=n,
                              maxReplicas=max(most, n) if t.autoscaling else n)
        elif state == keys.State.FAILED and self.rng.random() < 0.5:
            patch = {"metadata": {"labels": {keys.STATE_LABEL: keys.State.PENDING.value}}}
            self._call("start over (Failed)", lambda: self.kube.patch(t.resource, t.name, patch, t.namespace,
                                                                     content_type=MERGE_PATCH))
        elif self.rng.random() < 0.5:
            patch = {"metadata": {"labels": {"soak.raygate.dev/edited": str(self.serial)}}}
            self._call(f"edit a label ({state})", lambda: self.kube.patch(t.resource, t.name, patch, t.namespace,
                                                                         content_type=MERGE_PATCH))
        else:
            self._patch_group(t, obj, f"grow ({state})", replicas=replicas + 1, maxReplicas=most + 1)

    def scale_up(self) -> None:
        """An autoscaling RayCluster: replicas + 1 (within maxReplicas, else both), or maxReplicas + 1..4."""
        if (picked := self._pick(lambda t: t.autoscaling)) is None:
            self.create()
            return
        t, obj, state = picked
        group = get(obj, ("spec", "workerGroupSpecs", 0)) or {}
        replicas, most = int(group.get("replicas", 1)), int(group.get("maxReplicas", 1))
        if self.rng.random() < 0.5:
            self._patch_group(t, obj, f"scale-up replicas ({state})", replicas=replicas + 1,
                              maxReplicas=max(most, replicas + 1))
        else:
            self._patch_group(t, obj, f"scale-up maxReplicas ({state})", maxReplicas=most + self.rng.randint(1, 4))

    def invalid(self) -> None:
        self.serial += 1
        self.invalids += 1
        what, obj = invalid_object(self.rng, INVALID[self.invalids % len(INVALID)], f"bad-{self.serial:05d}",
                                   self.rng.choice(NAMESPACES))
        t = Tracked(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"], False)
        self._create_one((t, obj), f"invalid: {what}")

    def unexpected(self) -> int:
        """Requests that had to be refused and were allowed."""
        return sum(n for (action, result), n in self.results.items()
                   if result == "allowed" and action.startswith(MUST_BE_REFUSED))


# --- fuzz ---------------------------------------------------------------------------------------------------

def fuzz_bases(namespace: str) -> list[JSON]:
    """fuzz.py's reviews to damage, moved into an opted-in namespace (so they reach the decision)."""
    out = []
    for review in _bases():
        review = copy.deepcopy(review)
        review["request"]["namespace"] = namespace
        for key in ("object", "oldObject"):
            if isinstance(review["request"].get(key), dict):
                review["request"][key]["metadata"]["namespace"] = namespace
        out.append(review)
    return out


def fuzz_loop(stack: Stack, seed: int, stop: threading.Event, tally: Counter[str], examples: list[str]) -> None:
    rng = random.Random(seed)
    bases = fuzz_bases(NAMESPACES[0])
    port, ca = int(stack.hook.url.rsplit(":", 1)[1]), str(stack.hook.ca_file)
    conn: _Conn | None = None
    i = 0
    while not stop.wait(FUZZ_PAUSE_S):
        i += 1
        body, sent = damage(rng, bases, f"soak-{seed}-{i}")
        request = http_request(body, port, rng.choice(["/mutate", "/validate"]))
        answer: tuple[int, bytes] | None = None
        for _ in range(2):  # a kept-alive connection the server closed: once more on a new one
            try:
                conn = conn or _Conn(port, ca)
                answer = conn.post(request)
                break
            except (OSError, BenchError):
                if conn:
                    conn.close()
                conn = None
        if answer is None:
            tally["no answer (webhook down)"] += 1
            continue
        tally["sent"] += 1
        _check(*answer, sent, tally, examples)
    if conn:
        conn.close()


# --- RSS -------------------------------------------------------------------------------------------------

@dataclass
class Sampler:
    state: State
    t0: float
    samples: dict[str, list[tuple[float, int, float]]] = field(
        default_factory=lambda: {name: [] for name in WATCHED})  # (seconds into the run, pid, RSS MB)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            t = time.monotonic() - self.t0
            for name, out in self.samples.items():
                pid = self.state.pids.get(name)
                if pid and common.alive(pid) and (mb := common.tree_rss_mb(pid)) > 0:
                    out.append((t, pid, mb))


def slope_mb_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB), per minute; NaN for fewer than 2 points."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / var if var else float("nan")


def rss_figures(samples: list[tuple[float, int, float]]) -> dict[str, Any]:
    """Start, peak and end over the run; and, for the longest life of the process (a kill starts a new
    one), its RSS after warm-up, at its end, the growth between them and the slope of its last half."""
    if not samples:
        return {"samples": 0}
    lives: list[list[tuple[float, int, float]]] = []
    for s in samples:
        if not lives or lives[-1][-1][1] != s[1]:
            lives.append([])
        lives[-1].append(s)
    life = max(lives, key=lambda ls: ls[-1][0] - ls[0][0])
    start, length = life[0][0], life[-1][0] - life[0][0]
    warm = next(mb for t, _, mb in life if t >= start + min(WARMUP_S, length / 4))
    end = life[-1][2]
    return {
        "samples": len(samples), "lives": len(lives), "start_mb": samples[0][2],
        "peak_mb": max(mb for _, _, mb in samples), "end_mb": samples[-1][2],
        "longest_life_s": round(length), "after_warmup_mb": warm, "end_of_longest_life_mb": end,
        "growth_pct": round(100 * (end / warm - 1), 1),
        "slope_last_half_mb_per_min": round(slope_mb_per_min(
            [(t, mb) for t, _, mb in life if t >= start + length / 2]), 3),
    }


# --- the end: settle, then the invariants ---------------------------------------------------------------

@dataclass
class Snapshot:
    objects: list[JSON]  # RayJobs and RayClusters (kind set)
    children: list[tuple[str, JSON]]  # raygate's children: (kind, object)
    pods: list[JSON]

    @classmethod
    def take(cls, stack: Stack) -> Snapshot:
        kube = stack.kube

        def items(res: Resource, **query: Any) -> list[JSON]:
            return [o for o in kube.list(res, **query).get("items") or []
                    if meta_str(o, "namespace") in NAMESPACES]

        objects = [{**o, "kind": res.kind} for res in (RAYJOBS, RAYCLUSTERS) for o in items(res)]
        managed = keys.MANAGED_SELECTOR
        children = [(res.kind, o) for res in stack.group_resources for o in items(res, labelSelector=managed)]
        return cls(objects, children, items(PODS))

    def held_requests(self) -> dict[tuple[str, str, str], str]:
        """Each held object's current request (its annotation)."""
        return {(o["kind"], meta_str(o, "namespace"), meta_str(o, "name")):
                str(get(o, ("metadata", "annotations", keys.REQUEST_ANNOTATION)) or "")
                for o in self.objects if get(o, ("metadata", "labels", keys.STATE_LABEL)) in keys.HELD_STATES}

    def fingerprint(self) -> tuple[Any, ...]:
        """What must stay still for the stack to count as settled. A held object counts as held, its request left
        out: under the queue the job at its turn asks again with a new request every provisionedTimeoutSeconds
        while capacity stays short (Provisioning -> Pending -> Provisioning, a new name), for as long as it
        waits. That it is still held is what must not change."""
        held = self.held_requests()
        objects = sorted((o["kind"], meta_str(o, "namespace"), meta_str(o, "name"), meta_str(o, "uid"),
                          "held" if (key := (o["kind"], meta_str(o, "namespace"), meta_str(o, "name"))) in held
                          else str(get(o, ("metadata", "labels", keys.STATE_LABEL))),
                          "" if key in held else str(get(o, ("metadata", "annotations", keys.REQUEST_ANNOTATION))),
                          str(get(o, ("spec", "suspend")))) for o in self.objects)
        children = sorted((k, meta_str(o, "namespace"), meta_str(o, "name")) for k, o in self.children
                          if not (k == keys.ChildKind.PROVISIONING_REQUEST and _owner(o) in held))
        pods = sorted((meta_str(p, "namespace"), meta_str(p, "name"), str(get(p, ("spec", "nodeName"))),
                       str(get(p, ("status", "phase")))) for p in self.pods)
        return tuple(objects), tuple(children), tuple(pods)


def _owner(child: JSON) -> tuple[str, str, str] | None:
    ref = controller_ref(child)
    return (str(ref.get("kind")), meta_str(child, "namespace"), str(ref.get("name"))) if ref is not None else None


@dataclass
class Settled:
    quiet: bool
    seconds: float
    snapshot: Snapshot
    asked_again: int  # held objects seen with a new request while settling (the queue's re-asks)
    before: Snapshot | None = None  # the one before it (a few seconds earlier)


def settle(stack: Stack) -> Settled:
    """Wait until nothing changes (objects, their state and request, raygate's children, pods) for QUIET_S, but for
    held objects asking again (Snapshot.fingerprint), which are counted."""
    t0 = time.monotonic()
    last: tuple[Any, ...] | None = None
    since = t0
    snap: Snapshot | None = None
    reported = t0
    requests: dict[tuple[str, str, str], str] = {}
    asked_again = 0
    before: Snapshot | None = None
    while True:
        with contextlib.suppress(ApiError):
            before, snap = snap, Snapshot.take(stack)
            now_held = snap.held_requests()
            asked_again += sum(1 for k, r in now_held.items() if k in requests and r != requests[k])
            requests = now_held
            if (fp := snap.fingerprint()) != last:
                last, since = fp, time.monotonic()
        now = time.monotonic()
        if snap is not None and now - since >= QUIET_S:
            return Settled(True, round(now - t0, 1), snap, asked_again, before)
        if now - t0 > SETTLE_TIMEOUT_S:
            if snap is None:
                raise BenchError(f"the API server did not answer for {SETTLE_TIMEOUT_S:.0f}s after the soak")
            return Settled(False, round(now - t0, 1), snap, asked_again, before)
        if now - reported > 30:
            print(f"bench: soak: settling, {now - t0:.0f}s (quiet for {now - since:.0f}s)", flush=True)
            reported = now
        time.sleep(3)


def _provisioned(request: JSON | None) -> bool:
    return request is not None and raw_conditions(request).get("Provisioned", {}).get("status") == "True"


def _requests_gpu(pod: JSON) -> bool:
    containers = (get(pod, ("spec", "containers")) or []) + (get(pod, ("spec", "initContainers")) or [])
    return any(str(get(c, ("resources", kind, GPU)) or "0") != "0" for c in containers for kind in ("requests",
                                                                                                  "limits"))


def _kuberay_child(obj: JSON) -> bool:
    ref = controller_ref(obj)
    return obj["kind"] == keys.RAYCLUSTER_KIND and ref is not None and ref.get("kind") == keys.RAYJOB_KIND


def queued_with_requests(snap: Snapshot) -> dict[tuple[str, str, str], tuple[str, list[str]]]:
    """Each held object waiting in its queue (its reason says so) that owns requests: (its resourceVersion, their
    names)."""
    owned: dict[tuple[str, str, str], list[str]] = {}
    for kind, child in snap.children:
        if kind == keys.ChildKind.PROVISIONING_REQUEST and (owner := _owner(child)) is not None:
            owned.setdefault(owner, []).append(meta_str(child, "name"))
    out = {}
    for o in snap.objects:
        key = (o["kind"], meta_str(o, "namespace"), meta_str(o, "name"))
        reason = str(get(o, ("metadata", "annotations", keys.REASON_ANNOTATION)) or "")
        if get(o, ("metadata", "labels", keys.STATE_LABEL)) in keys.HELD_STATES and \
                reason.startswith("waiting in queue ") and key in owned:
            out[key] = (meta_str(o, "resourceVersion"), sorted(owned[key]))
    return out


def judge(snap: Snapshot, traffic: Traffic, before: Snapshot | None = None) -> dict[str, Any]:
    """Each Ray object in one outcome; the violations of the invariants counted, with examples. `before`: a
    snapshot a few seconds earlier; a job waiting in its queue with a request out is a violation only when it was
    so, unchanged, in both (a snapshot lists the objects, then their children: a job whose turn comes in between
    shows a request it just made)."""
    counts: Counter[str] = Counter()
    violations: Counter[str] = Counter()
    examples: list[str] = []
    reasons: dict[str, list[str]] = {}  # a few reasons of each outcome, as written on the objects

    def violation(what: str, example: str) -> None:
        violations[what] += 1
        examples.append(f"{what}: {example}"[:400])

    requests = {(meta_str(o, "namespace"), meta_str(o, "name")): o for k, o in snap.children
                if k == keys.ChildKind.PROVISIONING_REQUEST}
    queued_now = queued_with_requests(snap)
    queued_before = queued_with_requests(before) if before is not None else queued_now
    present = set()
    for obj in snap.objects:
        ref = f"{obj['kind']} {meta_str(obj, 'namespace')}/{meta_str(obj, 'name')}"
        if _kuberay_child(obj):
            counts["RayClusters KubeRay made for admitted RayJobs (not counted above)"] += 1
            continue
        present.add((obj["kind"], meta_str(obj, "namespace"), meta_str(obj, "name")))
        state = get(obj, ("metadata", "labels", keys.STATE_LABEL))
        reason = str(get(obj, ("metadata", "annotations", keys.REASON_ANNOTATION)) or "")
        request = requests.get((meta_str(obj, "namespace"),
                                str(get(obj, ("metadata", "annotations", keys.REQUEST_ANNOTATION)) or "")))
        outcome = None
        if get(obj, ("metadata", "deletionTimestamp")):
            outcome = "being deleted"
        elif state == keys.State.ADMITTED:
            outcome = "Admitted"
        elif state == keys.State.FAILED:
            if reason:
                outcome = "Failed, with a reason"
            else:
                violation("Failed without a reason", ref)
        elif state in keys.HELD_STATES:
            key = (obj["kind"], meta_str(obj, "namespace"), meta_str(obj, "name"))
            if not reason:
                violation("held without a reason", f"{ref} ({state})")
            elif _provisioned(request):
                violation("held on a Provisioned request", f"{ref} ({state}): {reason}")
            elif reason.startswith("waiting in queue "):
                # Not its turn: the queue's promise is that it has no request out.
                if key in queued_now and queued_before.get(key, ("", []))[0] == queued_now[key][0]:
                    violation("waiting in its queue with a request out",
                              f"{ref} ({state}): {reason}; {queued_now[key][1]}")
                else:
                    outcome = "held, waiting in its queue behind another job"
            else:
                outcome = "held, waiting for capacity the node group cannot give"
        else:
            violation("no raygate state", f"{ref} (labels {get(obj, ('metadata', 'labels'))})")
        if outcome is not None:
            counts[outcome] += 1
            if len(found := reasons.setdefault(outcome, [])) < 5:
                found.append(f"{ref}: {reason}"[:400])
    counts["gone (deleted by the soak)"] = len(traffic.deleted - present)
    counts["gone (not deleted by the soak)"] = len(traffic.created - traffic.deleted - present)
    _children_and_pods(snap, requests, counts, violation)
    return {"counts": dict(counts), "violations": {k: violations.get(k, 0) for k in VIOLATIONS},
            "examples": examples[:30], "reasons": reasons}


VIOLATIONS = ("Failed without a reason", "held without a reason", "held on a Provisioned request",
              "waiting in its queue with a request out", "no raygate state", "orphaned children",
              "GPU pods bound without a booking")


def _children_and_pods(snap: Snapshot, requests: dict[tuple[str, str], JSON], counts: Counter[str],
                       violation: Callable[[str, str], None]) -> None:
    owners = {(o["kind"], meta_str(o, "namespace"), meta_str(o, "name")): meta_str(o, "uid") for o in snap.objects}
    consumers: Counter[tuple[str, str]] = Counter(
        (meta_str(p, "namespace"), str(get(p, ("metadata", "annotations", keys.CONSUME_ANNOTATION))))
        for p in snap.pods if get(p, ("status", "phase")) not in ("Succeeded", "Failed"))
    kept_templates = {(ns, str(get(s, ("podTemplateRef", "name")))) for (ns, name), r in requests.items()
                      if consumers[(ns, name)] for s in get(r, ("spec", "podSets")) or []}
    for kind, child in snap.children:
        ns, name, ref = meta_str(child, "namespace"), meta_str(child, "name"), controller_ref(child)
        if ref is not None and owners.get((str(ref.get("kind")), ns, str(ref.get("name")))) == ref.get("uid"):
            counts[f"{kind}s owned by a live object"] += 1
        elif (kind == keys.ChildKind.PROVISIONING_REQUEST and consumers[(ns, name)]) or \
                (kind == keys.ChildKind.POD_TEMPLATE and (ns, name) in kept_templates):
            counts[f"{kind}s kept for pods still running"] += 1
        else:
            owner = f"{ref.get('kind')} {ref.get('name')} uid {ref.get('uid')}" if ref else "no controller"
            violation("orphaned children", f"{kind} {ns}/{name} (owner {owner} is gone)")
    bound: Counter[tuple[str, str]] = Counter()  # request -> GPU pods bound that consume it
    for pod in snap.pods:
        if not get(pod, ("spec", "nodeName")) or not _requests_gpu(pod) or \
                get(pod, ("status", "phase")) in ("Succeeded", "Failed"):
            continue
        consumed = str(get(pod, ("metadata", "annotations", keys.CONSUME_ANNOTATION)) or "")
        if _provisioned(requests.get((meta_str(pod, "namespace"), consumed))):
            counts["GPU pods bound, on a Provisioned request"] += 1
            bound[(meta_str(pod, "namespace"), consumed)] += 1
        else:
            violation("GPU pods bound without a booking", f"pod {meta_str(pod, 'namespace')}/{meta_str(pod, 'name')} "
                                                          f"on {get(pod, ('spec', 'nodeName'))} consumes "
                                                          f"{consumed or 'nothing'}")
    # Not a violation: replicas raised within maxReplicas after admission (as the Ray autoscaler does) start
    # pods that consume the request but are beyond the count it booked.
    counts["GPU pods bound beyond their request's count"] = sum(
        max(n - sum(int(get(s, ("count",)) or 0) for s in get(requests[key], ("spec", "podSets")) or []), 0)
        for key, n in bound.items())


# --- the run ------------------------------------------------------------------------------------------------

def _thread(name: str, fn: Callable[[], None], stop: threading.Event, errors: list[str]) -> threading.Thread:
    """A thread whose exception ends the soak (the benchmark broke) instead of dying unseen."""
    def run() -> None:
        try:
            fn()
        except Exception as err:
            errors.append(f"{name}: {type(err).__name__}: {err}")
            stop.set()

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def run_soak(minutes: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with common.control_plane(kuberay=True) as cp:
        stack = start_stack(cp)
        t0 = time.monotonic()
        traffic = Traffic(Kube.connect(str(cp.kubeconfig), user_agent="raygate-soak", pool_size=8),
                          random.Random(rng.random()))
        chaos = Chaos(stack, random.Random(rng.random()), min(40.0, minutes * 60 / 6), t0)
        sampler = Sampler(stack.state, t0)
        fuzz_tally: Counter[str] = Counter()
        fuzz_examples: list[str] = []
        stop, stop_sampling = threading.Event(), threading.Event()
        errors: list[str] = []
        sampling = _thread("sampler", lambda: sampler.run(stop_sampling), stop_sampling, errors)
        fuzz_seed = rng.randint(0, 2**31)
        traffic.seed(6)
        threads = [_thread("traffic", lambda: traffic.run(stop), stop, errors),
                   _thread("chaos", lambda: chaos.run(stop), stop, errors),
                   _thread("fuzz", lambda: fuzz_loop(stack, fuzz_seed, stop, fuzz_tally, fuzz_examples), stop, errors)]
        end = t0 + minutes * 60
        while not stop.wait(max(min(60.0, end - time.monotonic()), 0.0)) and time.monotonic() < end:
            print(f"bench: soak {(time.monotonic() - t0) / 60:.0f}/{minutes:g} min: {sum(traffic.results.values())} "
                  f"requests, {len(traffic.live)} objects live, {sum(chaos.kills.values())} kills, "
                  f"{fuzz_tally['sent']} fuzzed reviews; load average {common.loadavg()}", flush=True)
        stop.set()
        for t in threads:
            t.join(READY_TIMEOUT_S * 3)  # a restart in progress finishes first
        if errors:
            raise BenchError("; ".join(errors))
        traffic_s = time.monotonic() - t0
        chaos.revive_dead()
        settled = settle(stack)
        stop_sampling.set()
        sampling.join(10)
        final = judge(settled.snapshot, traffic, settled.before)
    return {
        "minutes": minutes, "seed": seed, "traffic_seconds": round(traffic_s), "config": CONFIG,
        "traffic": [{"action": a, "result": r, "count": n, **({"first_message": traffic.messages[(a, r)]}
                                                              if (a, r) in traffic.messages else {})}
                    for (a, r), n in sorted(traffic.results.items())],
        "requests_sent": sum(traffic.results.values()), "objects_created": len(traffic.created),
        "allowed_that_must_be_refused": traffic.unexpected(),
        "kills": dict(chaos.kills), "back_after_kill_s": {k: common.summary(v) for k, v in chaos.back_after_s.items()},
        "unexpected_exits": chaos.unexpected_exits,
        "fuzz": {"counts": dict(sorted(fuzz_tally.items())), "examples": fuzz_examples[:20]},
        "settled": settled.quiet, "settle_seconds": settled.seconds, "final": final,
        "held_asked_again_while_settling": settled.asked_again,
        "rss": {name: rss_figures(s) for name, s in sampler.samples.items()},
    }


# --- the report -----------------------------------------------------------------------------------------

def targets_of(r: dict[str, Any]) -> list[Target]:
    v, fuzz = r["final"]["violations"], r["fuzz"]["counts"]
    out = [Target(f"settled (quiet {QUIET_S:.0f}s) after the soak", r["settle_seconds"] if r["settled"]
                  else float("nan"), "<=", SETTLE_TIMEOUT_S, "s")]
    out += [Target(what, v[what], "<=", 0, "") for what in VIOLATIONS]
    out += [Target("invalid objects allowed", r["allowed_that_must_be_refused"], "<=", 0, ""),
            Target("fuzzed reviews answered 5xx, code 500, malformed or with a bad patch",
                   sum(fuzz.get(k, 0) for k in ("http 5xx", "decisions with code 500", "malformed answers",
                                                "patches that fail to apply")), "<=", 0, "")]
    for name, f in r["rss"].items():
        out.append(Target(f"{name} RSS: end of its longest life vs after warm-up", f.get("growth_pct", float("nan")),
                          "<=", 100 * RSS_GROWTH, "%"))
    return out


def print_report(r: dict[str, Any]) -> None:
    print()
    print(common.table(["action", "result", "count"], [[t["action"], t["result"], t["count"]] for t in r["traffic"]],
                       f"Soak: {r['minutes']:g} min of traffic (seed {r['seed']}), {r['requests_sent']} requests, "
                       f"{r['objects_created']} Ray objects created"))
    print()
    exits = Counter(e["process"] for e in r["unexpected_exits"])
    print(common.table(["process", "kills", "back after (p50 s)", "max s", "exited on its own"],
                       [[n, r["kills"].get(n, 0), r["back_after_kill_s"].get(n, {}).get("p50", float("nan")),
                         r["back_after_kill_s"].get(n, {}).get("max", float("nan")), exits.get(n, 0)]
                        for n in sorted(set(VICTIMS) | set(exits))], "Kills (SIGKILL, then restarted)"))
    print()
    print(common.table(["answer", "count"], [[k, v] for k, v in r["fuzz"]["counts"].items()],
                       "Fuzzed AdmissionReviews sent to the webhook"))
    print()
    final = r["final"]
    settled = (f"settled in {r['settle_seconds']:.0f}s" if r["settled"] else
               f"NOT settled after {r['settle_seconds']:.0f}s") + \
        f"; held jobs asked again {r['held_asked_again_while_settling']} times meanwhile"
    rows = [[k, v] for k, v in sorted(final["counts"].items())] + [[f"VIOLATION: {k}", v]
                                                                   for k, v in final["violations"].items()]
    print(common.table(["outcome", "count"], rows, f"At the end ({settled})"))
    for outcome, found in sorted(final["reasons"].items()):
        print(f"  {outcome}, e.g. {found[0]}")
    for line in final["examples"][:10]:
        print(f"  {line}")
    print()
    print(common.table(["process", "lives", "start MB", "peak MB", "end MB", "longest life s", "after warm-up MB",
                        "its end MB", "growth %", "slope of last half MB/min"],
                       [[n, f.get("lives", 0), f.get("start_mb", float("nan")), f.get("peak_mb", float("nan")),
                         f.get("end_mb", float("nan")), f.get("longest_life_s", float("nan")),
                         f.get("after_warmup_mb", float("nan")), f.get("end_of_longest_life_mb", float("nan")),
                         f.get("growth_pct", float("nan")), f.get("slope_last_half_mb_per_min", float("nan"))]
                        for n, f in r["rss"].items()], "RSS (process tree, sampled every 2 s)"))


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    report: dict[str, Any] = {"benchmark": "soak", "started": common.now_iso(), "machine": common.machine_info()}
    print(f"bench: soak: {args.soak_minutes:g} min, seed {args.soak_seed}; load average "
          f"{report['machine']['loadavg_at_start']}", flush=True)
    r = run_soak(args.soak_minutes, args.soak_seed)
    report["soak"] = r
    targets = targets_of(r)
    path = common.write_report("soak", report, targets, t0)
    print_report(r)
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0
