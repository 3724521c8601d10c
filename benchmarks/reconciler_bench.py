"""Reconciler benchmark: 1,000 RayJobs at once, through the real webhook and reconciler processes.

Held jobs wait in a queue (raygate.core.queueing): on plentiful capacity only the front has a
ProvisioningRequest out, and the job behind it asks once it is admitted. So the burst is no longer
a pool (every request out at once, all provisioned at once) but a chain of turns.

1. Create N RayJobs (the multi-group GPU sample: head + 3 worker groups, two of them with GPUs) in an
   opted-in namespace, as fast as a pool of client threads can; every create goes through the
   webhook, which labels the job Pending. Phase 1 ends when the reconciler has placed every job in
   its queue (watched): the front labelled Provisioning with its request named in its annotation,
   every other job with its reason ("waiting in queue default behind RayJob ns/x", no request).
2. Play cluster-autoscaler as the queue asks it to: a watch on ProvisioningRequests feeds
   --status-writers threads (8 by default), each setting Accepted=True and Provisioned=True on a
   request (one status-subresource patch) as soon as the watch shows it, as fast as the API server
   answers (far faster than a real autoscaler, whose client sends at most 5 writes/s by default),
   until every job is admitted. Per job: the delay from the moment its request was patched to the
   moment a watch on RayJobs shows `spec.suspend: false`, measured from when the status patch was
   *sent* (which includes the patch's own latency and the watch delivery: an upper bound) and from
   its response; and the queue's hand-off, from the job ahead unsuspended to this job's request
   seen. A job's turn is hand-off + the benchmark's pick-up + Provisioned -> unsuspended; N turns
   one after another are the drain.
3. API writes per admitted job, counted by the API server itself: the delta of
   `apiserver_request_total` for write verbs between a scrape before the creates and one after the
   last job is admitted, minus the writes this benchmark made (known exactly: one create per job and
   one status patch per request it saw). Nothing else writes in that window (KubeRay is not running;
   the webhook writes nothing; kube-controller-manager has nothing to do), and the per-resource
   breakdown shows what was written. Lease renewals and Events count as the reconciler's writes, and
   so do the queue's own: a queued job's "waiting behind" reason, the FrontOfQueue Event.
4. The reconciler's peak RSS: VmHWM from /proc/<pid>/status (summed over its process tree).
5. What the API server can take here: after the flow, 16 client threads write as fast as they can
   for a few seconds, once with status patches of the requests (what the autoscaler writes) and once
   with patches of the jobs (what the reconciler writes; each goes through raygate's validating
   webhook). Writes/s and the cores kube-apiserver and etcd used: the ceiling a pool of requests
   provisioned at once runs into (the queue's chain runs into latency first).
6. Where a job's time went inside the reconciler, from its own metrics scraped at the phase
   boundaries: the wait in its work queue for a worker and the latency of its API requests. With
   the probe's costs per write, a small model says what delay the API server allows: with P status
   patches in flight (the writers, but no more than the requests the queue keeps out at once), the
   server shares its cores among everything in flight, so raygate keeps about P * (job patch cost /
   status patch cost) patches in flight and each job waits about P * (1 + that ratio) /
   (admissions/s) after its status patch is sent.
7. With --profile, py-spy samples the reconciler through both phases (where its CPU goes).
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
import os
import queue
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks import common
from benchmarks.common import BenchError, Target
from benchmarks.samples import rayjob
from raygate.core import keys
from raygate.core.api import CONFIGMAPS, EVENTS, LEASES, RAYJOBS, Resource, provisioning_requests
from raygate.core.conditions import conditions
from raygate.core.objects import JSON, get, metadata
from raygate.kube import discovery
from raygate.kube.client import MERGE_PATCH, ApiError, Kube
from raygate.kube.informer import Informer

NAMESPACE = "bench-jobs"
P99_TARGET_S = 0.25
CREATE_P99_TARGET_S = 5.0
WRITES_TARGET = 6.0
PROBE_SECONDS = 5.0
RSS_TARGET_MB = 200.0
CLIENT_THREADS = 16
CORES = len(os.sched_getaffinity(0))  # what the API server, etcd, raygate and this benchmark share
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"})
_METRIC = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.eE+]+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _kube(kubeconfig: str, pool_size: int) -> Kube:
    from kubernetes import client, config

    conf = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
    return Kube(conf, user_agent="raygate-bench", pool_size=pool_size)


# --- what the watches see --------------------------------------------------------------------------

@dataclass
class QueuePatches:
    """The queue's own patches of raygate's jobs, each seen on a watch as one new version of a job (only raygate
    writes the jobs while they are held): a "waiting in queue" reason written, a request withdrawn
    (Provisioning -> Pending), a job asking again after it was withdrawn. Not locked: callers hold their own."""

    counts: Counter[str] = field(default_factory=Counter)
    _last: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # job -> (resourceVersion, state, reason)
    _asked: set[str] = field(default_factory=set)  # jobs seen Provisioning

    def see(self, obj: JSON) -> None:
        meta = metadata(obj)
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        state = str((meta.get("labels") or {}).get(keys.STATE_LABEL) or "")
        reason = str((meta.get("annotations") or {}).get(keys.REASON_ANNOTATION) or "")
        before = self._last.get(name)
        self._last[name] = (version, state, reason)
        if before is not None and before[0] != version:
            _, was, said = before
            if reason.startswith("waiting in queue ") and reason != said:
                self.counts["'waiting in queue' reason"] += 1
            elif (was, state) == (keys.State.PROVISIONING.value, keys.State.PENDING.value):
                self.counts["request withdrawn"] += 1
            elif state == keys.State.PROVISIONING.value and was != state and name in self._asked:
                self.counts["asks again"] += 1
        if state == keys.State.PROVISIONING.value:
            self._asked.add(name)


@dataclass
class Tracker:
    """First time (time.monotonic) each job reached each milestone, from watch events."""

    names: set[str]
    created: dict[str, float] = field(default_factory=dict)
    placed: dict[str, float] = field(default_factory=dict)  # labelled, with the reconciler's reason: in its queue
    queued: dict[str, float] = field(default_factory=dict)  # its reason said it waits behind another job
    behind: dict[str, set[str]] = field(default_factory=dict)  # the "waiting in queue ... behind X" reasons it had
    request_seen: dict[str, float] = field(default_factory=dict)  # a ProvisioningRequest owned by the job exists
    requests_per_job: dict[str, set[str]] = field(default_factory=dict)
    unsuspended: dict[str, float] = field(default_factory=dict)  # spec.suspend false
    admitted: dict[str, float] = field(default_factory=dict)  # state Admitted
    request_of: dict[str, str] = field(default_factory=dict)  # job -> request named in its annotation
    open_requests: set[str] = field(default_factory=set)  # requests that exist and are not Provisioned
    most_open: int = 0  # the most requests out (not Provisioned) at once, since the last reset
    queue_patches: QueuePatches = field(default_factory=QueuePatches)
    lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def on_job(self, kind: str, obj: JSON) -> None:
        now = time.monotonic()
        meta = metadata(obj)
        name = str(meta.get("name") or "")
        if kind == "DELETED" or name not in self.names:
            return
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        state = labels.get(keys.STATE_LABEL)
        reason = str(annotations.get(keys.REASON_ANNOTATION) or "")
        with self.changed:
            request = annotations.get(keys.REQUEST_ANNOTATION)
            if request:
                self.request_of[name] = str(request)
            # The webhook labels every job Pending as it is created; the reason is the reconciler's.
            if state and reason:
                self.placed.setdefault(name, now)
            if reason.startswith("waiting in queue "):
                self.queued.setdefault(name, now)
                self.behind.setdefault(name, set()).add(reason)
            self.queue_patches.see(obj)
            if (obj.get("spec") or {}).get("suspend") is False:
                self.unsuspended.setdefault(name, now)
            if state == keys.State.ADMITTED.value:
                self.admitted.setdefault(name, now)
            self.changed.notify_all()

    def reset_most_open(self) -> int:
        """The most requests out at once so far; counting starts again from those out now."""
        with self.lock:
            most, self.most_open = self.most_open, len(self.open_requests)
        return most

    def on_request(self, kind: str, obj: JSON) -> str | None:
        """Record a request; the job it books (None: not one of the benchmark's jobs)."""
        now = time.monotonic()
        meta = metadata(obj)
        job = job_of_request(obj, self.names)
        if job is None:
            return None
        name = str(meta.get("name"))
        with self.changed:
            if kind == "DELETED" or provisioned(obj):
                self.open_requests.discard(name)
            else:
                self.open_requests.add(name)
                self.most_open = max(self.most_open, len(self.open_requests))
            if kind != "DELETED":
                self.request_seen.setdefault(job, now)
                self.requests_per_job.setdefault(job, set()).add(name)
            self.changed.notify_all()
        return job

    def wait(self, what: dict[str, float], timeout: float, label: str) -> bool:
        return common.wait_all(self.changed, what, len(self.names), timeout, label)

    def handoffs(self) -> list[float]:
        """The queue's hand-off, per job that asked after another was admitted: from the latest unsuspend
        before its request was seen, to that request."""
        with self.lock:
            done = sorted(self.unsuspended.values())
            asked = list(self.request_seen.values())
        out = []
        for t in asked:
            i = bisect.bisect_right(done, t)
            if i:
                out.append(t - done[i - 1])
        return out


def job_of_request(obj: JSON, names: set[str]) -> str | None:
    """The benchmark's RayJob that owns a request, or None."""
    return next((str(ref.get("name")) for ref in metadata(obj).get("ownerReferences") or []
                 if ref.get("kind") == keys.RAYJOB_KIND and ref.get("name") in names), None)


def provisioned(obj: JSON) -> bool:
    found = conditions(obj).get("Provisioned")
    return found is not None and found.true


# --- the API server's own write count ---------------------------------------------------------------

def scrape_writes(cp: Any) -> Counter[tuple[str, str, str, str]]:
    """apiserver_request_total for write verbs, by (resource, subresource, verb, code)."""
    ctx = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
    ctx.load_cert_chain(str(cp.pki / "admin.crt"), str(cp.pki / "admin.key"))
    with urllib.request.urlopen(f"{cp.server}/metrics", context=ctx, timeout=30) as resp:
        text = resp.read().decode()
    out: Counter[tuple[str, str, str, str]] = Counter()
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        if labels.get("verb") not in WRITE_VERBS or labels.get("dry_run"):
            continue
        group = labels.get("group", "")
        resource = f"{group}/{labels.get('resource', '')}" if group else labels.get("resource", "")
        out[(resource, labels.get("subresource", ""), labels["verb"], labels.get("code", ""))] += int(
            float(m["value"]))
    return out


def _delta(after: Counter[Any], before: Counter[Any]) -> Counter[Any]:
    return Counter({k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0})


# --- the reconciler's own view -----------------------------------------------------------------------

def reconciler_metrics(cp: Any) -> dict[str, dict[str, float]]:
    """The reconciler's latency histograms as {series: {le or "sum"/"count": value}}, from its /metrics
    (its port is in its start-up log line)."""
    from prometheus_client.parser import text_string_to_metric_families

    from raygate.devenv.raygate_local import reconciler_metrics_port

    port = reconciler_metrics_port(cp)
    if port is None:
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("raygate_reconciler_queue_wait_seconds", "raygate_reconciler_api_request_seconds"):
            continue
        for sample in family.samples:
            series = family.name.removeprefix("raygate_reconciler_") + (
                f" {sample.labels['method']}" if "method" in sample.labels else "")
            part = sample.labels.get("le") or sample.name.rsplit("_", 1)[-1]
            if part in ("created", "seconds"):
                continue
            out.setdefault(series, {})[part] = sample.value
    return out


def latency_between(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, JSON]:
    """Per series, for the observations made between two scrapes: count, mean, and the bucket bound
    the 99th percentile falls under."""
    out: dict[str, JSON] = {}
    for series, now in after.items():
        then = before.get(series, {})
        count = now.get("count", 0) - then.get("count", 0)
        if count <= 0:
            continue
        bounds = sorted((float(le), now[le] - then.get(le, 0)) for le in now if le not in ("sum", "count"))
        p99 = next((b for b, n in bounds if n >= 0.99 * count), float("inf"))
        out[series] = {"count": int(count), "mean_s": (now.get("sum", 0) - then.get("sum", 0)) / count,
                       "p99_under_s": p99}
    return out


def predicted_delay(probe: dict[str, Any], writers: int, cores: int = CORES, requests_out: int | None = None) -> JSON:
    """The model in the module docstring, from the probe's control-plane CPU per write. `requests_out`: the most
    requests the queue kept out at once (None: as many as there are writers); no more status patches than that
    are in flight, however many writers wait for them."""
    cost = {k: p["cpu_ms_per_write"].get("kube-apiserver", 0) + p["cpu_ms_per_write"].get("etcd", 0)
            for k, p in probe.items()}
    status, patch, event = cost["request status patch"], cost["job patch by the reconciler"], cost["Event"]
    if not status:
        return {}
    rate = cores * 1000 / (status + patch + event)
    ratio = patch / status
    in_flight = writers if requests_out is None else max(min(writers, requests_out), 1)
    return {"writers": writers, "status_patches_in_flight": in_flight, "job_to_status_cost": ratio,
            "admissions_per_s": rate, "raygate_patches_in_flight": in_flight * ratio,
            "delay_s": in_flight * (1 + ratio) / rate}


# --- the flow ------------------------------------------------------------------------------------

def _provisioned_patch() -> JSON:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [
        {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "raygate benchmark",
         "lastTransitionTime": now},
        {"type": "Provisioned", "status": "True", "reason": "Provisioned",
         "message": "raygate benchmark: capacity is available", "lastTransitionTime": now},
    ]}}


