"""`raygate demo`: the scenario from MCAD's, Volcano's and Kueue's own guides, on a local control plane.

Two GPU RayJobs compete for capacity that fits one of them. A stand-in for cluster-autoscaler
(raygate.devenv.capacity, answering ProvisioningRequests like the check-capacity class) owns a
fixed number of GPUs. The first job is admitted and KubeRay creates its pods; the second is held,
suspended, with no pods at all; deleting the first frees the capacity and the second is admitted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raygate import keys
from raygate.errors import RaygateError

JOBS = ("train-a", "train-b")
WORKERS = 2
GPUS_PER_WORKER = 2
GPUS_PER_JOB = WORKERS * GPUS_PER_WORKER


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
        "--gpus", type=int, default=GPUS_PER_JOB,
        help=f"GPUs the capacity stand-in offers (default {GPUS_PER_JOB}: room for one job)",
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
    start: float = field(default_factory=time.monotonic)
    seen: dict[str, str] = field(default_factory=dict)
    seen_events: set[str] = field(default_factory=set)
    _prs: list[dict[str, Any]] = field(default_factory=list)

    def say(self, subject: str, text: str) -> None:
        print(f"{time.monotonic() - self.start:7.1f}s  {subject:<32} {text}", flush=True)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        from raygate.kube import PODS, RAYCLUSTERS, RAYJOBS, provisioning_requests

        jobs = {j["metadata"]["name"]: j for j in self.kube.list(RAYJOBS, DEMO_NAMESPACE)["items"]}
        clusters = self.kube.list(RAYCLUSTERS, DEMO_NAMESPACE)["items"]
        pods = self.kube.list(PODS, DEMO_NAMESPACE)["items"]
        requests = self.kube.list(provisioning_requests("v1"), DEMO_NAMESPACE)["items"]
        out: dict[str, dict[str, Any]] = {}
        for name in JOBS:
            job = jobs.get(name)
            if job is None:
                out[name] = {"exists": False}
                continue
            meta = job["metadata"]
            owned = [c["metadata"]["name"] for c in clusters
                     if (c["metadata"].get("labels") or {}).get(keys.ORIGINATED_FROM_NAME_LABEL) == name]
            pod_count = sum(1 for p in pods if (p["metadata"].get("labels") or {}).get(keys.RAY_CLUSTER_LABEL) in owned)
            out[name] = {
                "exists": True,
                "state": (meta.get("labels") or {}).get(keys.STATE_LABEL, "-"),
                "suspend": bool(job["spec"].get("suspend")),
                "pods": pod_count,
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
        from raygate.kube import EVENTS
        from reconciler.flow import raw_conditions

        snap = self.snapshot()
        for name, facts in snap.items():
            if not facts["exists"]:
                if f"rayjob/{name}/state" in self.seen:
                    self.report(f"rayjob/{name}", "state", "deleted")
                continue
            self.report(f"rayjob/{name}", "state",
                        f"raygate.io/state={facts['state']}  suspend={str(facts['suspend']).lower()}")
            self.report(f"rayjob/{name}", "pods", f"rayclusters={facts['rayclusters']}  pods={facts['pods']}")
        for pr in self._prs:
            conditions = raw_conditions(pr)
            for ctype in ("Accepted", "Provisioned", "Failed", "BookingExpired"):
                cond = conditions.get(ctype)
                if cond is None:
                    continue
                text = f"{ctype}={cond.get('status')}"
                if cond.get("status") != "True" and cond.get("reason"):
                    text += f" ({cond['reason']})"
                self.report(f"provreq/{pr['metadata']['name']}", ctype, text)
        for ev in sorted(self.kube.list(EVENTS, DEMO_NAMESPACE)["items"],
                         key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
            uid = ev["metadata"]["uid"]
            involved = ev.get("involvedObject") or {}
            if uid in self.seen_events or involved.get("kind") != "RayJob":
                continue
            self.seen_events.add(uid)
            self.say(f"event rayjob/{involved.get('name')}", f"{ev.get('reason')}: {ev.get('message', '')[:160]}")
        return snap

    def until(self, what: str, done: Callable[[dict[str, dict[str, Any]]], bool], timeout: float,
              hold: float = 0.0) -> None:
        """Tick until `done` holds (and keeps holding for `hold` seconds)."""
        deadline = time.monotonic() + timeout
        held_since: float | None = None
        while time.monotonic() < deadline:
            if done(self.tick()):
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since >= hold:
                    return
            else:
                held_since = None
            time.sleep(0.25)
        raise RaygateError(f"demo: timed out after {timeout:.0f}s waiting until {what}; see .dev/logs/")


def _admitted(facts: dict[str, Any]) -> bool:
    return bool(facts["exists"] and facts["state"] == keys.State.ADMITTED and facts["pods"] > 0)


def _held_without_pods(facts: dict[str, Any]) -> bool:
    return bool(facts["exists"] and facts["state"] in keys.HELD_STATES and facts["suspend"]
                and facts["pods"] == 0 and facts["rayclusters"] == 0)


def _start(args: argparse.Namespace) -> Any:
    from raygate.devenv.build import ensure_bundle
    from raygate.devenv.capacity import start_capacity
    from raygate.devenv.controlplane import ControlPlane
    from raygate.devenv.raygate_local import start_raygate
    from raygate.kube import Kube

    cp = ControlPlane(args.dir, ensure_bundle())
    cp.up(kuberay=True)
    start_raygate(cp)
    start_capacity(cp, args.gpus)
    return cp, Kube.connect(str(cp.kubeconfig), user_agent="raygate-demo")


def _clean_previous_run(cp: Any) -> None:
    cp.kubectl("delete", "rayjobs", "-n", DEMO_NAMESPACE, *JOBS, "--ignore-not-found", "--wait=true",
               "--timeout=60s")


def run(args: argparse.Namespace) -> int:
    import orjson

    from raygate.kube import RAYJOBS

    if args.gpus < 1:
        raise RaygateError("--gpus must be at least 1")
    cp, kube = _start(args)
    try:
        _clean_previous_run(cp)
        first, second = JOBS
        print(f"\nraygate demo: a stand-in for cluster-autoscaler offers {args.gpus} GPUs "
              f"(nvidia.com/gpu); each RayJob needs {GPUS_PER_JOB} ({WORKERS} workers x {GPUS_PER_WORKER}).\n")
        tl = Timeline(kube)
        tl.say("kubectl create", f"rayjob/{first}")
        kube.create(RAYJOBS, rayjob(first), DEMO_NAMESPACE)
        tl.until(f"{first} is admitted and KubeRay created its pods", lambda s: _admitted(s[first]), args.timeout)

        tl.say("kubectl create", f"rayjob/{second}")
        kube.create(RAYJOBS, rayjob(second), DEMO_NAMESPACE)
        tl.until(f"{second} is held with no pods while {first} runs",
                 lambda s: _held_without_pods(s[second]) and _admitted(s[first]), args.timeout, hold=5)

        tl.say("kubectl delete", f"rayjob/{first}")
        cp.kubectl("delete", "rayjob", "-n", DEMO_NAMESPACE, first, "--wait=false")
        tl.until(f"{second} is admitted", lambda s: _admitted(s[second]) and not s[first]["exists"], args.timeout)

        print(f"\nDone: {second} was admitted only after {first} was deleted and its capacity freed.")
        print(orjson.dumps({"result": "ok", "admittedAfterDelete": second}).decode())
    finally:
        if args.down:
            cp.down()
    if not args.down:
        print("\nThe control plane is still up. Explore it:")
        # kubectl from the pinned bundle; raygate (and the kubectl plugin) from this environment.
        print(f"  export KUBECONFIG={cp.kubeconfig} PATH={cp.bundle.bin_dir}:{Path(sys.executable).parent}:$PATH")
        print(f"  kubectl get rayjobs -n {DEMO_NAMESPACE} -L {keys.STATE_LABEL}")
        print(f"  kubectl describe rayjob -n {DEMO_NAMESPACE} {JOBS[1]}")
        print(f"  kubectl get provisioningrequests,pods -n {DEMO_NAMESPACE}")
        print("  kubectl raygate status -A")
        print("Stop it with: raygate dev down   (or make dev-down)")
    sys.stdout.flush()
    return 0
