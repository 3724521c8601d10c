"""The workload both benchmarks use: a realistic multi-group GPU RayJob and its AdmissionReview."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from raygate.core import keys

JSON = dict[str, Any]

RAY_IMAGE = "rayproject/ray:2.41.0-py311-gpu"


def _container(name: str, cpu: str, memory: str, gpus: int, ports: list[JSON] | None = None) -> JSON:
    limits: JSON = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)  # GPU in limits only, as most users write it
    c: JSON = {
        "name": name,
        "image": RAY_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
        "env": [
            {"name": "RAY_GRAFANA_HOST", "value": "http://grafana.monitoring.svc:3000"},
            {"name": "NCCL_DEBUG", "value": "WARN"},
        ],
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "ray-logs", "mountPath": "/tmp/ray"}],
    }
    if ports:
        c["ports"] = ports
    return c


def _pod_template(container: JSON, *, gpu_node: bool) -> JSON:
    spec: JSON = {
        "containers": [container],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
            {"name": "ray-logs", "emptyDir": {}},
        ],
        "serviceAccountName": "ray-training",
    }
    if gpu_node:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        spec["nodeSelector"] = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    return {"metadata": {"labels": {"app.kubernetes.io/part-of": "llm-finetune"}}, "spec": spec}


def _worker_group(name: str, replicas: int, cpu: str, memory: str, gpus: int) -> JSON:
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas * 2,
        "rayStartParams": {"num-gpus": str(gpus)} if gpus else {},
        "template": _pod_template(_container("ray-worker", cpu, memory, gpus), gpu_node=gpus > 0),
    }


def rayjob(name: str = "llm-finetune", namespace: str = "bench") -> JSON:
    """Head (CPU) + three worker groups: 8-GPU trainers, 1-GPU evaluators, CPU data loaders."""
    head_ports = [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"},
                  {"containerPort": 10001, "name": "client"}]
    return {
        "apiVersion": f"{keys.RAY_GROUP}/{keys.RAY_VERSION}",
        "kind": keys.RAYJOB_KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"team": "research", "app.kubernetes.io/name": "llm-finetune"},
            "annotations": {"example.com/owner": "data-science@example.com"},
        },
        "spec": {
            "entrypoint": "python /home/ray/train.py --model llama-3-8b --epochs 3 --batch-size 32",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "activeDeadlineSeconds": 86400,
            "runtimeEnvYAML": "pip:\n  - transformers==4.46.0\n  - datasets==3.1.0\nenv_vars:\n  HF_HOME: /tmp/hf\n",
            "rayClusterSpec": {
                "rayVersion": "2.41.0",
                "headGroupSpec": {
                    "serviceType": "ClusterIP",
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
                    "template": _pod_template(_container("ray-head", "4", "16Gi", 0, head_ports), gpu_node=False),
                },
                "workerGroupSpecs": [
                    _worker_group("trainer", 4, "32", "256Gi", 8),
                    _worker_group("evaluator", 2, "8", "64Gi", 1),
                    _worker_group("dataloader", 4, "8", "32Gi", 0),
                ],
            },
        },
    }


def admission_review(obj: JSON, *, uid: str | None = None) -> JSON:
    """An admission.k8s.io/v1 AdmissionReview for CREATE of `obj`, as the API server sends it."""
    meta = obj["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION, "kind": keys.RAYJOB_KIND},
            "resource": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION, "resource": keys.RAYJOB_PLURAL},
            "requestKind": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION, "kind": keys.RAYJOB_KIND},
            "requestResource": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION,
                                "resource": keys.RAYJOB_PLURAL},
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "alice@example.com", "uid": "6c1f0b7e-alice",
                         "groups": ["system:authenticated", "data-science"]},
            "object": copy.deepcopy(obj),
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions", "fieldManager": "kubectl-create"},
        },
    }