def _pr_resource(kube: Kube) -> Resource:
    if (version := discovery.served_provreq_version(kube)) is not None:
        return provisioning_requests(version)
    raise BenchError("the API server serves no ProvisioningRequest version: are the CRDs installed?")


class Autoscaler:
    """Plays cluster-autoscaler as the queue asks it to: from start() on, `writers` threads set Accepted and
    Provisioned (one status patch) on each request as soon as a watch shows it (offer()); `rate` > 0 spaces the
    patches 1/rate s apart, as a real autoscaler's client does (QPS 5 by default), 0 sends each as fast as the
    API server answers. A request withdrawn before its patch is counted apart."""

    def __init__(self, kube: Kube, pr_res: Resource, namespace: str, writers: int, rate: float = 0.0) -> None:
        self._kube, self._res, self._namespace = kube, pr_res, namespace
        self._writers, self._rate = writers, rate
        self._todo: queue.SimpleQueue[tuple[str, str, float] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._deleted: set[str] = set()
        self._early: list[tuple[str, str, float]] = []  # seen before start()
        self._threads: list[threading.Thread] = []
        self._next_slot = 0.0
        self.started = float("nan")
        self.seen: dict[str, float] = {}  # job -> when the watch showed the request patched for it
        self.sent: dict[str, float] = {}  # job -> when its status patch was sent
        self.returned: dict[str, float] = {}  # job -> when its status patch returned
        self.patches = 0  # status patches sent (the API server counts each, answered 2xx or not)
        self.refused = 0  # of those, answered non-2xx
        self.gone: list[str] = []  # requests deleted before their patch (withdrawn by the queue)
        self.errors: list[str] = []

    def offer(self, job: str, obj: JSON, seen: float) -> None:
        """A request the watch shows (each is patched once; one already Provisioned is left alone)."""
        name = str(metadata(obj).get("name") or "")
        if not name or provisioned(obj):
            return
        with self._lock:
            if name in self._known:
                return
            self._known.add(name)
            if not self._threads:
                self._early.append((job, name, seen))
                return
        self._todo.put((job, name, seen))

    def forget(self, obj: JSON) -> None:
        """A request deleted (withdrawn by the queue): not to be patched if it was not yet."""
        with self._lock:
            self._deleted.add(str(metadata(obj).get("name") or ""))

    def start(self) -> float:
        """The writers start, with the requests seen so far first; returns when."""
        with self._lock:
            self.started = time.monotonic()
            self._threads = [threading.Thread(target=self._run, name=f"autoscaler-{i}", daemon=True)
                             for i in range(self._writers)]
            early, self._early = self._early, []
        for item in early:
            self._todo.put(item)
        for t in self._threads:
            t.start()
        return self.started

    def stop(self) -> None:
        for _ in self._threads:
            self._todo.put(None)
        for t in self._threads:
            t.join(timeout=30)

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            job, name, seen = item
            with self._lock:
                if name in self._deleted:
                    self.gone.append(name)
                    continue
            if self._rate:
                with self._lock:
                    slot = max(time.monotonic(), self._next_slot)
                    self._next_slot = slot + 1 / self._rate
                time.sleep(max(slot - time.monotonic(), 0))
            t0 = time.monotonic()
            try:
                self._kube.patch(self._res, name, _provisioned_patch(), self._namespace,
                                 content_type=MERGE_PATCH, sub="status")
            except ApiError as err:
                with self._lock:
                    self.patches += 1
                    self.refused += 1
                    (self.gone if err.not_found else self.errors).append(name if err.not_found else str(err))
                continue
            with self._lock:
                self.patches += 1
                # Seen before start(): its pick-up counts from the start.
                self.seen[job], self.sent[job], self.returned[job] = max(seen, self.started), t0, time.monotonic()


def _wait_leader(kube: Kube, pid: int, timeout: float = 60) -> str:
    """The reconciler takes its Lease before acting; return its holder (or a note if none appeared)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not common.alive(pid):
            raise BenchError("the reconciler exited during start-up (see its log in the control-plane workdir)")
        try:
            lease = kube.get(LEASES, keys.LEADER_LEASE, keys.SYSTEM_NAMESPACE)
            holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
            if holder:
                return holder
        except ApiError as err:
            if not err.not_found:
                raise
        time.sleep(0.2)
    return f"no Lease {keys.SYSTEM_NAMESPACE}/{keys.LEADER_LEASE} after {timeout:.0f}s"


def _cpu_by_process(cp: Any) -> dict[str, float]:
    """CPU seconds used so far by each control-plane and raygate process (with its children) and this one."""
    state = cp.load_state()
    out = {name: common.cpu_seconds(common.process_tree(pid)) for name, pid in (state.pids if state else {}).items()}
    out["benchmark (this process)"] = common.cpu_seconds([os.getpid()])
    return out


def _delays(start: dict[str, float], end: dict[str, float]) -> list[float]:
    return [end[k] - start[k] for k in start if k in end]


def probe_writes(cp: Any, write: Callable[[int], Any], seconds: float = PROBE_SECONDS) -> dict[str, Any]:
    """Call `write(n)` as fast as CLIENT_THREADS threads can for `seconds`; writes/s and the CPU each
    process used meanwhile (per write, CPU time is a fair measure even when other work shares the cores)."""
    stop = time.monotonic() + seconds
    counts = [0] * CLIENT_THREADS
    errors: list[str] = []

    def writer(i: int) -> None:
        n = i
        while time.monotonic() < stop:
            try:
                write(n)
            except ApiError as err:
                errors.append(str(err))
            counts[i] += 1
            n += CLIENT_THREADS

    cpu0 = _cpu_by_process(cp)
    t0 = time.monotonic()
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(writer, range(CLIENT_THREADS)))
    elapsed = time.monotonic() - t0
    cpu1 = _cpu_by_process(cp)
    total = max(sum(counts), 1)
    return {"writes_per_s": sum(counts) / elapsed, "writes": sum(counts), "seconds": elapsed, "errors": len(errors),
            "error_sample": errors[:3],
            "cores_by_process": {n: round((cpu1[n] - cpu0.get(n, 0)) / elapsed, 2) for n in cpu1},
            "cpu_ms_per_write": {n: round((cpu1[n] - cpu0.get(n, 0)) * 1000 / total, 2) for n in cpu1}}


def api_server_probe(cp: Any, kube: Kube, pr_res: Resource, requests: list[str], jobs: list[str]) -> dict[str, Any]:
    """Each kind of write an admission takes, alone: the autoscaler's status patch, raygate's job patch
    (as the reconciler, whose writes skip the validating webhook by its matchConditions; and as any
    other user, through the webhook) and an Event."""
    from raygate.devenv.raygate_local import RECONCILER_USER

    reconciler = _kube(str(cp.kubeconfig), CLIENT_THREADS * 2)
    reconciler.impersonate = RECONCILER_USER
    # What sets a RayJob patch apart: the same write to a built-in object of the same size.
    size = len(orjson.dumps(kube.get(RAYJOBS, jobs[0], NAMESPACE)))
    maps = [f"probe-{i}" for i in range(CLIENT_THREADS)]
    for name in maps:
        kube.create(CONFIGMAPS, {"metadata": {"name": name}, "data": {"payload": "x" * size}}, NAMESPACE)

    def annotate(client: Kube) -> Callable[[int], Any]:
        def write(n: int) -> Any:
            body = {"metadata": {"annotations": {"bench.raygate.io/probe": str(n)}}}
            return client.patch(RAYJOBS, jobs[n % len(jobs)], body, NAMESPACE, content_type=MERGE_PATCH)
        return write

    return {
        "request status patch": probe_writes(cp, lambda n: kube.patch(
            pr_res, requests[n % len(requests)], _provisioned_patch(), NAMESPACE, content_type=MERGE_PATCH,
            sub="status")),
        "job patch by the reconciler": probe_writes(cp, annotate(reconciler)),
        "Event": probe_writes(cp, lambda n: kube.create(EVENTS, {
            "metadata": {"name": f"probe-{n}", "namespace": NAMESPACE},
            "involvedObject": {"kind": "RayJob", "name": jobs[n % len(jobs)], "namespace": NAMESPACE},
            "reason": "Probe", "message": "benchmark probe", "type": "Normal"}, NAMESPACE)),
        "job patch by others (through the webhook)": probe_writes(cp, annotate(kube)),
        "ConfigMap patch (a built-in kind, as large as a RayJob)": probe_writes(cp, lambda n: kube.patch(
            CONFIGMAPS, maps[n % len(maps)], {"metadata": {"annotations": {"bench.raygate.io/probe": str(n)}}},
            NAMESPACE, content_type=MERGE_PATCH)),
    }


class Profiler:
    """py-spy sampling one process (and its children) into collapsed stacks; stop() writes them."""

    def __init__(self, pid: int, out: Any) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.out = out
        self.proc = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
                                      "--output", str(out), "--nonblocking"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = "py-spy did not stop"
        if not Path(self.out).exists():
            return {"error": (err or "no output")[-500:]}
        return summarize_profile(Path(self.out).read_text())


def _frame(text: str) -> str:
    """`function (path/to/file.py:line)` -> `function (file.py)`."""
    name, _, where = text.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].rsplit('/', 1)[-1].rstrip(')')})" if where else name


def summarize_profile(text: str, top: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the share of samples in which each function is on the stack
    (inclusive) and on top (self), for raygate's own code and the libraries it calls."""
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [_frame(f) for f in stack.split(";") if f]
        for f in set(frames[1:]):  # the first frame is the thread
            inclusive[f] += count
        if len(frames) > 1:
            own[frames[-1]] += count

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / total, 1)) for f, n in c.most_common(top)] if total else []

    return {"samples": total, "inclusive_pct": share(inclusive), "self_pct": share(own)}


