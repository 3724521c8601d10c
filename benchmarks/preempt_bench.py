"""Preemption (issue 31): a high-priority RayJob arrives while a low-priority one holds the only GPU node.

The e2e benchmark's stack (kube-apiserver, etcd, kube-controller-manager, kube-scheduler, KWOK nodes, the real
cluster-autoscaler with its kwok provider and ProvisioningRequests, the KubeRay operator) with one GPU node group of
at most one 4-GPU node, and raygate (`provisioning` mode, best-effort-atomic). Every job is a RayJob whose one
worker needs the whole node. In each arm a low-priority job runs; then a job of the same shape whose
ray.io/priority-class-name names a PriorityClass of value 1000 is created, and the benchmark times it from that
create to every one of its Ray pods Running. Two arms, on the same stack and raygate, one after the other, each in
a namespace of its own mapped to a queue of its own in one raygate-config:

- preempt: the queue says `preemption: LowerPriority, minRunSeconds: 0`: raygate suspends the low job for the high
  one. Also timed: the high create -> the low job suspended, and, once the high job is deleted, the low job's way
  back (deleted -> every pod of the low job Running again); and whether the low job's Events say Preempted.
- never: the queue says `preemption: Never`: the low job "runs N seconds" (the benchmark deletes it
  `--preempt-low-seconds` after the high create), then the high one runs.

Rounds (`--preempt-rounds`) run both arms, taking turns which goes first; the table shows the median and each round.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks import common, e2e_bench
from benchmarks.common import BenchError, Target
from raygate.core import keys
from raygate.core.api import EVENTS, PODS, RAYCLUSTERS, RAYJOBS
from raygate.core.objects import JSON, metadata

PREEMPT, NEVER = "preempt", "never"
ARMS = (PREEMPT, NEVER)
ARM_TITLES = {PREEMPT: "LowerPriority", NEVER: "Never"}  # what each arm's queue says of preemption
NAMESPACES = {PREEMPT: "bench-preempt", NEVER: "bench-preempt-never"}
QUEUES = {PREEMPT: "preempting", NEVER: "never"}
HIGH_CLASS = "raygate-bench-high"
HIGH_PRIORITY = 1000
LOW, HIGH = "low", "high"
PODS_PER_JOB = 2  # the head and the one worker (the submitter's pod is not waited for)
RAYGATE_CONFIG = f"""\
queues:
  {QUEUES[PREEMPT]}: {{preemption: LowerPriority, minRunSeconds: 0}}
  {QUEUES[NEVER]}: {{preemption: Never}}
defaults:
  mode: provisioning
  queue: {QUEUES[NEVER]}
  provisioning:
    className: {keys.BEST_EFFORT_ATOMIC_CLASS}
namespaces:
  {NAMESPACES[PREEMPT]}: {{queue: {QUEUES[PREEMPT]}}}
  {NAMESPACES[NEVER]}: {{queue: {QUEUES[NEVER]}}}
"""
LOG_TAIL_LINES = 30  # of the reconciler's log, kept with a run in which something never happened


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    low_seconds: float = 60.0  # arm `never`: the low job is deleted this long after the high create
    timeout_s: float = 600.0  # give up waiting for one thing after this long


def rayjob(name: str, namespace: str, priority_class: str | None = None) -> JSON:
    """The e2e benchmark's RayJob with one worker that needs the whole 4-GPU node."""
    from raygate.devenv.capacity import Layout

    job = e2e_bench.rayjob(name, "raygate", namespace, workers=1, gpus_per_worker=Layout.gpus_per_node)
    if priority_class:
        job["metadata"]["labels"][keys.RAY_PRIORITY_CLASS_LABEL] = priority_class
    return job


# --- what the watches see ---------------------------------------------------------------------------------

