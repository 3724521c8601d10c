"""Reconciler memory: N RayJobs held at once (10,000 by default), each waiting for its capacity.

Every job goes through the webhook and the reconciler as in production, so when all are held the
reconciler's caches hold N jobs, 2 N PodTemplates and N ProvisioningRequests. Two figures:

1. Peak RSS (VmHWM) of the reconciler that held them as they came in (it made every child).
2. Peak RSS of a second reconciler started once all are held, the first one stopped: a restart or a
   failover lists everything at once and reconciles every job again.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks import common
from benchmarks.common import BenchError, Target
from benchmarks.reconciler_bench import _kube, _pr_resource, _wait_leader
from benchmarks.samples import rayjob
from raygate.core import keys
from raygate.core.api import RAYJOBS
from raygate.core.objects import JSON, metadata
from raygate.kube.informer import Informer

NAMESPACE = "held-jobs"
RSS_TARGET_MB = 200.0
CLIENT_THREADS = 16


class Counting:
    """Jobs that own a ProvisioningRequest, from a watch on requests (their owner references)."""

    def __init__(self) -> None:
        self.jobs: set[str] = set()
        self.changed = threading.Condition()

    def on_request(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            return
        for ref in metadata(obj).get("ownerReferences") or []:
            if ref.get("kind") == keys.RAYJOB_KIND:
                with self.changed:
                    self.jobs.add(str(ref.get("name")))
                    self.changed.notify_all()

    def wait(self, n: int, timeout: float) -> bool:
        deadline, last = time.monotonic() + timeout, time.monotonic()
        with self.changed:
            while len(self.jobs) < n:
                if time.monotonic() > deadline:
                    return False
                self.changed.wait(1.0)
                if time.monotonic() - last > 15:
                    print(f"bench: {len(self.jobs):,} of {n:,} jobs have a ProvisioningRequest", flush=True)
                    last = time.monotonic()
        return True


def _sampler(pid: int, out: list[float], stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(0.5):
            out.append(common.tree_rss_mb(pid))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _hwm_mb(pid: int) -> float:
    return sum(common.status_kb(p, "VmHWM") for p in common.process_tree(pid)) / 1024


def run(jobs: int, timeout: float) -> dict[str, Any]:
    from raygate.devenv import raygate_local

    with common.control_plane() as cp:
        kube = _kube(str(cp.kubeconfig), CLIENT_THREADS * 2)
        pr_res = _pr_resource(kube)
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("label", "namespace", NAMESPACE, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        raygate_local.start_webhook(cp, workers=2, threads=8)
        raygate_local.start_reconciler(cp)
        first = cp.load_state().pids["raygate-reconciler"]
        _wait_leader(kube, first)
        counting = Counting()
        watch = Informer(_kube(str(cp.kubeconfig), 2), pr_res, namespace=NAMESPACE, handler=counting.on_request,
                         resync_seconds=3600, transform=lambda o: {"metadata": o.get("metadata") or {}}).start()
        if not watch.wait_synced(30):
            raise BenchError("the benchmark's request watch did not sync")
        samples: list[float] = []
        stop = threading.Event()
        sampler = _sampler(first, samples, stop)
        t0 = time.monotonic()
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            list(pool.map(lambda i: kube.create(RAYJOBS, rayjob(f"job-{i:05d}", NAMESPACE), NAMESPACE), range(jobs)))
        created_s = time.monotonic() - t0
        print(f"bench: created {jobs:,} RayJobs in {created_s:.0f}s", flush=True)
        held = counting.wait(jobs, timeout)
        held_s = time.monotonic() - t0
        time.sleep(5)  # the last patches and their echoes
        stop.set()
        sampler.join(5)
        first_hwm, first_rss = _hwm_mb(first), (samples[-1] if samples else float("nan"))
        # A second reconciler takes over the same jobs: everything is listed at once.
        cp.stop_process("raygate-reconciler")
        raygate_local.start_reconciler(cp, name="raygate-reconciler-2")  # the first released its Lease
        second = cp.load_state().pids["raygate-reconciler-2"]
        samples2: list[float] = []
        stop2 = threading.Event()
        sampler2 = _sampler(second, samples2, stop2)
        t1 = time.monotonic()
        _wait_leader(kube, second)
        time.sleep(20)  # listed, leading, every job reconciled again (each a no-op)
        stop2.set()
        sampler2.join(5)
        second_hwm = _hwm_mb(second)
        watch.stop()
        return {
            "jobs": jobs, "create_seconds": created_s, "all_held": held, "seconds_until_all_held": held_s,
            "jobs_with_request": len(counting.jobs),
            "first_reconciler_peak_rss_mb": first_hwm, "first_reconciler_rss_at_end_mb": first_rss,
            "second_reconciler_peak_rss_mb": second_hwm,
            "second_reconciler_rss_at_end_mb": samples2[-1] if samples2 else float("nan"),
            "second_reconciler_observed_s": time.monotonic() - t1,
        }


def main(args: Any) -> int:
    t0 = time.monotonic()
    report: JSON = {"benchmark": "memory", "started": common.now_iso(), "machine": common.machine_info()}
    logging.getLogger("raygate").setLevel(logging.ERROR)
    print(f"bench: memory: {args.held_jobs:,} held jobs; load average {report['machine']['loadavg_at_start']}",
          flush=True)
    r = run(args.held_jobs, args.timeout)
    report["run"] = r
    n = r["jobs"]
    held = r["all_held"]
    targets = [
        Target(f"reconciler peak RSS, {n:,} held jobs (as they came)", r["first_reconciler_peak_rss_mb"]
               if held else float("nan"), "<=", RSS_TARGET_MB, "MB"),
        Target(f"reconciler peak RSS, {n:,} held jobs (restart)", r["second_reconciler_peak_rss_mb"]
               if held else float("nan"), "<=", RSS_TARGET_MB, "MB"),
    ]
    path = common.write_report("memory", report, targets, t0)
    print()
    print(common.table(["measure", "value"], [
        ["RayJobs created (through the webhook)", f"{n:,} in {r['create_seconds']:.0f} s"],
        ["until every job had its ProvisioningRequest", f"{r['seconds_until_all_held']:.0f} s "
                                                          f"({r['jobs_with_request']:,} of {n:,})"],
        ["reconciler that held them: peak RSS (VmHWM)", f"{r['first_reconciler_peak_rss_mb']:.0f} MB"],
        ["  RSS when all were held", f"{r['first_reconciler_rss_at_end_mb']:.0f} MB"],
        ["reconciler started on them (restart): peak RSS", f"{r['second_reconciler_peak_rss_mb']:.0f} MB"],
        ["  RSS after it reconciled every job", f"{r['second_reconciler_rss_at_end_mb']:.0f} MB"],
    ], f"Reconciler memory with {n:,} held jobs (each: 2 PodTemplates and a ProvisioningRequest)"))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0