@dataclass(frozen=True)
class Boundary:
    """What the benchmark reads at a phase boundary: API writes, the reconciler's histograms, CPU."""

    at: float
    writes: Counter[tuple[str, str, str, str]]
    inside: dict[str, dict[str, float]]
    cpu: dict[str, float]

    @classmethod
    def now(cls, cp: Any) -> Boundary:
        writes, inside = scrape_writes(cp), reconciler_metrics(cp)
        return cls(time.monotonic(), writes, inside, _cpu_by_process(cp))


class RssSampler:
    """The reconciler's resident memory (its whole process tree), every half second until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append(sum(common.status_kb(p, "VmRSS") for p in common.process_tree(self.pid)))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(timeout=5)
        return {"max": max(self.samples, default=0) / 1024, "last": (self.samples[-1] if self.samples else 0) / 1024}


def _start_raygate(cp: Any, kube: Kube, reconciler_args: tuple[str, ...]) -> tuple[int, str]:
    """The webhook and the reconciler, in the benchmark's opted-in namespace: (reconciler pid, Lease holder)."""
    common.start_raygate(cp, None, (NAMESPACE,), reconciler=reconciler_args)
    state = cp.load_state()
    if state is None or "raygate-reconciler" not in state.pids:
        raise BenchError("the reconciler was not started")
    rec_pid = int(state.pids["raygate-reconciler"])
    leader = _wait_leader(kube, rec_pid)
    print(f"bench: reconciler pid {rec_pid}, lease holder: {leader}", flush=True)
    return rec_pid, leader


