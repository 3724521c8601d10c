"""`make bench` keeps printing what the project claims: the benchmarks run end to end, small.

The burst and the side-by-side with Kueue run as `make bench` runs them (`python -m benchmarks.run`,
their own fresh control planes), with a handful of jobs. Nothing here judges a figure: speed lives
in `make bench`. What is asserted is what a reader of its output relies on: every job was admitted,
the tables are printed, and the JSON holds the figures they show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_bench(out: Path, *args: str) -> tuple[str, dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "RAYGATE_BENCH_OUT": str(out)}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / f"{args[0]}.json").read_text())
    return proc.stdout, report


def test_the_burst_prints_its_figures_and_where_a_jobs_time_went(tmp_path: Path) -> None:
    out, report = run_bench(tmp_path, "reconciler", "--jobs", "20", "--status-writers", "2")
    flow = report["flow"]
    assert flow["check"]["admitted"] == 20 and flow["check"]["unsuspended"] == 20, flow["check"]
    assert flow["check"]["jobs_with_more_than_one_request"] == 0
    assert report["writes_per_admitted_job"] <= 6
    for title in ("Reconciler: 20 RayJobs", "What the API server takes here",
                  "Where a job's time went inside the reconciler", "The API server's wall: 2 writers"):
        assert title in out, f"{title!r} not printed"
    # The reconciler's own histograms were read: each admission was a job handed to a worker and a PATCH.
    inside = flow["inside_reconciler"]["phase2"]
    assert inside["queue_wait_seconds"]["count"] >= 20
    assert inside["api_request_seconds PATCH"]["count"] >= 20
    assert flow["model"]["writers"] == 2 and flow["model"]["delay_s"] > 0


def test_the_side_by_side_with_kueue_prints_both_columns_and_what_differs(tmp_path: Path) -> None:
    out, report = run_bench(tmp_path, "peer", "--peer-jobs", "6", "--peer-sides", "raygate,kueue")
    runs = report["runs"]
    assert sorted((r["side"], r["rate"] or 0.0) for r in runs) == sorted(  # all at once is rate None
        (side, rate) for side in ("raygate", "kueue") for rate in report["pacings"].values())
    assert all(r["all_unsuspended"] and r["admitted"] == 6 for r in runs), [(r["side"], r["admitted"]) for r in runs]
    assert report["median"]["raygate"]["writes_per_job"] <= 6
    assert report["median"]["kueue"]["writes_per_job"] > 0
    for title in ("raygate and Kueue v", "x raygate", "How each side ran", "Differences and why",
                  "client QPS"):
        assert title in out, f"{title!r} not printed"
