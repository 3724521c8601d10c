"""`raygate demo`: the scenario from MCAD's, Volcano's and Kueue's own guides, on a local control plane.

Two GPU RayJobs compete for capacity that fits one of them: the real cluster-autoscaler (kwok
provider) may grow a GPU node group to one node's worth. The first job's ProvisioningRequest makes
it add a node, raygate unsuspends the job, kube-scheduler binds its pods to that node and they run;
the second is held, suspended, with no pods at all and the autoscaler's own reason; deleting the
first frees the node and the second gets it and runs. Each job is KubeRay's default K8sJobMode: once
its Ray cluster is up, KubeRay creates a submitter Job, whose pod kube-controller-manager's Job
controller creates.

The demo runs again on whatever an earlier run left: jobs, Ray clusters, and pods bound to a GPU node
the autoscaler deleted when the stack was stopped (`raygate dev down`), which no kubelet will ever
confirm gone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygate.core import keys
from raygate.core.errors import RaygateError
from raygate.core.objects import JSON
from raygate.devenv import demo_elastic

JOBS = ("train-a", "train-b")
WORKERS = 2
GPUS_PER_WORKER = 2
GPUS_PER_JOB = WORKERS * GPUS_PER_WORKER
GPUS_PER_NODE = 4
GPU_RESOURCE = "nvidia.com/gpu"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from raygate.devenv.cli import default_dir

    demo = sub.add_parser(
        "demo",
        help="replay the two-GPU-jobs scenario on a local control plane",
        description="Start the local control plane with KubeRay and raygate, then show two GPU RayJobs "
        "competing for capacity that fits one: the second is admitted only after the first is deleted.",
    )
    demo.add_argument("--dir", type=Path, default=default_dir(), help="state directory (default: .dev)")
    demo.add_argument(
        "--gpu-nodes", type=int, default=1,
        help=f"largest size of the GPU node group, {GPUS_PER_NODE} GPUs a node (default 1: room for one job)",
    )
    demo.add_argument("--down", action="store_true", help="tear the control plane down at the end")
    demo.add_argument("--timeout", type=float, default=180, help="seconds to wait for each step (default 180)")
    demo.set_defaults(func=run)


def rayjob(name: str) -> dict[str, Any]:
    """A RayJob as a data scientist writes it: nothing about raygate in it."""
    head_resources = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    worker_resources = {
        "requests": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": str(GPUS_PER_WORKER)},
        "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": str(GPUS_PER_WORKER)},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
        "spec": {
            "entrypoint": "python -c 'import ray; ray.init(); print(ray.cluster_resources())'",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-head", "image": "rayproject/ray:2.46.0",
                        "resources": head_resources,
                    }]}},
                },
                "workerGroupSpecs": [{
                    "groupName": "gpu",
                    "replicas": WORKERS,
                    "minReplicas": WORKERS,
                    "maxReplicas": WORKERS,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-worker", "image": "rayproject/ray:2.46.0-gpu", "resources": worker_resources,
                    }]}},
                }],
            },
        },
    }


DEMO_NAMESPACE = "demo"


@dataclass
class Timeline:
    """Prints what a user would see with kubectl, but only when it changes."""

    kube: Any
    logs: Path
    start: float = field(default_factory=time.monotonic)
    seen: dict[str, str] = field(default_factory=dict)
    seen_events: set[str] = field(default_factory=set)
    uids: set[str] = field(default_factory=set)  # this run's jobs: Events of an earlier run's stay hidden
    _prs: list[dict[str, Any]] = field(default_factory=list)
    _nodes: list[dict[str, Any]] = field(default_factory=list)

    def say(self, subject: str, text: str) -> None:
        print(f"{time.monotonic() - self.start:7.1f}s  {subject:<32} {text}", flush=True)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        from raygate.core.api import NODES, PODS, RAYCLUSTERS, RAYJOBS, provisioning_requests

        jobs = {j["metadata"]["name"]: j for j in self.kube.list(RAYJOBS, DEMO_NAMESPACE)["items"]}
        clusters = self.kube.list(RAYCLUSTERS, DEMO_NAMESPACE)["items"]
        pods = self.kube.list(PODS, DEMO_NAMESPACE)["items"]
        batch_jobs = self.kube.list(_batch_jobs(), DEMO_NAMESPACE)["items"]
        requests = self.kube.list(provisioning_requests("v1"), DEMO_NAMESPACE)["items"]
        self._nodes = self.kube.list(NODES)["items"]
        out: dict[str, dict[str, Any]] = {}
        for name in JOBS:
            job = jobs.get(name)
            if job is None:
                out[name] = {"exists": False}
                continue
            meta = job["metadata"]
            self.uids.add(meta["uid"])
            owned = [c["metadata"]["name"] for c in clusters
                     if (c["metadata"].get("labels") or {}).get(keys.ORIGINATED_FROM_NAME_LABEL) == name]
            ray_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(keys.RAY_CLUSTER_LABEL) in owned]
            submitter_jobs = {j["metadata"]["uid"] for j in batch_jobs if _controller_uid(j) == meta["uid"]}
            submitters = [p for p in pods if _controller_uid(p) in submitter_jobs]
            out[name] = {
                "exists": True,
                "state": (meta.get("labels") or {}).get(keys.STATE_LABEL, "-"),
                "suspend": bool(job["spec"].get("suspend")),
                "pods": len(ray_pods) + len(submitters),
                "running": sum(1 for p in ray_pods if _phase(p) == "Running"),
                "submitter": next((_phase(p) for p in submitters), "-"),
                "placement": sorted(_placement(p) for p in ray_pods + submitters),
                "rayclusters": len(owned),
            }
        self._prs = requests
        return out

    def report(self, subject: str, aspect: str, text: str) -> None:
        key = f"{subject}/{aspect}"
        if self.seen.get(key) != text:
            self.seen[key] = text
            self.say(subject, text)

    def tick(self) -> dict[str, dict[str, Any]]:
        from raygate.core import booking
        from raygate.core.api import EVENTS
        from raygate.core.conditions import raw_conditions

        snap = self.snapshot()
        # Cause before effect: nodes and requests, then the jobs they let run, then the jobs' Events.
        for n in self._nodes:
            ready = next((c.get("status") for c in (n.get("status") or {}).get("conditions") or []
                          if c.get("type") == "Ready"), "Unknown")
            gpus = ((n.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
            self.report(f"node/{n['metadata']['name']}", "ready", f"Ready={ready}  nvidia.com/gpu={gpus}")
        for name in [k.split("/", 2)[1] for k in self.seen if k.startswith("node/")]:
            if name not in {n["metadata"]["name"] for n in self._nodes}:
                self.report(f"node/{name}", "ready", "deleted (scaled down)")
        for pr in self._prs:
            conditions = raw_conditions(pr)
            for ctype in (booking.ACCEPTED, booking.PROVISIONED, booking.FAILED, booking.BOOKING_EXPIRED):
                cond = conditions.get(ctype)
                if cond is None:
                    continue
                text = f"{ctype}={cond.get('status')}"
                if cond.get("status") != "True" and cond.get("reason"):
                    text += f" ({cond['reason']}: {str(cond.get('message', ''))[:100]})"
                self.report(f"provreq/{pr['metadata']['name']}", ctype, text)
        for name, facts in snap.items():
            if not facts["exists"]:
                if f"rayjob/{name}/state" in self.seen:
                    self.report(f"rayjob/{name}", "state", "deleted")
                continue
            self.report(f"rayjob/{name}", "state",
                        f"raygate.io/state={facts['state']}  suspend={str(facts['suspend']).lower()}")
            self.report(f"rayjob/{name}", "pods", f"rayclusters={facts['rayclusters']}  pods={facts['pods']}")
            if facts["placement"]:
                self.report(f"rayjob/{name}", "placement", "pods " + " ".join(facts["placement"]))
        for ev in sorted(self.kube.list(EVENTS, DEMO_NAMESPACE)["items"],
                         key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
            uid = ev["metadata"]["uid"]
            involved = ev.get("involvedObject") or {}
            if uid in self.seen_events or involved.get("uid") not in self.uids:
                continue
            self.seen_events.add(uid)
            self.say(f"event rayjob/{involved.get('name')}", f"{ev.get('reason')}: {ev.get('message', '')[:160]}")
        return snap

    def until(self, what: str, done: Callable[[dict[str, dict[str, Any]]], bool], timeout: float,
              hold: float = 0.0) -> None:
        """Tick until `done` holds (and keeps holding for `hold` seconds)."""
        deadline = time.monotonic() + timeout
        held_since: float | None = None
        snap: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            snap = self.tick()
            if done(snap):
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since >= hold:
                    return
            else:
                held_since = None
            time.sleep(0.25)
        last = "; ".join(f"{name}: {_describe(facts)}" for name, facts in snap.items())
        raise RaygateError(f"demo: timed out after {timeout:.0f}s waiting until {what} (last seen: {last}); "
                           f"see the logs in {self.logs}/")


def _phase(pod: JSON) -> str:
    return str((pod.get("status") or {}).get("phase", "?"))


def _controller_uid(obj: JSON) -> str | None:
    return next((ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")),
                None)


def _placement(pod: JSON) -> str:
    """`<head|worker|submitter>:<phase>@<node>`: what `kubectl get pods -o wide` shows, in one word."""
    role = (pod["metadata"].get("labels") or {}).get("ray.io/node-type", "submitter")
    return f"{role}:{_phase(pod)}@{pod['spec'].get('nodeName') or '-'}"


def _describe(facts: dict[str, Any]) -> str:
    if not facts["exists"]:
        return "no RayJob"
    return (f"state={facts['state']} suspend={str(facts['suspend']).lower()} rayclusters={facts['rayclusters']} "
            f"pods {' '.join(facts['placement']) or 'none'}")


def _running(facts: dict[str, Any]) -> bool:
    """Admitted; KubeRay's head and workers all Running on nodes, and the submitter pod that KubeRay's
    Job gets from the Job controller once the Ray cluster is up (K8sJobMode) Running too."""
    return bool(facts["exists"] and facts["state"] == keys.State.ADMITTED and facts["running"] >= 1 + WORKERS
                and facts["submitter"] == "Running")


def _held_without_pods(facts: dict[str, Any]) -> bool:
    return bool(facts["exists"] and facts["state"] in keys.HELD_STATES and facts["suspend"]
                and facts["pods"] == 0 and facts["rayclusters"] == 0)


def _start(args: argparse.Namespace) -> Any:
    from raygate.devenv.build import ensure_bundle
    from raygate.devenv.capacity import Layout, start_capacity
    from raygate.devenv.controlplane import ControlPlane
    from raygate.devenv.raygate_local import start_raygate
    from raygate.kube.client import Kube

    cp = ControlPlane(args.dir, ensure_bundle())
    state = cp.up(kuberay=True)
    layout = start_capacity(cp, state, Layout(gpu_nodes_max=args.gpu_nodes, gpus_per_node=GPUS_PER_NODE))
    kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-demo")
    _await_namespace(kube, args.timeout)
    start_raygate(cp)
    return cp, kube, layout


def holds_gpus(pod: JSON) -> bool:
    """The pod asks for GPUs (requests or limits of any container), so it occupies a GPU node."""
    spec = pod.get("spec") or {}
    return any(GPU_RESOURCE in ((c.get("resources") or {}).get(kind) or {})
               for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
               for kind in ("requests", "limits"))


@dataclass(frozen=True)
class Leftovers:
    """What stands between an earlier run's remains and a clean start, decided from one listing."""

    force_delete: list[JSON]  # the demo's own pods on nodes that are gone: nothing else removes them soon
    waiting: list[JSON]  # every GPU pod: the demo starts once none is left