def _watch(cp: Any, tracker: Tracker, autoscaler: Autoscaler, pr_res: Resource,
           lease_updates: list[float]) -> list[Informer]:
    """The benchmark's own watches: jobs feed `tracker`, requests `tracker` and `autoscaler`, raygate's Lease
    renewals `lease_updates`."""

    def on_request(kind: str, obj: JSON) -> None:
        job = tracker.on_request(kind, obj)
        if job is not None and kind == "DELETED":
            autoscaler.forget(obj)
        elif job is not None:
            autoscaler.offer(job, obj, time.monotonic())

    def on_lease(kind: str, obj: JSON) -> None:
        meta = metadata(obj)
        if kind in {"ADDED", "MODIFIED"} and (meta.get("namespace"), meta.get("name")) == (
                keys.SYSTEM_NAMESPACE, keys.LEADER_LEASE):
            lease_updates.append(time.monotonic())

    watches = [
        Informer(_kube(str(cp.kubeconfig), 2), RAYJOBS, namespace=NAMESPACE, handler=tracker.on_job,
                 resync_seconds=3600).start(),
        Informer(_kube(str(cp.kubeconfig), 2), pr_res, namespace=NAMESPACE, handler=on_request,
                 resync_seconds=3600).start(),
        Informer(_kube(str(cp.kubeconfig), 2), LEASES, namespace=keys.SYSTEM_NAMESPACE, handler=on_lease,
                 resync_seconds=3600).start(),
    ]
    if not all(w.wait_synced(30) for w in watches):
        raise BenchError("the benchmark's own watches did not sync")
    return watches


