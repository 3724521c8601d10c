"""Real capacity for the local control plane: kube-scheduler, KWOK's controller and cluster-autoscaler.

cluster-autoscaler runs with its kwok cloud provider and ProvisioningRequests on: it answers raygate's
requests itself and, for a GPU gang that does not fit, adds nodes from a GPU node group that starts at
zero. The nodes are fake (KWOK marks them Ready and the pods bound to them Running), but everything
that decides where a pod goes is real: the autoscaler's simulation, the booking it records, the
scheduler's binding. A few CPU nodes exist from the start for heads and submitters.

The layout is printed by `raygate dev env` and beside the end-to-end benchmark, because the
autoscaler's loop settings (scan interval, backoff, scale-down times) are a large part of what a
user waits for.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raygate.core import keys
from raygate.core.errors import RaygateError
from raygate.devenv import versions as v

if TYPE_CHECKING:
    from raygate.devenv.controlplane import ControlPlane, State

NAMESPACE = "kube-system"  # where the kwok provider reads its ConfigMaps (POD_NAMESPACE)
NODE_GROUP_LABEL = "raygate.dev/node-group"
GPU_GROUP = "gpu-pool"
CPU_GROUP = "cpu"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB"
KWOK_MANAGED = {"kwok.x-k8s.io/node": "fake"}  # the annotation KWOK's controller manages nodes by
PROCESSES = ("kube-scheduler", "kwok", "cluster-autoscaler")
# KWOK's own stages (from its module): nodes become Ready and keep a heartbeat, bound pods become
# Running, deleted pods go. Pods are never completed, so a Ray cluster stays up until deleted.
KWOK_STAGES = ("kustomize/stage/node/fast/node-initialize.yaml", "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
               "kustomize/stage/pod/fast/pod-ready.yaml", "kustomize/stage/pod/fast/pod-delete.yaml")


@dataclass(frozen=True)
class Layout:
    """The local cluster's capacity: static CPU nodes, and a GPU node group the autoscaler grows."""

    cpu_nodes: int = 2
    cpu_node_cpu: int = 16
    gpu_nodes_max: int = 4
    gpus_per_node: int = 4
    gpu_node_cpu: int = 32
    # cluster-autoscaler's loop, fast so tests finish quickly (production defaults in brackets).
    scan_interval: str = "1s"  # [10s]
    provisioning_request_backoff: str = "2s"  # retry of a request that could not be provisioned [1m]
    scale_down_delay_after_add: str = "20s"  # [10m]
    scale_down_unneeded_time: str = "10s"  # [10m]
    # A node found unremovable is simulated again after this [5m]. While a deleted Job's pod terminates, the autoscaler
    # cannot find the pod's Job and holds its node as unremovable; with the default the node stayed 5 minutes.
    unremovable_recheck: str = "20s"
    # Where it serves /metrics (its loop's own timings); port 0: a free one, not told to anyone.
    metrics_address: str = "127.0.0.1:0"

    def autoscaler_args(self) -> list[str]:
        return [
            "--cloud-provider=kwok", "--enable-provisioning-requests=true", f"--namespace={NAMESPACE}",
            f"--scan-interval={self.scan_interval}", "--leader-elect=false", f"--address={self.metrics_address}",
            f"--provisioning-request-initial-backoff-time={self.provisioning_request_backoff}",
            f"--provisioning-request-max-backoff-time={self.provisioning_request_backoff}",
            f"--scale-down-delay-after-add={self.scale_down_delay_after_add}",
            f"--scale-down-unneeded-time={self.scale_down_unneeded_time}",
            f"--unremovable-node-recheck-timeout={self.unremovable_recheck}",
            "--scale-down-delay-after-delete=0s", "--scale-down-delay-after-failure=5s",
            "--max-node-provision-time=2m", "--skip-nodes-with-local-storage=false",
            "--write-status-configmap=true", "--v=2",
            # Its ProvisioningRequest client shares this setting, and a CRD cannot be encoded as protobuf
            # (with the default, every status update fails: "does not implement the protobuf marshalling").
            "--kube-api-content-type=application/json",
        ]

    def loop(self) -> str:
        """cluster-autoscaler's loop settings, which bound how fast it answers."""
        return (f"scan {self.scan_interval}, request backoff {self.provisioning_request_backoff}, scale-down after "
                f"{self.scale_down_unneeded_time} unneeded ({self.scale_down_delay_after_add} after a scale-up)")

    def describe(self) -> str:
        return (f"{self.cpu_nodes} CPU nodes ({self.cpu_node_cpu} CPU each); GPU node group {GPU_GROUP}: 0 to "
                f"{self.gpu_nodes_max} nodes of {self.gpus_per_node} {GPU_RESOURCE}; cluster-autoscaler "
                f"{self.loop()}")


def node(name: str, group: str, cpu: int, memory_gi: int, gpus: int = 0) -> dict[str, Any]:
    """A fake node as KWOK serves it; `gpus` adds nvidia.com/gpu and the GPU product label."""
    resources = {"cpu": str(cpu), "memory": f"{memory_gi}Gi", "pods": "110", "ephemeral-storage": "500Gi"}
    labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
              "type": "kwok", NODE_GROUP_LABEL: group}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
        labels[GPU_PRODUCT_LABEL] = GPU_PRODUCT
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": dict(KWOK_MANAGED)},
            "spec": {},
            "status": {"allocatable": resources, "capacity": resources}}  # KWOK fills in the rest


