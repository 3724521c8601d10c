"""Warm start-up of the local control plane: what every `make test`, `make demo` and `raygate dev up`
waits for before anything runs. The binaries are cached (`make cluster-bins`); this measures
`raygate dev up --kuberay` (etcd, kube-apiserver, kube-controller-manager, the KubeRay operator,
every CRD Established) until it returns, then `dev down`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BenchError,
    Target,
    machine_info,
    now_iso,
    report_footer,
    summary,
    table,
    targets_table,
    write_report,
)

TARGET_SECONDS = 30.0


def _dev(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raygate", "dev", "--dir", str(workdir), *args],
                          capture_output=True, text=True, check=False, timeout=300)


def main(args: argparse.Namespace) -> int:
    from benchmarks.common import bundle

    bundle()  # the cache must be warm: building is not start-up
    t_start = time.monotonic()
    report: dict[str, Any] = {"benchmark": "startup", "started": now_iso(), "machine": machine_info()}
    seconds = []
    for _ in range(args.startup_runs):
        workdir = Path(tempfile.mkdtemp(prefix="raygate-bench-startup-"))
        try:
            t0 = time.monotonic()
            up = _dev(workdir, "up", "--kuberay")
            took = time.monotonic() - t0
            if up.returncode != 0:
                raise BenchError(f"raygate dev up failed: {up.stderr.strip()[-500:]}")
            seconds.append(took)
        finally:
            _dev(workdir, "down")
            shutil.rmtree(workdir, ignore_errors=True)
    stats = summary(seconds)
    # The median: one run slowed by a neighbour's load should not decide it (loads are in the JSON).
    targets = [Target("warm `raygate dev up --kuberay`, median", stats["p50"], "<=", TARGET_SECONDS, "s")]
    print(table(["run", "seconds"], [[str(i + 1), s] for i, s in enumerate(seconds)], "Warm control-plane start-up"))
    print()
    print(targets_table(targets))
    report.update({"runs_seconds": seconds, "summary": stats})
    print(report_footer(report, write_report("startup", report, targets, t_start)))
    return 0