def _create_all(kube: Kube, tracker: Tracker, names: list[str]) -> tuple[float, float]:
    """Phase 1: every job created at once; (start, end) of the creates."""

    def create(obj: JSON) -> None:
        kube.create(RAYJOBS, obj, NAMESPACE)
        with tracker.changed:
            tracker.created[obj["metadata"]["name"]] = time.monotonic()

    t_create = time.monotonic()
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(create, [rayjob(n, NAMESPACE) for n in names]))
    t_created = time.monotonic()
    print(f"bench: created {len(names)} RayJobs in {t_created - t_create:.1f}s", flush=True)
    return t_create, t_created


def run_flow(cp: Any, jobs: int, timeout: float, status_writers: int, reconciler_args: tuple[str, ...] = (),
             profile: bool = False) -> dict[str, Any]:
    kube = _kube(str(cp.kubeconfig), CLIENT_THREADS * 2)
    pr_res = _pr_resource(kube)
    rec_pid, leader = _start_raygate(cp, kube, reconciler_args)
    names = [f"job-{i:04d}" for i in range(jobs)]
    tracker = Tracker(set(names))
    autoscaler = Autoscaler(_kube(str(cp.kubeconfig), status_writers * 2), pr_res, NAMESPACE, status_writers)
    lease_updates: list[float] = []
    watches = _watch(cp, tracker, autoscaler, pr_res, lease_updates)
    warm = common.wait_admitting(kube, NAMESPACE, rayjob("warm-up", NAMESPACE))
    print(f"bench: the webhook answered a dry-run create {warm:.1f}s after the benchmark first asked", flush=True)
    b0 = Boundary.now(cp)
    rss = RssSampler(rec_pid)
    profiler = Profiler(rec_pid, common.OUT_DIR / "reconciler-profile-phase1.txt") if profile else None
    profiles: dict[str, Any] = {}

    # Phase 1: the burst, until the reconciler has placed every job in its queue (the front asks; the rest wait).
    t_create, t_created = _create_all(kube, tracker, names)
    all_placed = tracker.wait(tracker.placed, timeout, "placed in their queue")
    t_placed = max(tracker.placed.values(), default=float("nan"))
    time.sleep(2)  # let trailing phase-1 writes (Events) land before the phase boundary scrape
    b1 = Boundary.now(cp)
    most_out_phase1 = tracker.reset_most_open()
    with tracker.lock:
        asking_at_boundary = len(tracker.open_requests)
        queued_at_boundary = len(tracker.queued)
    if profiler:
        profiles["phase1"] = profiler.stop()
        profiler = Profiler(rec_pid, common.OUT_DIR / "reconciler-profile-phase2.txt")

    # Phase 2: the benchmark plays the autoscaler, provisioning each request as it appears, until all are admitted.
    t_patch = autoscaler.start()
    print(f"bench: provisioning requests as they appear ({status_writers} writers)", flush=True)
    all_unsuspended = tracker.wait(tracker.unsuspended, timeout, "unsuspended")
    t_unsuspended = max(tracker.unsuspended.values(), default=float("nan"))
    tracker.wait(tracker.admitted, 10 if all_unsuspended else 1, "labelled Admitted")
    time.sleep(3)  # trailing writes (Events, annotations) of the last admissions
    autoscaler.stop()
    b2 = Boundary.now(cp)
    print(f"bench: {len(tracker.unsuspended)} of {jobs} unsuspended {t_unsuspended - t_patch:.1f}s after the first "
          f"request was provisioned; {autoscaler.patches} status patches", flush=True)
    if profiler:
        profiles["phase2"] = profiler.stop()
    rss_mb = rss.stop()
    hwm_kb = sum(common.status_kb(p, "VmHWM") for p in common.process_tree(rec_pid))
    alive = common.alive(rec_pid)
    for watch in watches:
        watch.stop()
    lease_writes = (sum(1 for t in lease_updates if b0.at <= t < b1.at),
                    sum(1 for t in lease_updates if b1.at <= t < b2.at))
    bench_writes: Counter[str] = Counter({"ray.io/rayjobs POST": jobs,
                                          f"{keys.PROVREQ_GROUP}/{pr_res.plural}/status PATCH": autoscaler.patches})
    sent, returned = autoscaler.sent, autoscaler.returned

    # Check what the reconciler left, from a fresh list (not only the watch).
    listed = kube.list(RAYJOBS, NAMESPACE).get("items") or []
    requests = kube.list(pr_res, NAMESPACE).get("items") or []
    check = _check_jobs(listed, requests)
    events = kube.list(EVENTS, NAMESPACE).get("items") or []
    front_events = sum(1 for e in events if e.get("reason") == "FrontOfQueue")
    # The ceiling: how many writes/s the API server takes here, with nothing else going on.
    probe = api_server_probe(cp, kube, pr_res, sorted(metadata(r)["name"] for r in requests), names)
    turns = [sent[j] - autoscaler.seen[j] for j in sent]
    behind = [len(tracker.behind.get(n, ())) for n in names if n in tracker.queued]

    return {
        "jobs": jobs,
        "shape": "RayJob: head (4 CPU) + trainer 4x8 GPU + evaluator 2x1 GPU + dataloader 4 CPU pods; "
                 "2 GPU pod sets per job",
        "provisioning_request_version": pr_res.version,
        "reconciler_leader": leader,
        "create_seconds": t_created - t_create,
        "creates_per_s": jobs / (t_created - t_create),
        "all_placed": all_placed,
        "seconds_until_all_placed": t_placed - t_create,
        "placed_after_create_s": common.summary(_delays(tracker.created, tracker.placed)),
        "requests_out_at_phase_boundary": asking_at_boundary,
        "queued_at_phase_boundary": queued_at_boundary,
        "jobs_queued_behind_another": len(tracker.queued),
        "behind_reasons_per_queued_job": common.summary([float(n) for n in behind]),
        "most_requests_out_at_once": tracker.most_open,  # phase 2: while jobs were being admitted
        "most_requests_out_at_once_phase1": most_out_phase1,
        "queue_patches_of_jobs": dict(tracker.queue_patches.counts),
        "front_of_queue_events": front_events,
        "jobs_with_request": len(tracker.request_seen),
        "request_after_create_s": common.summary(_delays(tracker.created, tracker.request_seen)),
        "status_patches": autoscaler.patches,
        "requests_gone_before_patch": len(autoscaler.gone),
        "status_patch_errors": autoscaler.errors[:5],
        "all_unsuspended": all_unsuspended,
        "seconds_from_first_patch_to_last_unsuspend": t_unsuspended - t_patch,
        "jobs_unsuspended": len(tracker.unsuspended),
        "delay_from_patch_sent_s": common.summary(_delays(sent, tracker.unsuspended)),
        "delay_from_patch_returned_s": common.summary(_delays(returned, tracker.unsuspended)),
        "handoff_s": common.summary(tracker.handoffs()),
        "request_seen_to_patch_sent_s": common.summary(turns),
        "writes_by_resource": _writes_table((_delta(b1.writes, b0.writes), _delta(b2.writes, b1.writes)),
                                            bench_writes, lease_writes),
        "bench_writes": dict(bench_writes),
        "reconciler_peak_rss_mb": hwm_kb / 1024,
        "reconciler_rss_samples_mb": rss_mb,
        "reconciler_alive_at_end": alive,
        "check": check,
        "cpu_seconds_by_process": {
            name: {"phase1": round(b1.cpu.get(name, 0) - b0.cpu.get(name, 0), 2),
                   "phase2": round(b2.cpu.get(name, 0) - b1.cpu.get(name, 0), 2)} for name in b2.cpu},
        "phase_seconds": {"phase1": b1.at - b0.at, "phase2": b2.at - b1.at},
        "api_server_probe": probe,
        "inside_reconciler": {"phase1": latency_between(b0.inside, b1.inside),
                              "phase2": latency_between(b1.inside, b2.inside)},
        "model": predicted_delay(probe, status_writers, requests_out=tracker.most_open),
        "model_pool": predicted_delay(probe, status_writers),
        "profiles": profiles,
    }