@dataclass
class Tracker:
    """Per job (namespace/name), every change the watches saw, in order, as (time.monotonic, what): `running` when
    all its Ray pods turn bound and Running, `stopped` when they no longer all are, `suspended` and `unsuspended`
    as its spec.suspend turns; and its uid (each round's jobs have the names of the last round's)."""

    namespaces: set[str]
    events: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    job_of_cluster: dict[str, str] = field(default_factory=dict)
    pods: dict[str, dict[str, bool]] = field(default_factory=dict)  # cluster -> pod -> bound and Running
    changed: threading.Condition = field(default_factory=threading.Condition)

    def _note(self, job: str, what: str, when: float) -> None:
        self.events.setdefault(job, []).append((when, what))
        self.changed.notify_all()

    def _last(self, job: str, kinds: tuple[str, str]) -> str | None:
        return next((w for _, w in reversed(self.events.get(job, [])) if w in kinds), None)

    def on_job(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        meta = metadata(obj)
        if kind == "DELETED" or meta.get("namespace") not in self.namespaces:
            return
        job = f"{meta.get('namespace')}/{meta.get('name')}"
        state = "suspended" if (obj.get("spec") or {}).get("suspend") is True else "unsuspended"
        with self.changed:
            self.uids[job] = str(meta.get("uid"))
            if self._last(job, ("suspended", "unsuspended")) != state:
                self._note(job, state, now)

    def on_cluster(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        meta = metadata(obj)
        job = (meta.get("labels") or {}).get(keys.ORIGINATED_FROM_NAME_LABEL)
        if kind == "DELETED" or job is None or meta.get("namespace") not in self.namespaces:
            return
        cluster = f"{meta.get('namespace')}/{meta.get('name')}"
        with self.changed:
            self.job_of_cluster[cluster] = f"{meta.get('namespace')}/{job}"
            self._update(cluster, now)

    def on_pod(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        meta = metadata(obj)
        labels = meta.get("labels") or {}
        if meta.get("namespace") not in self.namespaces or keys.RAY_NODE_TYPE_LABEL not in labels:
            return
        cluster = f"{meta.get('namespace')}/{labels.get(keys.RAY_CLUSTER_LABEL)}"
        with self.changed:
            pods = self.pods.setdefault(cluster, {})
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                pods.pop(str(meta.get("name")), None)
            else:
                pods[str(meta.get("name"))] = bool((obj.get("spec") or {}).get("nodeName")) and (
                    (obj.get("status") or {}).get("phase") == "Running")
            self._update(cluster, now)

    def _update(self, cluster: str, now: float) -> None:
        job = self.job_of_cluster.get(cluster)
        if job is None:
            return
        running = any(len(pods) >= PODS_PER_JOB and all(pods.values())
                      for c, pods in self.pods.items() if self.job_of_cluster.get(c) == job)
        last = self._last(job, ("running", "stopped"))
        if running and last != "running":
            self._note(job, "running", now)
        elif not running and last == "running":
            self._note(job, "stopped", now)

    def marked(self, job: str, what: str) -> None:
        """Something the benchmark did (created, deleted), at this moment."""
        with self.changed:
            self._note(job, what, time.monotonic())

    def wait(self, job: str, what: str, after: float, timeout: float) -> float | None:
        """The first moment at or after `after` at which `job` did `what`; None once `timeout` passed."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while (found := first(self.events.get(job, []), what, after)) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(min(left, 1.0))
        return found

    def snapshot(self) -> tuple[dict[str, list[tuple[float, str]]], set[str]]:
        """Every job's timeline, and the uids of the jobs seen."""
        with self.changed:
            return {job: list(events) for job, events in self.events.items()}, set(self.uids.values())


# --- the figures (pure) -------------------------------------------------------------------------------------

def first(events: Sequence[tuple[float, str]], what: str, after: float = -math.inf) -> float | None:
    """The first moment at or after `after` at which `what` happened."""
    return next((t for t, w in events if w == what and t >= after), None)


def between(events: Sequence[tuple[float, str]], what: str, start: float, end: float) -> list[float]:
    """Every moment in [start, end) at which `what` happened."""
    return [t for t, w in events if w == what and start <= t < end]


def _since(a: float | None, b: float | None) -> float:
    return round(b - a, 3) if a is not None and b is not None else math.nan


def arm_figures(arm: str, low: Sequence[tuple[float, str]], high: Sequence[tuple[float, str]],
                preempted_events: Mapping[str, str]) -> dict[str, Any]:
    """One arm's figures from the two jobs' timelines (seconds; NaN for what never happened) and the Events with
    reason Preempted in its namespace (the job each is on -> its message)."""
    created = first(high, "created")
    low_ran = first(low, "running")
    high_ran = first(high, "running", created or 0.0)
    out: dict[str, Any] = {
        "low_create_to_running_s": _since(first(low, "created"), low_ran),
        "high_create_to_running_s": _since(created, high_ran),
        "high_ran": high_ran is not None,
        "low_preempted_event": LOW in preempted_events,
        "preempted_message": preempted_events.get(LOW, ""),
        "other_preempted_events": sorted(set(preempted_events) - {LOW}),
    }
    if arm == PREEMPT:
        suspended = first(low, "suspended", created or 0.0)
        gone = first(low, "stopped", suspended) if suspended is not None else None
        high_deleted = first(high, "deleted")
        back = first(low, "running", high_deleted) if high_deleted is not None else None
        out.update({
            "high_create_to_low_suspended_s": _since(created, suspended),
            "low_suspended_to_its_pods_gone_s": _since(suspended, gone),  # KubeRay deletes its cluster
            "low_pods_gone_to_high_running_s": _since(gone, high_ran),
            "high_deleted_to_low_running_again_s": _since(high_deleted, back),
            "low_ran_again": back is not None,
        })
    else:
        low_deleted = first(low, "deleted")
        end = low_deleted if low_deleted is not None else math.inf
        out.update({
            "low_deleted_after_s": _since(created, low_deleted),
            "low_deleted_to_high_running_s": _since(low_deleted, high_ran),
            # Until the benchmark deleted it, the low job was neither suspended nor stopped.
            "low_ran_until_deleted": created is not None and not (
                between(low, "suspended", created, end) or between(low, "stopped", created, end)),
        })
    return out


# One table row per figure: (arm, label, key, how a round's value is shown). Durations take their median.
ROWS: tuple[tuple[str, str, str, str], ...] = (
    (PREEMPT, "low create -> every low pod Running", "low_create_to_running_s", "s"),
    (PREEMPT, "high create -> every high pod Running", "high_create_to_running_s", "s"),
    (PREEMPT, "high create -> low suspended (preempted)", "high_create_to_low_suspended_s", "s"),
    (PREEMPT, "low suspended -> its Ray pods gone (KubeRay)", "low_suspended_to_its_pods_gone_s", "s"),
    (PREEMPT, "low's pods gone -> every high pod Running", "low_pods_gone_to_high_running_s", "s"),
    (PREEMPT, "high deleted -> every low pod Running again", "high_deleted_to_low_running_again_s", "s"),
    (PREEMPT, "low's Events say Preempted", "low_preempted_event", "yes"),
    (PREEMPT, "low ran again once high was gone", "low_ran_again", "yes"),
    (NEVER, "low create -> every low pod Running", "low_create_to_running_s", "s"),
    (NEVER, "high create -> every high pod Running", "high_create_to_running_s", "s"),
    (NEVER, "high create -> low deleted (by the benchmark)", "low_deleted_after_s", "s"),
    (NEVER, "low deleted -> every high pod Running", "low_deleted_to_high_running_s", "s"),
    (NEVER, "low ran on until deleted (not suspended)", "low_ran_until_deleted", "yes"),
    (NEVER, "low's Events say Preempted", "low_preempted_event", "yes"),
)


def _median(values: Sequence[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return statistics.median(clean) if clean else math.nan


def _shown(value: Any, how: str) -> str:
    if how == "yes":
        return "yes" if value else "no"
    return "n/a" if math.isnan(value) else f"{value:.1f} s"


def rounds_saying(rounds: Sequence[Mapping[str, Mapping[str, Any]]], arm: str, key: str) -> int:
    """How many rounds the yes/no figure `key` of `arm` was yes."""
    return sum(1 for r in rounds if (r.get(arm) or {}).get(key))


def summary(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm and figure: the median of the durations over rounds (NaN where none happened), and for a yes/no
    figure how many rounds said yes."""
    out: dict[str, dict[str, Any]] = {arm: {} for arm in ARMS}
    for arm, _, key, how in ROWS:
        out[arm][key] = (rounds_saying(rounds, arm, key) if how == "yes"
                         else _median([r[arm][key] for r in rounds if arm in r]))
    return out


def summary_table(rounds: Sequence[Mapping[str, Mapping[str, Any]]], plan: Plan) -> str:
    med = summary(rounds)
    headers = ["arm", "measure", "median", *[f"round {i + 1}" for i in range(len(rounds))]]
    rows = []
    for arm, label, key, how in ROWS:
        middle = f"{med[arm][key]} of {len(rounds)}" if how == "yes" else _shown(med[arm][key], how)
        rows.append([ARM_TITLES[arm], label, middle, *[_shown(r[arm][key], how) if arm in r else "-" for r in rounds]])
    return common.table(headers, rows, f"Preemption: a high-priority RayJob for the only GPU node, held by a "
                                       f"low-priority one ({plan.rounds} round{'s' * (plan.rounds != 1)}; Never: "
                                       f"low deleted {plan.low_seconds:g} s after the high create)")


def messages_text(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> str:
    lines = ["The low job's Preempted Event (arm LowerPriority), and anything that never happened:"]
    for i, r in enumerate(rounds, 1):
        for arm in ARMS:
            if arm not in r:
                continue
            a = r[arm]
            if a.get("preempted_message"):
                lines.append(f"- round {i}, {ARM_TITLES[arm]}: {a['preempted_message']}")
            if a.get("gave_up"):
                lines.append(f"- round {i}, {ARM_TITLES[arm]}: gave up waiting for {a['gave_up']} (the reconciler's "
                             f"last log lines: the JSON's runs[{i - 1}].{arm}.reconciler_log_tail)")
    return "\n".join(lines)


# --- one round's arm on the stack ---------------------------------------------------------------------------

class GaveUp(Exception):
    """Something the arm waits for did not happen in time: the arm ends, the figures say what did."""


def run_arm(kube: Any, tracker: Tracker, arm: str, plan: Plan) -> str | None:
    """Low runs, high arrives; then the arm's course (module docstring). Returns what was waited for in vain."""
    ns = NAMESPACES[arm]
    low, high = f"{ns}/{LOW}", f"{ns}/{HIGH}"

    def create(job: str, name: str, priority_class: str | None = None) -> float:
        kube.create(RAYJOBS, rayjob(name, ns, priority_class), ns)
        tracker.marked(job, "created")
        return time.monotonic()

    def delete(job: str, name: str) -> float:
        kube.delete(RAYJOBS, name, ns)
        tracker.marked(job, "deleted")
        return time.monotonic()

    def wait(job: str, what: str, after: float, label: str) -> float:
        found = tracker.wait(job, what, after, plan.timeout_s)
        if found is None:
            raise GaveUp(label)
        return found

    try:
        wait(low, "running", create(low, LOW), "the low job to run")
        t0 = create(high, HIGH, HIGH_CLASS)
        if arm == PREEMPT:
            wait(high, "running", t0, "the high job to run (the low one preempted)")
            wait(low, "running", delete(high, HIGH), "the low job to run again once the high one was gone")
        else:
            time.sleep(max(0.0, t0 + plan.low_seconds - time.monotonic()))
            delete(low, LOW)
            wait(high, "running", t0, "the high job to run once the low one was deleted")
    except GaveUp as err:
        return str(err)
    return None


def clean(kube: Any, ns: str, timeout: float) -> None:
    """Delete every RayJob of `ns`; return once they, their Ray pods and their ProvisioningRequests are gone."""
    from raygate.core.api import provisioning_requests

    for job in kube.list(RAYJOBS, ns).get("items") or []:
        kube.delete(RAYJOBS, job["metadata"]["name"], ns)

    def gone() -> bool:
        return not any(kube.list(res, ns).get("items")
                       for res in (RAYJOBS, RAYCLUSTERS, PODS, provisioning_requests("v1")))

    common.until(gone, timeout, f"the jobs of {ns}, their pods and requests to be gone", 0.5)


def preempted_events(kube: Any, ns: str, uids: set[str]) -> dict[str, str]:
    """Events with reason Preempted in `ns` on the objects of these uids (not on an earlier round's job of the same
    name): the object each is on -> its message."""
    return {e["involvedObject"]["name"]: str(e.get("message") or "") for e in kube.list(EVENTS, ns).get("items") or []
            if e.get("reason") == "Preempted" and e["involvedObject"].get("uid") in uids}


def log_tail(cp: Any, name: str, lines: int = LOG_TAIL_LINES) -> list[str]:
    path = cp.logs / f"{name}.log"
    return path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []


def one_arm(cp: Any, kube: Any, tracker: Tracker, arm: str, plan: Plan) -> dict[str, Any]:
    ns = NAMESPACES[arm]
    gave_up = run_arm(kube, tracker, arm, plan)
    events, uids = tracker.snapshot()
    figures = arm_figures(arm, events.get(f"{ns}/{LOW}", []), events.get(f"{ns}/{HIGH}", []),
                          preempted_events(kube, ns, uids))
    t0 = first(events.get(f"{ns}/{HIGH}", []), "created") or 0.0
    timeline = {name: [(round(t - t0, 3), w) for t, w in events.get(f"{ns}/{name}", [])] for name in (LOW, HIGH)}
    result = {**figures, "gave_up": gave_up, "timeline_s": timeline}
    if gave_up:
        result["reconciler_log_tail"] = log_tail(cp, "raygate-reconciler")
        print(f"bench:   {ARM_TITLES[arm]}: gave up waiting for {gave_up}; the reconciler's log ended:\n  "
              + "\n  ".join(result["reconciler_log_tail"]), flush=True)
    clean(kube, ns, plan.timeout_s)
    with tracker.changed:  # a fresh timeline for the next round's jobs of the same names
        for name in (LOW, HIGH):
            tracker.events.pop(f"{ns}/{name}", None)
            tracker.uids.pop(f"{ns}/{name}", None)
    return result


def run(plan: Plan) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every round of both arms on one stack: (the rounds, the settings)."""
    from benchmarks.reconciler_bench import _kube, _wait_leader
    from raygate.devenv.capacity import Layout, start_capacity
    from raygate.devenv.controlplane import free_port
    from raygate.kube.client import Kube
    from raygate.kube.informer import Informer

    layout = Layout(gpu_nodes_max=1, metrics_address=f"127.0.0.1:{free_port()}")
    rounds: list[dict[str, Any]] = []
    with common.control_plane(kuberay=True) as cp:
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        start_capacity(cp, state, layout)
        cp.kubectl("apply", "-f", "-", input_text=priority_class_json())
        common.start_raygate(cp, RAYGATE_CONFIG, tuple(NAMESPACES.values()))
        _wait_leader(_kube(str(cp.kubeconfig), 2), cp.load_state().pids["raygate-reconciler"])
        tracker = Tracker(set(NAMESPACES.values()))
        watches = [Informer(_kube(str(cp.kubeconfig), 2), res, handler=h, resync_seconds=3600)
                   for res, h in ((RAYJOBS, tracker.on_job), (RAYCLUSTERS, tracker.on_cluster), (PODS, tracker.on_pod))]
        for w in watches:
            w.start()
        if not all(w.wait_synced(30) for w in watches):
            raise BenchError("the benchmark's own watches did not sync")
        kube = Kube.connect(str(cp.kubeconfig), user_agent="raygate-bench", pool_size=4)
        e2e_bench._wait_autoscaler_loops(layout.metrics_address, 2, 120)
        for rnd in range(plan.rounds):
            r: dict[str, Any] = {"round": rnd + 1, "loadavg_before": common.loadavg()}
            for arm in ARMS if rnd % 2 == 0 else tuple(reversed(ARMS)):  # neither always has the quieter slot
                print(f"bench: round {rnd + 1}: {ARM_TITLES[arm]}", flush=True)
                r[arm] = one_arm(cp, kube, tracker, arm, plan)
                print(f"bench:   high create -> Running {_shown(r[arm]['high_create_to_running_s'], 's')}; "
                      f"low's Events say Preempted: {_shown(r[arm]['low_preempted_event'], 'yes')}", flush=True)
            r["loadavg_after"] = common.loadavg()
            rounds.append(r)
        for w in watches:
            w.stop()
    settings = {"raygate_config": RAYGATE_CONFIG, "layout": asdict(layout), "autoscaler_args": layout.autoscaler_args(),
                "high_priority_class": {"name": HIGH_CLASS, "value": HIGH_PRIORITY}}
    return rounds, settings


def priority_class_json() -> str:
    import json

    return json.dumps({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": HIGH_CLASS},
                       "value": HIGH_PRIORITY, "description": "the preemption benchmark's high-priority jobs"})


def targets(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> list[Target]:
    """What issue 31 asks, counted over rounds: preempted, with an Event saying so, and back once the high job is
    gone; in a queue that never preempts, nobody is."""
    n = float(len(rounds))
    return [Target(f"{ARM_TITLES[arm]}: rounds {what}", float(rounds_saying(rounds, arm, key)), ">=", n, "rounds")
            for arm, what, key in (
                (PREEMPT, "the high job ran", "high_ran"),
                (PREEMPT, "the low job's Events say Preempted", "low_preempted_event"),
                (PREEMPT, "the low job ran again once the high one was gone", "low_ran_again"),
                (NEVER, "the high job ran", "high_ran"),
                (NEVER, "the low job ran on until deleted", "low_ran_until_deleted"))]


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    plan = Plan(rounds=args.preempt_rounds, low_seconds=args.preempt_low_seconds, timeout_s=args.timeout)
    report: JSON = {"benchmark": "preempt", "started": common.now_iso(), "machine": common.machine_info()}
    logging.getLogger("raygate").setLevel(logging.ERROR)  # our watches complain when the stack stops
    print(f"bench: preempt: {plan.rounds} round(s) of LowerPriority and Never on one stack; load average "
          f"{report['machine']['loadavg_at_start']}", flush=True)
    rounds, settings = run(plan)
    report.update({"plan": asdict(plan), "settings": settings, "runs": rounds, "median": summary(rounds)})
    goals = targets(rounds)
    path = common.write_report("preempt", report, goals, started)
    print()
    print(summary_table(rounds, plan))
    print()
    print(messages_text(rounds))
    print()
    print("raygate-config (one raygate, two namespaces, a queue each): " + " ".join(RAYGATE_CONFIG.split()))
    print()
    print(common.targets_table(goals))
    print(common.report_footer(report, path))
    return 0
