"""Reconciler memory: N RayJobs held at once (10,000 by default), each waiting for its capacity.

Every job goes through the webhook and the reconciler as in production, so when all are held the
reconciler's caches hold N jobs waiting in their queue (raygate's queue: only the job at its turn has a
ProvisioningRequest and its PodTemplates; before the queue every job had its own, 2 N PodTemplates and N
requests, so the caches held more then). Figures:

1. Peak RSS (VmHWM) of the reconciler that held them as they came in (it made every child).
2. Peak RSS of a second reconciler started once all are held, the first one stopped: a restart or a
   failover lists everything at once and reconciles every job again.
3. What the webhook's processes hold once every job went through them: per process (gunicorn's master
   and each worker; the reconciler beside them) RSS, PSS and how much of it is private or shared; and what
   importing a worker's modules costs a fresh interpreter, step by step.
4. That restart, timed from the moment the second reconciler is started: until its caches are synced
   (its /readyz), until it holds the leader Lease, and until the job at the front, whose request the
   autoscaler set Provisioned while no reconciler ran, is unsuspended (target: 30 s); then the next job's
   request, provisioned once it asks, as in steady state. Its RSS at the moment the first job was unsuspended.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import BenchError, Target
from benchmarks.reconciler_bench import _kube, _pr_resource, _provisioned_patch, _wait_leader
from benchmarks.samples import rayjob
from raygate.core import keys
from raygate.core.api import LEASES, RAYJOBS, Resource
from raygate.core.objects import JSON, get, meta_str, metadata
from raygate.kube.client import MERGE_PATCH, ApiError, Kube
from raygate.kube.informer import Informer

NAMESPACE = "held-jobs"
RSS_TARGET_MB = 200.0
RESTART_TARGET_S = 30.0  # restart -> a job Provisioned meanwhile is unsuspended
CLIENT_THREADS = 16
SECOND = "bench-restarted"  # the identity of the reconciler started on the held jobs


class Counting:
    """Jobs raygate holds (labelled with a held state: placed in their queue), from a watch on RayJobs."""

    def __init__(self) -> None:
        self.jobs: set[str] = set()
        self.changed = threading.Condition()

    def on_job(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED" or (metadata(obj).get("labels") or {}).get(keys.STATE_LABEL) not in keys.HELD_STATES:
            return
        with self.changed:
            self.jobs.add(str(metadata(obj).get("name")))
            self.changed.notify_all()

    def wait(self, n: int, timeout: float) -> bool:
        deadline, last = time.monotonic() + timeout, time.monotonic()
        with self.changed:
            while len(self.jobs) < n:
                if time.monotonic() > deadline:
                    return False
                self.changed.wait(1.0)
                if time.monotonic() - last > 15:
                    print(f"bench: {len(self.jobs):,} of {n:,} jobs are held", flush=True)
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


SMAPS = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty", "Anonymous")


def smaps_mb(pid: int) -> dict[str, float]:
    """/proc/<pid>/smaps_rollup in MB (what a process maps: private, shared with others, anonymous)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value = line.split(":", 1)
            if key in SMAPS:
                out[key] = int(value.split()[0]) / 1024
    return out


def processes(cp: Any) -> list[dict[str, Any]]:
    """raygate's processes: the webhook's master and workers, and the reconciler(s)."""
    out = []
    for name, pid in cp.load_state().pids.items():
        if not name.startswith("raygate-"):
            continue
        for i, p in enumerate(common.process_tree(pid)):
            role = name if i == 0 else f"{name} worker"
            if name == "raygate-webhook" and i == 0:
                role = "raygate-webhook master"
            out.append({"process": role, "pid": p, **smaps_mb(p)})
    return out


# What a fresh interpreter holds after each step of imports: the webhook's master (gunicorn, its TLS with
# cryptography), then what every worker runs (webhook/server.py PRELOAD), then the kubernetes package, which
# raygate imported until it read credentials itself (raygate/kube/credentials.py).
IMPORT_STEPS = (
    ("python", ()),
    ("+ gunicorn, ssl, cryptography (the master)", ("gunicorn.app.base", "gunicorn.workers.gthread", "ssl",
                                                    "raygate.webhook.tls")),
    ("+ a worker's modules (flask, pydantic and the config model, prometheus_client, raygate)",
     ("raygate.webhook.app", "raygate.webhook.state")),
    ("+ the kubernetes package (no longer imported for these credentials)", ("kubernetes",)),
)