# Resources (and verbs) only raygate writes in this setup; the benchmark's own writes are subtracted.
RAYGATE_WRITES = ("ray.io/rayjobs", "ray.io/rayclusters", "podtemplates", "events", "events.k8s.io/events",
                  "autoscaling.x-k8s.io/provisioningrequests", "scheduling.volcano.sh/podgroups")


def _writes_table(deltas: tuple[Counter[Any], Counter[Any]], bench: Counter[str],
                  raygate_lease_writes: tuple[int, int]) -> list[JSON]:
    """Per resource and verb: writes per phase, and who made them. The leases row is split by a
    watch on raygate's own Lease (kube-apiserver renews its identity Lease in the same resource)."""
    rows: dict[tuple[str, str], JSON] = {}
    for i, delta in enumerate(deltas):
        for (resource, subresource, verb, code), n in delta.items():
            key = (f"{resource}{'/' + subresource if subresource else ''}", verb)
            row = rows.setdefault(key, {"resource": key[0], "verb": verb, "phase1": 0, "phase2": 0, "non_2xx": 0})
            row[f"phase{i + 1}"] += n
            if not code.startswith("2"):
                row["non_2xx"] += n
    for row in rows.values():
        row["total"] = total = row["phase1"] + row["phase2"]
        row["by_benchmark"] = mine = min(bench.get(f"{row['resource']} {row['verb']}", 0), total)
        if row["resource"] == "coordination.k8s.io/leases":
            row["by_raygate"] = min(sum(raygate_lease_writes), total)
        elif row["resource"] in RAYGATE_WRITES:
            row["by_raygate"] = total - mine
        else:
            row["by_raygate"] = 0
        row["by_others"] = total - mine - row["by_raygate"]
    return sorted(rows.values(), key=lambda r: (-r["by_raygate"], r["resource"]))


def _n(count: int, noun: str, plural: str = "s") -> str:
    return f"{count:,} {noun}{'' if count == 1 else plural}"


def probe_table(probe: dict[str, Any], flow: JSON) -> str:
    rows = []
    for what, p in probe.items():
        ms, cores = p["cpu_ms_per_write"], p["cores_by_process"]
        rows.append([what, f"{p['writes_per_s']:.0f}", f"{ms.get('kube-apiserver', 0):.1f}", f"{ms.get('etcd', 0):.1f}",
                     f"{ms.get('raygate-webhook', 0):.1f}", f"{cores.get('kube-apiserver', 0):.2f}"])
    apiserver = {k: p["cpu_ms_per_write"].get("kube-apiserver", 0) + p["cpu_ms_per_write"].get("etcd", 0)
                 + p["cpu_ms_per_write"].get("raygate-webhook", 0) for k, p in probe.items()}
    per_admission = sum(apiserver[k] for k in ("request status patch", "job patch by the reconciler", "Event"))
    ceiling = CORES * 1000 / per_admission if per_admission else float("nan")
    jobs, drain = flow["jobs"], flow["seconds_from_first_patch_to_last_unsuspend"]
    rate = flow["jobs_unsuspended"] / drain if drain > 0 else float("nan")
    text = common.table(
        ["write (16 threads, each kind alone)", "per s", "apiserver CPU ms", "etcd CPU ms", "webhook CPU ms",
         "apiserver cores"], rows, "What the API server takes here")
    if per_admission:
        text += (
            f"\nOne admission costs the control plane {per_admission:.1f} ms of CPU (status patch + the reconciler's "
            f"job patch + Event; apiserver + etcd):\non {CORES} cores and nothing else running, at most {ceiling:.0f} "
            f"admissions/s; a pool of {jobs:,} requests provisioned at once would need {jobs / ceiling:.1f} s at the "
            f"least.\nThe queue kept at most {_n(flow['most_requests_out_at_once'], 'request')} out at once: "
            f"{flow['jobs_unsuspended']:,} jobs were admitted one after another in {drain:.1f} s ({rate:.0f}/s, "
            f"{100 * rate / ceiling:.0f} % of that ceiling); each job asks only once the one ahead is Provisioned, so "
            "the latency of a turn, not the API server's CPU, sets the pace.")
    return text


def inside_table(flow: JSON) -> str:
    """Queue wait and API latency per phase from the reconciler's metrics, then the model's figure."""
    rows = []
    for phase, label in (("phase1", "creates"), ("phase2", "Provisioned")):
        for series, s in sorted(flow["inside_reconciler"][phase].items()):
            rows.append([label, series, f"{s['count']:,}", f"{s['mean_s'] * 1000:.0f}",
                         f"<= {s['p99_under_s'] * 1000:.0f}" if s["p99_under_s"] != float("inf") else "> 30000"])
    text = common.table(["phase", "what (reconciler metrics)", "count", "mean ms", "p99 ms"], rows,
                        "Where a job's time went inside the reconciler")
    m = flow.get("model") or {}
    if m:
        d = flow["delay_from_patch_sent_s"]
        pool = flow.get("model_pool") or {}
        n = m["status_patches_in_flight"]
        text += (
            f"\nThe API server's wall: {m['writers']} writer{'s' if m['writers'] != 1 else ''} set Provisioned, but "
            f"the queue kept at most {_n(flow['most_requests_out_at_once'], 'request')} out at once, so "
            f"{_n(n, 'status patch', 'es')} in flight; a job patch costs {m['job_to_status_cost']:.1f}x a status "
            f"patch, so raygate holds about {m['raygate_patches_in_flight']:.1f} patches in flight and each job waits "
            f"about {m['delay_s'] * 1000:.0f} ms at {m['admissions_per_s']:.0f} admissions/s (measured: mean "
            f"{d['mean'] * 1000:.0f} ms, p99 {d['p99'] * 1000:.0f} ms).\n"
            f"The delay grows in step with the status patches in flight: a p99 of {P99_TARGET_S * 1000:.0f} ms allows "
            f"about {n * P99_TARGET_S / d['p99']:.1f} at once here")
        if pool:
            text += (f" (a pool of requests all out at once, provisioned by {pool['writers']} writers, would wait "
                     f"about {pool['delay_s'] * 1000:.0f} ms)")
        text += "; cluster-autoscaler's own client sends at most 5 writes/s by default (QPS 5, burst 10)."
    return text