def leftovers(pods: list[JSON], nodes: set[str], namespace: str = DEMO_NAMESPACE) -> Leftovers:
    """Pods of `namespace` bound to a node that no longer exists (the autoscaler deletes its nodes when it
    stops) are force-deleted: no kubelet, and no KWOK, will ever confirm their deletion, and pod GC
    takes 40 to 80 s to notice. Only pods already being deleted, or with no controller: a controller
    still at work would replace one. Every GPU pod, anywhere, is waited for."""
    gone = [p for p in pods if p["metadata"].get("namespace") == namespace and _on_missing_node(p, nodes)
            and (p["metadata"].get("deletionTimestamp") or _controller_uid(p) is None)]
    return Leftovers(force_delete=gone, waiting=[p for p in pods if holds_gpus(p)])


def _on_missing_node(pod: JSON, nodes: set[str]) -> bool:
    node = (pod.get("spec") or {}).get("nodeName")
    return bool(node) and node not in nodes


def pod_story(pod: JSON, nodes: set[str]) -> str:
    """`ns/name (Terminating on node X, which no longer exists)`: where a pod is, in one phrase."""
    meta = pod["metadata"]
    state = "Terminating" if meta.get("deletionTimestamp") else _phase(pod)
    node = (pod.get("spec") or {}).get("nodeName")
    where = f" on node {node}" + (", which no longer exists" if node not in nodes else "") if node else ", unbound"
    held = f"; finalizers {', '.join(meta['finalizers'])}" if meta.get("deletionTimestamp") and meta.get(
        "finalizers") else ""
    return f"{meta.get('namespace')}/{meta['name']} ({state}{where}{held})"


