"""List, then watch from the list's resourceVersion, keeping a local store current.

Bookmarks keep the resourceVersion fresh; 410 Gone (or an expired version) relists; dropped
connections reconnect with capped exponential backoff; a periodic resync replays the store so
level-triggered handlers see every object again even if an event was missed.

A compact informer keeps each object as compressed JSON and parses it on every read: a parsed
Kubernetes object takes about five times the memory of its JSON and twenty times that of the JSON
compressed (zlib, fastest level: about 0.1 ms to pack, 15 µs to unpack a RayJob), and a controller
holding ten thousand jobs reads only the few it is working on.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from raygate.core.api import Resource
from raygate.core.objects import JSON, meta_str
from raygate.kube.client import ApiError, Kube

log = logging.getLogger("raygate.informer")

Key = tuple[str, str]  # (namespace, name)
Handler = Callable[[str, JSON], None]  # (event type: ADDED, MODIFIED, DELETED, SYNC), object
Transform = Callable[[JSON], JSON]  # applied to each object before it is stored (e.g. to drop fields)


def _unpack(value: JSON | bytes) -> JSON:
    return orjson.loads(zlib.decompress(value)) if isinstance(value, bytes) else value


def key_of(obj: JSON) -> Key:
    return meta_str(obj, "namespace"), meta_str(obj, "name")


class Informer:
    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        handler: Handler | None = None,
        resync_seconds: float = 300.0,
        watch_timeout: int = 300,
        page_size: int = 500,
        transform: Transform | None = None,
        compact: bool = False,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        self.handler = handler
        self.resync_seconds = resync_seconds
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.transform = transform
        self.compact = compact
        self._store: dict[Key, JSON | bytes] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.relists = 0

    # --- store ------------------------------------------------------------------------------
    def _pack(self, obj: JSON) -> JSON | bytes:
        """What the store keeps of an object already transformed."""
        return zlib.compress(orjson.dumps(obj), 1) if self.compact else obj

    def get(self, namespace: str, name: str) -> JSON | None:
        """The cached object; a compact informer parses a new copy on every call."""
        with self._lock:
            value = self._store.get((namespace, name))
        return None if value is None else _unpack(value)

    def cached_keys(self) -> list[Key]:
        with self._lock:
            return list(self._store)

    def items(self) -> list[JSON]:
        return list(self.iter_items())

    def iter_items(self) -> Iterator[JSON]:
        """Every cached object, parsed one at a time (a compact store is never parsed all at once)."""
        with self._lock:
            values = list(self._store.values())
        for value in values:
            yield _unpack(value)

    def _emit(self, kind: str, obj: JSON) -> None:
        if self.handler is None:
            return
        try:
            self.handler(kind, obj)
        except Exception:  # a handler bug must not kill the watch
            log.exception("informer handler failed", extra={"resource": self.resource.plural})

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.resource.plural}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    def _list(self) -> str:
        items: dict[Key, JSON | bytes] = {}
        cont: str | None = None
        rv = ""
        while True:
            page = self.kube.list(self.resource, self.namespace, limit=self.page_size, **{"continue": cont},
                                  **self.selectors)
            for obj in page.get("items") or []:
                items[key_of(obj)] = self._pack(self.transform(obj) if self.transform else obj)
            rv = meta_str(page, "resourceVersion") or rv
            cont = meta_str(page, "continue") or None
            if not cont:
                break
        with self._lock:
            gone = [o for k, o in self._store.items() if k not in items]
            self._store = items
        for value in gone:
            self._emit("DELETED", _unpack(value))
        for value in items.values():
            self._emit("SYNC", _unpack(value))
        self.relists += 1
        return rv

    def _apply(self, event: dict[str, Any]) -> str | None:
        """Apply one watch event; return its resourceVersion, or None when a relist is needed."""
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = meta_str(obj, "resourceVersion")
        if kind == "BOOKMARK":
            return rv
        if kind == "ERROR":
            code = obj.get("code")
            log.info("watch error, relisting", extra={"resource": self.resource.plural, "code": code})
            return None
        if self.transform:
            obj = self.transform(obj)
        k = key_of(obj)
        with self._lock:
            if kind == "DELETED":
                self._store.pop(k, None)
            else:
                self._store[k] = self._pack(obj)
        self._emit(str(kind), obj)
        return rv

    def _run(self) -> None:
        backoff = 0.5
        rv: str | None = None
        last_resync = time.monotonic()
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                    self.synced.set()
                    last_resync = time.monotonic()
                for event in self.kube.watch(self.resource, self.namespace, timeout_seconds=self.watch_timeout,
                                             resourceVersion=rv, **self.selectors):
                    if self._stop.is_set():
                        return
                    new_rv = self._apply(event)
                    if new_rv is None:
                        rv = None
                        break
                    rv = new_rv or rv
                    backoff = 0.5
                    if time.monotonic() - last_resync > self.resync_seconds:
                        self.resync()
                        last_resync = time.monotonic()
                if rv is not None and time.monotonic() - last_resync > self.resync_seconds:
                    self.resync()
                    last_resync = time.monotonic()
            except ApiError as err:
                if err.gone:
                    rv = None  # our resourceVersion is too old: relist
                    continue
                log.warning("watch failed, retrying", extra={"resource": self.resource.plural, "error": str(err),
                                                            "retry_in": backoff})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except Exception as err:  # never let the watch thread die
                log.exception("watch loop error", extra={"resource": self.resource.plural, "error": str(err)})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def resync(self) -> None:
        for obj in self.iter_items():
            self._emit("SYNC", obj)