def _check_jobs(jobs: list[JSON], requests: list[JSON]) -> JSON:
    """Every job Admitted, unsuspended, consume annotations on its GPU templates, one request each."""
    per_job: Counter[str] = Counter()
    for pr in requests:
        for ref in metadata(pr).get("ownerReferences") or []:
            if ref.get("kind") == keys.RAYJOB_KIND:
                per_job[str(ref.get("name"))] += 1
    admitted = unsuspended = annotated = 0
    for job in jobs:
        meta = metadata(job)
        spec = job.get("spec") or {}
        admitted += (meta.get("labels") or {}).get(keys.STATE_LABEL) == keys.State.ADMITTED.value
        unsuspended += spec.get("suspend") is False
        groups = ((spec.get("rayClusterSpec") or {}).get("workerGroupSpecs")) or []
        gpu = [g for g in groups if g.get("rayStartParams", {}).get("num-gpus")]
        request = (meta.get("annotations") or {}).get(keys.REQUEST_ANNOTATION)
        annotated += bool(gpu) and all(
            get(g, ("template", "metadata", "annotations", keys.CONSUME_ANNOTATION))
            == request for g in gpu)
    return {"jobs": len(jobs), "admitted": admitted, "unsuspended": unsuspended,
            "consume_annotations_ok": annotated, "requests": len(requests),
            "jobs_with_more_than_one_request": sum(1 for n in per_job.values() if n > 1)}


# --- report --------------------------------------------------------------------------------------

def split_writes(ok: Mapping[str, int], refused: int, queue_patches: Mapping[str, int], front_events: int,
                 admitted: int) -> dict[str, Any]:
    """raygate's writes for its jobs (Lease renewals apart) by what they were for. `ok`: those the API server took,
    by "resource verb"; `refused`: those it answered non-2xx (a patch whose `test` failed, an Event that already
    existed). The queue's own: the job patches a watch saw it make (QueuePatches), its FrontOfQueue Events, requests
    withdrawn and made again. The admission: the rest (per job, before the queue: 2 PodTemplates, the request, the
    Provisioning patch, the admitting patch and its Event)."""
    pr = f"{keys.PROVREQ_GROUP}/provisioningrequests"
    queue = {**queue_patches, "FrontOfQueue Event": front_events, "request deleted": ok.get(f"{pr} DELETE", 0),
             "request made again": max(ok.get(f"{pr} POST", 0) - admitted, 0)}
    total = sum(ok.values()) + refused
    return {"total": total, "queue": sum(queue.values()), "queue_by_what": {k: v for k, v in queue.items() if v},
            "refused": refused, "admission": total - sum(queue.values()) - refused}


def writes_of_flow(flow: JSON) -> dict[str, Any]:
    rows = [r for r in flow["writes_by_resource"] if r["by_raygate"] and not r["resource"].endswith("/leases")]
    return split_writes({f"{r['resource']} {r['verb']}": r["by_raygate"] - r["non_2xx"] for r in rows},
                        sum(r["non_2xx"] for r in rows), flow["queue_patches_of_jobs"], flow["front_of_queue_events"],
                        flow["check"]["admitted"])


