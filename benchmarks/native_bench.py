"""What native mode costs at the moment it matters: a 32-pod GPU gang from Provisioned to every worker bound,
in native mode (raygate's booking plus Kubernetes' own Workload and PodGroup, kube-scheduler gang-binding
it) against provisioning mode (the booking alone, pods bound one by one).

One control plane with Kubernetes' gang scheduling on (`raygate dev up --gang-scheduling`), the capacity
layer with 8 static GPU nodes of 4 GPUs (check-capacity books them; the autoscaler adds none), KubeRay,
raygate's webhook and reconciler. Each round creates the same RayCluster (a head and 32 one-GPU workers) in
a provisioning-mode and a native-mode namespace, one after the other, and times its request's Provisioned
to the 32nd worker bound. Rounds alternate which mode goes first. Target: native within 1.5x of provisioning
(median of the rounds): binding a gang whole must not cost much more than binding its pods one by one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.common import BenchError, Target, bound_workers, gpu_workers, request_provisioned, until
from benchmarks.podgate_bench import raycluster
from raygate.core import keys
from raygate.core.api import RAYCLUSTERS, gang_pod_groups
from raygate.kube.client import Kube

GANG = 32
ROUNDS = 3
RATIO_TARGET = 1.5
MODES = ("provisioning", "native")
NAMESPACE = {m: f"bench-native-{m}" for m in MODES}
STATIC_GROUP = "gpu-static"
CONFIG = {"defaults": {"provisioning": {"className": keys.CHECK_CAPACITY_CLASS}},
          "namespaces": {NAMESPACE[m]: {"mode": m} for m in MODES}}


def _one(kube: Kube, mode: str, name: str, timeout: float) -> float:
    ns = NAMESPACE[mode]
    cluster = raycluster(name, ns, GANG)
    cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] = {
        "raygate.dev/node-group": STATIC_GROUP}
    kube.create(RAYCLUSTERS, cluster, ns)
    provisioned = until(lambda: request_provisioned(kube, name, ns), timeout, f"{name} Provisioned", 0.05)
    done = until(lambda: bound_workers(kube, name, ns) == GANG, timeout, f"every worker of {name} bound", 0.05)
    if mode == "native" and not any(p["spec"].get("schedulingGroup") for p in gpu_workers(kube, name, ns)):
        raise BenchError(f"{name}'s pods name no PodGroup: native mode did not run")
    kube.delete(RAYCLUSTERS, name, ns)
    until(lambda: not gpu_workers(kube, name, ns) and not kube.list(gang_pod_groups("v1alpha2"), ns)["items"],
          timeout, f"{name}'s pods and PodGroup gone", 0.5)
    return done - provisioned


def on_capacity(rounds: int, timeout: float) -> dict[str, Any]:
    from raygate.devenv.capacity import Layout, start_capacity

    layout = Layout(cpu_nodes=2, cpu_node_cpu=32, gpu_nodes_max=0)
    out: dict[str, Any] = {"layout": f"{layout.describe()}; {GANG // layout.gpus_per_node} static GPU nodes"}
    with common.control_plane(kuberay=True, gang=True) as cp:
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        start_capacity(cp, state, layout)
        common.start_raygate(cp, CONFIG, list(NAMESPACE.values()))
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=8)
        common.add_static_gpu_nodes(cp, kube, STATIC_GROUP, GANG // layout.gpus_per_node, layout.gpus_per_node, timeout)
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(rounds):
            for mode in (MODES if r % 2 == 0 else tuple(reversed(MODES))):
                took = _one(kube, mode, f"gang-{mode}-{r}", timeout)
                seconds[mode].append(round(took, 2))
                print(f"bench: round {r + 1}, {mode}: Provisioned -> {GANG} workers bound {took:.2f}s", flush=True)
        out["seconds"] = seconds
        out["median"] = {m: round(statistics.median(v), 2) for m, v in seconds.items()}
    return out


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    report: dict[str, Any] = {"benchmark": "native", "started": common.now_iso(), "machine": common.machine_info()}
    cap = on_capacity(ROUNDS, args.timeout)
    report["capacity"] = cap
    ratio = cap["median"]["native"] / max(cap["median"]["provisioning"], 1e-9)
    report["native_over_provisioning"] = round(ratio, 2)
    targets = [Target(f"{GANG}-pod gang Provisioned -> bound, native / provisioning (median)", ratio, "<=",
                      RATIO_TARGET, "x")]
    rows = [[f"{GANG}-pod gang, Provisioned -> every worker bound, {m} mode",
             ", ".join(f"{s:.2f}" for s in cap["seconds"][m]), cap["median"][m]] for m in MODES]
    print(common.table(["", "rounds (s)", "median (s)"], rows, f"On real capacity ({cap['layout']})"))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, common.write_report("native", report, targets, t0)))
    return 0
