"""Scarce capacity (issue 30): one-node GPU RayJobs created in order on a GPU node group of at most 2 nodes.

The e2e benchmark's stack and watches (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, KWOK
nodes, the real cluster-autoscaler with its kwok provider and ProvisioningRequests, the KubeRay operator), but
capacity is scarce: one GPU node group of at most `--scarce-nodes-max` 4-GPU nodes (2), starting at zero. N
RayJobs (20), each a head and two 2-GPU workers (one whole node), are created in order q01, q02, ... a couple
of seconds apart (`--scarce-interval`); each is deleted a few seconds (`--scarce-hold`, 10-15 s, the same per
job on both sides) after all its Ray pods Run (a RayJob on KWOK never finishes by itself), which frees its node
for the next.

Sides, each on a fresh stack, taking turns:
- raygate, `provisioning` mode with the best-effort-atomic class, its config from `--scarce-raygate-config`
  (default: the e2e benchmark's; the queue of issue 30 is configured there, in raygate-config);
- Kueue, its RayJob integration behind a ClusterQueue with queueingStrategy StrictFIFO whose GPU quota is what
  the node group holds at most (so Kueue's own queue decides who asks for capacity), with its
  ProvisioningRequest admission check (best-effort-atomic), as the e2e benchmark sets it up.

Per side: the order jobs started running (all Ray pods Running), pairs out of order (of N(N-1)/2, the pairs
i < j where j ran before i), each job's wait (create -> all Running), GPU node-seconds used by running jobs
against GPU node-seconds available (nodes that exist) while at least one job waits, the makespan, and every job
that ended Failed (raygate's state Failed; Kueue's Workload deactivated), with its reason.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, e2e_bench
from benchmarks.common import BenchError, Target
from raygate.core import keys
from raygate.core.api import RAYJOBS
from raygate.core.objects import JSON, metadata

NAMESPACE = "bench-scarce"
SIDES = e2e_bench.SIDES
TITLES = e2e_bench.TITLES
KUEUE_STRATEGY = "StrictFIFO"
# Kueue's quota besides the GPUs: ample, so only the GPUs (what the node group holds) decide.
KUEUE_AMPLE = {"cpu": "10M", "memory": "10Ei"}
WAITING_ENDS = ("running", "failed")  # a job waits from its create until it runs or is given up


@dataclass(frozen=True)
class Plan:
    """What one run does: the same on both sides."""

    jobs: int = 20
    nodes_max: int = 2
    interval_s: float = 2.0
    hold_s: tuple[float, float] = (10.0, 15.0)
    seed: int = 1
    timeout_s: float = 1800.0
    raygate_config: str = e2e_bench.RAYGATE_CONFIG
    raygate_config_source: str = "the e2e benchmark's (benchmarks/e2e_bench.py RAYGATE_CONFIG)"

    def names(self) -> list[str]:
        width = max(2, len(str(self.jobs)))
        return [f"q{i:0{width}d}" for i in range(1, self.jobs + 1)]

    def holds(self) -> dict[str, float]:
        """How long each job runs before the benchmark deletes it: drawn once from the seed, so job qNN runs
        as long on either side."""
        rng = random.Random(self.seed)
        lo, hi = self.hold_s
        return {name: round(rng.uniform(lo, hi), 2) for name in self.names()}


# --- what the watches see, on top of the e2e tracker ------------------------------------------------------

@dataclass
class ScarceTracker(e2e_bench.Tracker):
    """The e2e tracker's milestones and GPU nodes, plus: when the benchmark deleted each job, when its last Ray pod
    was gone, and each job that ended Failed with its reason."""

    failed: dict[str, str] = field(default_factory=dict)  # job -> reason

    def on_job(self, kind: str, obj: JSON) -> None:
        super().on_job(kind, obj)
        meta = metadata(obj)
        name = str(meta.get("name"))
        if kind == "DELETED" or name not in self.names:
            return
        if (meta.get("labels") or {}).get(keys.STATE_LABEL) == keys.State.FAILED:
            reason = (meta.get("annotations") or {}).get(keys.REASON_ANNOTATION) or "(no reason given)"
            self._failed(name, reason)

    def on_workload(self, kind: str, obj: JSON) -> None:
        super().on_workload(kind, obj)
        if kind == "DELETED" or (obj.get("spec") or {}).get("active", True) is not False:
            return
        with self.changed:
            job = self.owners.job_of_workload.get(str(metadata(obj).get("name")))
        if job is not None:
            self._failed(job, f"Workload deactivated: {_kueue_reason(obj)}")

    def _failed(self, job: str, reason: str) -> None:
        with self.changed:
            self.failed.setdefault(job, reason)
            self._mark(job, "failed", time.monotonic())

    def on_pod(self, kind: str, obj: JSON) -> None:
        super().on_pod(kind, obj)
        cluster = (metadata(obj).get("labels") or {}).get(keys.RAY_CLUSTER_LABEL)
        if kind != "DELETED" or not cluster:
            return
        with self.changed:
            job = self.job_of_cluster.get(str(cluster))
            if job is not None and "running" in self.marks.get(job, {}) and not self.pods.get(str(cluster)):
                self._mark(job, "gone", time.monotonic())  # its last Ray pod left: its node is free

    def deleted(self, job: str) -> None:
        with self.changed:
            self._mark(job, "deleted", time.monotonic())

    def snapshot(self) -> tuple[dict[str, dict[str, float]], dict[str, str], int]:
        with self.changed:
            return ({n: dict(m) for n, m in self.marks.items()}, dict(self.failed),
                    sum(1 for v in self.nodes.values() if "deleted" not in v))


def _kueue_reason(obj: JSON) -> str:
    """Why Kueue gave up on a Workload: its rejected admission check's message, else its Evicted condition's."""
    status = obj.get("status") or {}
    for check in status.get("admissionChecks") or []:
        if check.get("state") == "Rejected":
            return f"admission check {check.get('name')} Rejected: {check.get('message')}"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Evicted" and cond.get("status") == "True":
            return f"Evicted ({cond.get('reason')}): {cond.get('message')}"
    return "(no reason given)"


# --- the figures (pure) ----------------------------------------------------------------------------------

def started_order(names: Sequence[str], marks: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The jobs that ran, in the order they started running (ties: creation order)."""
    ran = [n for n in names if "running" in marks.get(n, {})]
    return sorted(ran, key=lambda n: (marks[n]["running"], names.index(n)))


