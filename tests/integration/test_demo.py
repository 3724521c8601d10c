"""`make demo` is the newcomer's first five minutes: it must run to completion and tell the story right.

Runs `raygate demo --down` exactly as `make demo` does (own control plane, KubeRay, raygate, and the
capacity layer: kube-scheduler, KWOK and the real cluster-autoscaler) and reads its timeline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from procs import processes_mentioning

from raygate.devenv.build import Bundle

pytestmark = [pytest.mark.integration, pytest.mark.kuberay]


def test_demo_admits_the_second_job_only_after_the_first_is_deleted(bundle: Bundle, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "raygate", "demo", "--dir", str(tmp_path / "dev"), "--down", "--timeout", "240"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed: {proc.stderr[-2000:]}\n{out[-3000:]}"
    result = next(ln for ln in out.splitlines() if ln.startswith('{"result"'))
    assert json.loads(result) == {"result": "ok", "admittedAfterDelete": "train-b"}

    lines = out.splitlines()

    def first(fragment: str, subject: str) -> int:
        return next(i for i, ln in enumerate(lines) if subject in ln and fragment in ln)

    a_provisioned = first("Provisioned=True", "provreq/train-a")
    gpu_node = first("nvidia.com/gpu=4", "node/gpu-pool")
    a_admitted = first("raygate.io/state=Admitted", "rayjob/train-a ")
    a_running = first("worker:Running@gpu-pool", "rayjob/train-a ")
    b_created = first("rayjob/train-b", "kubectl create")
    b_held = first("raygate.io/state=Provisioning", "rayjob/train-b ")
    b_refused = first("Provisioned=False", "provreq/train-b")  # the autoscaler's own answer, with its reason
    a_deleted = first("rayjob/train-a", "kubectl delete")
    b_admitted = first("raygate.io/state=Admitted", "rayjob/train-b ")
    b_running = first("worker:Running@gpu-pool", "rayjob/train-b ")
    assert a_provisioned < a_admitted < a_running and gpu_node < a_running
    assert a_running < b_created < b_held < b_refused < a_deleted < b_admitted < b_running
    # While train-a ran, train-b had no RayCluster and no pods.
    b_pods = [ln for ln in lines[b_created:a_deleted] if "rayjob/train-b " in ln and "pods" in ln]
    assert b_pods and all("rayclusters=0  pods=0" in ln for ln in b_pods), b_pods
    assert "cluster-autoscaler (kwok provider)" in out
    assert "dev: stopped" in out
    assert processes_mentioning(str(tmp_path / "dev")) == []  # --down left no process behind