def main(args: Any) -> int:
    t0 = time.monotonic()
    report: JSON = {"benchmark": "reconciler", "started": common.now_iso(), "machine": common.machine_info()}
    print(f"bench: reconciler: load average {report['machine']['loadavg_at_start']}", flush=True)
    logging.getLogger("raygate").setLevel(logging.ERROR)  # our watches complain when the control plane stops
    with common.control_plane() as cp:
        extra = ("--workers", str(args.reconciler_workers)) if args.reconciler_workers else ()
        flow = run_flow(cp, args.jobs, args.timeout, args.status_writers, extra, profile=args.profile)
        flow["reconciler_args"] = list(extra)
    report["flow"] = flow
    jobs = flow["jobs"]
    admitted = flow["check"]["admitted"]
    raygate_writes = sum(r["by_raygate"] for r in flow["writes_by_resource"])
    # Lease renewals are the leader's heartbeat: they grow with time, not with jobs (the same number
    # would be written with no job at all), so the per-job figure leaves them out and shows them apart.
    lease_writes = sum(r["by_raygate"] for r in flow["writes_by_resource"] if r["resource"].endswith("/leases"))
    job_writes = raygate_writes - lease_writes
    writes_per_job = job_writes / admitted if admitted else float("nan")
    nan = float("nan")
    split = writes_of_flow(flow)
    per = admitted or nan
    delay = flow["delay_from_patch_sent_s"]
    complete = flow["all_unsuspended"]
    targets = [
        Target(f"Provisioned -> unsuspended p99 ({jobs:,} jobs)", delay["p99"] if complete else nan, "<=",
               P99_TARGET_S, "s"),
        # Under the queue only the front asks at once: a job's request waits for every admission ahead of it, so
        # create -> request is no target any more (docs/benchmarks.md); what the burst must not slow is the
        # reconciler placing every job in its queue.
        Target(f"create -> placed in its queue p99 ({jobs:,} jobs)", flow["placed_after_create_s"]["p99"]
               if flow["all_placed"] else nan, "<=", CREATE_P99_TARGET_S, "s"),
        # The queue's own writes (a "waiting in queue" reason, a FrontOfQueue Event, withdrawals) come on top of
        # the admission's: the target stays on the admission, and the total is printed beside it.
        Target("API writes per admitted job for the admission (the queue's own, refused and Lease renewals apart)",
               split["admission"] / per, "<=", WRITES_TARGET, "writes"),
        Target("reconciler peak RSS (VmHWM)", flow["reconciler_peak_rss_mb"] or nan, "<=", RSS_TARGET_MB, "MB"),
    ]
    report["raygate_writes"] = raygate_writes
    report["raygate_lease_writes"] = lease_writes
    report["writes_per_admitted_job"] = writes_per_job
    report["writes_by_what"] = split
    report["admission_writes_per_admitted_job"] = split["admission"] / per
    report["queue_writes_per_admitted_job"] = split["queue"] / per
    report["writes_per_admitted_job_with_leases"] = raygate_writes / admitted if admitted else float("nan")
    path = common.write_report("reconciler", report, targets, t0)

    print()
    placed, req = flow["placed_after_create_s"], flow["request_after_create_s"]
    hand, pick = flow["handoff_s"], flow["request_seen_to_patch_sent_s"]
    rows: list[list[Any]] = [
        ["RayJobs created at once", f"{jobs:,}", f"in {flow['create_seconds']:.1f} s ({flow['creates_per_s']:.0f}/s)"],
        ["until every job is placed in its queue", f"{flow['seconds_until_all_placed']:.1f} s",
         f"from the first create; then {_n(flow['requests_out_at_phase_boundary'], 'request')} out, "
         f"{flow['queued_at_phase_boundary']:,} jobs waiting behind another"],
        ["create -> placed, p50 / p99", f"{placed['p50']:.2f} / {placed['p99']:.2f} s",
         "per job: labelled, with the reconciler's reason"],
        ["create -> request, p50 / p99", f"{req['p50']:.2f} / {req['p99']:.2f} s",
         f"per job, its wait for its turn included; {flow['jobs_with_request']:,} of {jobs:,} asked"],
        ["most requests out at once", f"{flow['most_requests_out_at_once']}",
         f"{flow['status_patches']:,} status patches by {flow['model']['writers'] if flow['model'] else '?'} "
         f"writers as each request appeared; {flow['requests_gone_before_patch']} withdrawn first"],
        ["'waiting behind' reasons per queued job", f"mean {flow['behind_reasons_per_queued_job']['mean']:.2f}",
         f"max {flow['behind_reasons_per_queued_job']['max']:.0f}; {flow['jobs_queued_behind_another']:,} jobs "
         "waited behind another"],
        ["hand-off: job ahead unsuspended -> request",
         f"p50 {hand['p50'] * 1000:.0f} ms, p99 {hand['p99'] * 1000:.0f} ms",
         f"max {hand['max'] * 1000:.0f} ms; the queue moving on"],
        ["request seen -> status patch sent", f"p50 {pick['p50'] * 1000:.0f} ms, p99 {pick['p99'] * 1000:.0f} ms",
         "the benchmark's own pick-up"],
    ]
    for label, key in (("from patch sent", "delay_from_patch_sent_s"), ("from patch returned",
                                                                         "delay_from_patch_returned_s")):
        s = flow[key]
        rows.append([f"Provisioned -> unsuspended, {label}",
                     f"p50 {s['p50'] * 1000:.0f} ms, p99 {s['p99'] * 1000:.0f} ms",
                     f"max {s['max'] * 1000:.0f} ms; {flow['jobs_unsuspended']:,} of {jobs:,} unsuspended"])
    c = flow["check"]
    drain = flow["seconds_from_first_patch_to_last_unsuspend"]
    rows.append(["first request provisioned -> last job unsuspended", f"{drain:.1f} s",
                 f"{flow['jobs_unsuspended'] / drain:.1f} admissions/s, a turn every "
                 f"{drain / flow['jobs_unsuspended'] * 1000:.0f} ms" if drain > 0 and flow["jobs_unsuspended"] else ""])
    events = sum(r["by_raygate"] for r in flow["writes_by_resource"] if r["resource"].endswith("events"))
    rows += [
        ["API writes by raygate for the jobs", f"{job_writes:,}", f"{writes_per_job:.2f} per admitted job "
         f"({(job_writes - events) / per:.2f} without Events)"],
        ["  for the admission itself", f"{split['admission']:,}", f"{split['admission'] / per:.2f} per admitted job"],
        ["  the queue's own", f"{split['queue']:,}", f"{split['queue'] / per:.2f} per admitted job: "
         + ", ".join(f"{n} {what}" for what, n in split["queue_by_what"].items())],
        ["  refused by the API server (non-2xx)", f"{split['refused']:,}", f"{split['refused'] / per:.2f} per "
         "admitted job: a patch whose test failed, an Event that existed"],
        ["  + its Lease renewals", f"{lease_writes:,}", f"{raygate_writes / per:.2f} per admitted job with them"],
        ["reconciler peak RSS (VmHWM)", f"{flow['reconciler_peak_rss_mb']:.0f} MB",
         f"alive at end: {flow['reconciler_alive_at_end']}"],
        ["final state", f"{c['admitted']:,} Admitted",
         f"{c['unsuspended']:,} unsuspended, {c['consume_annotations_ok']:,} with consume annotations, "
         f"{c['requests']:,} requests, {c['jobs_with_more_than_one_request']} jobs with >1 request"],
    ]
    print(common.table(["measure", "value", "note"], rows,
                       f"Reconciler: {jobs:,} RayJobs at once, admitted in their queue's turn (webhook + reconciler "
                       "as processes on a local control plane)"))
    print()
    phases = flow["phase_seconds"]
    print(common.table(
        ["process", "phase 1 CPU s", "cores", "phase 2 CPU s", "cores"],
        [[name, c["phase1"], c["phase1"] / phases["phase1"], c["phase2"], c["phase2"] / phases["phase2"]]
         for name, c in sorted(flow["cpu_seconds_by_process"].items(), key=lambda kv: -sum(kv[1].values()))],
        f"Where the CPU went (phase 1: creates until every job is placed in its queue, {phases['phase1']:.0f} s; "
        f"phase 2: requests provisioned as they appear until all admitted, {phases['phase2']:.0f} s)",
    ))
    print()
    print(common.table(
        ["resource", "verb", "phase 1", "phase 2", "total", "by benchmark", "by raygate", "by others", "non-2xx"],
        [[r["resource"], r["verb"], str(r["phase1"]), str(r["phase2"]), str(r["total"]), str(r["by_benchmark"]),
          str(r["by_raygate"]), str(r["by_others"]), str(r["non_2xx"])] for r in flow["writes_by_resource"]],
        "API writes counted by kube-apiserver (apiserver_request_total deltas)",
    ))
    print()
    print(probe_table(flow["api_server_probe"], flow))
    print()
    print(inside_table(flow))
    for phase, prof in flow["profiles"].items():
        if prof.get("samples"):
            print()
            print(common.table(["function (file)", "% of samples on stack", "function (file)", "% on top"],
                               [[a[0], f"{a[1]:.1f}", b[0], f"{b[1]:.1f}"] for a, b in
                                zip(prof["inclusive_pct"], prof["self_pct"], strict=False)],
                               f"Reconciler profile, {phase} (py-spy, {prof['samples']:,} samples of busy threads)"))
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0
