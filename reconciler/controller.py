"""The watch-and-reconcile loop: informers feed a work queue of job keys; workers run the pure
decision on what the caches hold (with the notes that cover their lag, reconciler/view.py) and
apply its plan.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from raygate.core import booking, dra, identity, keys, logs, podgate, preemption, queueing
from raygate.core.api import CLAIM_TEMPLATES, EVENTS, PODS, PRIORITY_CLASSES, RAYCLUSTERS, RAYJOBS, Resource, Served
from raygate.core.booking import settled
from raygate.core.keys import ChildKind
from raygate.core.modes import Prerequisite, all_group_rules, for_object
from raygate.core.names import short_hash
from raygate.core.objects import JSON, Key, PodKey, controller_ref, get, meta_str, metadata, string_map, with_kind
from raygate.core.policy import NamespacePolicy, QueuePolicy
from raygate.core.times import parse_time, timestamp
from raygate.core.workload import Workload
from raygate.kube import discovery
from raygate.kube.client import JSON_PATCH, ApiError, Kube
from raygate.kube.configsource import ConfigSource
from raygate.kube.informer import Informer
from raygate.reconciler import children, decision, metrics
from raygate.reconciler.event_sender import EventSender
from raygate.reconciler.held import prerequisite_to_check
from raygate.reconciler.plan import (
    Action,
    Create,
    Delete,
    Emit,
    Observed,
    Outcome,
    PatchChild,
    PatchJob,
    Plan,
    Preempt,
    Preempting,
    ReleasePod,
    Step,
    delete_all,
    fail,
)
from raygate.reconciler.pods import JOBS, PodIndex
from raygate.reconciler.queues import Placement, QueueIndex, rules_of, running_of, waiting_of
from raygate.reconciler.view import ChildKey, Notes, child_view, slim
from raygate.reconciler.workqueue import BATCH_SECONDS, Backoff, WorkQueue, run_workers

log = logging.getLogger("raygate.reconciler")

POD = "Pod"  # the work queue's kind of key for a gated pod to place (reconciler/pods.py)
JOB_KINDS: dict[str, Resource] = {keys.RAYJOB_KIND: RAYJOBS, keys.RAYCLUSTER_KIND: RAYCLUSTERS}
REQUEUE_SLACK = 0.05  # requeue just after a deadline, not just before it
# Objects per page of a cache's initial list: all caches list at once on start, and a parsed page of
# RayJobs is about 40 KB per job before it is compacted (500 a page: 20 MB at once per cache).
LIST_PAGE = 100


@dataclass(frozen=True)
class Options:
    workers: int = 64
    resync_seconds: float = 300.0
    # A job's pod events (a gang's creates, gate lifts and binds come in bursts) are reconciled this long after the
    # first of a batch; with a max, once its pods are quiet this long, at the latest max after the first.
    pod_batch_seconds: float = BATCH_SECONDS
    pod_batch_max_seconds: float | None = None


class Controller:
    def __init__(self, kube: Kube, config: ConfigSource, options: Options | None = None,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC), served: Served | None = None
                 ) -> None:
        """`served`: what the cluster serves, as discovery found it (asked here when not given)."""
        self.kube = kube
        self.config = config
        self.options = options or Options()
        self.clock = clock
        self.queue: WorkQueue[Key] = WorkQueue(Backoff(base_seconds=0.1, max_seconds=60.0),
                                                  on_wait=metrics.QUEUE_WAIT_SECONDS.observe)
        self.served = served if served is not None else discovery.served(kube)
        self.provreq_version = discovery.served_provreq_version(kube)
        self.child_resources = discovery.child_resources(kube, self.provreq_version, self.served)
        # The group objects of the modes that have them (Volcano PodGroups; Workloads and PodGroups), where served.
        self.group_kinds = {k for r in all_group_rules() for k in r.group_kinds} & set(self.child_resources)
        rs = self.options.resync_seconds
        # Compact caches: ten thousand held jobs and their children fit in tens of MB, not hundreds.
        self.jobs = {kind: Informer(kube, res, label_selector=keys.STATE_LABEL, resync_seconds=rs,
                                    handler=self._job_event(kind), transform=slim, compact=True,
                                    page_size=LIST_PAGE)
                     for kind, res in JOB_KINDS.items()}
        self.children = {kind: Informer(kube, res, label_selector=keys.MANAGED_SELECTOR, resync_seconds=rs,
                                        handler=self._child_event(kind), transform=child_view, compact=True,
                                        page_size=LIST_PAGE)
                         for kind, res in self.child_resources.items()}
        # Pods: which bookings they consume (a request goes only when its pods have), and the gated ones to
        # release against bookings (reconciler/pods.py).
        self.pods = PodIndex(kube, rs, LIST_PAGE, owner_of=self._owner_of,
                             on_change=lambda owner: self.queue.add_batched(owner, self.options.pod_batch_seconds,
                                                                            self.options.pod_batch_max_seconds),
                             on_unowned=lambda pod: self.queue.add(Key(POD, *pod)),
                             on_consumers=self._consumers_changed)
        # DRA claim templates, to count the GPUs pods claim through them (where the cluster serves DRA).
        self.claim_templates = (Informer(kube, CLAIM_TEMPLATES, resync_seconds=rs, transform=dra.template_view,
                                         page_size=LIST_PAGE)
                                if kube.served(keys.DRA_GROUP, keys.DRA_VERSION) else None)
        self.notes = Notes(self.children)
        self._lock = threading.Lock()
        self._cluster_of: dict[tuple[str, str], str] = {}  # (namespace, RayJob) -> KubeRay's RayCluster for it
        self._workers: list[threading.Thread] = []
        # The queues held jobs wait in (reconciler/queues.py), kept from the caches like everything else; the
        # PriorityClasses their order reads.
        self.queues = QueueIndex(on_change=self.queue.add)
        self.priority_classes = Informer(kube, PRIORITY_CLASSES, resync_seconds=rs, transform=_priority_view,
                                         handler=lambda event, obj: self._place_all())
        # What the cluster-autoscaler said of a request it could not provision (NotTriggerScaleUp on the pods it
        # simulated for it): a job no node group can hold is told apart from one that waits for capacity.
        self.autoscaler_said = Informer(kube, EVENTS, field_selector=f"reason={booking.NOT_TRIGGERED_REASON}",
                                        resync_seconds=rs, transform=_said_view, handler=self._said_event)
        config.on_loaded(self._place_all)
        self.events = EventSender(kube, busy=lambda: self.queue.busy())
        self._side = ThreadPoolExecutor(self.options.workers, thread_name_prefix="create")

    # --- lifecycle --------------------------------------------------------------------------------
    def _informers(self) -> list[Informer]:
        caches = [*self.jobs.values(), *self.children.values(), *self.pods.all_informers(), self.priority_classes,
                  self.autoscaler_said]
        return caches if self.claim_templates is None else [*caches, self.claim_templates]

    def start_informers(self) -> None:
        for inf in self._informers():
            inf.start()

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers())

    def not_ready(self) -> list[str]:
        missing = [f"{i.resource.plural} cache" for i in self._informers() if not i.synced.is_set()]
        if not self.config.loaded.is_set():
            missing.append("config")
        return missing

    def start_workers(self) -> None:
        """Called once leading: every job is queued, so the new leader picks up every flow."""
        for kind, inf in self.jobs.items():
            for namespace, name in inf.cached_keys():
                self.queue.add(Key(kind, namespace, name))
        self._workers = run_workers(self.queue, self._handle, self.options.workers, name="reconcile")

    def stop(self, grace: float = 5.0) -> None:
        self.queue.shutdown()
        for t in self._workers:  # let in-flight reconciles finish before the Lease is released
            t.join(grace)
        self.events.stop(grace)
        self._side.shutdown(wait=False)
        for inf in self._informers():
            inf.stop()

    def all_jobs(self) -> Iterator[JSON]:
        """Held and admitted jobs, one at a time; KubeRay's cluster of a RayJob carries its labels but is
        not one."""
        for kind, inf in self.jobs.items():
            for o in inf.iter_items():
                if kind != keys.RAYCLUSTER_KIND or not (self.kuberay_child(o) or identity.recorded_parent(o)):
                    yield o

    def kuberay_child(self, obj: JSON) -> bool:
        """KubeRay's cluster of a RayJob raygate admitted: its parent is the one the webhook recorded when
        KubeRay's operator created it, and that RayJob (same uid) is one we hold. A RayCluster that only claims
        a RayJob parent (an ownerReference, labels: anyone may write those) was held by the webhook like any
        other, so it is reconciled, and booked, as a job of its own."""
        parent = self._parent(obj)
        job = self.jobs[keys.RAYJOB_KIND].get(meta_str(obj, "namespace"), parent[0]) if parent else None
        return job is not None and parent is not None and meta_str(job, "uid") == parent[1] and (
            identity.recorded_parent(obj) is not None or _legacy_child_of(obj, job))

    @staticmethod
    def _parent(obj: JSON) -> tuple[str, str] | None:
        """(name, uid) of the RayJob a RayCluster was made for: raygate's record, or for a cluster made before
        raygate recorded parents, the one its owner reference names (checked by kuberay_child)."""
        recorded = identity.recorded_parent(obj)
        if recorded is not None:
            return recorded.name, recorded.uid
        return Workload(obj).rayjob_parent() if keys.PARENT_ANNOTATION not in string_map(
            metadata(obj).get("annotations")) else None

    # --- event handlers (informer threads) ---------------------------------------------------------
    def _job_event(self, kind: str) -> Callable[[str, JSON], None]:
        def handle(event: str, obj: JSON) -> None:
            namespace, name = meta_str(obj, "namespace"), meta_str(obj, "name")
            self._place(Key(kind, namespace, name))  # its place in its queue first: its reconcile reads its turn
            self.queue.add(Key(kind, namespace, name))
            parent = self._parent(obj) if kind == keys.RAYCLUSTER_KIND else None
            if parent is not None:
                # A scale-up of a RayJob's cluster is the RayJob's to book: it reads the cluster's spec.
                with self._lock:
                    if event == "DELETED":
                        self._cluster_of.pop((namespace, parent[0]), None)
                    else:
                        self._cluster_of[(namespace, parent[0])] = name
                self.queue.add(Key(keys.RAYJOB_KIND, namespace, parent[0]))
            # Whose booking its pods use may change with it (it came, went, or is a RayJob's cluster now).
            recorded = [(kind, name)]
            if kind == keys.RAYJOB_KIND:
                with self._lock:
                    cluster = self._cluster_of.get((namespace, name))
                recorded += [(keys.RAYCLUSTER_KIND, cluster)] if cluster else []
            for k, n in recorded:
                for pod in self.pods.reresolve(k, namespace, n):
                    self.queue.add(Key(POD, *pod))

        return handle

    def _kuberay_cluster(self, key: Key) -> JSON | None:
        """KubeRay's RayCluster for the RayJob `key`, once it is the job's own (see kuberay_child)."""
        if key.kind != keys.RAYJOB_KIND:
            return None
        with self._lock:
            name = self._cluster_of.get((key.namespace, key.name))
        cluster = self.jobs[keys.RAYCLUSTER_KIND].get(key.namespace, name) if name else None
        return cluster if cluster is not None and self.kuberay_child(cluster) else None

    def _child_event(self, kind: ChildKind) -> Callable[[str, JSON], None]:
        def handle(event: str, obj: JSON) -> None:
            ck: ChildKey = (kind, meta_str(obj, "namespace"), meta_str(obj, "name"))
            owner = children.controller_key(obj)
            self.notes.cache_event(event, ck, owner)
            if owner:
                if kind == ChildKind.PROVISIONING_REQUEST:
                    self._place(owner)  # the autoscaler's answer decides whether the jobs behind it may try
                # A settled request asks for one patch of its job (admit, retry or give up): it goes ahead.
                self.queue.add(owner, urgent=kind == ChildKind.PROVISIONING_REQUEST and settled(obj))

        return handle

    # --- the queues ---------------------------------------------------------------------------------
    def _place(self, key: Key) -> None:
        self.queues.place(key, lambda: self._placement(key))

    def _placement(self, key: Key) -> Placement | None:
        """The job's place in its queue, as the caches have it now (none: not held, or nothing booked)."""
        obj = self._job(key)
        if obj is None or (key.kind == keys.RAYCLUSTER_KIND and (self.kuberay_child(obj)
                                                                  or identity.recorded_parent(obj))):
            return None
        w = Workload(obj, self._claim_template)
        cfg = self.config.config
        rules = for_object(cfg.policy_for(w.namespace), w.annotations)
        informer = self.children.get(ChildKind.PROVISIONING_REQUEST)
        current = w.annotations.get(keys.REQUEST_ANNOTATION)
        request = informer.get(w.namespace, current) if informer is not None and current else None
        classes, global_default = queueing.priority_classes(self.priority_classes.iter_items())
        name = rules.policy.queue
        job = waiting_of(key, w, rules, classes, global_default, request) or running_of(
            key, w, rules, classes, global_default)
        return Placement(name, rules_of(cfg.queues.get(name) or QueuePolicy()), job) if job is not None else None

    def _place_all(self) -> None:
        """Every job placed again: the config (queues, priorities) or a PriorityClass changed."""
        for kind, inf in self.jobs.items():
            for namespace, name in inf.cached_keys():
                self._place(Key(kind, namespace, name))

    def _said_event(self, event: str, obj: JSON) -> None:
        """The autoscaler's words on a request: its job decides again (it may never fit)."""
        request = booking.request_of_simulated_pod(str(get(obj, ("involvedObject", "name")) or ""))
        owner = self._request_owner(meta_str(obj, "namespace"), request) if request else None
        if owner is not None and event != "DELETED":
            self.queue.add(owner)

    def _said(self, namespace: str, requests: list[JSON]) -> dict[str, str]:
        """The autoscaler's latest NotTriggerScaleUp words on each of these requests."""
        names = {meta_str(r, "name") for r in requests}
        latest: dict[str, tuple[str, str]] = {}
        for e in self.autoscaler_said.iter_items():
            request = booking.request_of_simulated_pod(str(get(e, ("involvedObject", "name")) or ""))
            if request in names and meta_str(e, "namespace") == namespace:
                when = str(e.get("lastTimestamp") or "")
                if request not in latest or when >= latest[request][0]:
                    latest[request] = (when, str(e.get("message") or ""))
        return {r: m for r, (_, m) in latest.items()}

    def queue_metrics(self) -> dict[str, tuple[int, float]]:
        """Per queue: its held jobs, and how long its oldest has waited (seconds)."""
        now = self.clock()
        oldest = self.queues.oldest()
        return {name: (n, max((now - t).total_seconds(), 0.0) if (t := parse_time(oldest.get(name))) else 0.0)
                for name, n in self.queues.lengths().items()}

    def _consumers_changed(self, namespace: str, request: str) -> None:
        """A request got its first running pod or lost its last one: its job decides whether it may go; and when
        the last one went, capacity of its queue freed."""
        owner = self._request_owner(namespace, request)
        if owner is not None and not self.pods.consumers(namespace, request):
            self.queues.freed(self.config.config.policy_for(namespace).queue, timestamp(self.clock()))
        if owner is not None:
            self.queue.add(owner)

    def _owner_of(self, kind: str, namespace: str, name: str, uid: str) -> Key | None:
        """Whose booking the pods of a Ray object use: the RayJob's for KubeRay's cluster of a RayJob, the
        object's own for one raygate holds; none for one that is gone (another uid) or that raygate does not hold."""
        if kind not in self.jobs:
            return None
        found = self.jobs[kind].get(namespace, name)
        if found is None or meta_str(found, "uid") != uid:
            return None
        parent = self._parent(found) if kind == keys.RAYCLUSTER_KIND else None
        if parent is not None and self.kuberay_child(found):
            return Key(keys.RAYJOB_KIND, namespace, parent[0])
        if kind == keys.RAYCLUSTER_KIND and identity.recorded_parent(found) is not None:
            return None  # KubeRay's cluster of a RayJob that is gone: no booking can cover its pods any more
        return Key(kind, namespace, name)

    def _request_owner(self, namespace: str, request: str) -> Key | None:
        informer = self.children.get(ChildKind.PROVISIONING_REQUEST)
        found = informer.get(namespace, request) if informer is not None else None
        return children.controller_key(found) if found is not None else None

    def _claim_template(self, namespace: str, name: str) -> JSON | None:
        return self.claim_templates.get(namespace, name) if self.claim_templates is not None else None

    # --- the view -------------------------------------------------------------------------------------
    def _job(self, key: Key) -> JSON | None:
        obj = self.notes.job(key, self.jobs[key.kind].get(key.namespace, key.name))
        return _typed(obj, key.kind) if obj is not None else None

    # --- reconcile ----------------------------------------------------------------------------------
    def _handle(self, key: Key) -> None:
        try:
            self.reconcile(key)
        except ApiError as err:
            delay = self.queue.add_rate_limited(key)
            metrics.RECONCILE_ERRORS.labels(err.reason or str(err.status)).inc()
            log.warning("reconcile failed, retrying", extra={**_fields(key), "error": str(err),
                                                              "retry_in": round(delay, 2)})
        except Exception as err:
            delay = self.queue.add_rate_limited(key)
            metrics.RECONCILE_ERRORS.labels("Internal").inc()
            log.exception("reconcile error", extra={**_fields(key),
                                                    "error": str(err), "retry_in": round(delay, 2)})
        else:
            self.queue.forget(key)

    def reconcile(self, key: Key) -> None:
        if key.kind == POD:
            self._reconcile_pod(key.namespace, key.name)
            return
        obj = self._job(key)
        kids = self.notes.children_of(key)
        if obj is None:
            self._delete_orphans(kids)  # the job is gone: free its booking now rather than at GC
            return
        if key.kind == keys.RAYCLUSTER_KIND and (self.kuberay_child(obj) or identity.recorded_parent(obj)):
            return  # KubeRay's cluster of a RayJob carries its labels; the RayJob is what we hold (or held)
        uid = meta_str(obj, "uid")
        mine = {k: [c for c in v if children.made_for(c) == uid] for k, v in kids.items()}
        strays = {k: [c for c in v if children.made_for(c) != uid] for k, v in kids.items()}
        self._delete_orphans(strays)  # children of an earlier job of the same name
        self._reconcile_job(key, obj, mine, retry_conflict=True)

    def _reconcile_pod(self, namespace: str, name: str) -> None:
        """A gated pod the caches could not place. Recorded as no Ray object's: its gate is lifted (not raygate's
        to hold). Recorded as a Ray object's: placed once that object is in the caches; while it is gone, or is not
        one raygate holds, the pod stays gated and says why. A pod without a record (made before raygate recorded
        them) is read from its owners, through its batch Job, as it always was."""
        pod = self.pods.get(PodKey(namespace, name))
        if pod is None or not podgate.gated(pod):
            return
        job = None
        if job_name := self.pods.legacy_job(pod):
            try:
                job = self.kube.get(JOBS, job_name, namespace)
            except ApiError as err:
                if not err.not_found:
                    raise
        owner = self.pods.owner(pod, job)
        if owner is not None:
            self.pods.assign(PodKey(namespace, name), owner)
            self.queue.add(owner)
            return
        record = identity.recorded(pod)
        ray = identity.RayOwner.parse(record) if record is not None else identity.ray_ref(
            controller_ref(job) if job is not None else controller_ref(pod))
        if ray is None:
            self._release(namespace, ReleasePod(name, tuple(podgate.release_ops(pod, None, None))))
            log.info("pod of no Ray object released", extra={"namespace": namespace, "object": name})
            return
        self._say_why_gated(with_kind(dict(pod), "Pod", "v1"), ray)

    def _say_why_gated(self, pod: JSON, ray: identity.RayOwner) -> None:
        """An Event on a gated pod whose Ray object cannot book it: gone, or never held by raygate. (One that is
        raygate's and only not in the caches yet is placed when it arrives: PodIndex.arrived.)"""
        found = self._get_ray(ray, meta_str(pod, "namespace"))
        parent = identity.recorded_parent(found) if found is not None else None
        if parent is not None and meta_str(found or {}, "uid") == ray.uid:
            ray, found = parent, self._get_ray(parent, meta_str(pod, "namespace"))  # a RayJob's cluster: the RayJob
        ref = f"{ray.kind} {ray.name}"
        if found is None or meta_str(found, "uid") != ray.uid:
            why = (f"{ref}, which made this pod, is gone (deleted, perhaps with --cascade=orphan): no booking can "
                   "cover this pod, so it stays gated and holds no GPU. Delete it; a new Ray object books its own")
        elif keys.STATE_LABEL not in string_map(metadata(found).get("labels")):
            why = (f"{ref} was not held by raygate (it was created before its namespace opted in), so nothing is "
                   "booked for its GPU pods: this pod stays gated. Delete and re-create it to have its gang booked")
        else:
            return
        self.events.send(pod, Emit("RayObjectCannotBook", why, warning=True,
                                            name=f"{meta_str(pod, 'name')}.{short_hash(ray.render())}"))

    def _get_ray(self, ray: identity.RayOwner, namespace: str) -> JSON | None:
        try:
            return self.kube.get(JOB_KINDS[ray.kind], ray.name, namespace)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def _reconcile_job(self, key: Key, obj: JSON, kids: dict[ChildKind, list[JSON]], *,
                       retry_conflict: bool) -> None:
        w = Workload(obj, self._claim_template)
        rules = for_object(self.config.config.policy_for(w.namespace), w.annotations)
        obs = self._observed(w.namespace, kids, key, rules.policy,
                             str(w.annotations.get(keys.PREEMPTING_ANNOTATION) or ""))
        prerequisite = prerequisite_to_check(w, rules, obs)
        if prerequisite is not None:
            obs = dataclasses.replace(obs, prerequisite=self._read(prerequisite))
        now = self.clock()
        plan = decision.decide(w, obs, rules, now, self.provreq_version)
        try:
            self._apply(key, w, obs, plan, now)
        except RefusedChild as err:
            # The API server will never take this child as the job is written: a reason, not a retry loop.
            self._apply(key, w, obs, fail(w, obs, rules, str(err)), now)
            return
        except ApiError as err:
            if not (retry_conflict and _is_conflict(err)):
                raise
            # Our view was stale: decide again on the job as the API server has it now.
            fresh = _typed(self.kube.get(JOB_KINDS[key.kind], key.name, key.namespace), key.kind)
            self._reconcile_job(key, fresh, kids, retry_conflict=False)
            return
        if plan.requeue_after is not None:
            self.queue.add_after(key, plan.requeue_after + REQUEUE_SLACK)

    def _read(self, prerequisite: Prerequisite) -> JSON | None:
        """The object a group needs before it is created, or None when it does not exist (404 also when
        its API is not served: the decision then holds the job with the reason)."""
        try:
            return self.kube.get(prerequisite.resource, prerequisite.name)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def _apply(self, key: Key, w: Workload, obs: Observed, plan: Plan, now: dt.datetime) -> None:
        job = dict(w.obj)
        ref = logs.ref(job)
        releases: list[Future[None]] = []  # a gang's pods are released side by side
        for action in _with_templates_grouped(plan.actions):
            if isinstance(action, list):
                # A job's PodTemplates do not depend on each other: its request (which names them)
                # waits for one round trip to the API server instead of one per template.
                others = [self._side.submit(self._create, a) for a in action[1:]]
                self._create(action[0])
                for created in others:
                    created.result()
            elif isinstance(action, Create):
                if not self._create(action):
                    continue
                if action.kind == ChildKind.PROVISIONING_REQUEST:
                    metrics.REQUESTS_CREATED.inc()
                    if plan.outcome is Outcome.RETRIED:
                        metrics.REQUESTS_RETRIED.inc()
            elif isinstance(action, Delete):
                self._delete(key.namespace, action)
            elif isinstance(action, PatchJob):
                if not action.changes:
                    continue
                old_rv = meta_str(job, "resourceVersion")
                job = _typed(slim(self.kube.patch(JOB_KINDS[key.kind], key.name, list(action.ops), key.namespace,
                                                  content_type=JSON_PATCH)), key.kind)
                self.notes.patched(key, old_rv, job)
                self._count_step(action.step, w, now)
                log.info("job updated", extra={**ref, "step": action.step, "state": get(
                    job, ("metadata", "labels", keys.STATE_LABEL)), "reason": get(
                    job, ("metadata", "annotations", keys.REASON_ANNOTATION))})
            elif isinstance(action, PatchChild):
                self._patch_child(key.namespace, action)
            elif isinstance(action, ReleasePod):
                releases.append(self._side.submit(self._release, key.namespace, action))
            elif isinstance(action, Preempt):
                self._preempt(action, obs.queue)
            elif isinstance(action, Emit):
                self.events.send(job, action)
        for released in releases:
            released.result()

    def _count_step(self, step: Step, w: Workload, now: dt.datetime) -> None:
        if step in (Step.RETRY, Step.FAIL) and w.labels.get(keys.STATE_LABEL) == keys.State.PROVISIONING:
            metrics.REQUESTS_FAILED.inc()
        if step is Step.ADMIT:
            created = parse_time(get(w.obj, ("metadata", "creationTimestamp")))
            if created is not None:
                waited = max((now - created).total_seconds(), 0.0)
                metrics.ADMISSION_SECONDS.labels(w.kind).observe(waited)
                policy = self.config.config.policy_for(w.namespace)
                if for_object(policy, w.annotations).books:  # it waited in its namespace's queue
                    metrics.HELD_SECONDS.labels(policy.queue).observe(waited)

    def _create(self, action: Create) -> bool:
        """Create a child; AlreadyExists is success (a replay after a crash). True when newly created."""
        meta = action.obj["metadata"]
        ck: ChildKey = (action.kind, meta["namespace"], meta["name"])
        res = self.child_resources.get(action.kind)
        if res is None:
            raise ApiError(404, {"reason": "NotServed", "message": f"{action.kind} is not served by this cluster"},
                           "POST", action.kind)
        try:
            created = self.kube.create(res, action.obj, meta["namespace"])
        except ApiError as err:
            if err.already_exists:
                return False
            if err.status in (400, 422):
                raise RefusedChild(f"the API server refused {action.kind} {meta['name']}: {err.message}") from None
            raise
        self.notes.written(ck, created)
        return True

    def _patch_child(self, namespace: str, action: PatchChild) -> None:
        """Record something on a child (gone already: nothing to record)."""
        res = self.child_resources.get(action.kind)
        if res is None:
            return
        try:
            patched = self.kube.patch(res, action.name, list(action.ops), namespace, content_type=JSON_PATCH,
                                      sub="status" if action.status else None)
        except ApiError as err:
            if err.not_found or (action.status and err.status == 422):
                return  # gone; or its status changed since it was read (decided again on the new one)
            raise
        self.notes.written((action.kind, namespace, action.name), patched)

    def _delete(self, namespace: str, action: Delete) -> None:
        res = self.child_resources.get(action.kind)
        if res is None:
            return
        self.kube.delete(res, action.name, namespace)
        self.notes.deleted((action.kind, namespace, action.name))

    def _observed(self, namespace: str, kids: dict[ChildKind, list[JSON]], key: Key | None = None,
                  policy: NamespacePolicy | None = None, preempting: str = "") -> Observed:
        every = kids.get(ChildKind.PROVISIONING_REQUEST, [])
        consumers = {name: n for r in every if (n := self.pods.consumers(namespace, name := meta_str(r, "name")))}
        return Observed(
            cluster=self._kuberay_cluster(key) if key else None,
            requests=tuple(r for r in every if not get(r, ("metadata", "annotations", keys.SCALE_UP_ANNOTATION))),
            scale_ups=tuple(r for r in every if get(r, ("metadata", "annotations", keys.SCALE_UP_ANNOTATION))),
            consumers=consumers, templates=tuple(kids.get(ChildKind.POD_TEMPLATE, ())),
            # With their kind: two modes' groups are both of kind PodGroup, and list items come without it.
            groups=tuple(with_kind(g, (res := self.child_resources[kind]).kind, res.api_version)
                         for kind in sorted(self.group_kinds) for g in kids.get(kind, ())),
            pods=self.pods.pods_of(key, policy, self._claim_template) if key and policy else (),
            served=self.served,
            bound={meta_str(g, "name"): self.pods.bound(namespace, meta_str(g, "name"))
                   for kind in self.group_kinds for g in kids.get(kind, ())},
            **self._turn(key, every, preempting),
        )

    def _turn(self, key: Key | None, requests: list[JSON], preempting: str) -> dict[str, Any]:
        """The job's turn in its queue, the queue, when its capacity last freed, what the queue does with a job
        that never fits, what the autoscaler said of its requests, and what it may preempt, given its record of
        those it preempted (`preempting`) (Observed's fields)."""
        name = self.queues.queue_of(key) if key is not None else None
        if key is None or name is None:
            return {}
        queue = self.config.config.queues.get(name) or QueuePolicy()
        waiting = self.queues.waiting(key)
        victims = [v.key for v in preemption.recorded(preempting)[1]]
        preempt = Preempting(queue.min_run_seconds, waiting.priority if waiting else 0,
                             tuple(self.queues.running(name)), {v: self.pods.consuming(v) for v in victims},
                             {v: meta_str(found, "uid") for v in victims if v.kind in self.jobs
                              and (found := self.jobs[v.kind].get(v.namespace, v.name)) is not None}) \
            if queue.preemption is keys.Preemption.LOWER_PRIORITY else None
        return {"turn": self.queues.turn(key), "queue": name, "freed": self.queues.freed_at(name),
                "never_fits": queue.never_fits, "said": self._said(key.namespace, requests), "preempt": preempt}

    def _preempt(self, action: Preempt, queue: str) -> None:
        """Suspend a job to make room. One that is no longer Admitted, or gone, is left as it is (the patch tests
        its state)."""
        v = action.victim
        try:
            self.kube.patch(JOB_KINDS[v.kind], v.name, list(action.ops), v.namespace, content_type=JSON_PATCH)
        except ApiError as err:
            if err.status in (404, 409, 422):
                return
            raise
        metrics.PREEMPTIONS.labels(queue).inc()
        self.queue.add(v)

    def _release(self, namespace: str, action: ReleasePod) -> None:
        """Lift a pod's gate. The patch tests the gate it removes: one already lifted (by another replica, or
        before a crash) answers 422, and nothing is released twice."""
        try:
            pod = self.kube.patch(PODS, action.name, list(action.ops), namespace, content_type=JSON_PATCH)
        except ApiError as err:
            if err.status in (404, 409, 422):
                return
            raise
        self.pods.released(PodKey(namespace, action.name), pod)
        metrics.PODS_RELEASED.inc()

    def _delete_orphans(self, kids: dict[ChildKind, list[JSON]]) -> None:
        """Children of a job that is gone: all go, but for bookings its pods still consume (they go with
        the last of those pods)."""
        by_namespace: dict[str, dict[ChildKind, list[JSON]]] = {}
        for kind, objs in kids.items():
            for obj in objs:
                by_namespace.setdefault(meta_str(obj, "namespace"), {}).setdefault(kind, []).append(obj)
        for namespace, found in by_namespace.items():
            actions = delete_all(self._observed(namespace, found))
            actions += [Delete(kind, meta_str(g, "name")) for kind in self.group_kinds
                        for g in found.get(kind, ())]
            for action in actions:
                if isinstance(action, Delete):
                    self._delete(namespace, action)