def _force_delete(kube: Any, pod: JSON) -> None:
    """Delete now, as pod GC does; the uid precondition spares a pod created since under the same name."""
    from raygate.core.api import PODS
    from raygate.kube.client import ApiError

    meta = pod["metadata"]
    try:
        kube.request("DELETE", PODS.path(meta["namespace"], meta["name"]),
                     body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
    except ApiError as err:
        if not (err.not_found or err.status == 409):
            raise


def clear_stranded_pods(kube: Any, namespace: str = DEMO_NAMESPACE) -> dict[str, str]:
    """Force-delete the pods of `namespace` left on nodes that are gone (see `leftovers`); each one's
    uid and where it was."""
    from raygate.core.api import NODES, PODS

    nodes = {n["metadata"]["name"] for n in kube.list(NODES)["items"]}
    stranded = leftovers(kube.list(PODS, namespace)["items"], nodes, namespace).force_delete
    for pod in stranded:
        _force_delete(kube, pod)
    return {p["metadata"]["uid"]: pod_story(p, nodes) for p in stranded}


def _clear_and_say(kube: Any, told: set[str]) -> None:
    """clear_stranded_pods, saying once of each pod what it was and why it is force-deleted."""
    for uid, story in clear_stranded_pods(kube).items():
        if uid not in told:
            told.add(uid)
            print(f"demo: pod {story} was left by an earlier run, and no kubelet will confirm its deletion: "
                  "force-deleted")


def _batch_jobs() -> Any:
    from raygate.core.api import Resource

    return Resource("batch", "v1", "jobs", "Job")


def _clean_previous_run(cp: Any, kube: Any, timeout: float) -> None:
    """The namespace may hold jobs from an earlier run, or a user's: say what was there, then clear it,
    and wait until it is all gone and no pod holds a GPU node, so the two jobs start from the same empty
    node group and their names are free (KubeRay names a RayJob's submitter Job after it)."""
    from raygate.core.api import NODES, PODS, RAYCLUSTERS, RAYJOBS

    found = [f"rayjob/{o['metadata']['name']}" for o in kube.list(RAYJOBS, DEMO_NAMESPACE)["items"]]
    found += [f"raycluster/{o['metadata']['name']}" for o in kube.list(RAYCLUSTERS, DEMO_NAMESPACE)["items"]
              if not (o["metadata"].get("labels") or {}).get(keys.ORIGINATED_FROM_CRD_LABEL)]
    if found:
        print(f"demo: namespace {DEMO_NAMESPACE} held {', '.join(found)} from an earlier run: deleting them")
        cp.kubectl("delete", "rayjobs,rayclusters", "--all", "-n", DEMO_NAMESPACE, "--wait=false")
    deadline = time.monotonic() + timeout
    told: set[str] = set()
    said_waiting = False
    while True:
        _clear_and_say(kube, told)
        nodes = {n["metadata"]["name"] for n in kube.list(NODES)["items"]}
        # A RayJob's submitter Job (KubeRay labels it) goes after the RayJob, by the garbage collector.
        submitters = {"labelSelector": f"{keys.ORIGINATED_FROM_CRD_LABEL}={keys.RAYJOB_KIND}"}
        waiting = [f"{res.kind.lower()} {DEMO_NAMESPACE}/{o['metadata']['name']}"
                   for res, query in ((RAYJOBS, {}), (RAYCLUSTERS, {}), (_batch_jobs(), submitters))
                   for o in kube.list(res, DEMO_NAMESPACE, **query)["items"]]
        waiting += [f"pod {pod_story(p, nodes)}" for p in leftovers(kube.list(PODS)["items"], nodes).waiting]
        if not waiting:
            return
        if not said_waiting:
            said_waiting = True
            print(f"demo: waiting until these are gone: {', '.join(waiting)}")
        if time.monotonic() > deadline:
            break
        time.sleep(1)
    raise RaygateError(
        f"demo: after {timeout:.0f}s these are still there: {', '.join(waiting)}; delete them (`kubectl delete "
        "KIND -n NAMESPACE NAME`, with `--grace-period=0 --force` for a pod on a node that no longer exists), "
        "or start from an empty cluster with `raygate dev up --fresh`")


def _await_namespace(kube: Any, timeout: float) -> None:
    """A demo namespace that is being deleted (a `kubectl delete namespace demo` the stack was stopped
    during) refuses new jobs: wait until the namespace controller has emptied and removed it, clearing
    its pods on nodes that are gone, which would hold it up; `start_raygate` then makes it anew."""
    from raygate.core.api import NAMESPACES
    from raygate.kube.client import ApiError

    def terminating() -> bool:
        try:
            return bool(kube.get(NAMESPACES, DEMO_NAMESPACE)["metadata"].get("deletionTimestamp"))
        except ApiError as err:
            if err.not_found:
                return False
            raise

    if not terminating():
        return
    print(f"demo: namespace {DEMO_NAMESPACE} is being deleted: waiting until it is gone, to make it anew")
    deadline = time.monotonic() + timeout
    told: set[str] = set()
    while terminating():
        if time.monotonic() > deadline:
            raise RaygateError(
                f"demo: namespace {DEMO_NAMESPACE} is still being deleted after {timeout:.0f}s: `kubectl get "
                f"namespace {DEMO_NAMESPACE} -o yaml` says what it waits for (status.conditions); or start from an "
                "empty cluster with `raygate dev up --fresh`")
        _clear_and_say(kube, told)
        time.sleep(1)


def _scenario(args: argparse.Namespace, cp: Any, kube: Any, layout: Any) -> None:
    import orjson

    from raygate.core.api import RAYJOBS

    _clean_previous_run(cp, kube, args.timeout)
    first, second = JOBS
    print(f"\nraygate demo: cluster-autoscaler (kwok provider) may add up to {args.gpu_nodes} GPU node"
          f"{'s' if args.gpu_nodes > 1 else ''} of {GPUS_PER_NODE} nvidia.com/gpu; each RayJob needs "
          f"{GPUS_PER_JOB} ({WORKERS} workers x {GPUS_PER_WORKER}).\n{layout.describe()}\n")
    tl = Timeline(kube, cp.logs)
    tl.say("kubectl create", f"rayjob/{first}")
    kube.create(RAYJOBS, rayjob(first), DEMO_NAMESPACE)
    tl.until(f"{first} is admitted and its pods run on the node the autoscaler added",
             lambda s: _running(s[first]), args.timeout)

    tl.say("kubectl create", f"rayjob/{second}")
    kube.create(RAYJOBS, rayjob(second), DEMO_NAMESPACE)
    tl.until(f"{second} is held with no pods while {first} runs",
             lambda s: _held_without_pods(s[second]) and _running(s[first]), args.timeout, hold=8)

    tl.say("kubectl delete", f"rayjob/{first}")
    cp.kubectl("delete", "rayjob", "-n", DEMO_NAMESPACE, first, "--wait=false")
    tl.until(f"{second} runs", lambda s: _running(s[second]) and not s[first]["exists"], args.timeout)

    print(f"\nDone: {second} got the GPU node only after {first} was deleted, and runs on it.")

    tl.say("kubectl delete", f"rayjob/{second}")
    cp.kubectl("delete", "rayjob", "-n", DEMO_NAMESPACE, second, "--wait=false")
    tl.until(f"{second} and its pods are gone", lambda s: not s[second]["exists"], args.timeout)
    demo_elastic.act(cp, kube, DEMO_NAMESPACE, args.timeout)
    print(orjson.dumps({"result": "ok", "admittedAfterDelete": second, "scaleUpBooked": demo_elastic.CLUSTER})
          .decode())


def run(args: argparse.Namespace) -> int:
    from raygate.kube.client import ApiError

    if args.gpu_nodes < 1:
        raise RaygateError("--gpu-nodes must be at least 1")
    cp, kube, layout = _start(args)
    try:
        _scenario(args, cp, kube, layout)
    except ApiError as err:
        if err.status != 0:
            raise
        # The API server went away under the demo (a process of the stack was stopped or killed).
        raise RaygateError(f"demo: the control plane stopped answering ({err}); `raygate dev env` says which process "
                           f"exited, its log is in {cp.logs}/; `raygate demo` again starts what is missing") from None
    finally:
        if args.down:
            cp.down()
    if not args.down:
        print("\nThe control plane is still up. Explore it:")
        # kubectl from the pinned bundle; raygate (and the kubectl plugin) from this environment.
        print(f"  export KUBECONFIG={cp.kubeconfig} PATH={cp.bundle.bin_dir}:{Path(sys.executable).parent}:$PATH")
        print(f"  kubectl get rayjobs -n {DEMO_NAMESPACE} -L {keys.STATE_LABEL}")
        print(f"  kubectl describe rayjob -n {DEMO_NAMESPACE} {JOBS[1]}")
        print(f"  kubectl get provisioningrequests,pods -n {DEMO_NAMESPACE} -o wide")
        print("  kubectl get nodes -L raygate.dev/node-group")
        print("  kubectl raygate status -A")
        print("Stop it with: raygate dev down   (or make dev-down)")
    sys.stdout.flush()
    return 0