def provider_config(layout: Layout) -> dict[str, Any]:
    """ConfigMaps `kwok-provider-config` and `kwok-provider-templates` of the autoscaler's kwok provider."""
    template = node("gpu-node", GPU_GROUP, layout.gpu_node_cpu, 256, layout.gpus_per_node)
    template["metadata"]["annotations"].update({
        "cluster-autoscaler.kwok.nodegroup/min-count": "0",
        "cluster-autoscaler.kwok.nodegroup/max-count": str(layout.gpu_nodes_max),
        "cluster-autoscaler.kwok.nodegroup/desired-count": "0",
    })
    config = {
        "apiVersion": "v1alpha1", "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeLabelKey": NODE_GROUP_LABEL},
        # No kwok-provider taint: raygate's pods carry no toleration for it, as on a real cluster.
        "nodes": {"skipTaint": True, "gpuConfig": {"gpuLabelKey": GPU_PRODUCT_LABEL,
                                                   "availableGPUTypes": {GPU_PRODUCT: {}}}},
        "configmap": {"name": "kwok-provider-templates"},
    }
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kwok-provider-config", "namespace": NAMESPACE},
         "data": {"config": yaml.safe_dump(config)}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kwok-provider-templates", "namespace": NAMESPACE},
         "data": {"templates": yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [template]})}},
    ]}


def kwok_stages(cp: ControlPlane) -> Path:
    """KWOK's stage configuration, taken once from its pinned module and kept beside the binaries."""
    path = cp.bundle.root / "kwok-stages.yaml"
    if path.exists():
        return path
    from raygate.devenv.build import download_module

    src = download_module(v.KWOK_MODULE, v.KWOK_VERSION, cp.workdir)
    docs = [(src / rel).read_text() for rel in KWOK_STAGES]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n---\n".join(d.strip() for d in docs) + "\n")
    tmp.replace(path)
    return path


def start_capacity(cp: ControlPlane, state: State, layout: Layout | None = None) -> Layout:
    """kube-scheduler, KWOK and cluster-autoscaler, plus the CPU nodes; harmless when they already run."""
    from raygate.devenv.controlplane import alive, free_port, gang_scheduling, log_gist

    layout = layout or Layout()
    missing = [b for b in PROCESSES if not cp.bundle.binary(b).exists()]
    if missing:
        raise RaygateError(f"{', '.join(missing)} not built: run `make cluster-bins`")
    kubeconfig = str(cp.kubeconfig)
    if not _running(state, "kube-scheduler"):
        cp.spawn(state, "kube-scheduler", [
            str(cp.bundle.binary("kube-scheduler")), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--v=1",
            *(keys.GANG_SCHEDULER_FLAGS if gang_scheduling(state) else ()),
        ])
    if not _running(state, "kwok"):
        cp.spawn(state, "kwok", [
            str(cp.bundle.binary("kwok")), f"--kubeconfig={kubeconfig}", f"--config={kwok_stages(cp)}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.0.0.1/16", "--node-ip=10.0.0.1", f"--server-address=127.0.0.1:{free_port()}",
        ])
    nodes = [node(f"cpu-node-{i}", CPU_GROUP, layout.cpu_node_cpu, 64) for i in range(layout.cpu_nodes)]
    cp.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    cp.kubectl("apply", "-f", "-", input_text=json.dumps(provider_config(layout)))
    if _running(state, "cluster-autoscaler") and layout_of(state) != layout:
        cp.stop_process("cluster-autoscaler", state)  # it reads its node groups only when it starts
    if not _running(state, "cluster-autoscaler"):
        cp.spawn(state, "cluster-autoscaler",
                 [str(cp.bundle.binary("cluster-autoscaler")), f"--kubeconfig={kubeconfig}", *layout.autoscaler_args()],
                 env={"KWOK_PROVIDER_MODE": "local", "POD_NAMESPACE": NAMESPACE, "KUBECONFIG": kubeconfig})
    state.extra["capacity"] = json.dumps(asdict(layout))
    cp.save_state(state)
    cp.wait_for(state, "kwok", lambda: _ready_nodes(cp) >= layout.cpu_nodes, 60)
    for name in PROCESSES:
        if not alive(state.pids[name]):
            raise RaygateError(f"{name} exited at start: {log_gist(cp.logs / (name + '.log'))} "
                               f"(its log: {cp.logs / (name + '.log')})")
    return layout


def layout_of(state: State) -> Layout | None:
    raw = state.extra.get("capacity")
    return Layout(**json.loads(raw)) if raw else None


def _running(state: State, name: str) -> bool:
    from raygate.devenv.controlplane import alive

    return name in state.pids and alive(state.pids[name])


def _ready_nodes(cp: ControlPlane) -> int:
    out = cp.kubectl("get", "nodes", "-o", "json", check=False)
    try:
        items = json.loads(out).get("items") or []
    except ValueError:
        return 0
    return sum(1 for n in items for c in (n.get("status") or {}).get("conditions") or []
               if c.get("type") == "Ready" and c.get("status") == "True")