def pairs_out_of_order(names: Sequence[str], marks: Mapping[str, Mapping[str, float]]) -> int:
    """Of the pairs i < j in creation order, how many ran j before i; a job that never ran runs after every job
    that did (two that never ran are not a pair out of order)."""
    running = [marks.get(n, {}).get("running", math.inf) for n in names]
    return sum(1 for i in range(len(names)) for j in range(i + 1, len(names)) if running[j] < running[i])


def passed_by(names: Sequence[str], marks: Mapping[str, Mapping[str, float]]) -> dict[str, int]:
    """For each job, how many jobs created after it started running before it."""
    running = [marks.get(n, {}).get("running", math.inf) for n in names]
    return {n: sum(1 for j in range(i + 1, len(names)) if running[j] < running[i]) for i, n in enumerate(names)}


def merge(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(span: tuple[float, float], window: Sequence[tuple[float, float]]) -> float:
    """Seconds of `span` inside the (disjoint) intervals of `window`."""
    return sum(max(0.0, min(span[1], b) - max(span[0], a)) for a, b in window)


def busy_at_once(spans: Sequence[tuple[float, float]], k: int) -> float:
    """Seconds during which at least `k` of the spans were open at once."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    total, open_now, since = 0.0, 0, 0.0
    for t, step in events:
        if open_now >= k:
            total += t - since
        open_now += step
        since = t
    return total


def figures(names: Sequence[str], marks: Mapping[str, Mapping[str, float]],
            nodes: Mapping[str, Mapping[str, float]], end: float, nodes_max: int) -> dict[str, Any]:
    """Everything the tables show, from the marks (seconds from the first create) and the GPU nodes seen.

    A job waits from its create until it runs, is given up (Failed) or the run ends; it uses a GPU node from all
    its pods Running until the benchmark deletes it. A GPU node is available from the moment it exists until it
    is deleted. Both are counted only while at least one job waits."""
    waits = {n: marks[n]["running"] - marks[n]["created"] for n in names if {"created", "running"} <= set(marks[n])}
    window = merge([(m["created"], min([m[k] for k in WAITING_ENDS if k in m], default=end))
                    for m in (marks[n] for n in names) if "created" in m])
    waiting_s = sum(b - a for a, b in window)
    used = sum(overlap((m["running"], m.get("deleted", end)), window) for m in marks.values() if "running" in m)
    available = sum(overlap((v["added"], v.get("deleted", end)), window) for v in nodes.values() if "added" in v)
    ran = [marks[n]["running"] for n in names if "running" in marks[n]]
    spans = [(m["running"], m.get("deleted", end)) for m in marks.values() if "running" in m]
    n = len(names)
    return {
        "order": started_order(names, marks),
        "never_ran": [x for x in names if "running" not in marks[x]],
        "pairs": n * (n - 1) // 2,
        "pairs_out_of_order": pairs_out_of_order(names, marks),
        "passed_by": passed_by(names, marks),
        "waits_s": {k: round(v, 2) for k, v in waits.items()},
        "wait": common.summary(list(waits.values())),
        "waiting_s": round(waiting_s, 2),
        "gpu_node_seconds_used": round(used, 1),
        "gpu_node_seconds_available": round(available, 1),
        "gpu_node_seconds_at_group_max": round(nodes_max * waiting_s, 1),
        "all_nodes_busy_s": round(busy_at_once(spans, nodes_max), 2),  # the group's max of jobs running at once
        "makespan_s": round(max(ran), 2) if len(ran) == n else math.nan,  # first create -> last Running
        "end_s": round(end, 2),
        "gpu_nodes_added": len(nodes),
        "gpu_nodes_removed": sum(1 for v in nodes.values() if "deleted" in v),
    }


# --- one side on one stack -------------------------------------------------------------------------------

def run_one(side: str, plan: Plan) -> dict[str, Any]:
    from raygate.devenv.capacity import GPU_RESOURCE, Layout, start_capacity
    from raygate.devenv.controlplane import free_port
    from raygate.kube.client import Kube

    layout = Layout(cpu_nodes=2, cpu_node_cpu=64, gpu_nodes_max=plan.nodes_max,
                    metrics_address=f"127.0.0.1:{free_port()}")
    quota = {**KUEUE_AMPLE, GPU_RESOURCE: str(plan.nodes_max * layout.gpus_per_node)}
    names = plan.names()
    holds = plan.holds()
    with common.control_plane(kuberay=True) as cp:
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        start_capacity(cp, state, layout)
        settings = e2e_bench.setup_side(cp, side, config=plan.raygate_config, namespace=NAMESPACE, quota=quota,
                                        strategy=KUEUE_STRATEGY)
        tracker = ScarceTracker(set(names))
        watches = e2e_bench.start_watches(cp, tracker, side, NAMESPACE)
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=4)
        e2e_bench._wait_autoscaler_loops(layout.metrics_address, 2, 120)
        load_before = common.loadavg()
        t0, timed_out = drive(kube, tracker, side, plan, names, holds)
        end = time.monotonic()
        for w in watches:
            w.stop()
    marks, failed, _ = tracker.snapshot()
    rel = {name: {k: round(v - t0, 3) for k, v in m.items()} for name, m in marks.items()}
    with tracker.changed:
        nodes = {name: {k: round(v - t0, 3) for k, v in m.items()} for name, m in tracker.nodes.items()}
        requests = {name: sorted(r) for name, r in tracker.requests_of.items()}
    return {
        "side": side, "plan": {**asdict(plan), "holds_s": holds}, "settings": settings, "layout": asdict(layout),
        "autoscaler_args": layout.autoscaler_args(), "kueue_quota": quota if side == "kueue" else None,
        "timed_out": timed_out, "marks": rel, "gpu_nodes": nodes, "requests_per_job": requests,
        "jobs_with_more_than_one_request": sum(1 for r in requests.values() if len(r) > 1),
        "failed": failed, **figures(names, rel, nodes, end - t0, plan.nodes_max),
        "loadavg_before": load_before, "loadavg_after": common.loadavg(),
    }


def drive(kube: Any, tracker: ScarceTracker, side: str, plan: Plan, names: Sequence[str],
          holds: Mapping[str, float]) -> tuple[float, bool]:
    """Create the jobs in order, `plan.interval_s` apart, and delete each `holds[job]` seconds after all its pods
    Run; until every job is deleted or Failed. Return the first create's time and whether the run timed out."""
    t0 = time.monotonic()
    todo = list(names)
    deadline, last_report = t0 + plan.timeout_s, t0
    while True:
        now = time.monotonic()
        while todo and t0 + plan.interval_s * (len(names) - len(todo)) <= now:
            name = todo.pop(0)
            kube.create(RAYJOBS, e2e_bench.rayjob(name, side, NAMESPACE), NAMESPACE)
            tracker.created(name)
        marks, failed, nodes_now = tracker.snapshot()
        for name in names:
            m = marks[name]
            if "running" in m and "deleted" not in m and now >= m["running"] + holds[name]:
                kube.delete(RAYJOBS, name, NAMESPACE)
                tracker.deleted(name)
        if not todo and all("deleted" in marks[n] or n in failed for n in names):
            return t0, False
        if now > deadline:
            print(f"bench: gave up after {plan.timeout_s:.0f}s", flush=True)
            return t0, True
        if now - last_report > 15:
            last_report = now
            counts = {k: sum(1 for m in marks.values() if k in m) for k in ("created", "running", "deleted")}
            print(f"bench:   {now - t0:.0f}s: {counts['created']} created, {counts['running']} ran, "
                  f"{counts['deleted']} deleted, {len(failed)} Failed; {nodes_now} GPU nodes", flush=True)
        with tracker.changed:
            tracker.changed.wait(0.2)


# --- report -------------------------------------------------------------------------------------------------

def _col(r: Mapping[str, Any]) -> str:
    return f"{TITLES[r['side']]} (round {r['round']})" if r.get("rounds", 1) > 1 else TITLES[r["side"]]


def _s(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.1f} s"


def summary_table(runs: Sequence[Mapping[str, Any]]) -> str:
    rows: list[list[str]] = []

    def row(label: str, cell: Any) -> None:
        rows.append([label, *[cell(r) for r in runs]])

    row("jobs Running (of created)", lambda r: f"{len(r['order'])} / {len(r['marks'])}")
    row("jobs Failed", lambda r: str(len(r["failed"])))
    row("pairs out of order", lambda r: f"{r['pairs_out_of_order']} of {r['pairs']}")
    row("wait (create -> all Running) p50", lambda r: _s(r["wait"]["p50"]))
    row("wait p99", lambda r: _s(r["wait"]["p99"]))
    row("wait max", lambda r: _s(r["wait"]["max"]))
    row("makespan (first create -> last Running)", lambda r: _s(r["makespan_s"]))
    row("time at least one job waits", lambda r: _s(r["waiting_s"]))
    row("  GPU node-s used by running jobs", lambda r: f"{r['gpu_node_seconds_used']:,.0f}")
    row("  GPU node-s available (nodes that exist)", lambda r: f"{r['gpu_node_seconds_available']:,.0f}")
    row("  used / available", lambda r: _ratio(r["gpu_node_seconds_used"], r["gpu_node_seconds_available"]))
    row("  GPU node-s at the group's max", lambda r: f"{r['gpu_node_seconds_at_group_max']:,.0f}")
    row(f"time {runs[0]['plan']['nodes_max']} jobs ran at once (the group's max)", lambda r: _s(r["all_nodes_busy_s"]))
    row("GPU nodes added / removed", lambda r: f"{r['gpu_nodes_added']} / {r['gpu_nodes_removed']}")
    # Under raygate's queue a job asks again with a new request each time capacity frees while it waits (the front
    # first), so a job may have many: that is the queue taking turns, not a retry.
    row("jobs with more than one request (a retry, or asking again in a queue)",
        lambda r: str(r["jobs_with_more_than_one_request"]))
    plan = runs[0]["plan"]
    lo, hi = plan["hold_s"]
    return common.table(["measure", *[_col(r) for r in runs]], rows,
                        f"Scarce capacity: {plan['jobs']} one-node GPU RayJobs, {plan['interval_s']:g} s apart, each "
                        f"deleted {lo:g}-{hi:g} s after it runs, GPU node group of max {plan['nodes_max']}")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.0%}" if b else "n/a"