def import_costs() -> list[tuple[str, float]]:
    import json
    import subprocess
    import sys

    code = ("import importlib, json, sys\n"
            "def rss():\n"
            "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1024\n"
            "out = []\n"
            "for label, mods in json.loads(sys.argv[1]):\n"
            "    for m in mods: importlib.import_module(m)\n"
            "    out.append([label, rss()])\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(IMPORT_STEPS)], capture_output=True, text=True,
                          check=False, env={"PROMETHEUS_MULTIPROC_DIR": tempfile_dir(), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        raise BenchError(f"measuring imports failed: {proc.stderr[-500:]}")
    return [(str(label), float(mb)) for label, mb in json.loads(proc.stdout)]


def tempfile_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="raygate-bench-metrics-")


def footprint_table(procs: list[dict[str, Any]], imports: list[tuple[str, float]]) -> str:
    rows = [[p["process"], p.get("Rss", 0.0), p.get("Pss", 0.0),
             p.get("Private_Clean", 0.0) + p.get("Private_Dirty", 0.0),
             p.get("Shared_Clean", 0.0) + p.get("Shared_Dirty", 0.0), p.get("Anonymous", 0.0)] for p in procs]
    total = [sum(float(r[i]) for r in rows) for i in range(1, 6)]
    rows.append(["all of raygate", *total])
    out = common.table(["process", "RSS MB", "PSS MB", "private MB", "shared MB", "anonymous MB"], rows,
                       "raygate's processes once every job went through them (/proc/<pid>/smaps_rollup)")
    steps, prev = [], 0.0
    for label, mb in imports:
        steps.append([label, mb, mb - prev if prev else mb])
        prev = mb
    return out + "\n\n" + common.table(["imports, in a fresh interpreter", "RSS MB", "step MB"], steps,
                                        "What a webhook worker's imports hold")


def run(jobs: int, timeout: float) -> dict[str, Any]:
    from raygate.devenv import raygate_local

    with common.control_plane() as cp:
        kube = _kube(str(cp.kubeconfig), CLIENT_THREADS * 2)
        pr_res = _pr_resource(kube)
        common.start_raygate(cp, None, (NAMESPACE,))
        first = cp.load_state().pids["raygate-reconciler"]
        _wait_leader(kube, first)
        counting = Counting()
        watch = Informer(_kube(str(cp.kubeconfig), 2), RAYJOBS, namespace=NAMESPACE, handler=counting.on_job,
                         resync_seconds=3600, transform=lambda o: {"metadata": o.get("metadata") or {}}).start()
        if not watch.wait_synced(30):
            raise BenchError("the benchmark's job watch did not sync")
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
        procs = processes(cp)
        # A second reconciler takes over the same jobs: everything is listed at once. Meanwhile the
        # autoscaler provisions one job's request: how long until the new reconciler admits it?
        first_job = _front(kube, timeout)
        cp.stop_process("raygate-reconciler")
        _provision(kube, pr_res, first_job)
        t1 = time.monotonic()
        raygate_local.start_reconciler(cp, "--identity", SECOND, name="raygate-reconciler-2")
        second = cp.load_state().pids["raygate-reconciler-2"]
        samples2: list[float] = []
        stop2 = threading.Event()
        sampler2 = _sampler(second, samples2, stop2)
        restart = _time_restart(cp, kube, second, first_job, t1, timeout)
        second_job = _front(kube, timeout, after=first_job)
        _provision(kube, pr_res, second_job)
        t2 = time.monotonic()
        restart["provisioned_once_leading_to_unsuspended_s"] = _until_unsuspended(kube, second_job, timeout) - t2
        time.sleep(20)  # listed, leading, every job reconciled again (each a no-op)
        stop2.set()
        sampler2.join(5)
        second_hwm = _hwm_mb(second)
        watch.stop()
        return {
            "jobs": jobs, "create_seconds": created_s, "all_held": held, "seconds_until_all_held": held_s,
            "jobs_held": len(counting.jobs),
            "first_reconciler_peak_rss_mb": first_hwm, "first_reconciler_rss_at_end_mb": first_rss,
            "second_reconciler_peak_rss_mb": second_hwm,
            "second_reconciler_rss_at_end_mb": samples2[-1] if samples2 else float("nan"),
            "second_reconciler_observed_s": time.monotonic() - t1,
            "restart": restart, "processes": procs, "imports": import_costs(),
        }


def _front(kube: Kube, timeout: float, after: str | None = None) -> str:
    """The job at the front of the queue: the one held job whose request is out (other than `after`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asking = [meta_str(o, "name") for o in kube.list(RAYJOBS, NAMESPACE, labelSelector=(
            f"{keys.STATE_LABEL}={keys.State.PROVISIONING.value}")).get("items") or []
            if meta_str(o, "name") != after and get(o, ("metadata", "annotations", keys.REQUEST_ANNOTATION))]
        if asking:
            return sorted(asking)[0]
        time.sleep(0.2)
    raise BenchError(f"no held job asked for capacity within {timeout:.0f}s")


def _provision(kube: Kube, pr_res: Resource, job: str) -> None:
    """Play the autoscaler for one held job: its request Accepted and Provisioned."""
    obj = kube.get(RAYJOBS, job, NAMESPACE)
    request = get(obj, ("metadata", "annotations", keys.REQUEST_ANNOTATION))
    if not request:
        raise BenchError(f"{job} names no ProvisioningRequest")
    kube.patch(pr_res, str(request), _provisioned_patch(), NAMESPACE, content_type=MERGE_PATCH, sub="status")


def _until_unsuspended(kube: Kube, job: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (kube.get(RAYJOBS, job, NAMESPACE).get("spec") or {}).get("suspend") is not True:
            return time.monotonic()
        time.sleep(0.1)
    raise BenchError(f"{job} was not unsuspended within {timeout:.0f}s")


def _ready(port: int | None) -> bool:
    import urllib.request

    if port is None:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _time_restart(cp: Any, kube: Kube, pid: int, job: str, t0: float, timeout: float) -> dict[str, float]:
    """Seconds from t0 (the new reconciler started) until its caches are synced, it leads, and `job` (its
    request Provisioned before it started) is unsuspended; its RSS then."""
    from raygate.devenv.raygate_local import reconciler_metrics_port

    seen: dict[str, float] = {}
    rss = float("nan")
    deadline = t0 + timeout
    while len(seen) < 3 and time.monotonic() < deadline:
        if not common.alive(pid):
            raise BenchError("the restarted reconciler exited (see its log in the control-plane workdir)")
        now = time.monotonic()
        if "synced" not in seen and _ready(reconciler_metrics_port(cp, "raygate-reconciler-2")):
            seen["synced"] = now
        if "leader" not in seen:
            with contextlib.suppress(ApiError):
                lease = kube.get(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)
                if get(lease, ("spec", "holderIdentity")) == SECOND:
                    seen["leader"] = now
        if "unsuspended" not in seen and (kube.get(RAYJOBS, job, NAMESPACE).get("spec") or {}).get(
                "suspend") is not True:
            seen["unsuspended"] = now
            rss = common.tree_rss_mb(pid)
        time.sleep(0.1)
    if len(seen) < 3:
        raise BenchError(f"the restarted reconciler reached only {sorted(seen)} within {timeout:.0f}s")
    return {**{f"until_{k}_s": round(v - t0, 2) for k, v in seen.items()}, "rss_when_unsuspended_mb": rss}


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
        Target(f"restart with {n:,} held jobs -> a job Provisioned meanwhile unsuspended",
               r["restart"]["until_unsuspended_s"] if held else float("nan"), "<=", RESTART_TARGET_S, "s"),
    ]
    path = common.write_report("memory", report, targets, t0)
    print()
    print(common.table(["measure", "value"], [
        ["RayJobs created (through the webhook)", f"{n:,} in {r['create_seconds']:.0f} s"],
        ["until every job was held in its queue", f"{r['seconds_until_all_held']:.0f} s "
                                                  f"({r['jobs_held']:,} of {n:,})"],
        ["reconciler that held them: peak RSS (VmHWM)", f"{r['first_reconciler_peak_rss_mb']:.0f} MB"],
        ["  RSS when all were held", f"{r['first_reconciler_rss_at_end_mb']:.0f} MB"],
        ["reconciler started on them (restart): peak RSS", f"{r['second_reconciler_peak_rss_mb']:.0f} MB"],
        ["  RSS after it reconciled every job", f"{r['second_reconciler_rss_at_end_mb']:.0f} MB"],
        ["restart: started -> caches synced (/readyz)", f"{r['restart']['until_synced_s']:.1f} s"],
        ["restart: started -> leader", f"{r['restart']['until_leader_s']:.1f} s"],
        ["restart: started -> the job Provisioned meanwhile unsuspended",
         f"{r['restart']['until_unsuspended_s']:.1f} s"],
        ["  its RSS then", f"{r['restart']['rss_when_unsuspended_mb']:.0f} MB"],
        ["once leading: Provisioned -> unsuspended",
         f"{r['restart']['provisioned_once_leading_to_unsuspended_s'] * 1000:.0f} ms"],
    ], f"Reconciler memory with {n:,} held jobs (each: 2 PodTemplates and a ProvisioningRequest)"))
    print()
    print(footprint_table(r["processes"], r["imports"]))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0
