"""The pods the reconciler follows: whose booking each belongs to, which still run, which are gated.

Two watches that no pod can move between: every pod the webhook gated (label raygate.io/pod-gate, set at
creation and raygate's alone: gated GPU pods of Ray objects, submitter pods of KubeRay's batch Jobs,
and whatever else asked for a managed resource), and KubeRay's other head and worker pods (label
ray.io/node-type without raygate.io/pod-gate), whose gang group native mode counts.

Whose a pod is, is the record the webhook wrote when the pod was created (raygate.core.identity): the Ray
object that made it, never re-read from owner references or labels that the garbage collector or a user
may change later. A RayCluster's pods use its own booking, or its RayJob's when it is KubeRay's cluster of
a RayJob. A pod recorded as no Ray object's is not raygate's to hold: its gate is lifted. A pod whose Ray
object is gone, or is not one raygate holds, stays gated: its owner is gone, not its identity. Pods from
before raygate recorded identities (no record) are read from their owner references, as they always were.

The index is kept from watch events; released pods the watch has not shown yet are noted so that a
decision right after a release counts them (the same lag note the controller keeps for its jobs).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raygate.core import identity, keys, podgate
from raygate.core.api import PODS, Resource
from raygate.core.objects import JSON, Key, PodKey, controller_ref, get, meta_str, metadata
from raygate.core.policy import NamespacePolicy
from raygate.core.workload import ManifestError
from raygate.kube.client import Kube
from raygate.kube.informer import Informer
from raygate.reconciler import gating

JOBS = Resource("batch", "v1", "jobs", "Job")
SELECTORS = (keys.POD_GATE_LABEL, f"{keys.RAY_NODE_TYPE_LABEL},!{keys.POD_GATE_LABEL}")


def pod_view(obj: JSON) -> JSON:
    """A pod as the reconciler keeps it: whose it is, its booking, whether it runs; a gated pod's spec too
    (its placement decides which booking covers it, and a scale-up's template is made from it)."""
    meta = metadata(obj)
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    kept = {k: annotations[k] for k in (keys.CONSUME_ANNOTATION, keys.RAY_OWNER_ANNOTATION) if k in annotations}
    view: JSON = {"metadata": {
        **{k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp")},
        "labels": {k: labels[k] for k in (keys.RAY_GROUP_LABEL, keys.POD_GATE_LABEL, keys.RAY_CLUSTER_LABEL)
                   if k in labels},
        "ownerReferences": meta.get("ownerReferences") or [],
        **({"annotations": kept} if kept else {})},
        "status": {"phase": get(obj, ("status", "phase"))}}
    view["spec"] = {"nodeName": get(obj, ("spec", "nodeName"))}  # bound yet (a booking all bound has done its work)
    if (group := get(obj, ("spec", "schedulingGroup"))) is not None:
        view["spec"]["schedulingGroup"] = group  # the gang group it joined (native mode)
    if podgate.gated(obj):
        view["spec"] = obj.get("spec")
        view["metadata"]["labels"] = {**labels}
    return view


def runs(pod: Mapping[str, Any]) -> bool:
    return get(pod, ("status", "phase")) not in gating.TERMINAL_POD_PHASES


def recorded_owner(pod: Mapping[str, Any]) -> identity.RayOwner | None:
    """The Ray object the webhook recorded as the pod's at its creation (None: none, or no record)."""
    return identity.RayOwner.parse(identity.recorded(pod))


def pod_set(pod: Mapping[str, Any]) -> str:
    """The pod set the pod was made for, as recorded (a pod from before the records: from its labels)."""
    owner = recorded_owner(pod)
    return owner.pod_set if owner is not None and owner.pod_set else podgate.pod_set_of(pod)


@dataclass(frozen=True)
class Seen:
    """What the index last knew of a pod: whose it is, and the state its owner's decision depends on."""

    owner: Key | None
    gated: bool
    runs: bool
    consumes: str | None
    bound_in: tuple[str, str] | None = None  # bound and running: (its gang group, its Ray cluster)
    bound: bool = False  # scheduled to a node


def bound_in(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(group, Ray cluster) of a pod that names a gang group, is bound to a node and still runs."""
    group = get(pod, keys.POD_GROUP_NAME_PATH)
    if not isinstance(group, str) or not get(pod, ("spec", "nodeName")) or not runs(pod):
        return None
    return group, str(get(pod, ("metadata", "labels", keys.RAY_CLUSTER_LABEL)) or "")


class PodIndex:
    def __init__(self, kube: Kube, resync_seconds: float, page_size: int,
                 owner_of: Callable[[str, str, str, str], Key | None],
                 on_change: Callable[[Key], None], on_unowned: Callable[[PodKey], None],
                 on_consumers: Callable[[str, str], None]) -> None:
        """`owner_of(kind, namespace, name, uid)`: the Ray object whose booking the pods of a RayJob or
        RayCluster use (None: gone, or not one raygate holds); `on_change(owner)`: a pod of it appeared, went,
        was released or ended; `on_unowned(pod)`: a gated pod whose owner the caches cannot tell (the worker
        looks further); `on_consumers(namespace, request)`: a request got its first running pod or lost its
        last one."""
        self._owner_of = owner_of
        self._on_change = on_change
        self._on_unowned = on_unowned
        self._on_consumers = on_consumers
        self._lock = threading.Lock()
        # Held from a pod's owner read out of the job caches to its write here, on the pods' thread and the jobs'
        # (reresolve): otherwise an owner read just before its job went could be written after the job's
        # reresolve ran, and the pod would stay filed under a deleted job, its "why" unsaid until a resync.
        self._resolving = threading.Lock()
        self._seen: dict[PodKey, Seen] = {}
        # The order pods were first seen in (a watch delivers them in the order they were written): first come,
        # first served among pods created in the same second, whose creationTimestamps cannot tell them apart.
        self._arrived: dict[PodKey, int] = {}
        self._arrivals = itertools.count()
        self._of: dict[Key, set[PodKey]] = {}
        self._recorded: dict[Key, set[PodKey]] = {}  # pods by the Ray object recorded as theirs
        self._consuming: dict[tuple[str, str], set[str]] = {}  # (namespace, request) -> released pods that run
        self._bound: dict[tuple[str, str], dict[str, int]] = {}  # (namespace, group) -> Ray cluster -> bound pods
        self._released: dict[PodKey, JSON] = {}  # released by us, not yet shown by the watch
        self.informers = [
            Informer(kube, PODS, label_selector=selector, resync_seconds=resync_seconds, handler=self._event,
                     transform=pod_view, compact=True, page_size=page_size)
            for selector in SELECTORS
        ]

    def all_informers(self) -> list[Informer]:
        return list(self.informers)

    # --- whose a pod is --------------------------------------------------------------------------
    def owner(self, pod: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> Key | None:
        """The Ray object whose booking the pod uses: the one recorded at its creation. A pod without a record
        (made before raygate recorded them) is read from its controller, and a batch Job's pod from the Job's
        controller (`job`: that Job, as the worker read it)."""
        namespace = meta_str(pod, "namespace")
        record = identity.recorded(pod)
        if record is not None:
            owner = identity.RayOwner.parse(record)
            return None if owner is None else self._owner_of(owner.kind, namespace, owner.name, owner.uid)
        ref = controller_ref(job) if job is not None else controller_ref(pod)
        if ref is None or not str(ref.get("apiVersion", "")).startswith(keys.RAY_GROUP + "/"):
            return None
        return self._owner_of(str(ref.get("kind") or ""), namespace, str(ref.get("name") or ""),
                              str(ref.get("uid") or ""))

    @staticmethod
    def legacy_job(pod: Mapping[str, Any]) -> str | None:
        """The batch Job controlling a pod without a record, if one does (its owner is read through the Job)."""
        ref = controller_ref(pod)
        if identity.recorded(pod) is not None or ref is None or ref.get("kind") != "Job" or \
                not str(ref.get("apiVersion", "")).startswith("batch/"):
            return None
        return str(ref.get("name") or "")

    def assign(self, key: PodKey, owner: Key) -> None:
        """The worker found the owner the caches could not tell (a pod of a batch Job from before the records)."""
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                return
            self._seen[key] = Seen(owner, seen.gated, seen.runs, seen.consumes, seen.bound_in, seen.bound)
            self._of.setdefault(owner, set()).add(key)

    def reresolve(self, kind: str, namespace: str, name: str) -> list[PodKey]:
        """The Ray object recorded as these pods' came, changed or went: whose booking they use is asked again.
        Returns the gated ones no Ray object in the caches can book now (the worker says why, or lifts the gate
        of one recorded as no Ray object's)."""
        changed: set[Key] = set()
        unowned = []
        with self._resolving:
            with self._lock:
                pods = sorted(self._recorded.get(Key(kind, namespace, name), set()))
            for key in pods:
                pod = self.get(key)
                if pod is None:
                    continue
                owner = self.owner(pod)
                with self._lock:
                    seen = self._seen.get(key)
                    if seen is None:
                        continue
                    before = seen.owner
                    if before != owner:
                        if before is not None:
                            self._of.get(before, set()).discard(key)
                        if owner is not None:
                            self._of.setdefault(owner, set()).add(key)
                        self._seen[key] = Seen(owner, seen.gated, seen.runs, seen.consumes, seen.bound_in,
                                               seen.bound)
                        changed.update(k for k in (before, owner) if k is not None)
                if owner is None and seen.gated:
                    unowned.append(key)
        for job in changed:
            self._on_change(job)
        return unowned

    # --- events ----------------------------------------------------------------------------------
    def _event(self, event: str, obj: JSON) -> None:
        key = PodKey(meta_str(obj, "namespace"), meta_str(obj, "name"))
        gone = event == "DELETED"
        consumes = get(obj, ("metadata", "annotations", keys.CONSUME_ANNOTATION))
        recorded = recorded_owner(obj)
        by_record = Key(recorded.kind, key.namespace, recorded.name) if recorded is not None else None
        with self._resolving:
            owner = None if gone else self.owner(obj)  # the caches' locks, never under self._lock
            now = Seen(owner, podgate.gated(obj), not gone and runs(obj),
                       consumes if isinstance(consumes, str) else None, None if gone else bound_in(obj),
                       bool(get(obj, ("spec", "nodeName"))))
            with self._lock:
                before = self._seen.pop(key, None)
                touched = {c for c in (before.consumes if before else None, now.consumes) if c}
                had = {c: bool(self._consuming.get((key.namespace, c))) for c in touched}
                if before is not None:
                    if before.owner is not None:
                        self._of.get(before.owner, set()).discard(key)
                    self._count(key, before, -1)
                if by_record is not None:
                    if gone:
                        self._recorded.get(by_record, set()).discard(key)
                        if not self._recorded.get(by_record):
                            self._recorded.pop(by_record, None)
                    else:
                        self._recorded.setdefault(by_record, set()).add(key)
                if gone:
                    self._arrived.pop(key, None)
                else:
                    self._arrived.setdefault(key, next(self._arrivals))
                    self._seen[key] = now
                    if owner is not None:
                        self._of.setdefault(owner, set()).add(key)
                    self._count(key, now, +1)
                if not now.gated:
                    self._released.pop(key, None)
                flipped = [c for c in touched if had[c] != bool(self._consuming.get((key.namespace, c)))]
        for request in flipped:
            self._on_consumers(key.namespace, request)
        if now != before:
            for changed in {k for k in (before.owner if before else None, owner) if k is not None}:
                self._on_change(changed)
        if not gone and owner is None and now.gated and (before is None or before.owner is not None
                                                          or before.gated != now.gated):
            self._on_unowned(key)

    def _count(self, key: PodKey, seen: Seen, step: int) -> None:
        """Keep the consumers of each request and the bound pods of each gang group (caller holds the lock)."""
        if seen.bound_in is not None:
            group, cluster = seen.bound_in
            clusters = self._bound.setdefault((key.namespace, group), {})
            clusters[cluster] = clusters.get(cluster, 0) + step
            if not clusters[cluster]:
                del clusters[cluster]
            if not clusters:
                del self._bound[(key.namespace, group)]
        if seen.consumes is None or seen.gated or not seen.runs:
            return
        pods = self._consuming.setdefault((key.namespace, seen.consumes), set())
        if step > 0:
            pods.add(key.name)
        else:
            pods.discard(key.name)
        if not pods:
            del self._consuming[(key.namespace, seen.consumes)]

    def released(self, key: PodKey, pod: JSON) -> None:
        """A pod this reconciler just released (the patch's answer), counted until the watch shows it."""
        with self._lock:
            self._released[key] = pod_view(pod)

    # --- reading -----------------------------------------------------------------------------------
    def get(self, key: PodKey) -> JSON | None:
        with self._lock:
            fresh = self._released.get(key)
        if fresh is not None:
            return fresh
        for informer in self.informers:
            if (found := informer.get(*key)) is not None:
                return found
        return None

    def pods_of(self, owner: Key, policy: NamespacePolicy, claims: Any) -> tuple[gating.Pod, ...]:
        """The owner's pods that raygate gated, as the gate decision reads them. A gated pod whose requests
        raygate cannot read is kept with why: it holds no slot and gets none, and the rest go on."""
        with self._lock:
            keys_ = sorted(self._of.get(owner, set()))
            arrived = {k: self._arrived.get(k, 0) for k in keys_}
        out = []
        for key in keys_:
            pod = self.get(key)
            if pod is None or get(pod, ("metadata", "labels", keys.POD_GATE_LABEL)) is None:
                continue
            digest, unreadable = "", None
            if podgate.gated(pod):
                try:
                    managed, _ = podgate.managed_request(pod, policy, claims, key.namespace)
                    digest = podgate.match_digest(pod.get("spec"), managed)
                except ManifestError as err:
                    unreadable = str(err)
            out.append(gating.pod_of(pod, digest, pod_set(pod), unreadable, arrived[key]))
        return tuple(out)

    def bound(self, namespace: str, group: str) -> dict[str, int]:
        """The pods bound in a gang group that still run, per Ray cluster."""
        with self._lock:
            return dict(self._bound.get((namespace, group), {}))

    def consuming(self, owner: Key) -> int:
        """Pods of `owner` that consume one of its requests and still run (the last one to go frees its queue's
        capacity)."""
        with self._lock:
            return sum(1 for k in self._of.get(owner, ()) if (s := self._seen.get(k)) and s.consumes and s.runs
                       and not s.gated)

    def consumers(self, namespace: str, request: str) -> int:
        """Pods that consume `request` and still run (released pods only: a gated pod consumes nothing)."""
        with self._lock:
            return len(self._consuming.get((namespace, request), ()))