def _with_templates_grouped(actions: Iterable[Action]) -> Iterator[Action | list[Create]]:
    """The actions in order, except that two or more adjacent PodTemplate creates come as one list."""
    run: list[Create] = []
    for action in actions:
        if isinstance(action, Create) and action.kind == ChildKind.POD_TEMPLATE:
            run.append(action)
            continue
        yield from _flush(run)
        run = []
        yield action
    yield from _flush(run)


def _flush(run: list[Create]) -> Iterator[Action | list[Create]]:
    if len(run) > 1:
        yield run
    else:
        yield from run


def _fields(key: Key) -> dict[str, str]:
    return {"kind": key.kind, "namespace": key.namespace, "object": key.name}


def _said_view(obj: JSON) -> JSON:
    return {"metadata": {k: metadata(obj).get(k) for k in ("name", "namespace")},
            "involvedObject": {"name": get(obj, ("involvedObject", "name"))}, "message": obj.get("message"),
            "lastTimestamp": obj.get("lastTimestamp")}


def _priority_view(obj: JSON) -> JSON:
    return {"metadata": {"name": meta_str(obj, "name")}, "value": obj.get("value"),
            "globalDefault": obj.get("globalDefault")}


def _legacy_child_of(cluster: JSON, job: JSON) -> bool:
    """A RayJob's cluster made before raygate recorded parents: it carries the admitted job's labels and its
    current request, which the webhook strips from any RayCluster a user creates."""
    def request(o: JSON) -> str | None:
        return string_map(metadata(o).get("annotations")).get(keys.REQUEST_ANNOTATION)
    return Workload(cluster).labels.get(keys.STATE_LABEL) == keys.State.ADMITTED and request(cluster) is not None \
        and request(cluster) == request(job)


def _typed(obj: JSON, kind: str) -> JSON:
    """A job with kind and apiVersion: cached list items and patch answers may come without them."""
    return with_kind(obj, kind, JOB_KINDS[kind].api_version)


class RefusedChild(Exception):
    """A child object the API server rejects as invalid (400/422): retrying cannot help."""


def _is_conflict(err: ApiError) -> bool:
    # A failed test operation of a JSON patch is answered 422 ("the server rejected our request"); a
    # patch that is invalid for another reason fails again after the re-read and then backs off.
    return err.conflict or err.status == 422