def order_text(runs: Sequence[Mapping[str, Any]]) -> str:
    lines = ["The order jobs started running (all Ray pods Running):"]
    for r in runs:
        never = f"; never ran: {' '.join(r['never_ran'])}" if r["never_ran"] else ""
        lines.append(f"- {_col(r)}: {' '.join(r['order'])}{never}")
    return "\n".join(lines)


def jobs_table(runs: Sequence[Mapping[str, Any]]) -> str:
    names = list(runs[0]["plan"]["holds_s"])
    headers = ["job", "holds s"]
    for r in runs:
        headers += [f"{_col(r)}: wait s", "ran as", "passed by", "requests"]
    rows = []
    for name in names:
        row = [name, f"{runs[0]['plan']['holds_s'][name]:.1f}"]
        for r in runs:
            wait = r["waits_s"].get(name)
            row += ["n/a" if wait is None else f"{wait:.1f}",
                    str(r["order"].index(name) + 1) if name in r["order"] else "-",
                    str(r["passed_by"][name]), str(len(r["requests_per_job"].get(name, [])))]
        rows.append(row)
    return common.table(headers, rows, "Each job: its wait, its place in the order run, how many jobs created after "
                                       "it ran before it, ProvisioningRequests made for it")


def failures_text(runs: Sequence[Mapping[str, Any]]) -> str:
    lines = ["Jobs that ended Failed:"]
    for r in runs:
        if not r["failed"] and not r["timed_out"]:
            lines.append(f"- {_col(r)}: none")
        for job, reason in sorted(r["failed"].items()):
            lines.append(f"- {_col(r)}: {job}: {reason}")
        if r["timed_out"]:
            lines.append(f"- {_col(r)}: the run timed out after {r['plan']['timeout_s']:.0f} s")
    return "\n".join(lines)


