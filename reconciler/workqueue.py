"""A work queue of object keys: deduplicated, one worker per key at a time, per-key backoff.

The same shape as client-go's rate-limited queue: a key added while it waits is queued once; a key
added while a worker holds it is queued again when the worker is done, so no change is lost and no
key is processed by two workers at once; failures back off per key, so one bad job never stalls
the others.

Each key's wait, from when it could first be handed out to when a worker took it, goes to
`on_wait` (the reconciler's queue-wait metric: time a job spent waiting for a worker, not for the
API server).

Batched keys wait a moment: a key added with `add_batched` (a job whose pods changed) is handed out
after a short period that every later change joins, as the Job controller batches pod events, so a gang
of 32 pod creates, gate lifts and binds costs a few reconciles of its job instead of one per event.

Urgent keys go first: a key added with `urgent=True` (a job whose capacity just arrived, so one
patch admits it) is handed out before the keys that were waiting, so that in a burst an admission
does not queue behind creations or behind the echoes of earlier writes.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# The reconciler's batch period for pod events: several times the gap between two of KubeRay's pod creates in a
# gang, so a burst is a few reconciles and a pod waits at most this much longer.
BATCH_SECONDS = 0.2


@dataclass(frozen=True)
class Backoff:
    base_seconds: float = 0.05
    max_seconds: float = 60.0

    def delay(self, failures: int) -> float:
        return float(min(self.base_seconds * 2 ** max(failures - 1, 0), self.max_seconds))


@dataclass
class WorkQueue(Generic[K]):
    backoff: Backoff = field(default_factory=Backoff)
    clock: Callable[[], float] = time.monotonic
    on_wait: Callable[[float], None] | None = None

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: deque[K] = deque()  # FIFO of keys that may be handed out
        self._urgent: deque[K] = deque()  # handed out before _ready
        self._in_urgent: set[K] = set()  # keys with an entry in _urgent
        self._urgent_next: set[K] = set()  # added urgent while being worked on
        self._queued: set[K] = set()  # keys in a lane or waiting to re-enter one after processing
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []  # heap of (due, seq, key)
        self._batching: dict[K, tuple[int, float, float]] = {}  # key -> (seq, due, deadline) of its add_batched
        self._stale: set[int] = set()  # seqs of add_batched entries pushed out by a later one
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._since: dict[K, float] = {}  # when each key in a lane could first be handed out
        self._shutdown = False

    def add(self, key: K, urgent: bool = False) -> None:
        """Queue `key` once. `urgent`: hand it out before the keys waiting now; a key already waiting
        moves ahead (its old place is skipped when reached)."""
        with self._cond:
            if self._shutdown:
                return
            if key in self._processing:
                self._queued.add(key)  # back in a lane when the worker is done
                if urgent:
                    self._urgent_next.add(key)
                return
            if key in self._queued and not (urgent and key not in self._in_urgent):
                return
            self._queued.add(key)
            self._append(key, urgent)
            self._cond.notify()

    def _append(self, key: K, urgent: bool) -> None:
        self._since.setdefault(key, self.clock())
        if urgent:
            self._urgent.append(key)
            self._in_urgent.add(key)
        else:
            self._ready.append(key)

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            self._seq += 1
            heapq.heappush(self._delayed, (self.clock() + delay, self._seq, key))
            self._cond.notify()

    def add_batched(self, key: K, quiet: float, most: float | None = None) -> None:
        """Queue `key` once `quiet` seconds pass without another add_batched of it, and at the latest `most`
        seconds (default: `quiet`) after the first: the changes of a burst are reconciled once, when it ends. A
        key already waiting for a worker (or to be worked on again) needs nothing more: that run reads the caches
        after this change."""
        if quiet <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown or key in self._queued:
                return
            now = self.clock()
            live = self._batching.get(key)
            deadline = live[2] if live is not None else now + max(quiet, most or 0.0)
            due = min(now + quiet, deadline)
            if live is not None:
                if due <= live[1]:
                    return
                self._stale.add(live[0])  # pushed out: its heap entry is skipped when it comes up
            self._seq += 1
            self._batching[key] = (self._seq, due, deadline)
            heapq.heappush(self._delayed, (due, self._seq, key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        """Queue `key` again after its own backoff; returns the delay chosen."""
        with self._cond:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def _promote_due(self) -> float | None:
        """Move due delayed keys to the ready list; return seconds until the next one is due."""
        now = self.clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, seq, key = heapq.heappop(self._delayed)
            if seq in self._stale:
                self._stale.discard(seq)
                continue
            if (live := self._batching.get(key)) is not None and live[0] == seq:
                del self._batching[key]
            if key not in self._queued:
                self._queued.add(key)
                if key not in self._processing:
                    self._append(key, urgent=False)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to work on (mark it done afterwards), or None on shutdown or timeout."""
        deadline = None if timeout is None else self.clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote_due()
                key = self._next_ready()
                if key is not None:
                    self._queued.discard(key)
                    self._processing.add(key)
                    since = self._since.pop(key, None)
                    if since is not None and self.on_wait is not None:
                        self.on_wait(self.clock() - since)
                    return key
                if deadline is not None:
                    left = deadline - self.clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def _next_ready(self) -> K | None:
        """Urgent keys first; an entry whose key was handed out from the other lane is skipped."""
        while self._urgent:
            key = self._urgent.popleft()
            self._in_urgent.discard(key)
            if key in self._queued and key not in self._processing:
                return key
        while self._ready:
            key = self._ready.popleft()
            if key in self._queued and key not in self._processing:
                return key
        return None

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            urgent = key in self._urgent_next
            self._urgent_next.discard(key)
            if key in self._queued:  # added again while it was being worked on
                self._append(key, urgent)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def busy(self) -> bool:
        """Keys are waiting to be handed out now or being worked on (delayed keys do not count)."""
        with self._cond:
            self._promote_due()
            return bool(self._queued) or bool(self._processing)

    def waiting(self) -> int:
        """Keys waiting for a worker now (delayed keys not yet due do not count)."""
        with self._cond:
            self._promote_due()
            return len(self._queued)

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued) + len(self._delayed)


def run_workers(queue: WorkQueue[K], handle: Callable[[K], None], count: int, name: str = "worker") -> list[
        threading.Thread]:
    """Start `count` daemon threads that take keys from `queue` and call `handle` until shutdown.

    `handle` owns error handling (it decides between forget and add_rate_limited); an exception
    escaping it is a bug, so the key is retried with backoff rather than lost.
    """

    def loop() -> None:
        while True:
            key = queue.get()
            if key is None:
                return
            try:
                handle(key)
            except Exception:
                queue.add_rate_limited(key)
            finally:
                queue.done(key)

    threads = [threading.Thread(target=loop, name=f"{name}-{i}", daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return threads
