"""Volcano for the local control plane: its scheduler and its controller-manager, on the capacity
layer's KWOK nodes.

- vc-scheduler gang-binds the pods of a PodGroup (all of minMember, or none) with the configuration
  kept beside this module (volcano-scheduler.yaml, which explains each action and plugin). At start
  it creates the queues `root` and `default`.
- vc-controller-manager runs only the queue controller (it sets a queue's status.state to Open: the
  scheduler and raygate's reconciler both refuse a queue that is not Open) and the PodGroup
  controller (a PodGroup for a pod routed to Volcano without one). Its Job, CronJob and JobFlow
  controllers are for Volcano's own batch API, which Ray does not use.
- Volcano's admission webhooks are not run: they default and validate Volcano's own Jobs and Queues
  and check pods against their queue's state; raygate's reconciler creates the PodGroup, checks the
  queue is Open before that, and its webhook writes every pod template's scheduling metadata.
- kube-controller-manager's Job controller (on in every local stack) creates the pod of KubeRay's
  K8sJobMode submitter Job, which Volcano schedules in the job's PodGroup.

All of Volcano's CRDs are installed (the bundle's are only the scheduling ones): the scheduler and
the queue controller watch its topology, NUMA, shard and command objects too and wait for them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from raygate.core.errors import RaygateError
from raygate.devenv import versions as v

if TYPE_CHECKING:
    from raygate.devenv.controlplane import ControlPlane, State

SCHEDULER_CONF = Path(__file__).with_name("volcano-scheduler.yaml")
PROCESSES = ("vc-controller-manager", "vc-scheduler")
CONTROLLERS = ("queue-controller", "pg-controller")
DEFAULT_QUEUE = "default"  # created by the scheduler at start; raygate's volcano mode uses it by default
CRD_DIR = "config/crd/volcano/bases"


def volcano_crds(cp: ControlPlane) -> Path:
    """Every CRD of the pinned Volcano module in one file, taken once and kept beside the binaries."""
    path = cp.bundle.root / "volcano-crds.yaml"
    if path.exists():
        return path
    from raygate.devenv.build import download_module

    found = sorted((download_module(v.VOLCANO_MODULE, v.VOLCANO_VERSION, cp.workdir) / CRD_DIR).glob("*.yaml"))
    if not found:
        raise RaygateError(f"no CRDs in {CRD_DIR} of {v.VOLCANO_MODULE}@{v.VOLCANO_VERSION}")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n---\n".join(f.read_text().strip() for f in found) + "\n")
    tmp.replace(path)
    return path


def scheduler_args(cp: ControlPlane) -> list[str]:
    return [str(cp.bundle.binary("vc-scheduler")), f"--kubeconfig={cp.kubeconfig}",
            f"--scheduler-conf={SCHEDULER_CONF}", "--leader-elect=false", f"--default-queue={DEFAULT_QUEUE}",
            # Metrics and health endpoints stay off (their defaults listen on fixed ports of all addresses).
            "--enable-metrics=false", "--enable-healthz=false", "--cache-dumper=false", "--v=3"]


def controller_manager_args(cp: ControlPlane) -> list[str]:
    return [str(cp.bundle.binary("vc-controller-manager")), f"--kubeconfig={cp.kubeconfig}",
            "--leader-elect=false", f"--controllers={','.join(CONTROLLERS)}",
            "--enable-metrics=false", "--enable-healthz=false", "--v=2"]


def start_volcano(cp: ControlPlane, state: State) -> None:
    """Volcano's CRDs, controller-manager and scheduler; harmless when they run."""
    from raygate.devenv.capacity import _running

    missing = [b for b in PROCESSES if not cp.bundle.binary(b).exists()]
    if missing:
        raise RaygateError(f"{', '.join(missing)} not built: run `make cluster-bins`")
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(volcano_crds(cp)))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(volcano_crds(cp)))
    if not _running(state, "vc-controller-manager"):
        cp.spawn(state, "vc-controller-manager", controller_manager_args(cp))
    if not _running(state, "vc-scheduler"):
        cp.spawn(state, "vc-scheduler", scheduler_args(cp))
    state.extra["volcano"] = v.VOLCANO_VERSION
    cp.save_state(state)
    cp.wait_for(state, "vc-scheduler", lambda: queue_state(cp, DEFAULT_QUEUE) == "Open", 60)
    time.sleep(0.2)
    for name in PROCESSES:
        cp.wait_for(state, name, lambda: True, 1)


def queue_state(cp: ControlPlane, name: str) -> str | None:
    """A Volcano queue's status.state (Open once the queue controller has seen it); None if absent."""
    out = cp.kubectl("get", "queues.scheduling.volcano.sh", name, "-o", "json", "--ignore-not-found", check=False)
    try:
        return str(((json.loads(out) if out.strip() else {}).get("status") or {}).get("state") or "") or None
    except ValueError:
        return None


def describe() -> str:
    return (f"Volcano {v.VOLCANO_VERSION}: vc-scheduler ({SCHEDULER_CONF.name}: enqueue, allocate, backfill; "
            f"gang, proportion, predicates, nodeorder), vc-controller-manager ({', '.join(CONTROLLERS)})")
