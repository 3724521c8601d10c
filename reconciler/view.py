"""The reconciler's view of the cluster: objects as its caches keep them, and two small in-memory notes that
cover the caches' lag behind its own writes (the job version a patch returned; children just created or deleted),
so a reconcile right after a write neither repeats it nor undoes it.

The notes are hints: correctness comes from the state test on every job patch and from deterministic child names,
which is why a restart with empty notes is safe."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import orjson

from raygate.core.keys import ChildKind
from raygate.core.objects import JSON, Key, meta_str
from raygate.kube.informer import Informer
from raygate.reconciler import children

ChildKey = tuple[ChildKind, str, str]  # (child kind, namespace, name)


def slim(obj: JSON) -> JSON:
    """Cached objects without managedFields: the reconciler never reads them, and on jobs patched
    several times they are a large part of each object."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def child_view(obj: JSON) -> JSON:
    """A child as the reconciler keeps it: without managedFields and without a PodTemplate's
    template, most of it and never read back (a PodGroup's spec and a request's status are)."""
    return {k: v for k, v in slim(obj).items() if k != "template"}


class Notes:
    """What the reconciler wrote that its caches may not show yet, laid over what they show."""

    def __init__(self, caches: Mapping[ChildKind, Informer]) -> None:
        self._caches = caches  # the children's caches, by kind
        self._lock = threading.Lock()
        self._owned: dict[Key, set[ChildKey]] = {}  # cached children by the job that controls them
        # Per job: the versions our patches replaced that the cache may still show, the version the last one
        # returned, and that job.
        self._fresh: dict[Key, tuple[frozenset[str], str, bytes]] = {}
        self._created: dict[ChildKey, JSON] = {}  # created or patched, not yet so in the cache
        self._gone: set[ChildKey] = set()  # deleted, still in the cache

    # --- jobs ---------------------------------------------------------------------------------------
    def patched(self, key: Key, old_version: str, job: JSON) -> None:
        """The job as a patch of version `old_version` returned it. A patch of the version an earlier one returned
        (two in a row, the cache behind both) leaves the cache possibly at either version replaced."""
        with self._lock:
            before = self._fresh.get(key)
            stale = before[0] if before is not None and before[1] == old_version else frozenset()
            self._fresh[key] = (stale | {old_version}, meta_str(job, "resourceVersion"), orjson.dumps(job))

    def job(self, key: Key, cached: JSON | None) -> JSON | None:
        """The job: the cached one, unless the cache still holds a version our own patches replaced."""
        with self._lock:
            fresh = self._fresh.pop(key, None)
            if cached is None or fresh is None or meta_str(cached, "resourceVersion") not in fresh[0]:
                return cached
            self._fresh[key] = fresh
        found: JSON = orjson.loads(fresh[2])
        return found

    # --- children -----------------------------------------------------------------------------------
    def written(self, ck: ChildKey, obj: JSON) -> None:
        """A child as our create or patch returned it."""
        with self._lock:
            self._created[ck] = child_view(obj)

    def deleted(self, ck: ChildKey) -> None:
        with self._lock:
            self._created.pop(ck, None)
            if self._caches[ck[0]].get(ck[1], ck[2]) is not None:
                self._gone.add(ck)

    def cache_event(self, event: str, ck: ChildKey, owner: Key | None) -> None:
        """The cache caught up with a child: what was noted of it is no longer needed."""
        with self._lock:
            if event == "DELETED":
                self._gone.discard(ck)
                if owner:
                    self._owned.get(owner, set()).discard(ck)
            else:
                self._created.pop(ck, None)
                if owner:
                    self._owned.setdefault(owner, set()).add(ck)

    def children_of(self, key: Key) -> dict[ChildKind, list[JSON]]:
        """The job's children by kind, as the caches and the notes have them."""
        out: dict[ChildKind, list[JSON]] = {k: [] for k in self._caches}
        with self._lock:
            owned = set(self._owned.get(key, set())) - self._gone
            created = [(ck, o) for ck, o in self._created.items() if children.controller_key(o) == key]
        for ck in owned:
            obj = self._caches[ck[0]].get(ck[1], ck[2])
            if obj is not None:
                out[ck[0]].append(obj)
        for ck, obj in created:
            if ck not in owned:
                out[ck[0]].append(obj)
        return out