QUOTA_NOTE = ("Kueue's ClusterQueue is StrictFIFO with GPU quota for what the node group holds at most (cpu and "
              "memory ample): Kueue's own queue decides which jobs ask the autoscaler, and at most that many ask at "
              "once. raygate has no quota: its queue (issue 30; raygate-config queues, --scarce-raygate-config) "
              "decides, in order of priority then creation, BestEffortFIFO by default: the front asks, and the jobs "
              "behind it try one at a time only once the ones ahead were answered \"not now\"; when capacity frees, "
              "those behind withdraw their requests and the front asks again first.")
DIFFERENCES = (*(d for d in e2e_bench.DIFFERENCES if not d.startswith("Kueue reserves quota")), QUOTA_NOTE)


def settings_text(runs: Sequence[Mapping[str, Any]]) -> str:
    r = runs[0]
    plan = r["plan"]
    lines = ["How each side ran (everything else is the same: the stack, the node group, the jobs, their hold times, "
             "the watches):",
             f"- raygate-config ({plan['raygate_config_source']}): " + " ".join(plan["raygate_config"].split())]
    for run in runs:
        if run["side"] == "kueue":
            lines.append(f"- Kueue: ClusterQueue queueingStrategy {KUEUE_STRATEGY}, quota "
                         + ", ".join(f"{k} {v}" for k, v in run["kueue_quota"].items())
                         + f"; admission check {keys.BEST_EFFORT_ATOMIC_CLASS} on nvidia.com/gpu pod sets")
            break
    lines.append(f"- cluster-autoscaler (both): {' '.join(r['autoscaler_args'])}")
    lines.append(f"- GPU node group: 0 to {plan['nodes_max']} nodes of {r['layout']['gpus_per_node']} GPUs; each job "
                 f"a head (0.5 CPU) and {e2e_bench.WORKERS} workers of {e2e_bench.GPUS_PER_WORKER} GPUs; jobs "
                 f"created {plan['interval_s']:g} s apart; hold times seeded ({plan['seed']})")
    lines.append("Differences and why:")
    if plan["raygate_config"] != e2e_bench.RAYGATE_CONFIG:
        lines.append(f"- raygate ran with {plan['raygate_config_source']} (above): where it sets them, its settings "
                     "replace raygate's defaults named below.")
    lines += [f"- {d}" for d in DIFFERENCES]
    return "\n".join(lines)


