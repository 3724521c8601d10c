"""Prometheus metrics of the reconciler (prefix raygate_reconciler_), and the small HTTP server
for /metrics, /healthz and /readyz the Deployment's probes use."""

from __future__ import annotations

import logging
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from raygate.core import keys
from raygate.core.objects import JSON, labels
from raygate.kube.client import Kube

log = logging.getLogger("raygate.reconciler")

REQUESTS_CREATED = Counter("raygate_reconciler_requests_created", "ProvisioningRequests created.")
REQUESTS_FAILED = Counter(
    "raygate_reconciler_requests_failed",
    "ProvisioningRequests that failed, lost their booking or timed out before the job was admitted.",
)
REQUESTS_RETRIED = Counter("raygate_reconciler_requests_retried", "ProvisioningRequests created as a retry.")
PREEMPTIONS = Counter(
    "raygate_reconciler_preemptions",
    "Running jobs raygate suspended to make room for a higher-priority job at the front of their queue, by queue.",
    ["queue"],
)
PODS_RELEASED = Counter("raygate_reconciler_pods_released", "Gated pods whose scheduling gate raygate lifted.")
RECONCILE_ERRORS = Counter(
    "raygate_reconciler_reconcile_errors", "Reconciles that failed and were retried with backoff.", ["reason"]
)
ADMISSION_SECONDS = Histogram(
    "raygate_reconciler_admission_seconds",
    "Seconds from a job's creation to its admission (state Admitted).",
    ["kind"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
)
HELD_SECONDS = Histogram(
    "raygate_reconciler_held_seconds",
    "Seconds a job waited in its queue, from its creation to its admission, by queue.",
    ["queue"],
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600),
)
# Where a job's time goes inside raygate: waiting for a worker, then waiting on the API server.
# A queue wait near zero while requests take long says the API server is the bottleneck, not raygate.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
QUEUE_WAIT_SECONDS = Histogram(
    "raygate_reconciler_queue_wait_seconds",
    "Seconds a job waited in the work queue for a worker.",
    buckets=_LATENCY_BUCKETS,
)
API_REQUEST_SECONDS = Histogram(
    "raygate_reconciler_api_request_seconds",
    "Seconds from sending an API request to its answer, by HTTP method (watches apart).",
    ["method"],
    buckets=_LATENCY_BUCKETS,
)


def observe_api_request(method: str, seconds: float) -> None:
    API_REQUEST_SECONDS.labels(method).observe(seconds)


class StateCollector(Collector):
    """raygate_reconciler_jobs{state}: held and admitted jobs, counted from the caches at scrape time;
    the API requests made and the jobs waiting for a worker, read at scrape time too."""

    def __init__(self, jobs: Callable[[], Iterable[JSON]], kube: Kube,
                 queue_depth: Callable[[], int] = lambda: 0,
                 queues: Callable[[], dict[str, tuple[int, float]]] = dict) -> None:
        """`queues`: per queue of held jobs, its length and how long its oldest job has waited (seconds)."""
        self._jobs = jobs
        self._kube = kube
        self._queue_depth = queue_depth
        self._queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        counts: Tally[str] = Tally()
        for obj in self._jobs():
            counts[labels(obj).get(keys.STATE_LABEL, "")] += 1
        g = GaugeMetricFamily("raygate_reconciler_jobs", "Ray jobs and clusters by raygate state.", labels=["state"])
        for state in keys.State:
            g.add_metric([state.value], counts.get(state.value, 0))
        yield g
        c = CounterMetricFamily("raygate_reconciler_api_requests", "API requests made, by method.",
                                labels=["method"])
        for method, n in sorted(self._kube.requests.items()):
            c.add_metric([method], n)
        yield c
        yield GaugeMetricFamily("raygate_reconciler_queue_depth", "Jobs waiting in the work queue for a worker.",
                                value=self._queue_depth())
        length = GaugeMetricFamily("raygate_queue_length", "Held jobs waiting in each queue.", labels=["queue"])
        oldest = GaugeMetricFamily("raygate_queue_oldest_wait_seconds",
                                   "How long the job that has waited longest in each queue has waited.",
                                   labels=["queue"])
        for name, (n, waited) in sorted(self._queues().items()):
            length.add_metric([name], n)
            oldest.add_metric([name], waited)
        yield length
        yield oldest


def serve(port: int, ready: Callable[[], list[str]]) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on `port` (0: any free port) in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif self.path.startswith("/healthz"):
                self._send(200, b"ok\n")
            elif self.path.startswith("/readyz"):
                missing = ready()
                self._send(503 if missing else 200, (f"waiting for {', '.join(missing)}" if missing else "ok")
                           .encode() + b"\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the log

    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
