"""Events on the reconciler's own threads, so a worker's next job never waits for a report."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from raygate.core import logs
from raygate.core.objects import JSON, metadata
from raygate.kube import events
from raygate.kube.client import Kube
from raygate.reconciler.plan import Emit

log = logging.getLogger("raygate.reconciler")


def event_subject(job: JSON) -> JSON:
    """The fields of a job an Event refers to: a queued Event holds these, not the whole job."""
    found = metadata(job)
    return {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"),
            "metadata": {k: found.get(k) for k in ("name", "namespace", "uid", "resourceVersion")}}


class EventSender:
    """Events leave the reconcile path on their own threads; and while jobs are queued they wait (up to
    `max_defer` seconds), so that in a burst the API server's time goes to admissions first. One lost in a crash is
    only a report; deterministic names keep a replay from doubling it."""

    def __init__(self, kube: Kube, busy: Callable[[], bool] = lambda: False, threads: int = 2,
                 capacity: int = 10_000, max_defer: float = 10.0) -> None:
        self.kube = kube
        self._busy = busy
        self._max_defer = max_defer
        self._queue: queue.Queue[tuple[float, JSON, Emit] | None] = queue.Queue(capacity)
        self._threads = [threading.Thread(target=self._run, name=f"events-{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def send(self, job: JSON, emit: Emit) -> None:
        try:
            self._queue.put_nowait((time.monotonic(), event_subject(job), emit))
        except queue.Full:
            log.warning("event dropped: too many queued", extra={**logs.ref(job), "reason": emit.reason})

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            queued, job, emit = item
            deadline = queued + self._max_defer
            while self._busy() and time.monotonic() < deadline:
                time.sleep(0.05)
            events.record(self.kube, job, emit.reason, emit.message, warning=emit.warning, name=emit.name)

    def stop(self, grace: float = 5.0) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(grace)