def load_plan(args: argparse.Namespace) -> Plan:
    """The plan from the command line; `--scarce-raygate-config FILE` replaces raygate-config on the raygate
    side (checked here as raygate would check it, so a config it refuses stops the benchmark at once)."""
    from raygate.core.config import parse_config
    from raygate.core.policy import ConfigError

    config, source = Plan.raygate_config, Plan.raygate_config_source
    if args.scarce_raygate_config:
        path = Path(args.scarce_raygate_config)
        config, source = path.read_text(), str(path)
        try:
            parse_config(config)
        except ConfigError as err:
            raise BenchError(f"--scarce-raygate-config {path}: raygate refuses it: {err}") from None
    lo, hi = args.scarce_hold
    return Plan(jobs=args.scarce_jobs, nodes_max=args.scarce_nodes_max, interval_s=args.scarce_interval,
                hold_s=(lo, hi), seed=args.scarce_seed, timeout_s=args.scarce_timeout, raygate_config=config,
                raygate_config_source=source)


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    plan = load_plan(args)
    report: JSON = {"benchmark": "scarce", "started": common.now_iso(), "machine": common.machine_info()}
    logging.getLogger("raygate").setLevel(logging.ERROR)  # our watches complain when a stack stops
    sides = [s for s in SIDES if s in args.scarce_sides]
    print(f"bench: scarce: {plan.jobs} one-node GPU RayJobs on a node group of max {plan.nodes_max}, "
          f"{args.scarce_rounds} round(s) of {', '.join(sides)}; load average {report['machine']['loadavg_at_start']}",
          flush=True)
    runs: list[dict[str, Any]] = []
    for rnd in range(args.scarce_rounds):
        for side in sides if rnd % 2 == 0 else list(reversed(sides)):
            print(f"bench: round {rnd + 1}: {TITLES[side]}", flush=True)
            r = run_one(side, plan)
            r.update({"round": rnd + 1, "rounds": args.scarce_rounds})
            runs.append(r)
            print(f"bench:   {len(r['order'])}/{plan.jobs} ran, {r['pairs_out_of_order']} of {r['pairs']} pairs out "
                  f"of order, wait p50 {_s(r['wait']['p50'])} p99 {_s(r['wait']['p99'])}, {len(r['failed'])} Failed; "
                  f"load {r['loadavg_after']}", flush=True)
    report.update({"plan": asdict(plan), "runs": runs, "differences": DIFFERENCES})
    targets = [t for r in runs if r["side"] == "raygate" for t in (
        Target(f"{_col(r)}: pairs out of order (issue 30: a queue)", float(r["pairs_out_of_order"]), "<=", 0,
               "pairs"),
        Target(f"{_col(r)}: jobs Failed while capacity was busy", float(len(r["failed"])), "<=", 0, "jobs"))]
    path = common.write_report("scarce", report, targets, started)
    print()
    print(summary_table(runs))
    print()
    print(order_text(runs))
    print()
    print(jobs_table(runs))
    print()
    print(failures_text(runs))
    print()
    print(settings_text(runs))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0
